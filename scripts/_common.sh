# Sourced by the scripts in this directory.
#
#   run COMMAND [ARG...]                 runs it
#   run_io IN OUT COMMAND [ARG...]       runs it with stdin IN, stdout OUT
#
# With TRAX_QKV_DRY_RUN=1 each prints its command line instead (shell-
# quoted, one line), and nothing runs: the test suite parses every printed
# command with that command's own parser (tests/cli/test_scripts.py).

run() {
  if [[ -n "${TRAX_QKV_DRY_RUN:-}" ]]; then
    printf '%q ' "$@"
    printf '\n'
  else
    "$@"
  fi
}

run_io() {
  local in=$1 out=$2
  shift 2
  if [[ -n "${TRAX_QKV_DRY_RUN:-}" ]]; then
    printf '%q ' "$@" '<' "$in" '>' "$out"
    printf '\n'
  else
    "$@" <"$in" >"$out"
  fi
}
