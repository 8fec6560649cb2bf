# ruff: noqa: N803  (Triton convention: compile-time tile sizes and flags in capitals)
# mypy: disable-error-code="untyped-decorator,no-untyped-def"
# (triton.jit is untyped, and annotations on a jitted function change how Triton specialises it.)
"""The Triton kernels: fused Token-PD scoring and batch-global eviction selection.

Scoring, for B new tokens with logits ``z`` of shape (B, V)::

    grid (ceil(B / BLOCK_B), SPLITS)    program (b, s) owns rows [b*BLOCK_B, (b+1)*BLOCK_B)
                                        and vocabulary slice s of ~V / SPLITS columns
    pass 1  _score_partial: one read of its logits tile, in BLOCK_V steps:
              online max m, S = sum e^(z-m), T = sum e^(z-m) (z-m)      (log-softmax stats)
              acc += z_tile @ W1^T_tile      (MLP only; tensor cores, fp32 accumulation)
              count of non-finite logits (zeroed, so the arithmetic stays finite)
            -> stats (4, SPLITS, B) f32 and acc (SPLITS, B, H) f32
    pass 2  _score_finish, grid (B,): merge the splits (all at once), lse = M + log S,
              MLP:     R = sigmoid(w2 . relu(acc - lse * rowsum(W1) + b1) + b2), var = risk
              compact: entropy = log S - T / S, top = 1 / S -> evict's log-linear model
              g = R - lambda var + delta - mu c          -> R, var, g as (B,) f32
              a row with a non-finite logit (or arrival attention) -> NaN in all three

Where the bytes go (the HBM traffic, pass 1 dominates): the logits, ``B * V * bytes`` read
once; ``W1^T``, ``V * H * bytes`` read once from HBM (programs of one vocabulary slice run
side by side, the row block fastest, so the other row blocks find it in L2); the partials,
``SPLITS * B * (H + 3) * 4`` written once and read once by pass 2; 12 bytes per token out.
``W1 (z - lse) = W1 z - lse * rowsum(W1)`` is what lets the dot run before lse is known.

Selection, over g of N resident tokens: a radix select of the m-th smallest key (4 passes of
an 8-bit histogram of the order-preserving uint32 image of g, ``_radix_hist``), then a
per-block count (``_select_count``) and an ordered compaction (``_select_write``) of the
tokens below that key and of the first ``need`` tokens equal to it (ties by index).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kvpolicy.kernels._params import (
    CompactWeights,
    EvictionSelection,
    MLPWeights,
    ScoreParams,
    TokenScores,
)

__all__ = [
    "ScoreLaunch",
    "finish_tiles",
    "score_launch",
    "score_tokens_triton",
    "select_evictions_triton",
    "vocab_slices",
]

_SM_GUESS = 132  # H100 SXM: the interpreter's stand-in for a device's SM count.
_SMEM_GUESS = 163 * 1024  # the A100's opt-in shared memory per block, the smallest targeted


@functools.cache
def _device_limits(device: torch.device) -> tuple[int, int]:
    """(streaming multiprocessors, opt-in shared memory bytes per block) of ``device``."""
    if device.type != "cuda":
        return _SM_GUESS, _SMEM_GUESS
    props = torch.cuda.get_device_properties(device)
    smem = int(getattr(props, "shared_memory_per_block_optin", _SMEM_GUESS))
    return int(props.multi_processor_count), smem


@triton.jit
def _score_partial(
    z_ptr,
    w_ptr,
    stats_ptr,
    acc_ptr,
    B,
    V,
    stride_z,
    cols_per_split,
    H: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_V: tl.constexpr,
    HAS_MLP: tl.constexpr,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid_b = tl.program_id(0)
    pid_s = tl.program_id(1)
    num_s = tl.num_programs(1)
    rows = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    rmask = rows < B
    v0 = pid_s * cols_per_split
    v_end = tl.minimum(v0 + cols_per_split, V)
    m = tl.full((BLOCK_B,), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK_B,), tl.float32)
    t = tl.zeros((BLOCK_B,), tl.float32)
    bad = tl.zeros((BLOCK_B,), tl.float32)
    acc = tl.zeros((BLOCK_B, H), tl.float32)
    hs = tl.arange(0, H)
    for vs in range(v0, v_end, BLOCK_V):
        cols = vs + tl.arange(0, BLOCK_V)
        cmask = cols < v_end
        mask = rmask[:, None] & cmask[None, :]
        z = tl.load(
            z_ptr + rows[:, None].to(tl.int64) * stride_z + cols[None, :], mask=mask, other=0.0
        )
        zf = z.to(tl.float32)
        nonfinite = mask & ((zf != zf) | (tl.abs(zf) == float("inf")))
        bad += tl.sum(nonfinite.to(tl.float32), axis=1)
        zf = tl.where(nonfinite, 0.0, zf)
        # The dot takes the zeroed tile too. Handing it the tile as loaded (its row comes
        # out NaN anyway) gave wrong rows on the H200 on the 64-row (wgmma) tiles in
        # Triton 3.6, and slower 16-row tiles: benchmarks/measured/h200-2026-11-27.
        z = tl.where(nonfinite, 0.0, z)
        zm = tl.where(mask, zf, float("-inf"))
        m_new = tl.maximum(m, tl.max(zm, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_safe)
        e = tl.exp(zm - m_safe[:, None])
        d = tl.where(mask, zf - m_safe[:, None], 0.0)
        # (m - m_safe) * s, written so that an empty row (m = -inf, s = 0) gives 0, not NaN.
        shift = (tl.where(s > 0, m, m_safe) - m_safe) * s
        t = alpha * (t + shift) + tl.sum(e * d, axis=1)
        s = alpha * s + tl.sum(e, axis=1)
        m = m_new
        if HAS_MLP:
            w = tl.load(
                w_ptr + cols[:, None].to(tl.int64) * H + hs[None, :], mask=cmask[:, None], other=0.0
            )
            if UPCAST:
                # Triton's CPU interpreter multiplies bf16 tiles wrongly; bf16 x bf16
                # products are exact in fp32, so the upcast dot is the same arithmetic.
                acc = tl.dot(z.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
            elif IEEE:
                acc = tl.dot(z, w, acc, input_precision="ieee")
            else:
                acc = tl.dot(z, w, acc)
    base = pid_s * B + rows
    tl.store(stats_ptr + base, m, mask=rmask)
    tl.store(stats_ptr + num_s * B + base, s, mask=rmask)
    tl.store(stats_ptr + 2 * num_s * B + base, t, mask=rmask)
    tl.store(stats_ptr + 3 * num_s * B + base, bad, mask=rmask)
    if HAS_MLP:
        tl.store(acc_ptr + base[:, None].to(tl.int64) * H + hs[None, :], acc, mask=rmask[:, None])


@triton.jit
def _score_finish(
    stats_ptr,
    acc_ptr,
    rowsum_ptr,
    b1_ptr,
    w2_ptr,
    cw_ptr,
    pos_ptr,
    att_ptr,
    r_ptr,
    v_ptr,
    g_ptr,
    B,
    num_s,
    b2,
    const_risk,
    half_s2,
    expm1_s2,
    lam,
    offset,
    H: tl.constexpr,
    S_PAD: tl.constexpr,
    S_CHUNK: tl.constexpr,
    HAS_MLP: tl.constexpr,
):
    # One program per row, the slices side by side: the merge reads every slice's
    # statistics in one (S_PAD,) load and the MLP partials S_CHUNK slices at a time,
    # so its latency is a few dependent loads, not one per slice.
    row = tl.program_id(0)
    ks = tl.arange(0, S_PAD)
    kmask = ks < num_s
    mk = tl.load(stats_ptr + ks * B + row, mask=kmask, other=float("-inf"))
    sk = tl.load(stats_ptr + (num_s + ks) * B + row, mask=kmask, other=0.0)
    tk = tl.load(stats_ptr + (2 * num_s + ks) * B + row, mask=kmask, other=0.0)
    bk = tl.load(stats_ptr + (3 * num_s + ks) * B + row, mask=kmask, other=0.0)
    big_m = tl.max(mk, axis=0)
    big_m = tl.where(big_m == float("-inf"), 0.0, big_m)
    alpha = tl.exp(mk - big_m)
    # A slice with no mass (s = 0) adds nothing; written so that it gives 0, not NaN.
    t = tl.sum(alpha * (tk + (tl.where(sk > 0, mk, big_m) - big_m) * sk), axis=0)
    s = tl.sum(alpha * sk, axis=0)
    bad = tl.sum(bk, axis=0)
    if HAS_MLP:
        hs = tl.arange(0, H)
        acc = tl.zeros((H,), tl.float32)
        for c in range(0, num_s, S_CHUNK):
            kc = c + tl.arange(0, S_CHUNK)
            idx = (kc[:, None] * B + row).to(tl.int64) * H + hs[None, :]
            part = tl.load(acc_ptr + idx, mask=(kc < num_s)[:, None], other=0.0)
            acc += tl.sum(part, axis=0)
        lse = big_m + tl.log(s)
        rowsum = tl.load(rowsum_ptr + hs)
        b1 = tl.load(b1_ptr + hs)
        w2 = tl.load(w2_ptr + hs)
        h = tl.maximum(acc - lse * rowsum + b1, 0.0)
        logit = tl.sum(h * w2, axis=0) + b2
        # The sigmoid without an overflowing exp (e <= 1) at either sign of the logit.
        e = tl.exp(-tl.abs(logit))
        r = tl.where(logit >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
        var = const_risk
    else:
        entropy = tl.log(s) - t / s
        top = 1.0 / s
        pos = tl.maximum(tl.load(pos_ptr + row).to(tl.float32), 0.0)
        att = tl.load(att_ptr + row).to(tl.float32)
        att_bad = (att != att) | (tl.abs(att) == float("inf"))
        bad += att_bad.to(tl.float32)
        att = tl.minimum(tl.maximum(tl.where(att_bad, 0.0, att), 0.0), 1.0)
        log_mean = (
            tl.load(cw_ptr)
            + tl.load(cw_ptr + 1) * entropy
            + tl.load(cw_ptr + 2) * top
            + tl.load(cw_ptr + 3) * tl.log(1.0 + pos)
            + tl.load(cw_ptr + 4) / (1.0 + pos)
            + tl.load(cw_ptr + 5) * att
            + tl.load(cw_ptr + 6) * tl.log(att + 1e-6)
        )
        r = tl.exp(tl.minimum(log_mean + half_s2, 0.0))
        var = expm1_s2 * tl.exp(tl.minimum(2.0 * log_mean + 2.0 * half_s2, 0.0))
    g = r - lam * var + offset
    nan = float("nan")
    r = tl.where(bad > 0, nan, r)
    var = tl.where(bad > 0, nan, var)
    g = tl.where(bad > 0, nan, g)
    tl.store(r_ptr + row, r)
    tl.store(v_ptr + row, var)
    tl.store(g_ptr + row, g)


@functools.lru_cache(maxsize=64)
def _compact_weights(weights: tuple[float, ...], device: torch.device) -> torch.Tensor:
    """The compact predictor's weights on ``device``, copied once (a copy from the host
    cannot be captured in a CUDA graph)."""
    return torch.tensor(weights, dtype=torch.float32, device=device)


class ScoreLaunch(NamedTuple):
    """How the scoring pass is launched (tile sizes, vocabulary slices, warps, stages).

    ``score_tokens_triton(..., launch=...)`` takes one to override ``score_launch``'s
    choice: the GPU benchmark sweeps them (``bench_gpu.py --tune``).
    """

    block_b: int
    block_v: int
    splits: int
    num_warps: int
    num_stages: int | None = None


def score_launch(
    b: int,
    v: int,
    hidden: int,
    elem: int,
    wide: bool,
    *,
    interpret: bool = False,
    sms: int = _SM_GUESS,
    smem: int = _SMEM_GUESS,
) -> ScoreLaunch:
    """The scoring launch for ``b`` rows of ``v`` logits of ``elem`` bytes on a device with
    ``sms`` SMs and ``smem`` bytes of shared memory per block (``hidden`` 0: compact).

    Tuned on an H200 (``bench_gpu.py --tune``; the packages' README has the sweep): with the
    MLP, about one program per SM, 8 warps, 16-row tiles up to 64 rows (then 64), 128
    vocabulary columns a step on 16-row tiles, 64 on wider ones; as many pipeline stages
    (at most 3) as the W1 and logits tiles fit in shared memory, so the same rule gives 3
    on an H100/H200 and 2 on an A100. ``wide``: fp32 operands, whose tiles are twice the
    bytes. Under the interpreter: few big steps.
    """
    if interpret:
        return ScoreLaunch(16 if b <= 16 else 64, 1024, max(1, min(4, triton.cdiv(v, 1024))), 4)
    if not hidden:
        block_b = 16 if b <= 16 else 64
        row_blocks = triton.cdiv(b, block_b)
        splits = max(1, min(triton.cdiv(v, 4 * 64), 2 * sms // row_blocks))
        return ScoreLaunch(block_b, 64, splits, 4)
    block_b = 16 if b <= 64 else 64
    block_v = 128 if block_b == 16 else 64
    if wide:
        block_v //= 2
    per_stage = (block_b * block_v + block_v * hidden) * elem
    while 2 * per_stage > smem and block_v > 16:
        block_v //= 2
        per_stage = (block_b * block_v + block_v * hidden) * elem
    stages = 3 if 3 * per_stage <= smem - 8 * 1024 else 2
    row_blocks = triton.cdiv(b, block_b)
    # About one program per SM; more slices would each add a (B, H) fp32 partial.
    splits = max(1, min(triton.cdiv(v, block_v), triton.cdiv(sms, row_blocks)))
    return ScoreLaunch(block_b, block_v, splits, 8, stages)


def vocab_slices(v: int, launch: ScoreLaunch) -> tuple[int, int]:
    """(columns per slice, slices) of ``v`` logits under ``launch``: whole ``block_v`` steps
    per slice, so the last slice may be short and there may be fewer than asked."""
    cols = triton.cdiv(triton.cdiv(v, launch.splits), launch.block_v) * launch.block_v
    return cols, triton.cdiv(v, cols)


FINISH_WARPS = 4


def finish_tiles(splits: int, hidden: int) -> tuple[int, int]:
    """(S_PAD, S_CHUNK) of the merging pass over ``splits`` slices: every slice's statistics
    in one power-of-2 load, the (slices, hidden) MLP partials at most 8,192 values a load
    (64 fp32 registers a thread at ``FINISH_WARPS`` warps; 8 warps and 16,384 values a
    load, with the weights loaded first, measured slower on the H200)."""
    pad = triton.next_power_of_2(splits)
    return pad, max(1, min(pad, 8192 // max(hidden, 1)))


def score_tokens_triton(
    logits: torch.Tensor,
    predictor: MLPWeights | CompactWeights,
    params: ScoreParams,
    positions: torch.Tensor | None = None,
    attention: torch.Tensor | None = None,
    *,
    interpret: bool = False,
    launch: ScoreLaunch | None = None,
) -> TokenScores:
    """Launch the two scoring passes (inputs already validated by the dispatcher)."""
    b, v = logits.shape
    dev = logits.device
    has_mlp = isinstance(predictor, MLPWeights)
    wide = has_mlp and logits.dtype == torch.float32
    hidden_or_0 = predictor.hidden if isinstance(predictor, MLPWeights) else 0
    if launch is None:
        sms, smem = _device_limits(dev)
        launch = score_launch(
            b, v, hidden_or_0, logits.element_size(), wide, interpret=interpret, sms=sms, smem=smem
        )
    block_b, block_v = launch.block_b, launch.block_v
    stages = {} if launch.num_stages is None else {"num_stages": launch.num_stages}
    cols, splits = vocab_slices(v, launch)
    f32 = torch.float32
    stats = torch.empty((4, splits, b), dtype=f32, device=dev)
    out = torch.empty((3, b), dtype=f32, device=dev)
    offset = params.recompute_penalty - params.price * params.token_cost
    if isinstance(predictor, MLPWeights):
        w1t, rowsum, b1, w2 = predictor.prepared(logits.dtype, dev)
        hidden = hidden_or_0
        acc = torch.empty((splits, b, hidden), dtype=f32, device=dev)
        cw = stats  # unused pointers
        pos = att = stats
        b2, risk, half_s2, expm1_s2 = predictor.b2, predictor.risk, 0.0, 0.0
    else:
        assert positions is not None
        assert attention is not None
        hidden = 16
        w1t = rowsum = b1 = w2 = acc = stats
        cw = _compact_weights(predictor.weights, dev)
        pos, att = positions, attention
        s2 = predictor.residual_variance
        b2, risk, half_s2, expm1_s2 = 0.0, 0.0, s2 / 2.0, math.expm1(s2)
    _score_partial[(triton.cdiv(b, block_b), splits)](
        logits,
        w1t,
        stats,
        acc,
        b,
        v,
        logits.stride(0),
        cols,
        H=hidden,
        BLOCK_B=block_b,
        BLOCK_V=block_v,
        HAS_MLP=has_mlp,
        IEEE=logits.dtype == torch.float32,
        UPCAST=interpret and logits.dtype == torch.bfloat16,
        num_warps=launch.num_warps,
        **stages,
    )
    s_pad, s_chunk = finish_tiles(splits, hidden_or_0)
    _score_finish[(b,)](
        stats,
        acc,
        rowsum,
        b1,
        w2,
        cw,
        pos,
        att,
        out[0],
        out[1],
        out[2],
        b,
        splits,
        b2,
        risk,
        half_s2,
        expm1_s2,
        params.risk_aversion,
        offset,
        H=hidden,
        S_PAD=s_pad,
        S_CHUNK=s_chunk,
        HAS_MLP=has_mlp,
        num_warps=FINISH_WARPS,
    )
    return TokenScores(out[0], out[1], out[2])


@triton.jit
def _ordered_key(g_ptr, offs, mask):
    # Order-preserving image of fp32 in uint32: flip every bit of a negative number and the
    # sign bit of a positive one. "+ 0.0" folds -0.0 into +0.0 (equal in evict's compares).
    x = (tl.load(g_ptr + offs, mask=mask, other=0.0) + 0.0).to(tl.uint32, bitcast=True)
    neg = (x >> 31) == 1
    return tl.where(neg, ~x, x | 0x80000000)


@triton.jit
def _radix_hist(g_ptr, n, prefix_ptr, hist_ptr, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    key = _ordered_key(g_ptr, offs, mask)
    if SHIFT < 24:
        prefix = tl.load(prefix_ptr).to(tl.uint32)
        mask = mask & ((key >> (SHIFT + 8)) == prefix)
    digit = ((key >> SHIFT) & 0xFF).to(tl.int32)
    hist = tl.histogram(digit, 256, mask=mask)
    tl.atomic_add(hist_ptr + tl.arange(0, 256), hist, mask=hist > 0)


@triton.jit
def _radix_pick(hist_ptr, state_ptr):
    # One program, after each histogram pass: the digit holding the rem-th smallest key of
    # those under the prefix, state (prefix, rem) <- (prefix * 256 + digit, rem - #below),
    # and the histogram zeroed for the next pass. Keeps the radix select on the device
    # without the host or a train of small torch launches.
    idx = tl.arange(0, 256)
    hist = tl.load(hist_ptr + idx).to(tl.int64)
    prefix = tl.load(state_ptr)
    rem = tl.load(state_ptr + 1)
    cum = tl.cumsum(hist, axis=0)
    digit = tl.sum((cum < rem).to(tl.int64), axis=0)
    below = tl.sum(tl.where(idx < digit, hist, 0), axis=0)
    tl.store(state_ptr, prefix * 256 + digit)
    tl.store(state_ptr + 1, rem - below)
    tl.store(hist_ptr + idx, tl.zeros((256,), tl.int32))


@triton.jit
def _select_count(g_ptr, n, kth_ptr, counts_ptr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    key = _ordered_key(g_ptr, offs, mask)
    kth = tl.load(kth_ptr).to(tl.uint32)
    less = mask & (key < kth)
    tie = mask & (key == kth)
    tl.store(counts_ptr + 2 * pid, tl.sum(less.to(tl.int32), axis=0))
    tl.store(counts_ptr + 2 * pid + 1, tl.sum(tie.to(tl.int32), axis=0))


@triton.jit
def _select_offsets(counts_ptr, nblocks, state_ptr, offsets_ptr, BLOCK: tl.constexpr):
    # One program: per block, where its taken tokens start in the output and how many ties
    # come before it (ties are taken in index order up to `need`), as running sums.
    need = tl.load(state_ptr + 1)
    carry_taken = tl.full((), 0, tl.int64)
    carry_tie = tl.full((), 0, tl.int64)
    for start in range(0, nblocks, BLOCK):
        blocks = start + tl.arange(0, BLOCK)
        mask = blocks < nblocks
        less = tl.load(counts_ptr + 2 * blocks, mask=mask, other=0).to(tl.int64)
        tie = tl.load(counts_ptr + 2 * blocks + 1, mask=mask, other=0).to(tl.int64)
        tie_before = carry_tie + tl.cumsum(tie, axis=0) - tie
        ties_taken = tl.minimum(tl.maximum(need - tie_before, 0), tie)
        taken = less + ties_taken
        first = carry_taken + tl.cumsum(taken, axis=0) - taken
        tl.store(offsets_ptr + 2 * blocks, first.to(tl.int32), mask=mask)
        tl.store(offsets_ptr + 2 * blocks + 1, tie_before.to(tl.int32), mask=mask)
        carry_taken += tl.sum(taken, axis=0)
        carry_tie += tl.sum(tie, axis=0)


@triton.jit
def _select_write(g_ptr, n, kth_ptr, need_ptr, offsets_ptr, out_ptr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    key = _ordered_key(g_ptr, offs, mask)
    kth = tl.load(kth_ptr).to(tl.uint32)
    need = tl.load(need_ptr).to(tl.int32)
    tie = mask & (key == kth)
    tie_rank = tl.load(offsets_ptr + 2 * pid + 1) + tl.cumsum(tie.to(tl.int32), axis=0) - 1
    take = (mask & (key < kth)) | (tie & (tie_rank < need))
    slot = tl.load(offsets_ptr + 2 * pid) + tl.cumsum(take.to(tl.int32), axis=0) - 1
    tl.store(out_ptr + slot, offs.to(tl.int64), mask=take)


def select_evictions_triton(
    g: torch.Tensor,
    budget_tokens: int,
    keep_rule: bool,
    *,
    interpret: bool = False,
    block: int | None = None,
) -> EvictionSelection:
    """Radix select + ordered compaction (inputs already validated by the dispatcher).

    One host synchronisation, and only with the keep rule (the count of ``g < 0`` sizes
    the output); the radix digits and the output offsets are chosen on the device by
    one-program kernels: 11 Triton launches and 3 fills, no train of small torch ops.
    """
    n = int(g.numel())
    dev = g.device
    below = int((g < 0).sum()) if keep_rule else 0
    m = min(n, max(below, n - budget_tokens))
    if m == 0:
        return EvictionSelection(torch.zeros(0, dtype=torch.int64, device=dev), n - below)
    if block is None:
        block = 1024 if interpret else 4096
    grid = (triton.cdiv(n, block),)
    # state = (prefix of the m-th key so far, its rank among the keys under that prefix);
    # after the 4 passes, (the m-th key, how many ties with it to take).
    state = torch.full((2,), m, dtype=torch.int64, device=dev)  # fills, no host copy:
    state[:1].fill_(0)  # capturable in a CUDA graph
    hist = torch.zeros(256, dtype=torch.int32, device=dev)
    for shift in (24, 16, 8, 0):
        _radix_hist[grid](g, n, state, hist, SHIFT=shift, BLOCK=block)
        _radix_pick[(1,)](hist, state)
    nblocks = grid[0]
    counts = torch.empty((nblocks, 2), dtype=torch.int32, device=dev)
    _select_count[grid](g, n, state, counts, BLOCK=block)
    offsets = torch.empty((nblocks, 2), dtype=torch.int32, device=dev)
    _select_offsets[(1,)](counts, nblocks, state, offsets, BLOCK=1024)
    out = torch.empty(m, dtype=torch.int64, device=dev)
    _select_write[grid](g, n, state, state[1:], offsets, out, BLOCK=block)
    return EvictionSelection(out, n - below)
