"""The gate over a real public trace: Azure LLM inference 2023, conversation (19,366 requests)."""

from __future__ import annotations

import csv
import datetime as dt
import heapq
import pathlib
from collections import Counter

import pytest

from kvpolicy.kvmodel import Request, get_model
from kvpolicy.tenancy import GateConfig, Resources, TokenEntitlement, TokenPool, TokenPoolGate

TRACES = pathlib.Path(__file__).resolve().parents[3] / ".." / "shared" / "traces"
AZURE = TRACES / "azure-llm-2023-conv" / "AzureLLMInferenceTrace_conv.csv"

pytestmark = pytest.mark.traces

CLASSES = ("guaranteed", "elastic", "spot")  # request i goes to tenant i % 3


def _requests() -> list[Request]:
    if not AZURE.exists():
        pytest.skip(f"public trace not found at {AZURE} (see ../shared/traces)")
    with AZURE.open() as f:
        rows = list(csv.DictReader(f))
    t0 = dt.datetime.fromisoformat(rows[0]["TIMESTAMP"][:26])
    out = []
    for i, row in enumerate(rows):
        when = (dt.datetime.fromisoformat(row["TIMESTAMP"][:26]) - t0).total_seconds()
        out.append(
            Request(
                f"az{i}",
                max(1, int(row["ContextTokens"])),
                max(1, int(row["GeneratedTokens"])),
                max(0.0, when),
                CLASSES[i % 3],
            )
        )
    return sorted(out, key=lambda r: r.arrival_time)


class TestAzureConversation:
    @pytest.mark.parametrize("overcommit", [True, False])
    def test_protection_and_conservation(self, overcommit: bool) -> None:
        """Over the whole trace guaranteed is never denied by the pool, spot takes most pool
        denials, every counter returns to zero, and (unless over-committing, seed 004's way)
        the pool never holds more than its 12 slots."""
        model = get_model("Llama-3-8B")
        bpt = model.kv_bytes_per_token()
        slot_kv = 4096 * bpt

        def ent(cls: str, slots: int) -> TokenEntitlement:
            base = Resources(2000.0 * slots, slot_kv * slots, slots)
            burst = (
                None
                if cls == "guaranteed"
                else Resources(4000.0 * slots, 2 * slot_kv * slots, 2 * slots)
            )
            return TokenEntitlement(cls, cls, base, burst, slo_target_s=2.0, max_output_tokens=512)

        pool = TokenPool(
            "azure", Resources(24_000.0, 12 * slot_kv, 12), [ent(c, 4) for c in CLASSES]
        )
        config = GateConfig(overcommit=overcommit, contention_level=1.0 if overcommit else 0.75)
        gate = TokenPoolGate(pool, model, config=config)
        peak = 0
        pending: list[tuple[float, str, Request]] = []
        reasons: Counter[tuple[str, str]] = Counter()
        for req in _requests():
            while pending and pending[0][0] <= req.arrival_time:
                done, _, old = heapq.heappop(pending)
                gate.release(old, done)
            decision = gate.check(req, req.arrival_time)
            reasons[req.tenant, decision.reason or "ok"] += 1
            peak = max(peak, gate.pool_state().in_flight)
            if decision.admitted:
                # A replica serving prompts at 3000 tokens/s and 30 output tokens/s per request.
                finish = req.arrival_time + req.prompt_len / 3000 + req.decode_len / 30
                heapq.heappush(pending, (finish, req.request_id, req))
        while pending:
            done, _, old = heapq.heappop(pending)
            gate.release(old, done)
        pool_denials = ("priority", "pool-full")
        assert all(reasons["guaranteed", why] == 0 for why in pool_denials)
        for why in pool_denials if not overcommit else ("priority",):
            assert reasons["spot", why] > reasons["elastic", why]
        assert (peak <= 12) != overcommit
        assert sum(reasons.values()) == 19_366
        ps = gate.pool_state()
        assert (ps.in_flight, ps.kv_bytes, ps.tokens, ps.reserved_used_slots) == (0, 0, 0, 0)
