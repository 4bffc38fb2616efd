"""`KernelLayer`: what `PureAttention` and `DotProductCausalAttention` share.

Both are Trax layers whose math is a kernel of `trax_qkv.kernels`, chosen
per call by `kernels.resolve`. Their arguments (dropout, mode,
implementation), the checks on them, the rate in effect per mode and the
choice of kernel are written once here; each layer says how its inputs
are checked and what a kernel sees of them (`_call`).
"""

from trax.layers import base

from trax_qkv import kernels
from trax_qkv.layers import checks


class KernelLayer(base.Layer):
  """A Trax layer that runs a kernel of `trax_qkv.kernels`.

  Subclasses define `check_inputs(inputs)` (raising ValueError/TypeError)
  and `_call(q, k)` (the `kernels.Call` of inputs shaped like q and k).
  """

  def __init__(self, n_in, n_out, dropout, mode, implementation):
    """Checks the shared arguments before anything is built.

    Args:
      n_in, n_out: the layer's inputs and outputs.
      dropout: attention-weight dropout rate in [0, 1), 'train' mode only.
      mode: one of 'train', 'eval', 'predict', 'viz'.
      implementation: a kernel name or 'auto' (`kernels.names()`); 'viz'
        mode runs 'reference', the one that materialises the weights. A
        kernel that cannot run here raises ValueError, here or at `init`
        for the input dtype; 'auto' picks one that can instead.
    """
    checks.check_dropout(dropout)
    checks.check_mode(mode)
    kernels.check_implementation(implementation)
    if mode != 'viz':
      kernels.check_supported(
        implementation, dropout_rate=dropout if mode == 'train' else 0.0
      )
    super().__init__(n_in=n_in, n_out=n_out)
    self._dropout = dropout
    self._mode = mode
    self._implementation = implementation

  @property
  def mode(self):
    return self._mode

  @property
  def dropout_rate(self):
    """The rate in effect: dropout applies in 'train' mode only."""
    return self._dropout if self._mode == 'train' else 0.0

  def check_inputs(self, inputs):
    raise NotImplementedError

  def _call(self, q, k):
    raise NotImplementedError

  def kernel_for(self, q, k):
    """The `kernels.Kernel` that runs for inputs shaped like q and k
    ('viz' runs 'reference')."""
    if self._mode == 'viz':
      return kernels.KERNELS[kernels.REFERENCE]
    return kernels.resolve(self._implementation, self._call(q, k))

  def implementation_for(self, q, k):
    """The name of `kernel_for(q, k)`."""
    return self.kernel_for(q, k).name

  def init(self, input_signature, rng=None, use_cache=False):
    # Checked here: Trax re-raises anything from inside init as LayerError.
    self.check_inputs(input_signature)
    self.kernel_for(*input_signature[:2])  # a kernel that cannot take the dtype
    return super().init(input_signature, rng=rng, use_cache=use_cache)
