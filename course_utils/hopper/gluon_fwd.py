"""Lesson 8 (b): a warp-specialised attention forward written in Gluon for sm90.

Gluon is Triton's lower-level language: layouts, shared memory, barriers and the
asynchronous units are spelled out by the programmer instead of chosen by the
compiler. This kernel is FlashAttention-3's structure, small enough to read:

* **Producer partition** (1 warp, register budget ``LOADER_REGS``): issues every
  TMA copy. Q once, then K and V tiles into a ring of ``STAGES`` shared-memory
  slots. Before refilling K slot ``s`` it waits on ``k_empty[s]``, before refilling V
  slot ``s`` on ``v_empty[s]``; each copy completes on ``k_ready[s]`` / ``v_ready[s]``,
  armed with the number of bytes to expect.
* **Consumer partition** (the default partition: 2 warpgroups = 8 warps, 128 query
  rows): for each key block, wait ``k_ready``, ``S = Q K^T`` with ``warpgroup_mma``
  (wgmma, operands straight from shared memory), arrive on ``k_empty`` once ``S`` is
  done, online softmax in registers, wait ``v_ready``, ``O += P V`` with P from
  registers, then arrive on ``v_empty``. K and V go back separately because the
  pipelined loop below needs ``K_{j+1}`` while it still holds ``V_j``: with one
  shared "empty" barrier a single-slot ring (``stages=1``) deadlocks.
* With ``PIPELINE=True`` the consumer issues the next block's ``Q K^T`` before it
  does this block's softmax, so the tensor cores work while the exp unit does (the
  intra-warpgroup overlap of FlashAttention-3, section 3.2 of the paper).

* With ``pingpong=True`` (FlashAttention-3's full schedule) there are **two** consumer
  partitions of one warpgroup (64 query rows) each. They share the K/V ring
  (``k_empty`` and ``v_empty`` expect two arrivals) and take turns issuing their matmuls through two
  mbarriers ``turn[0]`` / ``turn[1]``, so one consumer's softmax overlaps the other's
  matmuls; each runs the pipelined loop. ``worker_num_regs`` gives each consumer
  ``consumer_regs`` registers and the producer ``loader_regs`` (``setmaxnreg``).
* Both schedules are one kernel, :func:`_attn_fwd_gluon`: ``Q_TILES`` (1, 2 or 3) sets
  how many query tiles the loader fetches and how many consumers share the ring, and the
  consumer's ``PINGPONG`` constexpr adds the turn barriers around its matmuls.
* ``consumers=3`` puts three consumers of 64 rows on one 192-row tile, FlashAttention-3's
  choice at head dim 64. The register file then leaves each consumer thread 160
  registers (two get 240). The pipelined loop holds two score tiles at once (``S_{j+1}``
  in flight while ``P_j`` waits for ``V_j``) and spills at 160; the serial loop holds one
  and fits. So with ``pingpong=True, pipeline=False`` each consumer runs the serial loop
  (matmul, softmax, matmul) without turn barriers, and the warp schedulers interleave the
  consumers: while one computes its exponentials, the others' matmuls keep the tensor
  cores busy. With three consumers at head dim 64 that is the fastest schedule measured
  on an H100; at head dim 128 two pipelined consumers taking turns are
  (:data:`FASTEST`, measurements in ``benchmarks/<device>/ablation.md``). Untied by turns,
  a serial consumer also stops where its own rows stop seeing keys: under a causal mask
  the consumers of a tile's first rows multiply one or two key blocks fewer than its last
  rows, and only hand those slots of the ring back to the loader.

The grid: one program per query tile (``grid = (query tiles, B * Hq)``), or with
``persistent=True`` one program per SM, each running the tiles :func:`persistent_schedule`
gives it (head by head, longest first, each tile to the program free first). A persistent
program's ring slots, turns and Q barrier phase run on from tile to tile; its consumers
hand the Q slots back through ``q_empty`` after their last ``S = Q K^T`` of a tile, so the
loader fetches the next tile's Q and first K/V blocks while this tile finishes, and O
leaves from registers (the next Q is in its slot).

The epilogue: a consumer writes its normalised O tile into the shared-memory slot of its
Q tile (free once its last ``S = Q K^T`` is done) and one TMA copy stores it, whole lines
at a time; the last tile of a head whose length is not a multiple of the tile stores only
its rows below ``Nq`` from registers instead (a TMA copy would write the next head's rows).

Barrier phases: a slot is used for the ``j // STAGES``-th time at key block ``j``, so
its barriers complete phase ``(j // STAGES) & 1``. The producer's first wait on an
"empty" barrier asks for the phase *before* the first (parity 1), which a fresh
barrier reports as complete, so the ring starts empty without a special case.

Causal masks (both alignments of :mod:`course_utils.contract`): a query tile loads only
the key blocks its last row can see; the consumer masks a block only where the mask cuts
it (the diagonal blocks), and the grid starts with the longest tiles. A row that sees no
key (lower-right mask with ``Nq > Nk``: the first ``Nq - Nk`` rows) gives 0 and LSE
``-inf``; a tile of such rows loads nothing.

Any ``Nq`` and ``Nk``: the descriptors cover all heads' rows at once, so a tile past the
end of a head loads the next head's rows (or zeros past the tensor's end). The last key
block is masked where the keys end, and the last query tile stores only its rows below
``Nq``. (Its probabilities there are exact zeros, so the neighbour's values add nothing,
unless they hold inf or NaN.)

FP8 (:func:`attention_gluon_fp8`, on what :func:`course_utils.hopper.fp8.prepare_fp8`
returns): the same kernel on e4m3 tiles, chosen by the descriptors' dtype (``FP8``). Q and
K tiles arrive as they are, V transposed (``[D, BLOCK_N]`` boxes of ``(B * Hkv * D, Nk)``:
the fp8 wgmma reads both operands K-major, so P V takes the slot through ``.permute``).
The consumer multiplies the scores by ``qk_scale * sq * sk_j`` (one Q scale per 128-row
tile, shared by the two ping-pong consumers, one K scale per key block), folds the V
block's scale into the rescale (``acc <- acc * alpha * sv_{j-1} / sv_j + P8_j V8_j``, the
output times the last ``sv``) and casts P to e4m3 in registers. The wgmma operand layout
of an 8-bit P wants 4 consecutive keys per register where S's accumulator holds 2: rather
than move P between threads, the keys are renumbered within each 32 (``_p_operand``) and
``prepare_fp8`` stores V^T's columns in the same order, so P enters the matmul from the
registers its softmax left it in. The output is 16-bit and has shared-memory slots of its
own (twice the bytes of an e4m3 Q tile).

Sizes: D in {64, 128}. Runs only on an sm90 GPU; importing this module works anywhere.
"""
from __future__ import annotations

import functools
import heapq
import inspect
import math

import torch

from course_utils import device  # sets TRITON_INTERPRET before triton is imported

from course_utils.constants import LN2, LOG2E  # noqa: E402
from course_utils.hopper.triton_fwd import validate_hopper_inputs  # noqa: E402

__all__ = ["attention_gluon", "attention_gluon_fp8", "GLUON_AVAILABLE", "BLOCK_M",
           "BLOCK_N", "FP8_BLOCK_N", "GLUON_BLOCK_N", "FASTEST", "FASTEST_CAUSAL", "fastest"]

BLOCK_M = 128
BLOCK_N = 128
# key blocks the 16-bit kernel takes (``block_n``), and the shared memory of one sm90
# block they must fit in with the query tile and the K/V ring (227 KiB)
GLUON_BLOCK_N = (64, 128, 256)
SM90_SHARED_BYTES = 227 * 1024
# shared memory a persistent program leaves free beside its O slots (barriers, the
# compiler's scratch for layout changes)
O_SLOTS_MARGIN = 8 * 1024
# the options of attention_gluon measured fastest on an H100 per head dim, against the
# other schedules in the same run (benchmarks/nvidia-h100-80gb-hbm3/ablation.md): at 64,
# three serial consumers the schedulers interleave; at 128, two pipelined consumers
# taking turns, whose registers the serial three cannot hold without spilling. At 64 on
# the persistent grid (+3 to +8 % at 4k keys, where a tile's fixed cost weighs most,
# even at 16k); at 128 the grid of one program per tile (the persistent one: within
# +-1 % at 4k, 1-5 % slower at 16k without a mask)
FASTEST = {64: dict(pingpong=True, consumers=3, pipeline=False, stages=3, persistent=True),
           128: dict(pingpong=True, stages=3)}
# under a causal mask at head dim 128: two stages on the persistent grid, whose O then has
# slots of its own beside the ring (o_slots_fit). Against FASTEST[128] on an H200: faster at
# every causal point in both runs of benchmarks/nvidia-h200/o_slots_probe*.json (4k and 16k
# keys, fp16 and bf16: 1.008-1.060x), slower at 16k without a mask (0.984-0.996x)
FASTEST_CAUSAL = {128: dict(pingpong=True, stages=2, persistent=True)}


def fastest(d, causal=False) -> dict:
    """The options of :func:`attention_gluon` measured fastest at head dim ``d`` with (or
    without) a causal mask: :data:`FASTEST_CAUSAL` where it has the head dim, else
    :data:`FASTEST` (an empty dict for a head dim neither has)."""
    return dict((causal and FASTEST_CAUSAL.get(d)) or FASTEST.get(d, {}))

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
    GLUON_AVAILABLE = True
except ImportError:  # an older Triton without Gluon
    GLUON_AVAILABLE = False

if GLUON_AVAILABLE:
    # the [(function, args), ...] form of warp_specialize arrived in Triton 3.6
    GLUON_AVAILABLE = "functions_and_args" in inspect.signature(gl.warp_specialize).parameters
    _LN2 = gl.constexpr(LN2)
    # names that changed between Triton releases: a CTA-wide barrier among the partition's
    # warps, and the TMA copies (async_load / async_store in newer releases, which dropped
    # the names Triton 3.6 has)
    _sync_warps = getattr(gl, "thread_barrier", None) or gl.barrier
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    _GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16,
                  torch.float8_e4m3fn: gl.float8e4nv}
    # The exponentials of P on the FMA units as well as on the MUFU unit (a probe, off:
    # benchmarks/exp2_split_probe.py times copies of this module with it on). At head
    # dim 64 a 128 x 128 block of scores costs the MUFU unit (16 exponentials a clock a
    # multiprocessor) about as many clocks as its two products cost the tensor cores, and
    # twice as many in FP8; FlashAttention-4 (on Blackwell) moves part of the exponentials
    # to the FMA units. With _EXP2_SPLIT = K > 0, one value in every K is 2^x by a
    # polynomial instead of ex2.approx.
    _EXP2_SPLIT = gl.constexpr(0)

    @gluon.jit
    def _tile_span(sched_ptr, PERSISTENT: gl.constexpr):
        # the entries lo .. hi - 1 of the schedule this program runs (persistent grid: the
        # schedule starts with each program's first entry, see persistent_schedule), or
        # the one tile its place in the grid names
        if PERSISTENT:
            pid = gl.program_id(0)
            lo = gl.load(sched_ptr + pid)
            hi = gl.load(sched_ptr + pid + 1)
        else:
            lo = 0
            hi = 1
        return lo, hi

    @gluon.jit
    def _tile_at(i, sched_ptr, causal, n_m, PERSISTENT: gl.constexpr):
        # a tile is numbered bh * n_m + m: query tile m of head bh
        if PERSISTENT:
            tile = gl.load(sched_ptr + i)
        else:
            m = gl.program_id(0)
            # causal: longest rows first, the last query tiles see the most key blocks,
            # so they start first and the short ones fill in at the end of the grid
            m = m + causal * (n_m - 1 - 2 * m)
            tile = gl.program_id(1) * n_m + m
        return tile

    @gluon.jit
    def _tile_coords(tile, Hq, Nq, Nk, Q_ROWS, KV_ROWS, GROUP, DIAG, causal, n_m,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr,
                     FP8: gl.constexpr):
        # where tile ``tile`` reads and writes, and how many key blocks it loads. causal is
        # 0 or 1 (arithmetic rather than a branch: the loader and the consumers compute
        # the same numbers whether or not it arrives as a constant)
        bh = tile // n_m
        m0 = (tile % n_m) * BLOCK_M
        b = bh // Hq
        h = bh % Hq
        bkv = b * (Hq // GROUP) + h // GROUP
        q_row = bh * Q_ROWS + m0
        o_row = bh * Nq + m0
        kv_row = bkv * KV_ROWS
        if FP8:
            # FP8 V arrives transposed, (D, Nk) per head (the fp8 wgmma reads B K-major)
            v_row = bkv * D
        else:
            v_row = kv_row
        every = (Nk + BLOCK_N - 1) // BLOCK_N      # the last one masked where the keys end
        # causal: blocks up to the one holding the last key the tile's last row sees
        seen = gl.maximum(m0 + BLOCK_M + DIAG, 0)
        n_blocks = every + causal * (gl.minimum((seen + BLOCK_N - 1) // BLOCK_N, every) - every)
        # without a mask diag is so large that the mask never cuts a block
        diag = Nk + BLOCK_N + causal * (DIAG - Nk - BLOCK_N)
        return bh, bkv, q_row, o_row, kv_row, v_row, m0, n_blocks, diag

    @gluon.jit
    def _loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready,
                k_empty, v_empty, sched_ptr, Hq, Nq, Nk, Q_ROWS, KV_ROWS, GROUP, DIAG, causal,
                n_m):
        # constexprs do not cross into a partition as arguments: read them off the shapes.
        # Q_TILES query tiles (1, or 2 or 3 for ping-pong) of ROWS rows each, then the K/V
        # ring; a persistent program has a barrier for handing its Q slots back (q_empty
        # has two entries; one is used)
        Q_TILES: gl.constexpr = q_smem.shape[0]
        ROWS: gl.constexpr = q_smem.shape[1]
        D: gl.constexpr = q_smem.shape[2]
        BLOCK_N: gl.constexpr = k_smem.shape[1]
        STAGES: gl.constexpr = k_smem.shape[0]
        V_T: gl.constexpr = v_smem.dtype == gl.float8e4nv
        PERSISTENT: gl.constexpr = q_empty.shape[0] >= 2
        lo, hi = _tile_span(sched_ptr, PERSISTENT)
        ring = 0                                 # K/V blocks loaded for earlier tiles
        for i in range(lo, hi):
            tile = _tile_at(i, sched_ptr, causal, n_m, PERSISTENT)
            bh, bkv, q_row, o_row, kv_row, v_row, m0, n_blocks, diag = _tile_coords(
                tile, Hq, Nq, Nk, Q_ROWS, KV_ROWS, GROUP, DIAG, causal, n_m, Q_TILES * ROWS,
                BLOCK_N, D, V_T)
            if PERSISTENT:
                # the consumers hand the Q slots back after their last S = Q K^T of the
                # previous tile, while its last P V and its epilogue still run
                mbarrier.wait(q_empty.index(0), ((i - lo) & 1) ^ 1)
            mbarrier.expect(q_bar, Q_TILES * q_desc.block_type.nbytes)
            for t in gl.static_range(Q_TILES):
                _tma_load(q_desc, [q_row + t * ROWS, 0], q_bar, q_smem.index(t))
            # K and V slots are handed back separately: the pipelined consumer is done with
            # K_j (S_j finished) long before it is done with V_j (P_j V_j finished), and it
            # needs K_{j+1} in between. With one slot and one shared "empty" barrier, the
            # producer would wait for V_j's release before loading K_{j+1}, which the
            # consumer waits for before it can finish P_j V_j: a deadlock. The ring runs on
            # across a persistent program's tiles: block j of a tile is its (ring + j)-th
            for j in range(n_blocks):
                s = (ring + j) % STAGES
                phase = ((ring + j) // STAGES) & 1
                mbarrier.wait(k_empty.index(s), phase ^ 1)
                mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
                _tma_load(k_desc, [kv_row + j * BLOCK_N, 0], k_ready.index(s), k_smem.index(s))
                mbarrier.wait(v_empty.index(s), phase ^ 1)
                mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
                if V_T:
                    # FP8: key block j is the j-th column block of the head's D rows
                    _tma_load(v_desc, [v_row, j * BLOCK_N], v_ready.index(s), v_smem.index(s))
                else:
                    _tma_load(v_desc, [v_row + j * BLOCK_N, 0], v_ready.index(s),
                              v_smem.index(s))
            ring += n_blocks


    def _exp2_split_asm(k):
        """PTX for ``inline_asm_elementwise`` with ``pack=k``: $0..$(k-1) = 2^$k..2^$(2k-1),
        the first k - 1 by ``ex2.approx``, the last by FMAs. x <= 0 here (a score minus its
        row's maximum, base 2), -inf where masked. With x clamped to -127 and rounded to
        the nearest integer j (adding 1.5 * 2^23 leaves j in the low bits of the sum), f =
        x - j lies in [-1/2, 1/2]; 2^f ~ 1 + f (c1 + f (c2 + f c3)), within 1.02e-4 of it
        relatively (a fit of the relative error over [-1/2, 1/2]; float16's unit roundoff is
        4.9e-4), and adding j << 23 to its bits multiplies it by 2^j. c0 = 1 exactly keeps
        x = -127 (and so -inf) at exactly 0: 1.0's bits minus 127 << 23. Results under
        2^-126 (x below about -126) are not 2^x's subnormals, but they are off by less than
        2^-126, nothing P's sum or product can show."""
        mufu = "".join(f"ex2.approx.ftz.f32 ${i}, ${k + i};\n" for i in range(k - 1))
        return ("{\n.reg .f32 x, t, j, f, p;\n.reg .b32 e, b;\n" + mufu +
                f"max.ftz.f32 x, ${2 * k - 1}, 0fC2FE0000;\n"          # -127
                "add.rn.ftz.f32 t, x, 0f4B400000;\n"                   # 1.5 * 2^23
                "sub.rn.ftz.f32 j, t, 0f4B400000;\n"
                "sub.rn.ftz.f32 f, x, j;\n"
                "fma.rn.ftz.f32 p, f, 0f3D61510B, 0f3E780627;\n"       # c3, c2
                "fma.rn.ftz.f32 p, p, f, 0f3F317AFD;\n"                # c1
                "fma.rn.ftz.f32 p, p, f, 0f3F800000;\n"                # c0 = 1
                "mov.b32 e, t;\nshl.b32 e, e, 23;\nmov.b32 b, p;\n"
                f"add.s32 ${k - 1}, b, e;\n}}")

    def _exp2_split_constraints(k):
        """``inline_asm_elementwise``'s constraints for ``pack=k``: k outputs, k inputs."""
        return ",".join(["=r"] * k + ["r"] * k)

    # built for K = 2 where the switch is off (unused then)
    _EXP2_SPLIT_ASM = gl.constexpr(_exp2_split_asm(_EXP2_SPLIT.value or 2))
    _EXP2_SPLIT_CONSTRAINTS = gl.constexpr(_exp2_split_constraints(_EXP2_SPLIT.value or 2))

    @gluon.jit
    def _exp2_split(x):
        # 2^x with one value in _EXP2_SPLIT on the FMA units (the probabilities only: the
        # rescale factors, one a row, stay on the MUFU unit)
        return gl.inline_asm_elementwise(_EXP2_SPLIT_ASM, _EXP2_SPLIT_CONSTRAINTS, [x],
                                         dtype=gl.float32, is_pure=True, pack=_EXP2_SPLIT)

    @gluon.jit
    def _softmax_step(s, m_i, l_i, qk_scale):
        # one online-softmax update in base 2: new max, probabilities, rescale factor.
        # qk_scale > 0 (the contract takes positive scales only), so max(s) * scale =
        # max(s * scale): the scale moves into the row max and into one FMA per score
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
        if _EXP2_SPLIT == 0:
            p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
        else:
            p = _exp2_split(s * qk_scale - gl.expand_dims(m_new, 1))
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, axis=1)
        return p, alpha, m_new, l_i

    @gluon.jit
    def _softmax_masked(s, m_i, l_i, qk_scale, row0, col0, diag, nk,
                        s_layout: gl.constexpr):
        # the same update on a block the causal mask or the end of the keys cuts: key
        # col0 + c is visible to query row0 + r when col0 + c <= row0 + r + diag and
        # col0 + c < nk (the rows past nk that TMA loaded belong to the next head, or
        # are zeros past the tensor's end). A row that has seen no visible key yet keeps
        # m = -inf; subtracting 0 instead keeps -inf - -inf (NaN) out of p and alpha.
        BLOCK_M: gl.constexpr = s.shape[0]
        BLOCK_N: gl.constexpr = s.shape[1]
        rows = row0 + diag + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        cols = col0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        visible = (gl.expand_dims(cols, 0) <= gl.expand_dims(rows, 1)) & \
            (gl.expand_dims(cols, 0) < nk)
        s = gl.where(visible, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        if _EXP2_SPLIT == 0:
            p = gl.exp2(s * qk_scale - gl.expand_dims(m_use, 1))
        else:
            p = _exp2_split(s * qk_scale - gl.expand_dims(m_use, 1))
        alpha = gl.exp2(m_i - m_use)
        l_i = l_i * alpha + gl.sum(p, axis=1)
        return p, alpha, m_new, l_i

    @gluon.jit
    def _softmax_block(s, m_i, l_i, qk_scale, row0, j, diag, nk, s_layout: gl.constexpr):
        # key block j: masked only where the causal mask cuts it (its last key is
        # past what the consumer's first row sees) or where the keys end; without a
        # causal mask diag is so large that the mask never cuts
        BLOCK_N: gl.constexpr = s.shape[1]
        last = j * BLOCK_N + BLOCK_N - 1
        if (last > row0 + diag) | (last >= nk):
            p, alpha, m_new, l_i = _softmax_masked(s, m_i, l_i, qk_scale, row0, j * BLOCK_N,
                                                   diag, nk, s_layout)
        else:
            p, alpha, m_new, l_i = _softmax_step(s, m_i, l_i, qk_scale)
        return p, alpha, m_new, l_i

    @gluon.jit
    def _block_scales(ks_ptr, vs_ptr, j, FP8: gl.constexpr):
        # FP8: the float32 scales of K block j and V block j (loaded a step early, so the
        # load's latency hides behind a matmul); 16-bit: none
        sk = 1.0
        sv = 1.0
        if FP8:
            sk = gl.load(ks_ptr + j)
            sv = gl.load(vs_ptr + j)
        return sk, sv

    @gluon.jit
    def _softmax_scaled(s, m_i, l_i, qk_scale, sk, sv, sv_prev, row0, j, diag, nk,
                        s_layout: gl.constexpr, FP8: gl.constexpr):
        # FP8: the scores are (Q8 K8_j^T) * sq * sk_j (qk_scale already holds sq), and the
        # accumulator is kept in units of the current V block's scale,
        # acc_j = acc_{j-1} * alpha * sv_{j-1} / sv_j + P_j V8_j, so the one rescale per
        # block also changes the unit; the epilogue multiplies by the last sv
        if FP8:
            p, alpha, m_i, l_i = _softmax_block(s, m_i, l_i, qk_scale * sk, row0, j, diag, nk,
                                                s_layout)
            alpha = alpha * (sv_prev / sv)
            sv_prev = sv
        else:
            p, alpha, m_i, l_i = _softmax_block(s, m_i, l_i, qk_scale, row0, j, diag, nk,
                                                s_layout)
        return p, alpha, m_i, l_i, sv_prev

    @gluon.jit
    def _p_operand(p, dtype: gl.constexpr, p_layout: gl.constexpr, FP8: gl.constexpr):
        # P as the register A operand of O += P V. 16-bit: the accumulator layout of S
        # already holds, per thread, the pairs of keys the operand layout wants. e4m3: the
        # operand wants 4 consecutive keys per register where the accumulator has 2, so the
        # keys are renumbered instead of moved between threads: in each group of 32 keys,
        # key 16 b1 + 8 b0 + 2 t + e of S becomes operand column 16 b1 + 4 t + 2 b0 + e
        # (t: the thread's place in its quad), and prepare_fp8 stores V^T's columns in
        # that same order (v_key_order)
        if FP8:
            BM: gl.constexpr = p.shape[0]
            BN: gl.constexpr = p.shape[1]
            p8 = p.to(dtype).reshape([BM, BN // 32, 2, 2, 4, 2]).permute((0, 1, 2, 4, 3, 5))
            pv = gl.convert_layout(p8.reshape([BM, BN]), p_layout, assert_trivial=True)
        else:
            pv = gl.convert_layout(p.to(dtype), p_layout)
        return pv

    @gluon.jit
    def _v_operand(v_smem, st, FP8: gl.constexpr):
        # the B operand of O += P V: FP8 slots hold V^T ([D, BLOCK_N], keys contiguous)
        if FP8:
            vt = v_smem.index(st).permute((1, 0))
        else:
            vt = v_smem.index(st)
        return vt

    @gluon.jit
    def _pv_wait(acc, pv, FP8: gl.constexpr):
        # wait for O += P V; P from registers stays a dependency (kept alive) while the
        # tensor cores read it. Triton 3.6 cannot list an 8-bit tensor there; the e4m3 P
        # is never written again, so only the accumulator needs the wait's ordering
        if FP8:
            acc = warpgroup_mma_wait(0, deps=(acc,))
        else:
            acc, pv = warpgroup_mma_wait(0, deps=(acc, pv))
        return acc

    @gluon.jit
    def _release(empty, st):
        # every warp of the consumer partition has finished its wgmma reads of the
        # slot before one thread tells the producer it may overwrite it
        _sync_warps()
        mbarrier.arrive(empty.index(st), count=1)

    @gluon.jit
    def _turn_wait(turn, k, C: gl.constexpr):
        # ping-pong among the consumers 0, 1, ... in a circle: consumer C > 0 takes its
        # turn k after consumer C - 1 has taken its turn k; consumer 0 takes turn k after
        # the last consumer has taken turn k - 1. ``turn[C]`` is the barrier consumer C
        # waits on; it completes one phase per turn, so turn k waits for phase k's parity
        # (no consumer gets two turns ahead of the one after it, so parity is enough).
        if C == 0:
            if k > 0:
                mbarrier.wait(turn.index(0), (k - 1) & 1)
        else:
            mbarrier.wait(turn.index(C), k & 1)

    @gluon.jit
    def _turn_pass(turn, C: gl.constexpr, NC: gl.constexpr):
        _sync_warps()
        mbarrier.arrive(turn.index((C + 1) % NC), count=1)

    @gluon.jit
    def _consume_tile(q_smem, k_smem, v_smem, o_smem, q_bar, q_empty, k_ready, v_ready, k_empty,
                      v_empty, turn, o_ptr, o_desc, lse_ptr, ks_ptr, vs_ptr, qs_ptr, qs_rows,
                      qk_scale, tile, ring, turns, q_phase, Hq, nq, nk, Q_ROWS, KV_ROWS, GROUP,
                      DIAG, causal, n_m, C: gl.constexpr, PIPELINE: gl.constexpr,
                      PINGPONG: gl.constexpr):
        """Consumer ``C``'s part of one tile: the query rows in ``q_smem.index(C)``. One
        consumer (8 warps, 128 rows) or, with ``PINGPONG``, two or three (4 warps, 64 rows
        each) that take turns on the tensor cores through the ``turn`` barriers. With e4m3
        tiles (FP8) the same loop multiplies by the blocks' scales and feeds P to the
        tensor cores in e4m3. ``ring``: K/V blocks of the ring this consumer went through
        before the tile (key block j sits in slot ``(ring + j) % STAGES``), ``turns``: turns
        taken before it, ``q_phase``: the phase of ``q_bar`` that brings the tile's Q.
        Returns the number of key blocks the tile loaded."""
        BLOCK_M: gl.constexpr = q_smem.shape[1]
        D: gl.constexpr = q_smem.shape[2]
        BLOCK_N: gl.constexpr = k_smem.shape[1]
        STAGES: gl.constexpr = k_smem.shape[0]
        FP8: gl.constexpr = k_smem.dtype == gl.float8e4nv
        # a wgmma step reduces over 32 bytes of K (16 halves, 32 e4m3), and an operand
        # from registers packs 4 bytes of K per register (2 halves, 4 e4m3)
        BITS: gl.constexpr = k_smem.dtype.primitive_bitwidth
        NUM_WARPS: gl.constexpr = BLOCK_M // 16        # wgmma: 16 rows per warp
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, BLOCK_N, 256 // BITS])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, D, 256 // BITS])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout,
                                                     k_width=32 // BITS)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        NC: gl.constexpr = q_smem.shape[0]        # consumers taking turns (ping-pong)
        PERSISTENT: gl.constexpr = q_empty.shape[0] >= 2
        O_SLOTS: gl.constexpr = q_empty.shape[0] == 3  # persistent, O slots of its own
        q_tile = q_smem.index(C)
        bh, bkv, q_row, o_row, kv_row, v_row, m0, n_blocks, diag = _tile_coords(
            tile, Hq, nq, nk, Q_ROWS, KV_ROWS, GROUP, DIAG, causal, n_m, NC * BLOCK_M, BLOCK_N,
            D, FP8)

        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
        l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
        acc = gl.zeros([BLOCK_M, D], gl.float32, o_layout)
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        sv_prev = 1.0                            # FP8: the unit acc is kept in

        row0 = m0 + C * BLOCK_M                  # this consumer's first query position
        if FP8:
            # the head's scales: Q per qs_rows rows, K and V per key block (each head's rows
            # are padded to whole scale blocks, so a block never crosses a head); its rows'
            # Q scale (a consumer wholly past the head's rows stores nothing: the last
            # scale stands in)
            qs_count = Q_ROWS // qs_rows
            ks_ptr = ks_ptr + bkv * (KV_ROWS // BLOCK_N)
            vs_ptr = vs_ptr + bkv * (KV_ROWS // BLOCK_N)
            qk_scale = qk_scale * gl.load(qs_ptr + bh * qs_count +
                                          gl.minimum(row0 // qs_rows, qs_count - 1))
        mbarrier.wait(q_bar, q_phase)
        if n_blocks == 0:
            # a causal tile whose rows see no key (lower-right mask, Nq > Nk): nothing
            # to load or multiply; the output is 0 and the LSE -inf, as lesson 6's
            if PERSISTENT:
                _release(q_empty, 0)
        elif PIPELINE:
            # prologue: S_0 and its softmax
            sk, sv = _block_scales(ks_ptr, vs_ptr, 0, FP8)
            mbarrier.wait(k_ready.index(ring % STAGES), (ring // STAGES) & 1)
            if PINGPONG:
                _turn_wait(turn, turns, C)
            s = warpgroup_mma(q_tile, k_smem.index(ring % STAGES).permute((1, 0)), s_zero,
                              use_acc=False, is_async=True)
            if PINGPONG:
                _turn_pass(turn, C, NC)
            s = warpgroup_mma_wait(0, deps=(s,))
            _release(k_empty, ring % STAGES)     # K_0 is read: the producer may refill it
            p, alpha, m_i, l_i, sv_prev = _softmax_scaled(s, m_i, l_i, qk_scale, sk, sv, sv_prev,
                                                          row0, 0, diag, nk, s_layout, FP8)
            for j in range(n_blocks - 1):
                st = (ring + j) % STAGES
                nst = (ring + j + 1) % STAGES
                sk, sv = _block_scales(ks_ptr, vs_ptr, j + 1, FP8)
                mbarrier.wait(k_ready.index(nst), ((ring + j + 1) // STAGES) & 1)
                if PINGPONG:
                    # prepare P_j first, then issue both matmuls in this consumer's turn
                    acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
                    pv = _p_operand(p, v_smem.dtype, p_layout, FP8)
                    mbarrier.wait(v_ready.index(st), ((ring + j) // STAGES) & 1)
                    _turn_wait(turn, turns + j + 1, C)
                    s_next = warpgroup_mma(q_tile, k_smem.index(nst).permute((1, 0)), s_zero,
                                           use_acc=False, is_async=True)
                    acc = warpgroup_mma(pv, _v_operand(v_smem, st, FP8), acc, is_async=True)
                    _turn_pass(turn, C, NC)
                else:
                    # 1. issue S_{j+1} = Q K_{j+1}^T; 2. issue O += P_j V_j behind it
                    s_next = warpgroup_mma(q_tile, k_smem.index(nst).permute((1, 0)), s_zero,
                                           use_acc=False, is_async=True)
                    acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
                    pv = _p_operand(p, v_smem.dtype, p_layout, FP8)
                    mbarrier.wait(v_ready.index(st), ((ring + j) // STAGES) & 1)
                    acc = warpgroup_mma(pv, _v_operand(v_smem, st, FP8), acc, is_async=True)
                # 3. S_{j+1} is done (P_j V_j may still run): its softmax overlaps P_j V_j
                s = warpgroup_mma_wait(1, deps=(s_next,))
                _release(k_empty, nst)           # K_{j+1} is read; V_j may still be in use
                p, alpha, m_i, l_i, sv_prev = _softmax_scaled(s, m_i, l_i, qk_scale, sk, sv,
                                                              sv_prev, row0, j + 1, diag, nk,
                                                              s_layout, FP8)
                acc = _pv_wait(acc, pv, FP8)
                _release(v_empty, st)
            if PERSISTENT:
                # the tile's last S = Q K^T is done: the loader may bring the next tile's
                # Q while this one's last P V and epilogue run
                _release(q_empty, 0)
            last = ring + n_blocks - 1
            st = last % STAGES
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
            pv = _p_operand(p, v_smem.dtype, p_layout, FP8)
            mbarrier.wait(v_ready.index(st), (last // STAGES) & 1)
            if PINGPONG:
                _turn_wait(turn, turns + n_blocks, C)
            acc = warpgroup_mma(pv, _v_operand(v_smem, st, FP8), acc, is_async=True)
            if PINGPONG:
                _turn_pass(turn, C, NC)
            acc = warpgroup_mma_wait(0, deps=(acc,))
            _release(v_empty, st)
        else:
            # the serial FA2 order inside one warpgroup: matmul, softmax, matmul. Under a
            # causal mask a consumer of the tile's first rows sees fewer key blocks than its
            # last rows (n_blocks): it multiplies only its own (no turns tie it to the
            # others) and hands the rest of the ring back as their blocks arrive
            seen = gl.maximum(row0 + BLOCK_M + diag, 0)
            mine = gl.minimum((seen + BLOCK_N - 1) // BLOCK_N, n_blocks)
            for j in range(mine):
                st = (ring + j) % STAGES
                phase = ((ring + j) // STAGES) & 1
                sk, sv = _block_scales(ks_ptr, vs_ptr, j, FP8)
                mbarrier.wait(k_ready.index(st), phase)
                s = warpgroup_mma(q_tile, k_smem.index(st).permute((1, 0)), s_zero,
                                  use_acc=False, is_async=True)
                s = warpgroup_mma_wait(0, deps=(s,))
                _release(k_empty, st)
                p, alpha, m_i, l_i, sv_prev = _softmax_scaled(s, m_i, l_i, qk_scale, sk, sv,
                                                              sv_prev, row0, j, diag, nk,
                                                              s_layout, FP8)
                acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
                pv = _p_operand(p, v_smem.dtype, p_layout, FP8)
                mbarrier.wait(v_ready.index(st), phase)
                acc = warpgroup_mma(pv, _v_operand(v_smem, st, FP8), acc, is_async=True)
                acc = warpgroup_mma_wait(0, deps=(acc,))
                _release(v_empty, st)
            if PERSISTENT:
                _release(q_empty, 0)             # its last S = Q K^T is done
            for j in range(mine, n_blocks):
                # blocks past this consumer's rows: loaded for the others, released unread
                st = (ring + j) % STAGES
                phase = ((ring + j) // STAGES) & 1
                mbarrier.wait(k_ready.index(st), phase)
                _release(k_empty, st)
                mbarrier.wait(v_ready.index(st), phase)
                _release(v_empty, st)

        # a row that saw no key (only under a lower-right mask with Nq > Nk): 0 and -inf
        empty = l_i == 0.0
        l_use = gl.where(empty, 1.0, l_i)
        if FP8:
            l_use = l_use / sv_prev              # acc is in units of the last V block's scale
        out = acc / gl.expand_dims(gl.convert_layout(l_use, row_o), 1)
        base = o_row + C * BLOCK_M
        if PERSISTENT:
            if O_SLOTS:
                if row0 + BLOCK_M <= nq:
                    # the Q slot went back to the loader; O has a slot of its own and
                    # leaves in one TMA copy, which the consumer does not wait for: the
                    # wait comes before the slot's next use, a tile later
                    o_tile = o_smem.index(C)
                    tma.store_wait(0)            # the previous tile's copy has read it
                    _sync_warps()                # (one thread issued that copy)
                    o_tile.store(out.to(o_tile.dtype))
                    fence_async_shared()
                    _sync_warps()
                    _tma_store(o_desc, [base, 0], o_tile)
                else:
                    _store_rows(o_ptr, out, base, row0, nq, o_layout)
            else:
                # no room for O slots beside the Q slot (which went back to the loader):
                # O leaves from registers (the stores do not hold the consumer up)
                _store_rows(o_ptr, out, base, row0, nq, o_layout)
        elif row0 + BLOCK_M <= nq:
            # the whole tile lies in this head: O goes into shared memory (16-bit: the slot
            # of this consumer's Q tile, free once its last S = Q K^T is done) and leaves in
            # one TMA copy, which writes whole 128-byte lines instead of each thread's pairs
            o_tile = o_smem.index(C)
            o_tile.store(out.to(o_tile.dtype))
            fence_async_shared()                 # the writes, before the copy reads them
            _sync_warps()
            _tma_store(o_desc, [base, 0], o_tile)
            tma.store_wait(0)
        else:
            # the last tile of a head whose length is not a multiple of the tile: its rows
            # past nq were the next head's queries, so it stores only the rows below nq
            _store_rows(o_ptr, out, base, row0, nq, o_layout)
        gl.store(lse_ptr + base + gl.arange(0, BLOCK_M, layout=row_s),
                 gl.where(empty, float("-inf"), (m_i + gl.log2(l_i)) * _LN2),
                 mask=row0 + gl.arange(0, BLOCK_M, layout=row_s) < nq)
        return n_blocks

    @gluon.jit
    def _store_rows(o_ptr, out, base, row0, nq, o_layout: gl.constexpr):
        # O from registers, only the rows below nq (a tile's rows past nq would be the next
        # head's queries). 64-bit row offsets: B * H * N * D passes 2**31 long before the
        # row count does
        BLOCK_M: gl.constexpr = out.shape[0]
        D: gl.constexpr = out.shape[1]
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        rows = base.to(gl.int64) + gl.arange(0, BLOCK_M, layout=row_o)
        cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        in_o = gl.expand_dims(row0 + gl.arange(0, BLOCK_M, layout=row_o) < nq, 1) & \
            gl.expand_dims(cols < D, 0)
        gl.store(o_ptr + gl.expand_dims(rows, 1) * D + gl.expand_dims(cols, 0),
                 out.to(o_ptr.dtype.element_ty), mask=in_o)

    @gluon.jit
    def _consumer(q_smem, k_smem, v_smem, o_smem, q_bar, q_empty, k_ready, v_ready, k_empty,
                  v_empty, turn, o_ptr, o_desc, lse_ptr, ks_ptr, vs_ptr, qs_ptr, qs_rows, sched_ptr,
                  qk_scale, Hq, nq, nk, Q_ROWS, KV_ROWS, GROUP, DIAG, causal, n_m,
                  C: gl.constexpr, PIPELINE: gl.constexpr, PINGPONG: gl.constexpr):
        """Consumer ``C``: the one tile its place in the grid names, or, in a persistent
        program, each tile of its part of the schedule in turn, the K/V ring, the turns and
        the Q barrier's phase running on from one tile to the next."""
        PERSISTENT: gl.constexpr = q_empty.shape[0] >= 2
        if PERSISTENT:
            lo, hi = _tile_span(sched_ptr, True)
            ring = 0
            turns = 0
            for i in range(lo, hi):
                tile = _tile_at(i, sched_ptr, causal, n_m, True)
                n_blocks = _consume_tile(q_smem, k_smem, v_smem, o_smem, q_bar, q_empty, k_ready,
                                         v_ready, k_empty, v_empty, turn, o_ptr, o_desc, lse_ptr,
                                         ks_ptr, vs_ptr, qs_ptr, qs_rows, qk_scale, tile, ring,
                                         turns, (i - lo) & 1, Hq, nq, nk, Q_ROWS, KV_ROWS, GROUP,
                                         DIAG, causal, n_m, C, PIPELINE, PINGPONG)
                ring += n_blocks
                # a pipelined tile takes n_blocks + 1 turns (none if it loads no block)
                turns += gl.minimum(n_blocks, 1) * (n_blocks + 1)
            if q_empty.shape[0] == 3:
                tma.store_wait(0)                # the last tile's O has left its slot
        else:
            tile = _tile_at(0, sched_ptr, causal, n_m, False)
            _consume_tile(q_smem, k_smem, v_smem, o_smem, q_bar, q_empty, k_ready, v_ready,
                          k_empty, v_empty, turn, o_ptr, o_desc, lse_ptr, ks_ptr, vs_ptr, qs_ptr,
                          qs_rows, qk_scale, tile, 0, 0, 0, Hq, nq, nk, Q_ROWS, KV_ROWS, GROUP,
                          DIAG, causal, n_m, C, PIPELINE, PINGPONG)

    # the partitions' entry points: a constexpr cannot be passed to a partition, so each
    # consumer has its own (consumer C, PIPELINE, PINGPONG), taking the shared arguments
    # as one tuple. _ser*: interleaved consumers, the serial loop without turn barriers
    @gluon.jit
    def _consumer_serial(args):
        _consumer(*args, 0, False, False)

    @gluon.jit
    def _consumer_pipelined(args):
        _consumer(*args, 0, True, False)

    @gluon.jit
    def _consumer_pp0(args):
        _consumer(*args, 0, True, True)

    @gluon.jit
    def _consumer_pp1(args):
        _consumer(*args, 1, True, True)

    @gluon.jit
    def _consumer_pp2(args):
        _consumer(*args, 2, True, True)

    @gluon.jit
    def _consumer_ser0(args):
        _consumer(*args, 0, False, True)

    @gluon.jit
    def _consumer_ser1(args):
        _consumer(*args, 1, False, True)

    @gluon.jit
    def _consumer_ser2(args):
        _consumer(*args, 2, False, True)

    @gluon.jit
    def _attn_fwd_gluon(q_desc, k_desc, v_desc, o_ptr, o_desc, lse_ptr, qs_ptr, ks_ptr, vs_ptr,
                        sched_ptr, qk_scale, Hq, Nq, Nk, Q_ROWS, KV_ROWS, GROUP, DIAG,
                        D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                        STAGES: gl.constexpr, PIPELINE: gl.constexpr,
                        Q_TILES: gl.constexpr, LOADER_REGS: gl.constexpr,
                        CONSUMER_REGS: gl.constexpr, CAUSAL: gl.constexpr, FP8: gl.constexpr,
                        QS_ROWS: gl.constexpr, PERSISTENT: gl.constexpr,
                        O_SLOTS: gl.constexpr):
        # Q_TILES = 1: one consumer partition (the default one, 8 warps, BLOCK_M rows).
        # Q_TILES = 2 or 3: consumers of BLOCK_M // Q_TILES = 64 rows (4 warps each), with
        # PIPELINE taking turns (ping-pong), without it interleaved by the schedulers.
        # CAUSAL (0 or 1): key j is visible to query i when j <= i + DIAG (DIAG = 0:
        # upper-left, SDPA's is_causal; DIAG = Nk - Nq: lower-right).
        # FP8: Q, K are e4m3 with one float32 scale per tile (qs: per QS_ROWS query rows, the
        # tile's 128 or each consumer's 64; ks and vs: per BLOCK_N keys), V is e4m3
        # transposed, (B, Hkv, D, KV_ROWS); each head's rows are padded to whole scale
        # blocks (Q_ROWS, KV_ROWS), so a scale block never crosses a head.
        # 16-bit: Q_ROWS = Nq and KV_ROWS = Nk, the scale pointers are not read.
        # PERSISTENT: one program per SM runs the tiles persistent_schedule gave it
        # (sched_ptr); otherwise one program per tile, the grid (query tiles, B * Hq).
        # O_SLOTS (persistent only, where shared memory has room): O leaves through slots
        # of its own by TMA instead of from registers.
        n_m = (Nq + BLOCK_M - 1) // BLOCK_M      # query tiles per head
        ROWS: gl.constexpr = BLOCK_M // Q_TILES

        q_smem = gl.allocate_shared_memory(q_desc.dtype, [Q_TILES, ROWS, D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, D], k_desc.layout)
        if FP8:
            v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, D, BLOCK_N], v_desc.layout)
        else:
            v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, D], v_desc.layout)
        if (FP8 and not PERSISTENT) or O_SLOTS:
            # slots of its own: FP8's output is 16-bit, twice the bytes of an e4m3 Q tile;
            # a persistent program's Q slots go back to the loader before its epilogue
            o_smem = gl.allocate_shared_memory(o_desc.dtype, [Q_TILES, ROWS, D], o_desc.layout)
        else:
            # the epilogue stores O through the Q slots (a persistent program without
            # O_SLOTS stores it from registers and never reads this)
            o_smem = q_smem
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        # a persistent program's consumers hand the Q slots back to the loader through
        # q_empty; its number of entries (one used) is how the partitions tell that they
        # run persistent (2) and with O slots (3), since a constexpr cannot be passed to them
        q_empty = gl.allocate_shared_memory(gl.int64, [1 + PERSISTENT + O_SLOTS, 1],
                                            mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [3, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(1 + PERSISTENT + O_SLOTS):
            mbarrier.init(q_empty.index(i), count=Q_TILES)   # every consumer releases
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=Q_TILES)
            mbarrier.init(v_empty.index(i), count=Q_TILES)
        for i in gl.static_range(3):
            mbarrier.init(turn.index(i), count=1)

        cargs = (q_smem, k_smem, v_smem, o_smem, q_bar, q_empty, k_ready, v_ready, k_empty,
                 v_empty, turn, o_ptr, o_desc, lse_ptr, ks_ptr, vs_ptr, qs_ptr, QS_ROWS, sched_ptr,
                 qk_scale, Hq, Nq, Nk, Q_ROWS, KV_ROWS, GROUP, DIAG, CAUSAL, n_m)
        largs = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready,
                 v_ready, k_empty, v_empty, sched_ptr, Hq, Nq, Nk, Q_ROWS, KV_ROWS, GROUP, DIAG,
                 CAUSAL, n_m)
        if Q_TILES == 3:
            # three consumers (FlashAttention-3's choice at head dim 64, where the
            # exponentials weigh more against the smaller matmuls): pipelined ones in a
            # turn circle, or serial ones the schedulers interleave
            if PIPELINE:
                gl.warp_specialize([(_consumer_pp0, (cargs,)), (_consumer_pp1, (cargs,)),
                                    (_consumer_pp2, (cargs,)), (_loader, largs)], [4, 4, 1],
                                   [CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS])
            else:
                gl.warp_specialize([(_consumer_ser0, (cargs,)), (_consumer_ser1, (cargs,)),
                                    (_consumer_ser2, (cargs,)), (_loader, largs)], [4, 4, 1],
                                   [CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS])
        elif Q_TILES == 2:
            # the default partition (4 warps) is consumer 0; consumer 1 (4 warps) and the
            # loader (1 warp) are workers with setmaxnreg budgets
            if PIPELINE:
                gl.warp_specialize([(_consumer_pp0, (cargs,)), (_consumer_pp1, (cargs,)),
                                    (_loader, largs)], [4, 1], [CONSUMER_REGS, LOADER_REGS])
            else:
                gl.warp_specialize([(_consumer_ser0, (cargs,)), (_consumer_ser1, (cargs,)),
                                    (_loader, largs)], [4, 1], [CONSUMER_REGS, LOADER_REGS])
        elif PIPELINE:
            # the default partition (8 warps) consumes; one extra warp loads
            gl.warp_specialize([(_consumer_pipelined, (cargs,)), (_loader, largs)],
                               [1], [LOADER_REGS])
        else:
            gl.warp_specialize([(_consumer_serial, (cargs,)), (_loader, largs)],
                               [1], [LOADER_REGS])

        mbarrier.invalidate(q_bar)
        for i in gl.static_range(1 + PERSISTENT + O_SLOTS):
            mbarrier.invalidate(q_empty.index(i))
        for i in gl.static_range(3):
            mbarrier.invalidate(turn.index(i))
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(k_ready.index(i))
            mbarrier.invalidate(v_ready.index(i))
            mbarrier.invalidate(k_empty.index(i))
            mbarrier.invalidate(v_empty.index(i))


def _schedule(stages, pipeline, loader_regs, pingpong, consumers, consumer_regs,
              persistent=False):
    """Check the schedule options of :func:`attention_gluon`; returns the number of Q tiles
    (consumers), ``BLOCK_M`` and the consumers' register budget."""
    if isinstance(stages, bool) or not isinstance(stages, int) or not 1 <= stages <= 4:
        raise ValueError(f"stages must be an int in 1..4, got {stages!r}")
    for name, flag in (("pipeline", pipeline), ("pingpong", pingpong)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    if isinstance(consumers, bool) or not isinstance(consumers, int) or consumers not in (2, 3):
        raise ValueError(f"consumers must be 2 or 3, got {consumers!r}")
    if not (isinstance(persistent, bool) or (type(persistent) is int and persistent >= 1)):
        raise TypeError(f"persistent must be True, False or a number of programs >= 1, "
                        f"got {persistent!r}")
    if consumers == 3 and not pingpong:
        raise ValueError("consumers=3 is a ping-pong schedule: pass pingpong=True")
    if consumer_regs is None:
        consumer_regs = 160 if consumers == 3 else 240
    if consumer_regs not in range(80, 256, 8):
        raise ValueError(f"consumer_regs must be a multiple of 8 in 80..248, got {consumer_regs!r}")
    if loader_regs not in (24, 32, 40, 48, 56):
        raise ValueError(f"loader_regs must be one of 24, 32, 40, 48, 56 (a multiple of 8 "
                         f"that setmaxnreg accepts), got {loader_regs!r}")
    tiles = consumers if pingpong else 1
    return tiles, (64 * tiles if pingpong else BLOCK_M), consumer_regs


def _need_hopper(what):
    if not (GLUON_AVAILABLE and device.IS_HOPPER):
        raise RuntimeError(f"{what} needs Triton >= 3.6 with Gluon and an sm90 GPU "
                           f"(this machine: {device.describe()['device']})")


def tile_blocks(nq, nk, block_m, block_n, causal, diag):
    """Key blocks each query tile of a head loads, as :func:`_attn_fwd_gluon` counts them:
    all of them without a mask; under a causal mask those up to the block holding the
    last key the tile's last row sees (``diag``: the mask's offset, key j visible to
    query i when ``j <= i + diag``)."""
    every = -(-nk // block_n)
    if not causal:
        return [every] * -(-nq // block_m)
    return [min(-(-max(m0 + block_m + diag, 0) // block_n), every)
            for m0 in range(0, nq, block_m)]


# a tile's fixed cost (its Q load, the ring's first block, the epilogue) in key blocks,
# what the schedule adds to each tile's blocks when it balances the programs
TILE_COST = 1


def persistent_schedule(heads, blocks, programs):
    """The persistent grid's schedule: which tiles each of ``programs`` programs runs, in
    order. ``heads``: B * Hq; ``blocks``: :func:`tile_blocks` of one head (a tuple).

    Tiles are taken head by head (a head's tiles share its K and V, which then stay in
    L2 while its tiles run), the longest first within a head (the causal diagonal: the
    last query tiles see the most keys), and each goes to the program that finishes
    first, counting ``blocks + TILE_COST`` per tile: the greedy list schedule a GPU's own
    block scheduler makes for a grid of one program per tile, made once on the host.
    Returns ``(programs + 1 offsets, then the tile numbers)`` as one tuple: program p
    runs the entries ``offsets[p]`` up to ``offsets[p + 1]`` (indices into the same
    tuple); tile ``bh * len(blocks) + m`` is query tile m of head bh."""
    n_m = len(blocks)
    if heads < 1 or n_m < 1 or programs < 1:
        raise ValueError(f"need heads, tiles and programs >= 1, got {heads}, {n_m}, {programs}")
    order = sorted(range(n_m), key=lambda m: -blocks[m])     # stable: ties keep m's order
    free = [(0, p) for p in range(programs)]                 # (busy until, program)
    runs = [[] for _ in range(programs)]
    for bh in range(heads):
        for m in order:
            busy, p = heapq.heappop(free)
            runs[p].append(bh * n_m + m)
            heapq.heappush(free, (busy + blocks[m] + TILE_COST, p))
    offsets, at = [], programs + 1
    for run in runs:
        offsets.append(at)
        at += len(run)
    offsets.append(at)
    return tuple(offsets) + tuple(t for run in runs for t in run)


@functools.lru_cache(maxsize=64)
def _schedule_on(heads, blocks, programs, dev):
    """:func:`persistent_schedule` as an int32 tensor on device ``dev``, made once per
    shape."""
    sched = persistent_schedule(heads, blocks, programs)
    if sched[-1] >= 2 ** 31 or len(sched) >= 2 ** 31:
        raise ValueError("too many tiles for an int32 schedule")
    return torch.tensor(sched, dtype=torch.int32, device=dev)


def _schedule_tensor(heads, blocks, dev, programs):
    """The schedule for ``programs`` programs (``True``: one per SM of ``dev``; never more
    than there are tiles) on ``dev``, and the number of programs."""
    if programs is True:
        programs = torch.cuda.get_device_properties(dev).multi_processor_count
    programs = min(programs, heads * len(blocks))
    return _schedule_on(heads, blocks, programs, str(dev)), programs


def o_slots_fit(persistent, fp8, block_m, block_n, stages, d, in_bytes, out_bytes) -> bool:
    """Whether a persistent 16-bit program gets O slots of its own (its epilogue by TMA):
    where shared memory has room for them beside the query tile and the K/V ring, with
    :data:`O_SLOTS_MARGIN` left for the compiler's scratch. Not FP8: at head dim 128 the
    slots' epilogue made ptxas spill there and the FP8 forward ran 2-4 % slower
    (benchmarks/nvidia-h200/o_slots_probe.json)."""
    ring = (block_m + 2 * stages * block_n) * d * in_bytes
    return bool(persistent) and not fp8 and \
        ring + block_m * d * out_bytes + O_SLOTS_MARGIN <= SM90_SHARED_BYTES


def _launch(q2, k2, v2, o, lse, qk_scale, *, B, Hq, Nq, Nk, q_rows, kv_rows, group, diag,
            causal, block_n, stages, pipeline, tiles, block_m, loader_regs, consumer_regs,
            persistent=False, scales=None, qs_rows=None):
    """Build the TMA descriptors and launch :func:`_attn_fwd_gluon` on 2-D views of the
    inputs (rows of all heads one after the other). ``scales``: ``(qs, ks, vs)`` for
    e4m3 inputs, whose ``v2`` is V transposed, ``(B * Hkv * D, kv_rows)``, and ``qs_rows``
    the query rows of one Q scale (a multiple of a consumer's rows). ``persistent``: one
    program per SM (or that many programs, an int), each running its tiles of
    :func:`persistent_schedule`."""
    d = q2.shape[-1]
    fp8 = scales is not None
    gdt = _GL_DTYPES[q2.dtype]
    q_block = [block_m // tiles, d]
    v_block = [d, block_n] if fp8 else [block_n, d]
    layout = gl.NVMMASharedLayout.get_default_for
    q_desc = GluonDescriptor(q2, list(q2.shape), list(q2.stride()), q_block,
                             layout(q_block, gdt))
    k_desc = GluonDescriptor(k2, list(k2.shape), list(k2.stride()), [block_n, d],
                             layout([block_n, d], gdt))
    v_desc = GluonDescriptor(v2, list(v2.shape), list(v2.stride()), v_block,
                             layout(v_block, gdt))
    # the output through TMA too, in blocks of a consumer's rows
    o2 = o.view(-1, d)
    o_desc = GluonDescriptor(o2, list(o2.shape), list(o2.stride()), q_block,
                             layout(q_block, _GL_DTYPES[o.dtype]))
    qs, ks, vs = scales if fp8 else (lse, lse, lse)       # not read without FP8
    o_slots = o_slots_fit(persistent, fp8, block_m, block_n, stages, d, q2.element_size(),
                          o.element_size())
    if persistent:
        blocks = tuple(tile_blocks(Nq, Nk, block_m, block_n, causal, diag))
        sched, programs = _schedule_tensor(B * Hq, blocks, q2.device, persistent)
        grid = (programs,)
    else:
        sched = lse                              # not read
        grid = (-(-Nq // block_m), B * Hq)
    _attn_fwd_gluon[grid](q_desc, k_desc, v_desc, o, o_desc, lse, qs, ks, vs, sched, qk_scale,
                          Hq, Nq, Nk, q_rows, kv_rows, group, diag, D=d, BLOCK_M=block_m,
                          BLOCK_N=block_n, STAGES=stages, PIPELINE=pipeline, Q_TILES=tiles,
                          LOADER_REGS=loader_regs, CONSUMER_REGS=consumer_regs,
                          CAUSAL=int(bool(causal)), FP8=fp8, QS_ROWS=qs_rows or block_m,
                          PERSISTENT=bool(persistent), O_SLOTS=o_slots,
                          num_warps=4 if tiles > 1 else 8)


def attention_gluon(q, k, v, *, is_causal=False, scale=None, enable_gqa=False, alignment=None,
                    return_lse=False, stages=2, pipeline=True, loader_regs=24, pingpong=False,
                    consumers=2, consumer_regs=None, block_n=BLOCK_N, persistent=False):
    """Warp-specialised Gluon forward (sm90 only); SDPA's arguments and shapes.

    ``stages``: K/V slots in the producer's ring; ``pipeline``: overlap the next
    ``Q K^T`` with this block's softmax; ``loader_regs``: the producer warp's register
    budget (``setmaxnreg``), leaving the rest of the register file to the consumers.
    ``pingpong=True``: ``consumers`` (2 or 3) warpgroups of 64 query rows each; with
    ``pipeline=True`` they take turns on the tensor cores (ping-pong), with
    ``pipeline=False`` each runs the serial loop and the warp schedulers interleave them.
    Each gets ``consumer_regs`` registers per thread (default 240 for two, 160 for three,
    which is what the register file leaves them). :data:`FASTEST` holds the options
    measured fastest per head dim, :func:`fastest` with or without a causal mask. ``block_n``:
    keys per block, one of :data:`GLUON_BLOCK_N`, as long as the query tile and
    ``stages`` K/V blocks fit in shared memory (256 only at head dim 64).
    ``persistent=True``: one program per SM runs its share of the tiles
    (:func:`persistent_schedule`: head by head, the longest first, each to the program
    free first); the loader brings a tile's Q while the consumers finish the tile before,
    and O leaves through slots of its own by TMA where shared memory has room for them
    beside the ring (not at head dim 128 with 3 stages), from registers elsewhere. An int instead of ``True`` sets the number of programs
    (fewer programs, more tiles each: how the tiles queue up can be watched)."""
    # any lengths, head dims 64 and 128, both causal alignments, sm90: its record
    sh = validate_hopper_inputs(q, k, v, is_causal=is_causal, scale=scale,
                                enable_gqa=enable_gqa, alignment=alignment, impl="gluon",
                                hardware=False)
    tiles, block_m, consumer_regs = _schedule(stages, pipeline, loader_regs, pingpong,
                                              consumers, consumer_regs, persistent)
    if type(block_n) is not int or block_n not in GLUON_BLOCK_N:      # no bool, no float
        raise ValueError(f"block_n must be one of {GLUON_BLOCK_N}, got {block_n!r}")
    shared = (block_m + 2 * stages * block_n) * sh.D * q.element_size()
    if shared > SM90_SHARED_BYTES:
        raise ValueError(f"block_n={block_n} with {stages} stages at head dim {sh.D} needs "
                         f"{shared // 1024} KiB of shared memory (the query tile and "
                         f"{stages} K and V blocks); an sm90 block has "
                         f"{SM90_SHARED_BYTES // 1024} KiB: fewer stages or a smaller block_n")
    _need_hopper("attention_gluon")
    o = torch.empty((sh.B, sh.Hq, sh.Nq, sh.D), device=q.device, dtype=q.dtype)
    lse = torch.empty((sh.B, sh.Hq, sh.Nq), device=q.device, dtype=torch.float32)
    _launch(q.contiguous().reshape(-1, sh.D), k.contiguous().reshape(-1, sh.D),
            v.contiguous().reshape(-1, sh.D), o, lse, sh.scale * LOG2E, B=sh.B, Hq=sh.Hq,
            Nq=sh.Nq, Nk=sh.Nk, q_rows=sh.Nq, kv_rows=sh.Nk, group=sh.group, diag=sh.offset,
            causal=sh.is_causal, block_n=block_n, stages=stages, pipeline=pipeline,
            tiles=tiles, block_m=block_m, loader_regs=loader_regs, consumer_regs=consumer_regs,
            persistent=persistent)
    return (o, lse) if return_lse else o


# block_n of prepare_fp8 the FP8 path takes: the K and V scales' blocks are the kernel's
FP8_BLOCK_N = (64, 128, 256)
# and its block_m: Q scales per 128 query rows, or per 64 (one per ping-pong consumer)
FP8_BLOCK_M = (64, 128)


def attention_gluon_fp8(prep, *, is_causal=False, scale=None, return_lse=False,
                        out_dtype=torch.float16, stages=2, pipeline=True, pingpong=True,
                        loader_regs=24, consumers=2, consumer_regs=None, persistent=False):
    """The same kernel on e4m3 tiles from :func:`course_utils.hopper.fp8.prepare_fp8`
    (per-block scales, V transposed); ``is_causal``: SDPA's upper-left mask. Its key
    block is the K and V scales' (``block_n``, one of :data:`FP8_BLOCK_N`); each
    consumer's query rows lie in one Q scale's block (``block_m`` 128, or 64 with
    ``pingpong``). ``pingpong``: ``consumers`` (2, the default, FlashAttention-3's
    schedule, or 3) of 64 rows, taking turns with ``pipeline`` or interleaved by the
    schedulers without it, and ``persistent``, as :func:`attention_gluon`'s."""
    from course_utils.hopper.fp8 import check_prepared
    b, hq, hkv, nq, nk, d, q_rows, kv_rows = check_prepared(prep)
    if prep["kernel"] != "gluon":
        raise ValueError(f"prep was quantised for the {prep['kernel']!r} kernel (V^T's key "
                         "order differs): prepare_fp8(..., kernel='gluon')")
    if d not in (64, 128):
        raise ValueError(f"head dim D must be one of (64, 128) for attention_gluon_fp8, got D={d}")
    tiles, block_m, consumer_regs = _schedule(stages, pipeline, loader_regs, pingpong,
                                              consumers, consumer_regs, persistent)
    rows = block_m // tiles                      # a consumer's query rows
    if prep["block_m"] not in FP8_BLOCK_M or prep["block_m"] % rows:
        raise ValueError(f"attention_gluon_fp8 takes Q scales per 128 rows, or per 64 with "
                         f"pingpong (a consumer's rows in one scale block): got "
                         f"block_m={prep['block_m']} for consumers of {rows} rows")
    if prep["block_n"] not in FP8_BLOCK_N:
        raise ValueError(f"attention_gluon_fp8 takes K and V scales per {FP8_BLOCK_N} keys "
                         f"(its key block): got block_n={prep['block_n']}")
    if out_dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"out_dtype must be torch.float16 or torch.bfloat16, got {out_dtype}")
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be True or False, got {is_causal!r}")
    if scale is None:
        scale = 1.0 / d ** 0.5
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or \
            not (math.isfinite(scale) and scale > 0):
        # as the contract: the kernel takes the row max before scaling
        raise ValueError(f"scale must be a positive finite float or None, got {scale!r}")
    _need_hopper("attention_gluon_fp8")
    o = torch.empty((b, hq, nq, d), device=prep["q8"].device, dtype=out_dtype)
    lse = torch.empty((b, hq, nq), device=prep["q8"].device, dtype=torch.float32)
    _launch(prep["q8"].reshape(-1, d), prep["k8"].reshape(-1, d),
            prep["vt8"].reshape(-1, kv_rows), o, lse, scale * LOG2E, B=b, Hq=hq, Nq=nq, Nk=nk,
            q_rows=q_rows, kv_rows=kv_rows, group=hq // hkv, diag=0, causal=is_causal,
            block_n=prep["block_n"], stages=stages, pipeline=pipeline, tiles=tiles,
            block_m=block_m, loader_regs=loader_regs, consumer_regs=consumer_regs,
            persistent=persistent, scales=(prep["qs"], prep["ks"], prep["vs"]), qs_rows=prep["block_m"])
    return (o, lse) if return_lse else o
