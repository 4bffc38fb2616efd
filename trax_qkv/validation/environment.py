"""What a run ran on, recorded beside its figures.

XLA compiles each program for the machine it runs on: on a CPU it
vectorizes for the widest instruction set the CPU has, and each jaxlib
release compiles in its own way. The float sums of a training step, and
after many steps the trained model, can then differ from one CPU or stack
to another, while the built-in and trax_qkv stay bit-identical on each.
A summary that names its stack and its CPU says which figures a rerun can
be held to.
"""

import importlib.metadata
import os
import platform

import jax

PACKAGES = ('trax_qkv', 'trax', 'jax', 'jaxlib', 'tensorflow', 'numpy')
# /proc/cpuinfo flags of the vector instruction sets XLA:CPU may target.
_VECTOR_FLAG_PREFIXES = ('sse4', 'avx', 'fma', 'amx')


def describe():
  """{'python', each of PACKAGES, 'backend', 'device', 'cpu',
  'cpu_vector_flags', 'xla_flags'} of this process."""
  model, flags = _cpu()
  return {
    'python': platform.python_version(),
    **{name: package_version(name) for name in PACKAGES},
    'backend': jax.default_backend(),
    'device': jax.devices()[0].device_kind,
    'cpu': model,
    'cpu_vector_flags': flags,
    'xla_flags': os.environ.get('XLA_FLAGS', ''),
  }


def one_line(environment):
  """The record as one line of a report."""
  e = environment
  widest = next(
    (
      name
      for flag, name in (('avx512f', 'AVX-512'), ('avx2', 'AVX2'))
      if flag in e['cpu_vector_flags']
    ),
    None,
  )
  cpu = e['cpu'] + (f' ({widest})' if widest else '')
  # On a CPU backend the device is the CPU itself.
  device = '' if e['device'] == e['backend'] else f'{e["device"]}, '
  line = (
    f'Python {e["python"]}, trax {e["trax"]}, jax {e["jax"]} (jaxlib '
    f'{e["jaxlib"]}), tensorflow {e["tensorflow"]}, numpy {e["numpy"]}, '
    f'trax_qkv {e["trax_qkv"]}; {device}CPU {cpu}'
  )
  if e['xla_flags']:
    line += f'; XLA_FLAGS `{e["xla_flags"]}`'
  return line + '.'


def package_version(name):
  """The installed version of package `name`; None where it is not
  installed (trax_qkv run from a checkout)."""
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return None


def _cpu():
  """(model name, sorted vector-extension flags) from /proc/cpuinfo, where
  there is one (Linux); else (platform.processor(), [])."""
  try:
    with open('/proc/cpuinfo') as f:
      fields = dict(
        (key.strip(), value.strip())
        for key, _, value in (line.partition(':') for line in f)
        if value
      )
  except OSError:
    return platform.processor() or platform.machine(), []
  flags = sorted(
    flag
    for flag in fields.get('flags', '').split()
    if flag.startswith(_VECTOR_FLAG_PREFIXES)
  )
  return fields.get('model name', platform.machine()), flags
