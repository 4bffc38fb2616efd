"""scripts/: one runnable script per published result. Each is valid bash,
named in the README or docs/, and in dry-run mode (TRAX_QKV_DRY_RUN=1)
prints commands that its commands' own parsers accept, writing under the
output directory it is given."""

import glob
import os
import shlex
import subprocess

from helpers import ROOT
from helpers import command
import pytest

SCRIPTS = sorted(
  os.path.relpath(path, ROOT)
  for path in glob.glob(os.path.join(ROOT, 'scripts', '*'))
  if not os.path.basename(path).startswith('_')
)
DOCS = [os.path.join(ROOT, 'README.md')] + glob.glob(
  os.path.join(ROOT, 'docs', '*.md')
)


def _dry_run(script, output_dir):
  env = dict(os.environ, TRAX_QKV_DRY_RUN='1', SLURM_SUBMIT_DIR=ROOT)
  result = subprocess.run(
    ['bash', script, output_dir],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    check=True,
  )
  return [shlex.split(line) for line in result.stdout.splitlines()]


def _command_argv(tokens):
  """(trax_qkv.cli module, its argv) of a printed command line, without a
  launcher (srun, env VAR=...) before it or redirections after it."""
  while tokens[0] in ('srun', 'env') or '=' in tokens[0]:
    tokens = tokens[1:]
  if '<' in tokens:
    tokens = tokens[: tokens.index('<')]
  name = tokens[0].removeprefix('trax-qkv-').replace('-', '_')
  return command(name), tokens[1:]


def test_there_is_a_script_per_published_result():
  assert len(SCRIPTS) >= 3


@pytest.mark.parametrize('script', SCRIPTS)
def test_script_is_valid_bash_and_named_in_the_docs(script):
  subprocess.run(['bash', '-n', script], cwd=ROOT, check=True)
  assert any(script in open(doc).read() for doc in DOCS), script


@pytest.mark.parametrize('script', SCRIPTS)
def test_dry_run_commands_parse_and_write_under_the_output_dir(
  script, tmp_path
):
  output_dir = str(tmp_path / 'out')
  lines = _dry_run(script, output_dir)
  assert lines
  for tokens in lines:
    module, argv = _command_argv(tokens)
    module.build_parser().parse_args(argv)  # exits on a flag it lacks
    assert any(output_dir in token for token in tokens), tokens
  assert not os.path.exists(output_dir)  # nothing ran
