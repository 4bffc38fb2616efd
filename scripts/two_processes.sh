#!/usr/bin/env bash
# Two processes on JAX's distributed runtime train exactly as one process
# holding two devices (README "On several processes or hosts",
# docs/results.md, docs/distributed.md): the main job as 2 local processes
# of one CPU device each, then as one process of 2 CPU devices. Compare
# OUTPUT_DIR/two_processes/summary.json with two_devices/summary.json:
# the same losses, weights and decodes, bit for bit.
#
#   scripts/two_processes.sh [OUTPUT_DIR]    default runs/distributed
#
# On several hosts use slurm_two_hosts.sbatch, or the same command on each
# host with --coordinator_address HOST0:PORT --num_processes N
# --process_id I.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
out=${1:-runs/distributed}

run trax-qkv-validate --local_processes 2 --output_dir "$out/two_processes"
run env XLA_FLAGS=--xla_force_host_platform_device_count=2 \
  trax-qkv-validate --output_dir "$out/two_devices"
