"""The arithmetic of a run of decode iterations: the roofline time of each, and their sum
as numpy sums them.

Plain classes and functions over floats, the engine's innermost loops (a decode run's times
are asked for at every event), kept apart from :class:`~kvpolicy.sim._timing.TimingModel`
(an attrs class with validators) so that they compile with the engine core
(``KVPOLICY_COMPILE=1``); interpreted, they give the same floats.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["DecodeRoofline", "pairwise_sum"]


class DecodeRoofline:
    """A timing model's constants for decode-only iterations of a fixed batch (see
    :meth:`~kvpolicy.sim._timing.TimingModel.decode_series`).

    Args:
        weights: weight bytes read per iteration (one GPU's share).
        kv_bytes: KV bytes per resident token (one GPU's share).
        dense: ``2.0 * num_params`` FLOPs per computed token.
        per_pair: attention FLOPs per query-key pair.
        mem_rate: sustained bytes per second (``eta_bw * bandwidth``).
        flops_rate: sustained FLOPs per second (``eta_f * peak``).
        overhead: fixed seconds per iteration.
        tp: tensor-parallel GPUs.
    """

    __slots__ = (
        "dense",
        "flops_rate",
        "kv_bytes",
        "mem_rate",
        "overhead",
        "per_pair",
        "tp",
        "weights",
    )

    def __init__(
        self,
        weights: int,
        kv_bytes: int,
        dense: float,
        per_pair: float,
        mem_rate: float,
        flops_rate: float,
        overhead: float,
        tp: int,
    ) -> None:
        """See the class docstring."""
        self.weights = weights
        self.kv_bytes = kv_bytes
        self.dense = dense
        self.per_pair = per_pair
        self.mem_rate = mem_rate
        self.flops_rate = flops_rate
        self.overhead = overhead
        self.tp = tp

    def __reduce__(
        self,
    ) -> tuple[type[DecodeRoofline], tuple[int, int, float, float, float, float, float, int]]:
        """Pickled as its arguments (compiled, the class has no ``__dict__``)."""
        args = (self.weights, self.kv_bytes, self.dense, self.per_pair, self.mem_rate)
        return DecodeRoofline, (*args, self.flops_rate, self.overhead, self.tp)

    def series(
        self, batch: int, kv_tokens: int, context_tokens: int, first: int, count: int, comm: float
    ) -> list[float]:
        """Seconds of decode iterations ``first .. first + count - 1`` of a batch of
        ``batch`` requests holding ``kv_tokens`` resident tokens and ``context_tokens``
        context at iteration 0 (each iteration adds one token per request), ``comm`` the
        all-reduces' seconds of one iteration (``tp > 1``)."""
        weights, kv_bytes = self.weights, self.kv_bytes
        dense = self.dense * batch
        per_pair, mem_rate, flops_rate = self.per_pair, self.mem_rate, self.flops_rate
        overhead, tp = self.overhead, self.tp
        b = float(batch)
        out: list[float] = []
        for i in range(first, first + count):
            step = i * b
            t_mem = (weights + kv_bytes * (kv_tokens + step)) / mem_rate
            t_flops = (dense + per_pair * (context_tokens + step)) / flops_rate
            if tp == 1:
                out.append(overhead + (t_mem if t_mem >= t_flops else t_flops))
            else:
                t_flops /= tp
                out.append(overhead + (t_mem if t_mem >= t_flops else t_flops) + comm)
        return out


def pairwise_sum(values: Sequence[float], n: int) -> float:
    """The sum of ``values[:n]`` as numpy sums a float64 array (``np.sum``): pairwise, in
    blocks of at most 128 added by eight interleaved accumulators, so that a run of
    iterations summed here lands on exactly the clock an array sum gives.

    Args:
        values: at least ``n`` floats.
        n: how many of them, from the first.
    """
    if n < 8:
        total = 0.0
        for i in range(n):
            total += values[i]
        return total
    if n <= 128:
        whole = n - n % 8
        r0, r1, r2, r3 = values[0], values[1], values[2], values[3]
        r4, r5, r6, r7 = values[4], values[5], values[6], values[7]
        for j in range(8, whole, 8):
            r0 += values[j]
            r1 += values[j + 1]
            r2 += values[j + 2]
            r3 += values[j + 3]
            r4 += values[j + 4]
            r5 += values[j + 5]
            r6 += values[j + 6]
            r7 += values[j + 7]
        total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        for i in range(whole, n):
            total += values[i]
        return total
    half = n // 2
    half -= half % 8
    return pairwise_sum(values, half) + pairwise_sum(values[half:n], n - half)
