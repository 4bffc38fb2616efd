"""_trax_qkv_launcher: N local processes of a command, placed by the
launcher; the runs themselves are tests/supervised/test_distributed.py's."""

import argparse

import pytest

import _trax_qkv_launcher as launcher
from trax_qkv import cli
from trax_qkv.supervised import distributed


def test_local_launcher_places_the_processes_itself(capsys):
  assert (
    launcher.launch_local(
      'train', ['--output_dir', 'x', '--process_id', '0'], 2
    )
    == 2
  )
  assert '--process_id itself' in capsys.readouterr().err
  assert launcher.launch_local('train', [], 'two') == 2
  assert capsys.readouterr().err == (
    "error: --local_processes must be an int >= 1; got 'two'.\n"
  )


def test_one_owner_of_positive_ints_and_process_flags():
  with pytest.raises(argparse.ArgumentTypeError) as raised:
    cli.positive_int('0')
  assert str(raised.value) == "must be an int >= 1; got '0'"
  parser = argparse.ArgumentParser()
  distributed.add_flags(parser)
  flags = {a.option_strings[0] for a in parser._actions[1:]}
  assert flags == {'--' + name for name in distributed.PROCESS_FLAGS}
  assert set(launcher.PLACEMENT_FLAGS) < flags


def test_local_launcher_flag_is_taken_out_of_the_children_argv():
  n, rest = launcher.local_processes(
    ['--config', 'a = 1', '--local_processes', '3', '--output_dir', 'o']
  )
  assert n == '3'
  assert rest == ['--config', 'a = 1', '--output_dir', 'o']


def test_local_children_have_one_cpu_device_each():
  env = launcher.child_environment(
    {'XLA_FLAGS': '--xla_force_host_platform_device_count=8 --xla_foo=1'}
  )
  assert env['JAX_PLATFORMS'] == 'cpu'
  assert env['XLA_FLAGS'].split() == [
    '--xla_foo=1',
    '--xla_force_host_platform_device_count=1',
  ]
