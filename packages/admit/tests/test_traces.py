"""Replay of the public Azure LLM conversation trace through the model (arrivals and lengths)."""

from __future__ import annotations

import csv
import datetime as dt
import pathlib

import pytest

from kvpolicy.admit import TraceArrivals, simulate_model
from kvpolicy.kvmodel import Request

TRACES = pathlib.Path(__file__).resolve().parents[3] / ".." / "shared" / "traces"
AZURE = TRACES / "azure-llm-2023-conv" / "AzureLLMInferenceTrace_conv.csv"

pytestmark = pytest.mark.traces


def _requests(limit: int) -> list[Request]:
    if not AZURE.exists():
        pytest.skip(f"public trace not found at {AZURE} (see ../shared/traces)")
    out = []
    with AZURE.open(newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            if i == limit:
                break
            stamp = dt.datetime.fromisoformat(row["TIMESTAMP"][:26])
            out.append((stamp, int(row["ContextTokens"]), int(row["GeneratedTokens"])))
    t0 = out[0][0]
    return [
        Request(f"az{i}", max(p, 1), max(d, 1), (t - t0).total_seconds())
        for i, (t, p, d) in enumerate(out)
    ]


class TestAzureReplay:
    """The first 300 conversation requests, 50 ms per iteration, 60,000 KV tokens."""

    def test_every_request_completes_and_rate_limit_never_evicts(self) -> None:
        """Both policies finish all 300 requests; greedy evicts, the rate limiter does not."""
        requests = _requests(300)
        arrivals, workload = TraceArrivals.from_requests(requests, iteration_s=0.05, memory=60_000)
        steps = arrivals.steps[-1] + 4 * workload.max_decode_len
        greedy = simulate_model(workload, steps=steps, arrivals=arrivals, mode="integer")
        limited = simulate_model(
            workload, steps=steps, arrivals=arrivals, mode="integer", policy="rate-limited"
        )
        assert greedy.completed.sum() == 300
        assert limited.completed.sum() == 300
        assert greedy.evictions > 0
        assert limited.evictions == 0
        assert float(greedy.memory.max()) <= 60_000
