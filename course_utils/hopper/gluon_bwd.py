"""Lesson 8 (c): a warp-specialised attention backward written in Gluon for sm90.

Lesson 7's portable backward runs two kernels after the ``Delta`` preprocess: one keeps a
key tile still and streams the queries past it (dK, dV), the other keeps a query tile
still and streams the keys (dQ): seven matrix products per (query tile, key tile) pair.
This kernel is FlashAttention-3's answer on Hopper: **one** key-stationary pass with five
products, dQ added into a float32 buffer.

* **Producer** (1 warp): TMA-loads the program's K and V tile once (two blocks of 64 keys
  each), then, for every query head of the key/value head's group and every query tile
  that sees the keys, Q_i and dO_i (64 rows each) and the 64 rows' LSE and Delta (made
  beforehand by :func:`row_stats`) into a ring of ``STAGES`` slots, with ``ready`` /
  ``empty`` mbarriers as in the forward. The consumers read LSE and Delta out of shared
  memory, a few cycles away, instead of waiting on global loads every step.
* **Two consumers** (one warpgroup each, 64 of the tile's 128 keys): per query tile

  1. ``S^T = K_c Q_i^T`` and ``dP^T = V_c dO_i^T`` issued together (``warpgroup_mma``);
  2. ``P^T = exp2(S^T * scale * log2(e) - LSE_i * log2(e))`` as soon as S^T is done,
     while the tensor cores still work on dP^T;
  3. ``dV_c += P^T dO_i`` with P^T straight from registers;
  4. ``dS^T = P^T * (dP^T - Delta_i)``, then ``dK_c += dS^T Q_i``, again from registers;
  5. dS^T into a shared-memory buffer that holds both consumers' rows (two such buffers
     take turns, with ``ds_full`` / ``ds_free`` mbarriers between the consumers);
  6. ``dQ_i += dS K`` over all 128 keys, reading the buffer transposed: at D = 128 each
     consumer makes 64 of dQ's columns at the end of the step. At D = 64 one 64 x 64
     product makes all of it and the consumers take turns: the one whose turn it is makes
     step t's dQ during step t + 1, issued right after that step's S^T and dP^T so that
     it runs beside dP^T during the exponentials (the step loop is unrolled by two, so
     that whose turn it is is a constant: an asynchronous product whose accumulator is
     merged across a runtime branch makes ptxas serialize the products). The
     64 x 64 float32 result goes into shared memory and the TMA unit adds it into dQ in
     one bulk reduce-add (``cp.reduce.async.bulk.tensor``).

  Everything is computed transposed (keys as rows) so that the two accumulating
  products take their left operand from registers: wgmma reads a register operand only
  as the left one. Only dQ needs dS the other way round, and shared memory can be read
  either way.

How dQ is added decides the speed (``benchmarks/<device>/ablation.md``): one atomic add
per element pair from registers ran at less than half the speed of the same kernel with
the adds left out; the TMA unit's bulk adds, one per consumer and 64 keys, were 1.4-1.6x
faster; one bulk add per 128 keys (both consumers' dS first combined in shared memory)
halves the traffic into L2 again and is what this kernel does. Loading each step's LSE
and Delta into the ring, instead of from global memory in the consumers, was 12-29 %
faster again at seven of the eight points measured (the profile had shown the consumers
waiting on those two loads every step). Making each step's dQ during the next step at
D = 64 made the backward a few per cent faster at 16k keys on an H200 and not measurably
faster at 4k. At D = 128, issued beside S^T and dP^T it leaves too few registers (ptxas
serializes the products), and issued after dK it was not measurably faster.

Gradients of a K/V head shared by a group of query heads (GQA) accumulate in the same
registers, one head after the other, so dK and dV are written once, by one program, with
no atomics; only dQ is added to, once per step by every program whose keys the query
tile sees. On a GPU the order of those additions varies between runs, so dQ is not
bitwise reproducible.

Any lengths: the descriptors cover every head's rows at once (2-D views), so the last
query tile of a head reads the next head's rows. Those rows get ``LSE = +inf`` (their P
is exactly 0, so they add nothing), and the float32 dQ buffer is padded to whole query
tiles per head, so their share (zeros) lands in padding. Keys past ``Nk`` are masked
like the causal mask, and their dK / dV rows are not stored. A row that sees no key
(forward LSE ``-inf``) gets ``P = 0`` the same way.

Sizes: D in {64, 128}, float16 / bfloat16, both causal alignments of
:mod:`course_utils.contract`, GQA. Runs only on an sm90 GPU; importing works anywhere.
"""
from __future__ import annotations

import torch

from course_utils import device  # sets TRITON_INTERPRET before triton is imported

from course_utils.constants import LOG2E  # noqa: E402
from course_utils.hopper.triton_fwd import validate_hopper_inputs  # noqa: E402

__all__ = ["attention_gluon_backward", "gluon_attention", "row_stats", "BWD_BLOCK_M",
           "BWD_BLOCK_N"]

BWD_BLOCK_M = 64       # query rows per step of the stream
BWD_BLOCK_N = 128      # keys per program: two consumers of 64

from course_utils.hopper.gluon_fwd import (GLUON_AVAILABLE, SM90_SHARED_BYTES,  # noqa: E402
                                           _need_hopper, _schedule)


def shared_bytes(d, stages):
    """Shared memory the backward's program asks for at head dim ``d``: K and V (128
    keys), ``stages`` slots of Q_i, dO_i (64 rows) and their rows' LSE and Delta, two dS^T
    buffers (128 x 64, 16-bit), two 64 x 64 float32 dQ tiles, and 1 KiB for the barriers
    (the compiler's figure for sm90 is at most 1 KiB under this)."""
    return (2 * BWD_BLOCK_N * d * 2 + stages * (2 * BWD_BLOCK_M * d * 2 + 2 * BWD_BLOCK_M * 4)
            + 2 * BWD_BLOCK_N * BWD_BLOCK_M * 2 + 2 * BWD_BLOCK_M * 64 * 4 + 1024)


if device.HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _bwd_row_stats(O, DO, LSE, LSE2, DELTA, NQ, D: tl.constexpr, BLOCK: tl.constexpr,
                       LOG2E_: tl.constexpr):
        # BLOCK rows of one head (program (tile, head)): LSE in base 2 and
        # Delta = rowsum(dO * O), into buffers padded to whole tiles per head
        bh = tl.program_id(1).to(tl.int64)
        rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = rows < NQ
        at = (bh * NQ + rows)[:, None] * D + tl.arange(0, D)[None, :]
        o = tl.load(O + at, mask=ok[:, None], other=0.0).to(tl.float32)
        do = tl.load(DO + at, mask=ok[:, None], other=0.0).to(tl.float32)
        lse = tl.load(LSE + bh * NQ + rows, mask=ok, other=float("-inf"))
        padded = bh * tl.num_programs(0) * BLOCK + rows
        tl.store(LSE2 + padded, tl.where(lse == float("-inf"), float("inf"), lse * LOG2E_))
        tl.store(DELTA + padded, tl.sum(o * do, 1))


def row_stats(o, do, lse):
    """What every step of the backward needs per query row besides Q and dO, in float32
    and padded to whole query tiles (64 rows) per head, flat ``(B * H * Nq_pad,)``:
    ``lse2 = LSE * log2(e)`` and ``delta = rowsum(dO * O)``. The producer loads both into
    its ring with Q_i and dO_i. Padding rows and rows that saw no key (forward LSE
    ``-inf``) get ``lse2 = +inf``, so their ``P`` is exactly 0; padding rows get
    ``delta = 0``. ``o`` and ``do``: contiguous ``(B, H, Nq, D)``; ``lse``: ``(B, H, Nq)``.
    Runs wherever Triton does (the CPU interpreter included)."""
    b, h, nq, d = o.shape
    n_tiles = -(-nq // BWD_BLOCK_M)
    lse2, delta = torch.empty((2, b * h * n_tiles * BWD_BLOCK_M), device=o.device,
                              dtype=torch.float32)
    _bwd_row_stats[(n_tiles, b * h)](o, do, lse.contiguous(), lse2, delta, nq, D=d,
                                     BLOCK=BWD_BLOCK_M, LOG2E_=LOG2E)
    return lse2, delta


if GLUON_AVAILABLE:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

    from triton._C.libtriton import ir as _ir
    from triton.experimental.gluon.language._core import builtin as _builtin

    from course_utils.hopper.gluon_fwd import _GL_DTYPES, _sync_warps, _tma_load

    @_builtin
    def _tma_add(desc, coord, src, _semantic=None):
        # global[the box at coord] += the shared-memory tile src, by the TMA unit
        # (cp.reduce.async.bulk.tensor ... .add). Triton 3.6 builds the operation but
        # Gluon has no name for it yet; its completion is waited for like a TMA store's
        # (tma.store_wait).
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD, desc.handle,
                                                  coord, src.handle)

    @gluon.jit
    def _round_16(x, dtype: gl.constexpr):
        # float32 -> dtype, to nearest even. bfloat16 two values at a time, in one packed
        # instruction: from a plain .to(), Triton 3.6 rounded P^T one value an instruction
        # (F2F.BF16.F32, as many as the exponentials), and the bfloat16 backward ran slower
        # than the float16 one (benchmarks/<device>/ablation.md, "bfloat16 rounding")
        if dtype == gl.bfloat16:
            # $1 is the first value of each pair and goes to the low half of the result
            return gl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [x],
                                             dtype=gl.bfloat16, is_pure=True, pack=2)
        else:
            return x.to(dtype)

    @gluon.jit
    def _bwd_loader(k_desc, v_desc, q_desc, do_desc, lse_desc, delta_desc, k_smem, v_smem,
                    q_smem, do_smem, lse_smem, delta_smem, kv_bar, ready, empty, kv_row,
                    q_head0, nq, group, i_lo, n_tiles):
        # K and V: the program's keys as two 64-row boxes each, once
        BN: gl.constexpr = k_desc.block_type.shape[0]
        STAGES: gl.constexpr = q_smem.shape[0]
        BM: gl.constexpr = q_smem.shape[1]
        mbarrier.expect(kv_bar, 4 * k_desc.block_type.nbytes)
        for c in gl.static_range(2):
            _tma_load(k_desc, [kv_row + c * BN, 0], kv_bar, k_smem.slice(c * BN, BN, dim=0))
            _tma_load(v_desc, [kv_row + c * BN, 0], kv_bar, v_smem.slice(c * BN, BN, dim=0))
        # then Q_i, dO_i and their rows' LSE and Delta, for every query head of the group,
        # query tiles i_lo..n_tiles-1
        t = 0
        for g in range(group):
            row0 = (q_head0 + g) * nq
            for i in range(i_lo, n_tiles):
                s = t % STAGES
                mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(s), 2 * q_desc.block_type.nbytes
                                + 2 * lse_desc.block_type.nbytes)
                _tma_load(q_desc, [row0 + i * BM, 0], ready.index(s), q_smem.index(s))
                _tma_load(do_desc, [row0 + i * BM, 0], ready.index(s), do_smem.index(s))
                row = ((q_head0 + g) * n_tiles + i) * BM     # in the padded LSE / Delta
                _tma_load(lse_desc, [row], ready.index(s), lse_smem.index(s))
                _tma_load(delta_desc, [row], ready.index(s), delta_smem.index(s))
                t += 1

    @gluon.jit
    def _bwd_step(t, m0, bh, dk, dv, k_c, v_c, k_smem, q_smem, do_smem, lse_smem,
                  delta_smem, ds_smem, dq_c, ready, empty, ds_full, ds_free, dq_desc, nk, diag,
                  qk_scale, keys, q_in, key0, st_zero, dq_zero, q_head0, nq_pad, i_lo, per,
                  a_layout: gl.constexpr, col_l: gl.constexpr, C: gl.constexpr,
                  DQ_NOW: gl.constexpr, DQ_PREV: gl.constexpr, FREE_PREV: gl.constexpr):
        # One step of consumer C: the query tile of the stream's step t (rows m0.. of
        # query head bh; bh is used only with DQ_NOW, head dim 64 passes 0) against its 64
        # keys. DQ_NOW (head dim 128): this step's dQ share, at its end. DQ_PREV (head dim
        # 64, this consumer's turn): step t - 1's dQ, issued right after S^T and dP^T (per
        # query tiles a head from tile i_lo on say which tile that was). FREE_PREV (head
        # dim 64, t >= 1): release step t - 1's dS buffer.
        BN: gl.constexpr = ds_smem.shape[1] // 2
        STAGES: gl.constexpr = q_smem.shape[0]
        BM: gl.constexpr = q_smem.shape[1]
        COL: gl.constexpr = C * 64 * (k_smem.shape[1] // 64 - 1)  # this consumer's dQ columns
        dtype: gl.constexpr = k_smem.dtype
        s = t % STAGES
        b = t % 2                                      # the dS buffer of this step
        mbarrier.wait(ready.index(s), (t // STAGES) & 1)
        q_t = q_smem.index(s)
        do_t = do_smem.index(s)
        # this tile's LSE (base 2), one per query, from the ring like Q_i: rows past nq
        # (the next head's, read by the 2-D descriptor) and rows that saw no key have
        # LSE = +inf there, so P = 0 (see row_stats)
        lse2 = lse_smem.index(s).load(col_l)
        # 1. S^T = K_c Q^T and dP^T = V_c dO^T, both in flight
        st = warpgroup_mma(k_c, q_t.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        dpt = warpgroup_mma(v_c, do_t.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        if DQ_PREV:
            # 0. at head dim 64: step t - 1's dQ over all 128 keys, out of the other dS
            # buffer, issued third, so that it and dP^T run during this step's exponentials
            mbarrier.wait(ds_full.index(1 - b), ((t - 1) // 2) & 1)
            dq = warpgroup_mma(ds_smem.index(1 - b).permute((1, 0)),
                               k_smem.slice(COL, 64, dim=1), dq_zero, use_acc=False,
                               is_async=True)
            st = warpgroup_mma_wait(2, deps=(st,))
        else:
            st = warpgroup_mma_wait(1, deps=(st,))
        # 2. P^T while dP^T runs; masked where the causal mask cuts this block of keys or
        # where the keys end (key j is seen by query r when j <= r + diag)
        if (key0 + BN - 1 > m0 + diag) | (key0 + BN > nk):
            seen = (gl.expand_dims(keys, 1) <= gl.expand_dims(m0 + q_in, 0) + diag) & \
                gl.expand_dims(keys < nk, 1)
            st = gl.where(seen, st, float("-inf"))
        # P^T is kept in 16 bits only (the tensor cores take it so, and dS^T below is
        # rounded to 16 bits too): 32 registers a thread fewer than float32
        pt = _round_16(gl.exp2(st * qk_scale - gl.expand_dims(lse2, 0)), dtype)
        # 3. dV_c += P^T dO, P^T from registers
        pa = gl.convert_layout(pt, a_layout)
        dv = warpgroup_mma(pa, do_t, dv, is_async=True)
        delta = delta_smem.index(s).load(col_l)
        if DQ_PREV:
            dpt = warpgroup_mma_wait(2, deps=(dpt,))
        else:
            dpt = warpgroup_mma_wait(1, deps=(dpt,))
        # 4. dS^T = P^T (dP^T - Delta); dK_c += dS^T Q
        dst = _round_16(pt.to(gl.float32) * (dpt - gl.expand_dims(delta, 0)), dtype)
        dsa = gl.convert_layout(dst, a_layout)
        dk = warpgroup_mma(dsa, q_t, dk, is_async=True)
        # 5. this consumer's dS^T rows into buffer b, once both consumers have released
        # what step t - 2 left there
        if t >= 2:
            mbarrier.wait(ds_free.index(b), ((t // 2) - 1) & 1)
        ds_smem.index(b).slice(C * BN, BN, dim=0).store(dst)
        fence_async_shared()                           # the writes, before wgmma reads
        _sync_warps()
        mbarrier.arrive(ds_full.index(b), count=1)
        if DQ_PREV:
            dq = warpgroup_mma_wait(2, deps=(dq,))
            p = t - 1
            _add_dq(dq, dq_c, dq_desc, (q_head0 + p // per) * nq_pad + (i_lo + p % per) * BM,
                    COL)
        if FREE_PREV:
            _sync_warps()
            mbarrier.arrive(ds_free.index(1 - b), count=1)
        dv, dk, pa, dsa = warpgroup_mma_wait(0, deps=(dv, dk, pa, dsa))
        # every read of Q_i and dO_i is done: the slot goes back to the producer
        _sync_warps()
        mbarrier.arrive(empty.index(s), count=1)
        if DQ_NOW:
            # 6. dQ_i += dS K over all 128 keys of the program, read transposed out of
            # buffer b: consumer C makes columns 64 C .. 64 C + 63
            mbarrier.wait(ds_full.index(b), (t // 2) & 1)
            dq = warpgroup_mma(ds_smem.index(b).permute((1, 0)),
                               k_smem.slice(COL, 64, dim=1), dq_zero, use_acc=False)
            _add_dq(dq, dq_c, dq_desc, bh * nq_pad + m0, COL)
            _sync_warps()
            mbarrier.arrive(ds_free.index(b), count=1)
        return dk, dv

    @gluon.jit
    def _add_dq(dq, dq_c, dq_desc, row, col):
        # the 64 x 64 float32 tile goes out through shared memory and the TMA unit, one
        # bulk reduce-add; the previous add out of dq_c must have read it first. The
        # float32 buffer has nq_pad rows a head: rows past nq are padding
        tma.store_wait(0)
        _sync_warps()
        dq_c.store(dq)
        fence_async_shared()
        _sync_warps()
        _tma_add(dq_desc, [row, col], dq_c)

    @gluon.jit
    def _bwd_consumer(k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem,
                      kv_bar, ready, empty, ds_full, ds_free, dq_desc, dk_ptr, dv_ptr, kv_row,
                      q_head0, nk, nq_pad, group, i_lo, n_tiles, n0, diag, qk_scale, scale,
                      C: gl.constexpr):
        """Consumer ``C``: keys ``n0 + 64 C ..`` of the program's tile, as the rows of
        S^T, dP^T, dK and dV."""
        BN: gl.constexpr = ds_smem.shape[1] // 2       # 64 keys of this consumer
        D: gl.constexpr = k_smem.shape[1]
        BM: gl.constexpr = q_smem.shape[1]             # 64 query rows a step
        HALVES: gl.constexpr = D // 64                 # dQ is made 64 columns at a time
        st_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BM, 16])
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout,
                                                     k_width=2)
        col_l: gl.constexpr = gl.SliceLayout(0, st_layout)    # one value per query
        key_l: gl.constexpr = gl.SliceLayout(1, st_layout)    # one value per key

        k_c = k_smem.slice(C * BN, BN, dim=0)
        v_c = v_smem.slice(C * BN, BN, dim=0)
        dq_c = dq_smem.index(C)
        dk = gl.zeros([BN, D], gl.float32, acc_layout)
        dv = gl.zeros([BN, D], gl.float32, acc_layout)
        st_zero = gl.zeros([BN, BM], gl.float32, st_layout)
        dq_zero = gl.zeros([BM, 64], gl.float32, dq_layout)
        key0 = n0 + C * BN
        keys = key0 + gl.arange(0, BN, layout=key_l)
        q_in = gl.arange(0, BM, layout=col_l)

        mbarrier.wait(kv_bar, 0)
        per = n_tiles - i_lo                           # query tiles of each head
        sargs = (k_c, v_c, k_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_c, ready,
                 empty, ds_full, ds_free, dq_desc, nk, diag, qk_scale, keys, q_in, key0,
                 st_zero, dq_zero, q_head0, nq_pad, i_lo, per)
        if HALVES == 2:
            # head dim 128: each step ends with its own share of dQ, 64 columns a consumer
            t = 0
            for g in range(group):
                bh = q_head0 + g
                for i in range(i_lo, n_tiles):
                    dk, dv = _bwd_step(t, i * BM, bh, dk, dv, *sargs, a_layout, col_l, C, True,
                                       False, False)
                    t += 1
        else:
            # head dim 64: a step's dQ over the 128 keys is one 64 x 64 product. The
            # consumer whose turn it is (t % 2) makes step t's during step t + 1, issued
            # right after that step's S^T and dP^T, so that dQ and dP^T are both on the
            # tensor cores during the exponentials, and each consumer waits only for the
            # other's previous step. The loop is unrolled by two so that whose turn it is
            # stays a constant: an asynchronous product whose accumulator is merged across
            # a runtime branch makes ptxas serialize the products (lesson 8).
            total = group * per                        # steps: every head of the group
            if total > 0:
                dk, dv = _bwd_step(0, i_lo * BM, 0, dk, dv, *sargs, a_layout, col_l, C, False,
                                   False, False)
            for t in range(1, total - 1, 2):
                dk, dv = _bwd_step(t, (i_lo + t % per) * BM, 0, dk, dv, *sargs, a_layout,
                                   col_l, C, False, C == 0, True)
                dk, dv = _bwd_step(t + 1, (i_lo + (t + 1) % per) * BM, 0, dk, dv, *sargs,
                                   a_layout, col_l, C, False, C == 1, True)
            if (total > 1) & (total % 2 == 0):
                dk, dv = _bwd_step(total - 1, (i_lo + (total - 1) % per) * BM, 0, dk, dv,
                                   *sargs, a_layout, col_l, C, False, C == 0, True)
            # the last step's dQ, by the consumer whose turn it is
            last = total - 1
            if (total > 0) & (last % 2 == C):
                mbarrier.wait(ds_full.index(C), (last // 2) & 1)
                dq = warpgroup_mma(ds_smem.index(C).permute((1, 0)), k_smem, dq_zero,
                                   use_acc=False)
                _add_dq(dq, dq_c, dq_desc, (q_head0 + last // per) * nq_pad
                        + (i_lo + last % per) * BM, 0)

        # epilogue: dK (times the softmax scale) and dV, the rows of real keys only
        rows = key0 + gl.arange(0, BN, layout=gl.SliceLayout(1, acc_layout))
        cols = gl.arange(0, D, layout=gl.SliceLayout(0, acc_layout))
        ok = gl.expand_dims(rows < nk, 1) & gl.expand_dims(cols < D, 0)
        off = (kv_row + C * BN + gl.expand_dims(rows - key0, 1)).to(gl.int64) * D + \
            gl.expand_dims(cols, 0)
        gl.store(dk_ptr + off, (dk * scale).to(dk_ptr.dtype.element_ty), mask=ok)
        gl.store(dv_ptr + off, dv.to(dv_ptr.dtype.element_ty), mask=ok)
        tma.store_wait(0)                      # the last add has read its buffer

    # the partitions' entry points: a constexpr cannot be passed to a partition, so each
    # consumer has its own, taking the shared arguments as one tuple
    @gluon.jit
    def _bwd_consumer0(args):
        _bwd_consumer(*args, 0)

    @gluon.jit
    def _bwd_consumer1(args):
        _bwd_consumer(*args, 1)

    @gluon.jit
    def _attn_bwd_gluon(k_desc, v_desc, q_desc, do_desc, lse_desc, delta_desc, dq_desc, dk_ptr,
                        dv_ptr, qk_scale, scale, Hq, Hkv, Nq, Nk, NQ_PAD, DIAG,
                        D: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                        CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr):
        BM: gl.constexpr = q_desc.block_type.shape[0]
        BN: gl.constexpr = k_desc.block_type.shape[0]          # 64: one consumer's keys
        n0 = gl.program_id(0) * (2 * BN)       # causal upper-left: the longest tiles first
        bkv = gl.program_id(1)
        group = Hq // Hkv
        q_head0 = (bkv // Hkv) * Hq + (bkv % Hkv) * group
        kv_row = bkv * Nk + n0
        n_tiles = (Nq + BM - 1) // BM
        i_lo = 0
        diag = Nk + 2 * BN                      # no mask: no block is ever cut
        if CAUSAL:
            # query r sees key j when j <= r + DIAG: the first query that sees key n0
            i_lo = gl.minimum(gl.maximum(n0 - DIAG, 0) // BM, n_tiles)
            diag = DIAG

        k_smem = gl.allocate_shared_memory(k_desc.dtype, [2 * BN, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [2 * BN, D], v_desc.layout)
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES, BM, D], q_desc.layout)
        do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES, BM, D], do_desc.layout)
        lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BM], lse_desc.layout)
        delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BM], delta_desc.layout)
        # dS^T of both consumers (128 keys x 64 queries), two buffers taking turns
        ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([2 * BN, BM],
                                                                        k_desc.dtype)
        ds_smem = gl.allocate_shared_memory(k_desc.dtype, [2, 2 * BN, BM], ds_layout)
        # each consumer's 64 x 64 float32 share of dQ on its way to the TMA unit
        dq_smem = gl.allocate_shared_memory(gl.float32, [2, BM, 64], dq_desc.layout)
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=2)          # both consumers release
        for i in gl.static_range(2):
            mbarrier.init(ds_full.index(i), count=2)        # both consumers wrote
            mbarrier.init(ds_free.index(i), count=2)        # both consumers are done

        cargs = (k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem,
                 kv_bar, ready, empty, ds_full, ds_free, dq_desc, dk_ptr, dv_ptr, kv_row,
                 q_head0, Nk, NQ_PAD, group, i_lo, n_tiles, n0, diag, qk_scale, scale)
        largs = (k_desc, v_desc, q_desc, do_desc, lse_desc, delta_desc, k_smem, v_smem, q_smem,
                 do_smem, lse_smem, delta_smem, kv_bar, ready, empty, kv_row, q_head0, Nq,
                 group, i_lo, n_tiles)
        gl.warp_specialize([(_bwd_consumer0, (cargs,)), (_bwd_consumer1, (cargs,)),
                            (_bwd_loader, largs)], [4, 1], [CONSUMER_REGS, LOADER_REGS])

        mbarrier.invalidate(kv_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(i))
            mbarrier.invalidate(empty.index(i))
        for i in gl.static_range(2):
            mbarrier.invalidate(ds_full.index(i))
            mbarrier.invalidate(ds_free.index(i))


def _check_grads_inputs(q, o, lse, do):
    from course_utils.triton_attention import check_saved
    check_saved(q, o, lse, do)
    for name, t in (("o", o), ("do", do)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
    if lse.dtype != torch.float32:
        raise TypeError(f"lse must be float32 (the forward's), got {lse.dtype}")


def attention_gluon_backward(q, k, v, o, lse, do, *, is_causal=False, scale=None,
                             enable_gqa=False, alignment=None, stages=2, consumer_regs=240,
                             loader_regs=24):
    """Gradients ``(dq, dk, dv)`` of attention from the forward's ``o`` and ``lse``
    (natural log, float32, ``(B, Hq, Nq)``) and the incoming ``do``; the same arguments
    and contract as :func:`course_utils.hopper.gluon_fwd.attention_gluon` (sm90, D in
    {64, 128}, 16-bit, any lengths, both causal alignments, GQA). ``stages``: slots of the
    Q / dO ring. dQ is summed in float32 by the TMA unit's reduce-adds, in an order that
    varies from run to run, so it is not bitwise reproducible; dK and dV are."""
    sh = validate_hopper_inputs(q, k, v, is_causal=is_causal, scale=scale,
                                enable_gqa=enable_gqa, alignment=alignment, impl="gluon",
                                hardware=False)
    _check_grads_inputs(q, o, lse, do)
    # the forward's checks of the same options: two consumers taking turns, a loader warp
    _schedule(stages, True, loader_regs, True, 2, consumer_regs)
    if shared_bytes(sh.D, stages) > SM90_SHARED_BYTES:
        raise ValueError(f"stages={stages} at head dim {sh.D} needs "
                         f"{shared_bytes(sh.D, stages) // 1024} KiB of shared memory; an "
                         f"sm90 block has {SM90_SHARED_BYTES // 1024} KiB: fewer stages")
    _need_hopper("attention_gluon_backward")
    d = sh.D
    q, k, v, o, do = (t.contiguous() for t in (q, k, v, o, do))
    nq_pad = -(-sh.Nq // BWD_BLOCK_M) * BWD_BLOCK_M
    lse2, delta = row_stats(o, do, lse)
    dq32 = torch.zeros((sh.B, sh.Hq, nq_pad, d), device=q.device, dtype=torch.float32)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    gdt = _GL_DTYPES[q.dtype]
    block = [BWD_BLOCK_M, d]
    layout = gl.NVMMASharedLayout.get_default_for(block, gdt)

    def desc(t):
        t2 = t.reshape(-1, d)
        return GluonDescriptor(t2, list(t2.shape), list(t2.stride()), block, layout)

    grid = (-(-sh.Nk // BWD_BLOCK_N), sh.B * sh.Hkv)
    dq2 = dq32.view(-1, d)
    dq_desc = GluonDescriptor(dq2, list(dq2.shape), list(dq2.stride()), [BWD_BLOCK_M, 64],
                              gl.NVMMASharedLayout.get_default_for([BWD_BLOCK_M, 64], gl.float32))
    # one-dimensional boxes of 64 floats, unswizzled
    row_layout = gl.NVMMASharedLayout(0, 32, rank=1)
    row_descs = [GluonDescriptor(t, [t.numel()], [1], [BWD_BLOCK_M], row_layout)
                 for t in (lse2, delta)]
    _attn_bwd_gluon[grid](desc(k), desc(v), desc(q), desc(do), *row_descs, dq_desc, dk, dv,
                          sh.scale * LOG2E, sh.scale, sh.Hq, sh.Hkv, sh.Nq, sh.Nk, nq_pad,
                          sh.offset, D=d, STAGES=stages, CAUSAL=bool(sh.is_causal),
                          CONSUMER_REGS=consumer_regs, LOADER_REGS=loader_regs, num_warps=4)
    dq = (dq32[:, :, :sh.Nq] * sh.scale).to(q.dtype)
    return dq, dk, dv


class GluonAttention(torch.autograd.Function):
    """The Gluon forward (the schedule measured fastest at the head dim and mask,
    ``gluon_fwd.fastest``) and this backward as one differentiable op."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale, enable_gqa, alignment):
        from course_utils.hopper.gluon_fwd import attention_gluon, fastest
        o, lse = attention_gluon(q, k, v, is_causal=is_causal, scale=scale,
                                 enable_gqa=enable_gqa, alignment=alignment, return_lse=True,
                                 **fastest(q.shape[-1], is_causal))
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.opts = dict(is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                        alignment=alignment)
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = attention_gluon_backward(q, k, v, o, lse, do, **ctx.opts)
        return dq, dk, dv, None, None, None, None


def gluon_attention(q, k, v, *, is_causal=False, scale=None, enable_gqa=False,
                    alignment=None):
    """Differentiable attention on sm90: the Gluon ping-pong forward, and
    :func:`attention_gluon_backward` for the gradients. SDPA's arguments and shapes."""
    validate_hopper_inputs(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                           alignment=alignment, impl="gluon", hardware=False)
    return GluonAttention.apply(q, k, v, is_causal, scale, enable_gqa, alignment)
