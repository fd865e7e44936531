"""Lesson 6, part 1: the Triton programming model on three small kernels.

* :func:`vector_add` -- one program per block of ``BLOCK`` elements; a mask guards the
  last, partial block. The smallest complete kernel: program id, offsets, mask, load,
  compute, store.
* :func:`softmax_rows` -- a fused row softmax: one program per row, the whole row in
  registers, max, exp, sum and divide without a trip to memory in between (the
  three-pass safe softmax of lesson 2 becomes one read and one write).
* :func:`matmul` -- a tiled matrix product: one program per ``BLOCK_M x BLOCK_N`` output
  tile, a loop over ``BLOCK_K`` slices of the shared dimension with ``tl.dot`` and a
  float32 accumulator, which is the inner loop of every attention kernel that follows.

Each kernel has a Python wrapper that validates its inputs before the launch and picks
one fixed configuration (small blocks on a CPU, where the interpreter runs them).
"""
from __future__ import annotations

import torch

from course_utils import device  # sets TRITON_INTERPRET before triton is imported
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

__all__ = ["vector_add", "softmax_rows", "matmul", "add_kernel", "softmax_kernel",
           "matmul_kernel", "launch_grid", "launch", "kernel_source"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def _check_tensor(name, t, dims=None, dtypes=_FLOATS):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dims is not None and t.dim() != dims:
        raise ValueError(f"{name} must be {dims}-D, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype {names}; got {t.dtype}")
    if t.device.type == "cpu" and not device.INTERPRET:
        raise ValueError(f"{name} is on the CPU but Triton compiles for the GPU here: move it "
                         f"to course_utils.device.DEVICE")


def launch_grid(n, block):
    """Programs needed to cover ``n`` items in blocks of ``block``: ``ceil(n / block)``."""
    if not (isinstance(n, int) and isinstance(block, int)) or n < 0 or block < 1:
        raise ValueError(f"launch_grid needs n >= 0 and block >= 1 (ints), got {n!r}, {block!r}")
    return (n + block - 1) // block


def kernel_source(kernel) -> str:
    """The Python source of a ``@triton.jit`` function (compiled or interpreted)."""
    import inspect
    return inspect.getsource(getattr(kernel, "fn", kernel))


def launch(kernel, grid, *args, **kwargs):
    """``kernel[grid](*args, **kwargs)``. In the CPU interpreter an error raised inside a
    kernel comes back wrapped in Triton's ``InterpreterError``; a ``NotImplementedError``
    (an unsolved exercise) is unwrapped so its message reads as written."""
    from course_utils.kernel_loads import watched_launch
    try:
        if isinstance(kernel, (triton.runtime.jit.JITFunction,
                               triton.runtime.interpreter.InterpretedFunction)):
            # inside a check's kernel_loads.loads_within: watched (on a GPU, once more in
            # the interpreter), and only as plain Triton code
            return watched_launch(kernel, grid, args, kwargs)
        return kernel[grid](*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - re-raised below unless unwrapped
        inner, seen = err, set()
        while inner is not None and id(inner) not in seen:
            if isinstance(inner, NotImplementedError):
                raise inner from None
            seen.add(id(inner))
            inner = inner.__cause__ or inner.__context__
        raise


# --------------------------------------------------------------------------- vector add
@triton.jit
def add_kernel(X, Y, OUT, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)                      # which block this program owns
    offs = pid * BLOCK + tl.arange(0, BLOCK)    # the BLOCK element indices of that block
    mask = offs < n                             # the last block may run past the end
    x = tl.load(X + offs, mask=mask)
    y = tl.load(Y + offs, mask=mask)
    tl.store(OUT + offs, x + y, mask=mask)


def vector_add(x, y, block=None):
    """``x + y`` for two 1-D tensors of one length, dtype and device."""
    _check_tensor("x", x, 1)
    _check_tensor("y", y, 1)
    if x.shape != y.shape or x.dtype != y.dtype or x.device != y.device:
        raise ValueError(f"x and y must share shape, dtype and device; got {tuple(x.shape)} "
                         f"{x.dtype} {x.device} and {tuple(y.shape)} {y.dtype} {y.device}")
    block = block or device.pick(cpu=64, gpu=1024)
    if block & (block - 1):
        raise ValueError(f"block must be a power of two (tl.arange needs one), got {block}")
    x, y = x.contiguous(), y.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    add_kernel[(launch_grid(n, block),)](x, y, out, n, BLOCK=block)
    return out


# --------------------------------------------------------------------------- row softmax
@triton.jit
def softmax_kernel(X, OUT, n_cols, stride_x, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    # padding lanes read -inf: they never win the max and exp(-inf) = 0 adds nothing
    x = tl.load(X + row * stride_x + cols, mask=mask, other=float("-inf")).to(tl.float32)
    z = x - tl.max(x, axis=0)                   # safe softmax: the largest term is exp(0)
    e = tl.exp(z)
    y = e / tl.sum(e, axis=0)
    tl.store(OUT + row * stride_out + cols, y.to(OUT.dtype.element_ty), mask=mask)


def softmax_rows(x):
    """Softmax over the last dim of a 2-D tensor, one program per row (the whole row
    must fit in one block: up to 65536 columns)."""
    _check_tensor("x", x, 2)
    rows, cols = x.shape
    block = triton.next_power_of_2(cols)
    if block > 65536:
        raise ValueError(f"softmax_rows keeps a row in registers: at most 65536 columns, "
                         f"got {cols}")
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty_like(x)
    softmax_kernel[(rows,)](x, out, cols, x.stride(0), out.stride(0), BLOCK=block)
    return out


# --------------------------------------------------------------------------- tiled matmul
@triton.jit
def matmul_kernel(A, B, C, M, N, K, sam, sak, sbk, sbn, scm, scn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  UPCAST: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)    # float32 whatever the inputs
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(A + rm[:, None] * sam + (k0 + rk)[None, :] * sak,
                    mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K), other=0.0)
        b = tl.load(B + (k0 + rk)[:, None] * sbk + rn[None, :] * sbn,
                    mask=((k0 + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        if UPCAST:      # the CPU interpreter cannot multiply bfloat16 operands directly
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc += tl.dot(a, b)
    tl.store(C + rm[:, None] * scm + rn[None, :] * scn, acc.to(C.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(a, b, block_m=None, block_n=None, block_k=None):
    """``a @ b`` for 2-D ``a`` (M, K) and ``b`` (K, N) of one dtype, any strides."""
    _check_tensor("a", a, 2)
    _check_tensor("b", b, 2)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a is (M, K) = {tuple(a.shape)} and b must be (K, N) with the same "
                         f"K, got {tuple(b.shape)}")
    if a.dtype != b.dtype or a.device != b.device:
        raise ValueError(f"a and b must share dtype and device, got {a.dtype}/{b.dtype}, "
                         f"{a.device}/{b.device}")
    bm = block_m or device.pick(cpu=16, gpu=128)
    bn = block_n or device.pick(cpu=16, gpu=128)
    bk = block_k or device.pick(cpu=16, gpu=32)
    for name, v in (("block_m", bm), ("block_n", bn), ("block_k", bk)):
        if v < 16 or v & (v - 1):
            raise ValueError(f"{name} must be a power of two >= 16 (tl.dot's smallest tile), "
                             f"got {v}")
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty(M, N, dtype=a.dtype, device=a.device)
    grid = (launch_grid(M, bm), launch_grid(N, bn))
    matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                        c.stride(0), c.stride(1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                        UPCAST=device.INTERPRET and a.dtype == torch.bfloat16)
    return c
