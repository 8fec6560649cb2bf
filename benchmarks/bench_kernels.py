"""CPU figures of kvpolicy-kernels: the torch fallback's time per batch, and Token-PD's
per-step time with and without the kernels package.

Scoring: ``score_tokens`` on CPU (the torch backend the dispatcher picks for CPU tensors)
for B = 1 and 64 new tokens at V = 49,152, fp32 logits, the MLP (V -> 256 -> 1) and the
compact predictor. Selection: ``select_evictions`` over 10^6 resident tokens on CPU.

Token-PD step: 64 streams each insert one token priced from its logits
(``TokenPDPolicy.insert_logits`` with the compact predictor, CPU tensors) and the cache is
evicted back to its budget; "without" switches off evict's view of the kernels package
(``kvpolicy.evict._kernels._HAS_KERNELS``), which is what an install without the
``[kernels]`` extra sees. On CPU tensors both take evict's own path: the extra must cost
nothing here (the ratio should be ~1).

Run: ``python benchmarks/bench_kernels.py [--quick] [--out results/bench]``. Needs
kvpolicy-kernels; exits 0 with a message when it is absent.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from _harness import parse_args, write_result


def _cpu_ms(fn: Callable[[], Any], reps: int) -> float:
    """Median process CPU milliseconds of ``fn`` (the machines here are shared)."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.process_time()
        fn()
        times.append((time.process_time() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def _scoring(quick: bool) -> list[dict[str, Any]]:
    from kvpolicy.kernels import CompactWeights, MLPWeights, ScoreParams, score_tokens

    v = 49_152
    mlp = MLPWeights(torch.randn(256, v) / v**0.5, torch.randn(256), torch.randn(256), 0.1)
    compact = CompactWeights((-2.0, -0.3, 1.1, -0.4, 0.8, 3.0, 0.2), 0.6)
    params = ScoreParams(price=0.01)
    rows = []
    for b in (1, 64):
        z = torch.randn(b, v) * 2
        pos = torch.arange(b)
        att = torch.rand(b) * 0.05
        reps = 5 if quick else 20
        rows.append(
            {
                "B": b,
                "V": v,
                "mlp_cpu_ms": _cpu_ms(lambda: score_tokens(z, mlp, params), reps),  # noqa: B023
                "compact_cpu_ms": _cpu_ms(
                    lambda: score_tokens(z, compact, params, positions=pos, attention=att),  # noqa: B023
                    reps,
                ),
            }
        )
        print(rows[-1])
    return rows


def _selection(quick: bool) -> dict[str, Any]:
    from kvpolicy.kernels import select_evictions

    n = 1_000_000
    g = torch.randint(-200, 800, (n,)).float() / 1024.0
    ms = _cpu_ms(lambda: select_evictions(g, 900_000), 3 if quick else 10)
    topk = _cpu_ms(lambda: torch.topk(g, n // 10, largest=False), 3 if quick else 10)
    row = {"N": n, "select_cpu_ms": ms, "topk_cpu_ms": topk}
    print(row)
    return row


def _tokenpd_step(quick: bool) -> dict[str, Any]:
    from kvpolicy.evict import TokenPDPolicy, _kernels
    from kvpolicy.evict.predictors import default_compact

    streams, v, budget = 64, 4096, 64 * 512
    pred = default_compact()
    steps = 30 if quick else 120
    rng = np.random.default_rng(0)
    logits = [torch.randn(1, v) * 2 for _ in range(8)]

    def run(enabled: bool) -> float:
        _kernels._HAS_KERNELS = enabled
        policy = TokenPDPolicy()
        for s in range(streams):
            policy.insert(f"s{s}", np.arange(512), np.column_stack((rng.random(512) * 1e-3,) * 2))
        cpu = 0.0
        for step in range(steps):
            t0 = time.process_time()
            for s in range(streams):
                policy.insert_logits(
                    f"s{s}",
                    np.array([512 + step]),
                    logits[(s + step) % 8],
                    pred,
                    attention=np.array([0.01]),
                )
            policy.evict(budget)
            cpu += time.process_time() - t0
        return cpu / steps * 1e3

    saved = _kernels._HAS_KERNELS
    try:
        without = run(False)
        with_k = run(True)
    finally:
        _kernels._HAS_KERNELS = saved
    row = {
        "streams": streams,
        "V": v,
        "step_cpu_ms_without_kernels": without,
        "step_cpu_ms_with_kernels": with_k,
        "ratio_with_over_without": with_k / without,
    }
    print(row)
    return row


def main() -> int:
    args = parse_args(__doc__.splitlines()[0])
    if importlib.util.find_spec("kvpolicy.kernels") is None:
        print("bench_kernels: kvpolicy-kernels is not installed; nothing measured")
        return 0
    figures: dict[str, Any] = {
        "scoring": _scoring(args.quick),
        "selection": _selection(args.quick),
    }
    if importlib.util.find_spec("kvpolicy.evict") is not None:
        figures["tokenpd_step"] = _tokenpd_step(args.quick)
    write_result("bench_kernels", figures, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
