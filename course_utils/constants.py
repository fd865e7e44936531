"""Numbers every attention implementation of the course shares, defined once.

The kernels keep scores in base 2 (``exp2`` is one instruction on a GPU): they fold
``LOG2E`` into the softmax scale and convert the base-2 log-sum-exp back to natural
log with ``LN2``. Kernel modules import these and wrap them as ``tl.constexpr``.
"""
import math

__all__ = ["LOG2E", "LN2", "CAUSAL_UPPER_LEFT", "CAUSAL_LOWER_RIGHT", "ALIGNMENTS"]

LOG2E = math.log2(math.e)      # 1.4426950408889634: exp(x) == exp2(x * LOG2E)
LN2 = math.log(2.0)            # 0.6931471805599453: ln(x) == log2(x) * LN2

# Causal mask alignments, named as torch.nn.attention.bias names them.
CAUSAL_UPPER_LEFT = "causal_upper_left"     # SDPA's is_causal=True
CAUSAL_LOWER_RIGHT = "causal_lower_right"   # decoding, flash-attn's causal=True
ALIGNMENTS = (CAUSAL_UPPER_LEFT, CAUSAL_LOWER_RIGHT)
