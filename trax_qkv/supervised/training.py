"""Training from gin configs (`trax-qkv-train`) and its checks.

`python -m trax.trainer` no longer imports on current JAX; this is the same
job: parse gin files and bindings, then `trax.supervised.trainer_lib.train`,
which trains with `training.Loop` and resumes from the checkpoint in
`output_dir` when one is there. Here it builds a `ResumableLoop` (a Loop
whose checkpoints are atomic and resume exactly, see `checkpointing`).
Everything that can be wrong with the command line is checked before any
training or writing.
"""

import contextlib
import inspect
import os
import tokenize

import gin
import jax
import trax.data
import trax.models
from trax.supervised import trainer_lib

from trax_qkv import files
import trax_qkv.data  # the data configurables of our configs
from trax_qkv.models import registry
from trax_qkv.supervised import checkpointing
from trax_qkv.supervised import distributed
from trax_qkv.supervised import locking
from trax_qkv.supervised import model_dir


class ConfigError(ValueError):
  """A gin config file or binding that cannot be used."""


def check_output_dir(output_dir):
  """A directory that exists and is writable, or can be created."""
  if not output_dir:
    raise ValueError(
      f'output_dir must be a directory path; got {output_dir!r}.'
    )
  path = os.path.abspath(os.path.expanduser(output_dir))
  if os.path.islink(path) and not os.path.exists(path):
    raise ValueError(
      f'output_dir {path} is a symbolic link to '
      f'{os.readlink(path)}, which does not exist; remove the '
      'link or create its target.'
    )
  if os.path.exists(path) and not os.path.isdir(path):
    raise ValueError(
      f'output_dir {path} is a file; expected a directory '
      '(new or holding an earlier run to resume).'
    )
  existing = files.nearest_existing(path)
  if not os.access(existing, os.W_OK | os.X_OK):
    raise PermissionError(
      f'output_dir {path} is not writable (checked '
      f'{existing}); choose a directory you can write.'
    )
  return path


def parse_configs(config_files=(), bindings=()):
  """Parses gin files and bindings; raises ConfigError naming the culprit."""
  for path in config_files:
    if not os.path.isfile(path):
      raise ConfigError(
        f'config file {path} does not exist; expected a gin '
        'file such as configs/reference.gin.'
      )
    gin.add_config_file_search_path(os.path.dirname(os.path.abspath(path)))
  try:
    gin.parse_config_files_and_bindings(list(config_files), list(bindings))
  except (
    OSError,
    SyntaxError,
    ValueError,
    KeyError,
    ImportError,
    TypeError,
    AttributeError,
    tokenize.TokenError,
  ) as e:
    # gin reports a bad line by the parser's exception, a failed `import`
    # in a config by the import's.
    where = ' '.join(str(e).split())  # gin adds the file and line below
    raise ConfigError(
      f'gin could not use the configuration '
      f'(files {list(config_files)}, bindings '
      f'{list(bindings)}): {type(e).__name__}: '
      f'{where}'
    ) from None


# trainer_lib.train's arguments that must be positive ints when bound.
_POSITIVE_INT_ARGUMENTS = ('steps', 'eval_steps', 'eval_frequency')


def check_train_settings():
  """Raises ConfigError unless the parsed config's `train.steps`,
  `train.eval_steps` and `train.eval_frequency` (when bound) are positive
  ints, before anything is prepared or written."""
  for name in _POSITIVE_INT_ARGUMENTS:
    value = _bound('train', name, 1)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ConfigError(f'train.{name} must be a positive int; got {value!r}.')


def train_from_configs(config_files, bindings, output_dir):
  """`python -m trax.trainer`'s job, with exact resume.

  Args:
    config_files: gin files, parsed in order.
    bindings: gin bindings, applied after the files.
    output_dir: checkpoints and summaries; a checkpoint there is resumed.

  Returns:
    The `ResumableLoop` that `trainer_lib.train` ran.
  """
  output_dir = check_output_dir(output_dir)
  gin.clear_config()
  parse_configs(config_files, bindings)
  check_train_settings()
  reset_data_counters()
  # Across processes the chief prepares the data; the others then read it.
  distributed.chief_first(prepare_data)
  with (
    locking.hold_output_dir(output_dir),
    trainer_loop_class(checkpointing.ResumableLoop),
  ):
    checkpointing.check_checkpoint_files(output_dir)
    settings = translation_model_settings()
    # Written before a fresh run (so that a killed one has it too), and
    # after training (a resumed run's settings are checked against its
    # checkpoint by then): never over the settings of another model.
    chief = distributed.is_chief()
    if chief and settings and not checkpointing.checkpoint_step(output_dir):
      model_dir.save(output_dir, *settings)
    loop = trainer_lib.train(output_dir=output_dir)
    if chief and settings:
      model_dir.save(output_dir, *settings)
    return loop


def prepare_data():
  """Prepares the data set and vocabulary of `trax_qkv.data` when the
  parsed config trains on them (Trax's own inputs prepare themselves)."""
  inputs = _bound('train', 'inputs', None)
  vocab = _bound('Transformer', 'input_vocab_size', None)
  if getattr(inputs, 'selector', None) == 'trax_qkv.data.TranslationInputs' or (
    getattr(vocab, 'selector', None) == 'trax_qkv.data.translation_vocab_size'
  ):
    trax_qkv.data.translation_data()


@contextlib.contextmanager
def trainer_loop_class(loop_class):
  """Within the block, `trainer_lib.train` builds `loop_class` instead of
  `training.Loop` (same constructor). Across processes it also asks the
  data streams for batches of every device of the run, not of this
  process's devices: one process with all of them would read the same."""
  original = trainer_lib.training.Loop
  original_num_devices = trainer_lib.num_devices
  trainer_lib.training.Loop = loop_class
  if distributed.is_distributed():
    trainer_lib.num_devices = lambda: (
      original_num_devices() or jax.device_count()
    )
  try:
    yield
  finally:
    trainer_lib.training.Loop = original
    trainer_lib.num_devices = original_num_devices


def reset_data_counters():
  """Forgets the data positions of an earlier run in this process.

  Trax keeps `CountAndSkip` counters in one module-level dict; it is replaced
  by the checkpoint's when a Loop resumes, but a new run in the same process
  would otherwise skip what an earlier run read.
  """
  trax.data.inputs.data_counters = {}


def _bound(selector, name, default):
  try:
    return gin.query_parameter(f'{selector}.{name}')
  except ValueError:  # not bound: the function's own default
    return default


def translation_model_settings():
  """For a parsed config that trains trax.models.Transformer on
  trax_qkv.data: (settings, vocabulary file) to save beside the checkpoint
  (`model_dir`), so that trax-qkv-translate and trax-qkv-attention-map can
  use the run. None for any other model or data."""
  model = _bound('train', 'model', None)
  vocab = _bound('Transformer', 'input_vocab_size', None)
  if (
    getattr(model, 'selector', None) != 'trax.models.Transformer'
    or getattr(vocab, 'selector', None)
    != 'trax_qkv.data.translation_vocab_size'
  ):
    return None
  defaults = inspect.signature(trax.models.Transformer).parameters
  data = trax_qkv.data.translation_data()
  settings = model_dir.model_settings(
    data.vocab().vocab_size,
    {
      site.name: _bound(
        f'trax_qkv.{site.dispatcher}', 'implementation', registry.BUILTIN
      )
      for site in registry.SITES.values()
    },
    **{
      name: _bound('Transformer', name, defaults[name].default)
      for name in model_dir.TRANSFORMER.settings
    },
  )
  return settings, os.path.join(data.vocab_dir, data.vocab_file)
