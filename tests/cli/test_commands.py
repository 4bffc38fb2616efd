"""What every command shares (trax_qkv.cli): the compilation cache's
place, and its flag."""

import os

from helpers import command
import pytest

import _trax_qkv_launcher as launcher

COMMANDS = (
  'train',
  'validate',
  'translate',
  'attention_map',
  'compare',
  'circuits',
  'bench',
  'bench_kernels',
  'serve',
)


def test_compilation_cache_flag_then_env_then_jax_then_user_cache():
  where = launcher.compilation_cache_dir
  ours, jax_own = launcher.COMPILATION_CACHE_ENV, 'JAX_COMPILATION_CACHE_DIR'
  assert where('/flag', {ours: '/env'}) == '/flag'
  assert where('off', {ours: '/env'}) is None
  assert where(None, {ours: '/env', jax_own: '/jax'}) == '/env'
  assert where(None, {ours: 'off', jax_own: '/jax'}) is None
  assert where(None, {ours: '', jax_own: '/jax'}) is None
  assert where(None, {jax_own: '/jax'}) == '/jax'
  assert where(None, {'XDG_CACHE_HOME': '/c'}) == '/c/trax_qkv/xla'
  assert where(None, {}) == os.path.expanduser('~/.cache/trax_qkv/xla')


def test_the_console_commands_set_it_before_jax_is_imported():
  env = {}
  launcher.set_compilation_cache(['--compilation_cache', '/c', 'x'], env)
  assert env == {'JAX_COMPILATION_CACHE_DIR': '/c'}
  env = {'JAX_COMPILATION_CACHE_DIR': '/jax'}
  launcher.set_compilation_cache(['--compilation_cache', 'off'], env)
  assert env['JAX_ENABLE_COMPILATION_CACHE'] == 'false'


@pytest.mark.parametrize('name', COMMANDS)
def test_every_command_takes_the_cache_flag(name):
  usage = command(name).build_parser().format_help()
  assert '--compilation_cache DIR|off' in usage
