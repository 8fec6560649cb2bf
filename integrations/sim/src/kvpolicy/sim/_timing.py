"""Roofline time of one engine iteration, from a ModelSpec and a GPUSpec.

One iteration reads the weights once and the resident KV of every running request, and
computes ``2 · params`` FLOPs per token plus attention. Its time is the larger of the two
(a roofline) over what the hardware sustains, plus a fixed per-iteration overhead::

    t = overhead + max(bytes / (eta_bw · BW),  flops / (eta_f · F))
    bytes = W + c · kv_read          (W weight bytes, c KV bytes per token)
    flops = 2 · P · n + 4 · L · H_q · d_h · attn_pairs

``n`` is the tokens computed (one per decoding request plus prefill chunk tokens) and
``attn_pairs`` the query-key pairs scored (for a decoding request its context length; for a
chunk of ``q`` prompt tokens after ``s`` computed ones, ``q · s + q (q + 1) / 2``).

The default calibration constants are round figures consistent with public vLLM measurements
of Llama-3-8B on A100/H100 (decode at batch 1 runs at about 75% of HBM bandwidth; large
prefills reach about 55% of dense bf16 peak; the scheduler and sampler cost roughly half a
millisecond per step). :func:`fit_timing` replaces them with a fit to a user's measurements.

With ``tp``-way tensor parallelism each GPU reads its share of the weights
(``W / tp``) and of the KV (``max(1, H_kv / tp)`` KV heads: replicated past ``tp = H_kv``),
computes ``1 / tp`` of the FLOPs, and the group adds two all-reduces of the activations per
layer (after attention and after the MLP), not overlapped with compute. A ring all-reduce of
``m`` bytes over ``tp`` GPUs moves ``2 (tp - 1) / tp · m`` bytes through each GPU's link::

    t = overhead + max(bytes_gpu / (eta_bw · BW), flops / (tp · eta_f · F)) + t_ar
    t_ar = 2 · L · (2 (tp - 1) / tp · n · H_q · d_h · 2 / B_link + latency)

with ``n · H_q · d_h`` bf16 activations (2 bytes each), ``B_link`` the per-direction
interconnect bandwidth of one GPU (:data:`INTERCONNECT_BANDWIDTH`: NVLink for the SXM parts
and H200, PCIe Gen4 x16 for L40S) and a fixed latency per all-reduce. ``tp = 1`` is exactly
the single-GPU model above (no all-reduce term). Pipeline parallelism is not modelled
in time (its bubbles depend on micro-batching); capacity planning in kvmodel handles ``pp``.
"""

from __future__ import annotations

import csv
import math
import pathlib

import attrs
import numpy as np
from attrs import field, frozen
from attrs.validators import ge, gt, instance_of, le, optional
from numpy.typing import NDArray

from kvpolicy.kvmodel import GPUSpec, ModelSpec
from kvpolicy.sim._series import DecodeRoofline, pairwise_sum

__all__ = [
    "DEFAULT_INTERCONNECT_BANDWIDTH",
    "INTERCONNECT_BANDWIDTH",
    "TimingModel",
    "fit_error",
    "fit_timing",
    "pairwise_sum",
    "read_timing_csv",
]

INTERCONNECT_BANDWIDTH: dict[str, float] = {
    "A100-40GB": 300e9,  # NVLink 3: 600 GB/s bidirectional per GPU (SXM)
    "A100-80GB": 300e9,
    "H100-SXM": 450e9,  # NVLink 4: 900 GB/s bidirectional per GPU
    "H200": 450e9,
    "L40S": 32e9,  # no NVLink: PCIe Gen4 x16, about 32 GB/s each way
}
"""Per-direction GPU-to-GPU bandwidth in bytes per second, by GPU preset name (datasheets)."""

DEFAULT_INTERCONNECT_BANDWIDTH = 32e9
"""Link bandwidth assumed for a GPU not in :data:`INTERCONNECT_BANDWIDTH`: PCIe Gen4 x16."""

_ACTIVATION_BYTES = 2  # bf16 activations in the all-reduces


def _int_tp(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"'tp' must be an int: {value!r}")
    return value


_CSV_COLUMNS = ("batch", "tokens", "seconds", "kv_tokens")


@frozen
class TimingModel:
    """Roofline iteration time of ``model`` on ``gpu`` with calibration constants."""

    model: ModelSpec = field(validator=instance_of(ModelSpec))
    """The model served."""
    gpu: GPUSpec = field(validator=instance_of(GPUSpec))
    """The accelerator."""
    bandwidth_efficiency: float = field(default=0.75, validator=[gt(0.0), le(1.0)])
    """``eta_bw``: fraction of HBM bandwidth sustained by decode."""
    flops_efficiency: float = field(default=0.55, validator=[gt(0.0), le(1.0)])
    """``eta_f``: fraction of peak FLOP/s sustained by prefill (model FLOPs utilisation)."""
    overhead_s: float = field(default=5e-4, converter=float, validator=ge(0.0))
    """Fixed cost of one iteration in seconds (scheduling, sampling, kernel launches)."""
    tp: int = field(default=1, converter=_int_tp)
    """Tensor-parallel GPUs (validated by :meth:`~kvpolicy.kvmodel.ModelSpec.check_parallel`:
    a positive int dividing the query heads, dividing or a multiple of the KV heads)."""
    interconnect_bandwidth: float | None = field(
        default=None, converter=attrs.converters.optional(float), validator=optional(gt(0.0))
    )
    """Per-direction GPU link bandwidth in B/s; None: :data:`INTERCONNECT_BANDWIDTH` of the
    GPU, else :data:`DEFAULT_INTERCONNECT_BANDWIDTH`."""
    allreduce_latency_s: float = field(default=1e-5, converter=float, validator=ge(0.0))
    """Fixed seconds of one all-reduce (launch and synchronisation), used when ``tp > 1``."""
    # Derived once when built: the simulator asks for iteration times millions of times.
    _kv_bytes: int = field(init=False, repr=False, eq=False)
    _weight_bytes: int = field(init=False, repr=False, eq=False)
    _roofline: DecodeRoofline = field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        if self.model.num_params <= 0:
            raise ValueError(
                f"'model' needs num_params > 0 for timing: {self.model.name} has "
                f"{self.model.num_params}"
            )
        self.model.check_parallel(self.tp)
        object.__setattr__(self, "_kv_bytes", self.model.kv_bytes_per_token_per_gpu(self.tp))
        object.__setattr__(self, "_weight_bytes", self.model.weight_bytes_per_gpu(self.tp))
        roofline = DecodeRoofline(
            self._weight_bytes,
            self._kv_bytes,
            2.0 * self.model.num_params,
            self._attn_flops_per_pair,
            self.bandwidth_efficiency * self.gpu.hbm_bandwidth,
            self.flops_efficiency * self.gpu.peak_flops,
            self.overhead_s,
            self.tp,
        )
        object.__setattr__(self, "_roofline", roofline)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token of :attr:`model` on one GPU (all of it when ``tp = 1``)."""
        return self._kv_bytes

    @property
    def link_bandwidth(self) -> float:
        """Per-direction interconnect bandwidth of one GPU, B/s."""
        if self.interconnect_bandwidth is not None:
            return self.interconnect_bandwidth
        return INTERCONNECT_BANDWIDTH.get(self.gpu.name, DEFAULT_INTERCONNECT_BANDWIDTH)

    def allreduce_time(self, num_tokens: int | float) -> float:
        """Seconds of the ``2 · L`` ring all-reduces of ``num_tokens`` tokens' activations
        (0 when ``tp = 1``)."""
        if self.tp == 1:
            return 0.0
        hidden = self.model.query_heads * self.model.head_dim
        ring = 2.0 * (self.tp - 1) / self.tp * num_tokens * hidden * _ACTIVATION_BYTES
        return 2 * self.model.num_layers * (ring / self.link_bandwidth + self.allreduce_latency_s)

    def _weights(self) -> int:
        return self._weight_bytes

    @property
    def _attn_flops_per_pair(self) -> float:
        heads = self.model.num_attention_heads or self.model.num_kv_heads
        # QK^T and AV: two multiply-adds per head dimension per layer per query-key pair.
        return 4.0 * self.model.num_layers * heads * self.model.head_dim

    def iteration_time(
        self, num_tokens: int | float, kv_read_tokens: int | float, attn_pairs: int | float
    ) -> float:
        """Seconds of one iteration.

        Args:
            num_tokens: tokens computed this iteration (decode tokens plus prefill chunks).
            kv_read_tokens: resident KV tokens read by attention.
            attn_pairs: query-key pairs scored by attention.
        """
        mem = self._weights() + self.kv_bytes_per_token * kv_read_tokens
        flops = 2.0 * self.model.num_params * num_tokens + self._attn_flops_per_pair * attn_pairs
        t_mem = mem / (self.bandwidth_efficiency * self.gpu.hbm_bandwidth)
        t_flops = flops / (self.flops_efficiency * self.gpu.peak_flops)
        if self.tp == 1:
            return self.overhead_s + max(t_mem, t_flops)
        return self.overhead_s + max(t_mem, t_flops / self.tp) + self.allreduce_time(num_tokens)

    def decode_times(
        self, batch: int, kv_tokens: int, context_tokens: int, steps: int
    ) -> NDArray[np.float64]:
        """Seconds of ``steps`` consecutive decode-only iterations of a fixed batch.

        Each iteration adds one token of KV per request, so iteration ``i`` (from 0) reads
        ``kv_tokens + i · batch`` resident tokens and scores ``context_tokens + i · batch``
        query-key pairs.

        Returns:
            (steps,) float64 seconds of each iteration.
        """
        i = np.arange(steps, dtype=np.float64)
        kv = kv_tokens + i * batch
        ctx = context_tokens + i * batch
        mem = self._weights() + self.kv_bytes_per_token * kv
        flops = 2.0 * self.model.num_params * batch + self._attn_flops_per_pair * ctx
        t_mem = mem / (self.bandwidth_efficiency * self.gpu.hbm_bandwidth)
        t_flops = flops / (self.flops_efficiency * self.gpu.peak_flops)
        if self.tp == 1:
            out: NDArray[np.float64] = self.overhead_s + np.maximum(t_mem, t_flops)
            return out
        comm = self.allreduce_time(batch)
        tp_out: NDArray[np.float64] = self.overhead_s + np.maximum(t_mem, t_flops / self.tp) + comm
        return tp_out

    def decode_series(
        self, batch: int, kv_tokens: int, context_tokens: int, first: int, count: int
    ) -> list[float]:
        """The seconds of iterations ``first .. first + count - 1`` of :meth:`decode_times`,
        the same floats (token counts are whole numbers, exact in float64, so iteration
        ``i`` is computed alike from either end): a short stretch in plain Python, a long
        one with numpy, for a caller that needs only the first few of a long run.
        """
        if count >= 24:
            series: list[float] = self.decode_times(
                batch, kv_tokens + first * batch, context_tokens + first * batch, count
            ).tolist()
            return series
        comm = self.allreduce_time(batch) if self.tp > 1 else 0.0
        return self._roofline.series(batch, kv_tokens, context_tokens, first, count, comm)

    def compute_time(self, num_tokens: int | float, attn_pairs: int | float) -> float:
        """Seconds of compute that ``num_tokens`` tokens (scoring ``attn_pairs`` query-key
        pairs) add to an iteration: their FLOPs at the sustained rate, no weights read (split
        over ``tp`` GPUs, plus their all-reduces)."""
        flops = 2.0 * self.model.num_params * num_tokens + self._attn_flops_per_pair * attn_pairs
        seconds = flops / (self.flops_efficiency * self.gpu.peak_flops)
        if self.tp == 1:
            return seconds
        return seconds / self.tp + self.allreduce_time(num_tokens)

    def transfer_time(self, num_tokens: int, bandwidth: float) -> float:
        """Seconds to move the KV of ``num_tokens`` tokens over a link of ``bandwidth`` B/s."""
        return num_tokens * self.kv_bytes_per_token / bandwidth


def fit_timing(
    model: ModelSpec, gpu: GPUSpec, rows: NDArray[np.float64] | list[list[float]]
) -> TimingModel:
    """Fit the calibration constants of :class:`TimingModel` to measured iterations.

    The fit minimises the squared *relative* error, so that short iterations (decode at
    small batch) weigh as much as long prefills. It searches a log-spaced grid of ``eta_bw``
    and ``eta_f`` in [0.05, 1], zooming in four times around the best cell; for each pair
    the overhead is the weighted mean residual (clipped at 0). A grid is robust to which
    side of the roofline each row lies on, which a linearisation would have to guess; once
    the grid has decided that, a weighted linear least squares in
    ``(overhead, 1/eta_bw, 1/eta_f)`` polishes the estimate.

    Args:
        model: the model measured.
        gpu: the accelerator measured.
        rows: (n, 3) or (n, 4) float64 rows ``(batch, tokens, seconds[, kv_tokens])``:
            requests in the batch, tokens computed, measured seconds, and optionally the
            resident KV tokens read (default ``0``: weights only). Decode-only rows have
            ``tokens == batch``.

    Raises:
        ValueError: ``rows`` is not 2-D with 3 or 4 columns, has fewer than 2 rows, or holds
            a negative or non-finite value.
    """
    arr = np.asarray(rows, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] not in (3, 4) or arr.shape[0] < 2:
        raise ValueError(f"'rows' must be (n >= 2, 3 or 4) rows: got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError("'rows' must hold finite non-negative values")
    tokens, seconds = arr[:, 1], arr[:, 2]
    kv = arr[:, 3] if arr.shape[1] == 4 else np.zeros(len(arr))
    base = TimingModel(model, gpu)
    mem = model.weight_bytes() + base.kv_bytes_per_token * kv
    # Attention pairs are not measured separately; the context read stands in for them.
    flops = 2.0 * model.num_params * tokens + base._attn_flops_per_pair * kv
    if np.any(seconds <= 0):
        raise ValueError("'rows' must have measured seconds > 0")
    w = 1.0 / seconds**2  # relative squared error
    lo_bw, hi_bw, lo_f, hi_f = math.log(0.05), 0.0, math.log(0.05), 0.0
    best = (1.0, 1.0, 0.0)
    for _ in range(4):  # zoom in: each level spans two cells of the previous one
        g_bw = np.exp(np.linspace(lo_bw, hi_bw, 48))
        g_f = np.exp(np.linspace(lo_f, hi_f, 48))
        t_mem = mem[None, :] / (g_bw[:, None] * gpu.hbm_bandwidth)  # (48, n)
        t_flops = flops[None, :] / (g_f[:, None] * gpu.peak_flops)  # (48, n)
        roof = np.maximum(t_mem[:, None, :], t_flops[None, :, :])  # (48 bw, 48 f, n)
        resid = seconds[None, None, :] - roof
        overhead = np.clip((resid * w).sum(axis=2) / w.sum(), 0.0, None)
        err = (((roof + overhead[:, :, None] - seconds[None, None, :]) ** 2) * w).sum(axis=2)
        i, j = np.unravel_index(int(np.argmin(err)), err.shape)
        best = (float(g_bw[i]), float(g_f[j]), float(overhead[i, j]))
        step_bw = (hi_bw - lo_bw) / 47
        step_f = (hi_f - lo_f) / 47
        lo_bw, hi_bw = math.log(g_bw[i]) - 2 * step_bw, min(0.0, math.log(g_bw[i]) + 2 * step_bw)
        lo_f, hi_f = math.log(g_f[j]) - 2 * step_f, min(0.0, math.log(g_f[j]) + 2 * step_f)
    best = _refine(best, mem, flops, seconds, gpu)
    return attrs.evolve(
        base,
        bandwidth_efficiency=best[0],
        flops_efficiency=best[1],
        overhead_s=best[2],
    )


def _refine(
    start: tuple[float, float, float],
    mem: NDArray[np.float64],
    flops: NDArray[np.float64],
    seconds: NDArray[np.float64],
    gpu: GPUSpec,
) -> tuple[float, float, float]:
    """Polish a grid estimate: given which side of the roofline each row is on, the model
    is linear in (overhead, 1/eta_bw, 1/eta_f); solve, reclassify, repeat while it helps."""

    def sse(p: tuple[float, float, float]) -> float:
        pred = p[2] + np.maximum(mem / (p[0] * gpu.hbm_bandwidth), flops / (p[1] * gpu.peak_flops))
        return float((((pred - seconds) / seconds) ** 2).sum())

    best, best_err = start, sse(start)
    for _ in range(10):
        membound = mem / (best[0] * gpu.hbm_bandwidth) >= flops / (best[1] * gpu.peak_flops)
        a = np.column_stack(
            (
                np.ones(len(mem)),
                np.where(membound, mem / gpu.hbm_bandwidth, 0.0),
                np.where(membound, 0.0, flops / gpu.peak_flops),
            )
        )
        coef, *_ = np.linalg.lstsq(a / seconds[:, None], np.ones(len(seconds)), rcond=None)
        inv_bw = coef[1] if membound.any() else 1.0 / best[0]
        inv_f = coef[2] if (~membound).any() else 1.0 / best[1]
        if coef[0] < 0 or inv_bw < 1.0 or inv_f < 1.0:
            break
        cand = (float(1.0 / inv_bw), float(1.0 / inv_f), float(coef[0]))
        err = sse(cand)
        if err >= best_err:
            break
        best, best_err = cand, err
    return best


def read_timing_csv(path: str | pathlib.Path) -> NDArray[np.float64]:
    """Read measured iterations for :func:`fit_timing` from a CSV file.

    The header names the columns ``batch,tokens,seconds`` and optionally ``kv_tokens``, in
    any order (other columns are ignored); each row is one measured iteration.

    Returns:
        (n, 4) float64 rows ``(batch, tokens, seconds, kv_tokens)``; ``kv_tokens`` is 0 when
        the file has no such column.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a missing column, or a row that is not finite and non-negative (named
            with the file and line), or fewer than two rows.
    """
    p = pathlib.Path(path)
    with p.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        missing = [c for c in _CSV_COLUMNS[:3] if c not in header]
        if missing:
            raise ValueError(
                f"{p}: missing column(s) {', '.join(missing)}; the header must name "
                f"batch,tokens,seconds[,kv_tokens]: got {','.join(header) or '(empty)'}"
            )
        rows: list[list[float]] = []
        for row in reader:
            line = reader.line_num
            values = []
            for col in _CSV_COLUMNS:
                raw = row.get(col) if col in header else "0"
                try:
                    v = float(raw if raw is not None else "")
                except ValueError:
                    raise ValueError(
                        f"{p}:{line}: column {col!r} is not a number: {raw!r}"
                    ) from None
                if not math.isfinite(v) or v < 0:
                    raise ValueError(f"{p}:{line}: column {col!r} must be finite and >= 0: {raw!r}")
                values.append(v)
            rows.append(values)
    if len(rows) < 2:
        raise ValueError(f"{p}: needs at least 2 measured rows to fit, got {len(rows)}")
    return np.asarray(rows, dtype=np.float64)


def fit_error(timing: TimingModel, rows: NDArray[np.float64]) -> dict[str, float]:
    """How well ``timing`` predicts measured rows ``(batch, tokens, seconds[, kv_tokens])``.

    Returns:
        ``median_rel_error`` and ``max_rel_error`` (of ``|predicted - measured| / measured``)
        and ``r2``, the coefficient of determination.
    """
    arr = np.asarray(rows, dtype=np.float64)
    kv = arr[:, 3] if arr.shape[1] > 3 else np.zeros(len(arr))
    pred = np.array([timing.iteration_time(t, k, k) for t, k in zip(arr[:, 1], kv, strict=True)])
    measured = arr[:, 2]
    rel = np.abs(pred - measured) / np.maximum(measured, 1e-12)
    ss = float(((measured - measured.mean()) ** 2).sum())
    r2 = 1.0 - float(((pred - measured) ** 2).sum()) / ss if ss > 0 else math.nan
    return {
        "median_rel_error": float(np.median(rel)),
        "max_rel_error": float(rel.max()),
        "r2": r2,
    }
