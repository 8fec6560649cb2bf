"""Token-PD on a synthetic online knapsack against the clairvoyant optimum (seed 000, Sec. 4).

Each of T steps reveals n token values ``a ~ Beta(0.5, 5)`` (skewed, as attention mass is);
the budget lets a fraction ``rho`` of all tokens be kept. Token-PD keeps ``g = a - mu c >= 0``
(eq. 4) within a hard budget and updates ``mu`` by eq. 5 with ``eta = eta0 / sqrt(T)``. The
clairvoyant keeps the best ``B`` tokens. Figures: regret/T for each T and its log-log slope
(seed 000 claims ``Regret = O(sqrt T)``, i.e. slope -0.5), regret as a fraction of the
optimum (the ratio against the baseline measured in the same run), and the steps the price
takes to settle within 10% of the clairvoyant threshold from a cold start (``mu_1 = 1``) and
from a warm start (the first batch's clearing price); seed 000 says about 10.

Run: ``python benchmarks/bench_evict_regret.py [--quick] [--out results/bench]``.
"""

from __future__ import annotations

import math

import numpy as np
from _harness import parse_args, write_result

from kvpolicy.evict import TokenPDConfig, clairvoyant_value, online_knapsack, settling_step

N_PER_STEP = 64
RHO = 0.2
SEEDS = 5


def _slope(xs: list[float], ys: list[float]) -> float:
    lx = np.log(np.asarray(xs))
    ly = np.log(np.asarray(ys))
    return float(np.polyfit(lx, ly, 1)[0])


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    horizons = [100, 300, 1000, 3000] if args.quick else [100, 300, 1000, 3000, 10000, 30000]
    rows = []
    for steps in horizons:
        regret, frac, cold, warm, cold25, warm25 = [], [], [], [], [], []
        for seed in range(SEEDS):
            rng = np.random.default_rng(seed)
            values = rng.beta(0.5, 5.0, size=(steps, N_PER_STEP))
            budget = int(RHO * steps * N_PER_STEP)
            best = clairvoyant_value(values, budget)
            threshold = float(-np.partition(-values.ravel(), budget - 1)[budget - 1])
            run = online_knapsack(values, budget, TokenPDConfig(initial_price=1.0))
            assert run.kept <= budget
            regret.append(best - run.value)
            frac.append((best - run.value) / best)
            cold.append(settling_step(run.prices[:-1], threshold, 0.1))
            cold25.append(settling_step(run.prices[:-1], threshold, 0.25))
            warm_run = online_knapsack(values, budget, TokenPDConfig(initial_price=None))
            warm.append(settling_step(warm_run.prices[:-1], threshold, 0.1))
            warm25.append(settling_step(warm_run.prices[:-1], threshold, 0.25))
        rows.append(
            {
                "T": steps,
                "regret_per_step": float(np.mean(regret)) / steps,
                "regret_over_optimum": float(np.mean(frac)),
                "settle_steps_cold_median": float(np.median(cold)),
                "settle_steps_warm_median": float(np.median(warm)),
                "settle_steps_cold_over_sqrtT": float(np.median(cold)) / math.sqrt(steps),
                "settle_steps_cold_median_band25": float(np.median(cold25)),
                "settle_steps_warm_median_band25": float(np.median(warm25)),
            }
        )
        print(rows[-1])
    figures = {
        "setting": {
            "tokens_per_step": N_PER_STEP,
            "budget_fraction": RHO,
            "seeds": SEEDS,
            "values": "Beta(0.5, 5)",
            "eta": "1/sqrt(T)",
            "settle_bands": [0.1, 0.25],
        },
        "rows": rows,
        "loglog_slope_regret_per_step": _slope(
            [r["T"] for r in rows], [r["regret_per_step"] for r in rows]
        ),
    }
    print("log-log slope of regret/T:", figures["loglog_slope_regret_per_step"])
    write_result("evict_regret", figures, args.out)


if __name__ == "__main__":
    main()
