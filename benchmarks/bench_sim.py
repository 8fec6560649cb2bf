"""Speed of the kvpolicy simulator: the Azure conversation trace and per-request cost.

Figures (seconds of ``simulate``, wall-clock and CPU, workload loading excluded):

- ``azure_full_stack_s`` (and ``_cpu_s``): the 19,366-request Azure conversation trace (one hour) on
  Llama-3-8B / H100-SXM with the kvpolicy stack (every part whose package is installed);
  ``azure_baseline_s`` the vLLM-like stack in the same run, and their ratio. Each is the
  fastest of ``azure_repeats`` runs, the two stacks taking turns, so that a shared machine's
  load weighs on both alike (1 with ``--quick``).
- ``azure_baseline_us_per_request``: the vLLM-like stack's CPU microseconds per request on
  that trace, and ``vidur_ratio``: how many times faster that is than Vidur's published
  ~100 s per 10,000 requests on a CPU of this class (10 ms per request; not measured here).
- ``cpu_us_per_request[stack][workload][n]``: CPU microseconds per simulated request of each
  stack on ``n`` requests of the calibrated ``azure-conv-like`` workload and of an
  overloaded one (the same at 3x its rate: the batch always full), n = 10^3 .. 10^5
  (10^3 .. 10^4 with ``--quick``); ``flatness[stack][workload]`` is the largest cost over
  the smallest (1.0 = perfectly flat).
- ``fleet_cpu_us_per_request[n]``: CPU microseconds per simulated request of a fleet of
  ``n`` replicas (vLLM-like stack, round-robin) serving ``fleet_requests_per_replica``
  requests each of ``azure-conv-like`` at ``n`` times its rate (the same load per
  replica), n = 1, 8, 64 (1, 8 with ``--quick``); ``fleet_ratio`` is the largest ``n``'s
  cost over one replica's (issue 25 asks for at most 1.3 at 64).

Run: ``python benchmarks/bench_sim.py [--quick] [--out DIR]``.
"""

from __future__ import annotations

import pathlib
import time
from typing import Any

from _harness import parse_args, write_result

from kvpolicy.kvmodel import get_gpu, get_model
from kvpolicy.sim import STACK_PRESETS, FleetConfig, simulate
from kvpolicy.sim.workloads import get_workload, load_trace

TRACE = (
    pathlib.Path(__file__).resolve().parents[1]
    / ".."
    / "shared"
    / "traces"
    / "azure-llm-2023-conv"
    / "AzureLLMInferenceTrace_conv.csv"
)


def _time(requests: Any, stack: Any) -> tuple[float, float, Any]:
    """Wall and CPU seconds of one simulation (CPU time is what a shared machine gives us
    reliably; wall time is what a user waits)."""
    model, gpu = get_model("Llama-3-8B"), get_gpu("H100-SXM")
    c0, t0 = time.process_time(), time.perf_counter()
    result = simulate(requests, model, gpu, stack)
    return time.perf_counter() - t0, time.process_time() - c0, result


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    full = STACK_PRESETS["kvpolicy"]
    figures: dict[str, Any] = {
        "stack": {
            "admission": full.admission.name,
            "eviction": full.eviction.name,
            "preemption": full.preemption.name,
        },
    }
    # Warm up: the first run of a stack imports its packages (entry points resolved once);
    # that is start-up, not simulation.
    warm = get_workload("azure-conv-like", seed=1, num_requests=50).requests
    for name in ("vllm", "kvpolicy"):
        _time(warm, STACK_PRESETS[name])
    if TRACE.is_file():
        trace = load_trace(TRACE)
        repeats = 1 if args.quick else 3
        runs: dict[str, list[tuple[float, float, Any]]] = {"vllm": [], "kvpolicy": []}
        for _ in range(repeats):
            for name in runs:
                runs[name].append(_time(trace.requests, STACK_PRESETS[name]))
        base_s, base_cpu, _ = min(runs["vllm"], key=lambda r: r[1])
        full_s, full_cpu, res = min(runs["kvpolicy"], key=lambda r: r[1])
        figures.update(
            azure_repeats=repeats,
            azure_requests=len(trace.requests),
            azure_baseline_s=round(base_s, 3),
            azure_baseline_cpu_s=round(base_cpu, 3),
            azure_full_stack_s=round(full_s, 3),
            azure_full_stack_cpu_s=round(full_cpu, 3),
            azure_full_over_baseline=round(full_cpu / base_cpu, 3),
            azure_baseline_us_per_request=round(1e6 * base_cpu / len(trace.requests), 1),
            vidur_ratio=round(10_000.0 / (1e6 * base_cpu / len(trace.requests)), 1),
            azure_completed=res.summary.completed,
        )
        print(
            f"azure: baseline {base_s:.1f} s ({base_cpu:.1f} s CPU), "
            f"full stack {full_s:.1f} s ({full_cpu:.1f} s CPU)"
        )
    else:
        figures["azure_skipped"] = f"trace not found at {TRACE}"
    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    per_request: dict[str, dict[str, dict[str, float]]] = {}
    flatness: dict[str, dict[str, float]] = {}
    for stack_name in ("vllm", "kvpolicy"):
        per_request[stack_name] = {}
        flatness[stack_name] = {}
        for load, factor in (("azure-conv-like", 1.0), ("overloaded-3x", 3.0)):
            costs: dict[str, float] = {}
            for n in sizes:
                w = get_workload("azure-conv-like", seed=0, num_requests=n)
                if factor != 1.0:
                    w = w.with_rate(factor * w.mean_rate)
                secs, cpu, _ = _time(w.requests, STACK_PRESETS[stack_name])
                costs[str(n)] = round(1e6 * cpu / n, 2)
                print(
                    f"{stack_name:9s} {load:16s} {n:>7,} requests: {secs:.1f} s "
                    f"({cpu:.1f} s CPU), {1e6 * cpu / n:.0f} us CPU each"
                )
            per_request[stack_name][load] = costs
            flatness[stack_name][load] = round(max(costs.values()) / min(costs.values()), 3)
    figures["cpu_us_per_request"] = per_request
    figures["flatness"] = flatness
    figures.update(_fleet_scaling(args.quick))
    write_result("sim", figures, args.out)


def _fleet_scaling(quick: bool, per_replica: int = 200) -> dict[str, Any]:
    """CPU per request of fleets of 1..64 replicas at the same load per replica."""
    import attrs

    costs: dict[str, float] = {}
    for n in (1, 8) if quick else (1, 8, 64):
        w = get_workload("azure-conv-like", seed=0, num_requests=per_replica * n)
        w = w.with_rate(n * w.mean_rate)
        stack = STACK_PRESETS["vllm"]
        if n > 1:
            stack = attrs.evolve(stack, fleet=FleetConfig(n))
        secs, cpu, _ = _time(w.requests, stack)
        costs[str(n)] = round(1e6 * cpu / len(w.requests), 1)
        print(f"fleet of {n:>2}: {len(w.requests):,} requests, {secs:.1f} s ({cpu:.1f} s CPU)")
    largest = max(costs, key=int)
    return {
        "fleet_requests_per_replica": per_replica,
        "fleet_cpu_us_per_request": costs,
        "fleet_ratio": round(costs[largest] / costs["1"], 3),
    }


if __name__ == "__main__":
    main()
