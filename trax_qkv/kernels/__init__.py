"""Multi-head attention math as pure JAX functions: no Trax, no TensorFlow.

Every kernel computes what `reference.dot_product_attention` computes --
same inputs, float32 output, -1e9 masking, softmax as exp(x - logsumexp(x))
-- within float32 rounding; 'reference' is that function, operation for
operation as trax 1.4.1 runs it, so bit-identical:

  'reference'  trax's own math (reference.py).
  'fused'      cache-sized tiles with a flash-style backward (fused.py).
  'chunked'    keys in blocks with an online softmax (chunked.py); memory
               O(Lq * block) instead of O(Lq * Lk).
  'cudnn'      jax.nn.dot_product_attention's cuDNN kernel (cudnn.py): GPU,
               bfloat16/float16, no dropout; raises where it cannot run.
  'auto'       the first kernel of `KERNELS` whose rule takes the call.

Causal self-attention (causal.py) visits only the blocks on or below the
diagonal ('fused': `causal.DEFAULT_BLOCK_SIZE` blocks, 'chunked':
`chunked.DEFAULT_BLOCK_SIZE` ones); in predict mode the blockwise kernels
attend over the filled part of the cache only. Each kernel is one record in
`dispatch.KERNELS`, and `dispatch.resolve` is the one place that turns a
requested name into the kernel that runs. Measurements behind the rules:
docs/benchmarks.md.

Shape letters, in docstrings and einsum strings:
  b  batch entries             h  heads (n_heads)
  q  query positions (Lq)      k  key positions (Lk; `l` when Lq = Lk)
  d  features of one head (d_head), or of all heads where the shape says so
  g  rows of a blockwise step: (batch entry, head) pairs flattened
  S  any query length in a shape assertion
Layouts: `reference.split_heads` makes (b, h, L, d_head), as Trax does;
`common.heads_last` makes (b, L, h, d_head), a reshape with no copy.
"""

from trax_qkv.kernels import causal
from trax_qkv.kernels import chunked
from trax_qkv.kernels import cudnn
from trax_qkv.kernels import fused
from trax_qkv.kernels import reference
from trax_qkv.kernels.dispatch import AUTO
from trax_qkv.kernels.dispatch import KERNELS
from trax_qkv.kernels.dispatch import REFERENCE
from trax_qkv.kernels.dispatch import Call
from trax_qkv.kernels.dispatch import Kernel
from trax_qkv.kernels.dispatch import attend
from trax_qkv.kernels.dispatch import causal_mask
from trax_qkv.kernels.dispatch import check_implementation
from trax_qkv.kernels.dispatch import check_supported
from trax_qkv.kernels.dispatch import choose
from trax_qkv.kernels.dispatch import keeps_trax_state
from trax_qkv.kernels.dispatch import may_project_in_blocks
from trax_qkv.kernels.dispatch import names
from trax_qkv.kernels.dispatch import projects_rows
from trax_qkv.kernels.dispatch import register
from trax_qkv.kernels.dispatch import resolve
from trax_qkv.kernels.dispatch import unregister
