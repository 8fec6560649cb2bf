"""Load speed of the workload loaders and generators, against plain ``csv`` parsing.

Each loader reads its public trace from ``../shared/traces`` (or, when that folder is absent,
a file of the same format and size written from the synthetic presets, so the benchmark runs
anywhere) and builds a :class:`kvpolicy.sim.workloads.Workload`. The baseline is the
cheapest possible read of the Azure CSV: ``csv.reader`` iterating its rows, nothing parsed,
measured in the same run. Figures: rows per second (best of the repeats, by the process's CPU
time, since these machines are shared), and each loader's ratio to the baseline
(``loader rows/s / csv rows/s``: 0.25 means four times the cost of merely splitting the rows).
ServeGen and the generators count requests produced per second.

Run: ``python benchmarks/bench_workloads.py [--quick] [--out results/bench]``
(``--quick``: one repeat and smaller inputs).

When the public traces are present the JSON also records, under ``calibration``, the
statistics that calibrate the synthetic presets, recomputed from the traces with the
package's own fitting code (Gamma rate and CV, lognormal log-moments, quantile tables,
ServeGen client shares and CVs): the numbers tabulated in
``kvpolicy.sim.workloads._calibration`` and checked by ``test_workloads_calibration.py``.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import pathlib
import tempfile
import time
from collections.abc import Callable
from typing import Any

from _harness import parse_args, write_result

from kvpolicy.sim.workloads import (
    GammaArrivals,
    LogNormalLengths,
    QuantileLengths,
    Workload,
    describe,
    get_workload,
    load_trace,
    servegen_client_stats,
)

TRACES = pathlib.Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"
REAL = {
    "azure": TRACES / "azure-llm-2023-conv" / "AzureLLMInferenceTrace_conv.csv",
    "mooncake": TRACES / "mooncake-fast25-conversation" / "conversation_trace.jsonl",
    "lengths": TRACES / "sharegpt-8k-lengths" / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
    "servegen": TRACES / "servegen-bailian" / "reason" / "deepseek-r1",
}


def _write_stand_ins(folder: pathlib.Path, rows: int) -> dict[str, pathlib.Path]:
    """Files in each format, from the synthetic presets, for machines without the traces."""
    paths: dict[str, pathlib.Path] = {}
    w = get_workload("azure-conv-like", num_requests=rows)
    t0 = dt.datetime(2023, 11, 16, 18, 15, 46)
    azure = folder / "azure.csv"
    with azure.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        for r in w.requests:
            stamp = t0 + dt.timedelta(seconds=r.arrival_time)
            out.writerow([stamp.strftime("%Y-%m-%d %H:%M:%S.%f") + "0", r.prompt_len, r.decode_len])
    paths["azure"] = azure
    m = get_workload("mooncake-like", num_requests=rows // 2)
    mooncake = folder / "mooncake.jsonl"
    with mooncake.open("w") as f:
        for i, r in enumerate(m.requests):
            ids = [i * 1000 + k for k in range(-(-r.prompt_len // 512))]
            doc = {"timestamp": int(r.arrival_time * 1000), "input_length": r.prompt_len,
                   "output_length": r.decode_len, "hash_ids": ids}  # fmt: skip
            f.write(json.dumps(doc) + "\n")
    paths["mooncake"] = mooncake
    lengths = folder / "lengths.csv"
    with lengths.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["num_prefill_tokens", "num_decode_tokens"])
        out.writerows((r.prompt_len, r.decode_len) for r in w.requests)
    paths["lengths"] = lengths
    servegen = folder / "servegen"
    servegen.mkdir()
    for client, rate in enumerate((8.0, 4.0, 2.0, 1.0)):
        rows_csv = "".join(f"{k * 600},{rate},1.5,Gamma,0.44,1.0\n" for k in range(144))
        (servegen / f"chunk-{client}-trace.csv").write_text(rows_csv)
    paths["servegen"] = servegen
    return paths


def _best(fn: Callable[[], int], repeats: int) -> dict[str, float]:
    """Best CPU and wall seconds of ``repeats`` calls, and the rows the call produced."""
    cpu, wall, rows = [], [], 0
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        rows = fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
    best_cpu = max(min(cpu), 1e-9)
    return {"rows": rows, "cpu_s": best_cpu, "wall_s": min(wall), "rows_per_s": rows / best_cpu}


def _csv_rows(path: pathlib.Path) -> int:
    with path.open(newline="") as f:
        return sum(1 for _ in csv.reader(f)) - 1


def _lengths(w: Workload) -> dict[str, Any]:
    lognormal = LogNormalLengths.from_workload(w)
    quantiles = QuantileLengths.from_workload(w)
    return {
        "lognormal": {
            "prompt_mu": lognormal.prompt_mu,
            "prompt_sigma": lognormal.prompt_sigma,
            "decode_mu": lognormal.decode_mu,
            "decode_sigma": lognormal.decode_sigma,
            "correlation": lognormal.correlation,
            "max_prompt_len": lognormal.max_prompt_len,
            "max_decode_len": lognormal.max_decode_len,
        },
        "quantiles": {
            "probabilities": list(quantiles.probabilities),
            "prompt": list(quantiles.prompt_quantiles),
            "decode": list(quantiles.decode_quantiles),
            "copula_correlation": quantiles.correlation,
        },
        "describe": describe(w),
    }


def calibration() -> dict[str, Any]:
    """The presets' calibration statistics, recomputed from the public traces."""
    out: dict[str, Any] = {}
    for key, kwargs in (("azure", {}), ("mooncake", {"block_size": 512})):
        w = load_trace(REAL[key], key, **kwargs)  # type: ignore[arg-type]
        arrivals = GammaArrivals.fit(w.arrival_times())
        out[key] = {"rate": arrivals.rate, "cv": arrivals.cv, **_lengths(w)}
    for key, path in (
        ("sharegpt", REAL["lengths"]),
        ("arxiv", TRACES / "arxiv-summarization-lengths"
         / "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"),
    ):  # fmt: skip
        out[key] = _lengths(load_trace(path, "lengths", rate=1.0))
    clients = servegen_client_stats(TRACES / "servegen-bailian" / "language" / "m-small")
    out["servegen_m_small_clients"] = [
        {"client": c.client, "share": c.share, "cv": c.cv, "active_fraction": c.active_fraction}
        for c in clients
    ]
    return out


def main() -> None:
    """Measure and write ``bench_workloads.json``."""
    args = parse_args(__doc__.splitlines()[0])
    repeats = 1 if args.quick else 3
    limit = 5000 if args.quick else None
    with tempfile.TemporaryDirectory() as tmp:
        have_real = all(p.exists() for p in REAL.values())
        paths = REAL if have_real else _write_stand_ins(pathlib.Path(tmp), 20_000)
        figures: dict[str, Any] = {"inputs": "public traces" if have_real else "stand-in files"}
        figures["inputs_paths"] = {k: str(v) for k, v in paths.items()}
        base = _best(lambda: _csv_rows(paths["azure"]), repeats)
        figures["csv_baseline"] = base
        cases: dict[str, Callable[[], int]] = {
            "azure": lambda: load_trace(paths["azure"], "azure", limit=limit).num_requests,
            "lengths": lambda: (
                load_trace(paths["lengths"], "lengths", rate=2.0, limit=limit).num_requests
            ),
            "mooncake_block16": lambda: (
                load_trace(paths["mooncake"], "mooncake", block_size=16, limit=limit).num_requests
            ),
            "mooncake_block512": lambda: (
                load_trace(paths["mooncake"], "mooncake", block_size=512, limit=limit).num_requests
            ),
            "servegen_20k": lambda: (
                load_trace(
                    paths["servegen"], "servegen", limit=5000 if args.quick else 20_000
                ).num_requests
            ),
            "generate_multi_tenant_2k": lambda: get_workload("multi-tenant").num_requests,
            "generate_mooncake_like_2k": lambda: get_workload("mooncake-like").num_requests,
        }
        azure = load_trace(paths["azure"], "azure", limit=limit)
        cases["describe_azure"] = lambda: describe(azure)["num_requests"]
        for name, fn in cases.items():
            result = _best(fn, repeats)
            result["ratio_to_csv"] = result["rows_per_s"] / base["rows_per_s"]
            figures[name] = result
            print(
                f"{name:28s} {result['rows']:>8d} rows  {result['rows_per_s']:>12,.0f} rows/s  "
                f"x{result['ratio_to_csv']:.3f} of csv"
            )
        if have_real:
            figures["calibration"] = calibration()
    write_result("bench_workloads", figures, args.out)


if __name__ == "__main__":
    main()
