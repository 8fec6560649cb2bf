"""Gateway and tier value types: validation and Protocol conformance."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kvpolicy.kvmodel import (
    GateDecision,
    PrefixStore,
    PromptObserver,
    Request,
    RequestGate,
    TierFetch,
)


class TestGateDecision:
    def test_admitted_has_no_retry_after(self) -> None:
        """An admitted request carries no wait."""
        assert GateDecision(admitted=True).retry_after == 0.0
        with pytest.raises(ValueError, match="retry_after"):
            GateDecision(admitted=True, retry_after=1.0)

    def test_denied_names_its_check(self) -> None:
        """A denial must say which check denied it."""
        d = GateDecision(admitted=False, retry_after=2.5, reason="concurrency")
        assert (d.retry_after, d.reason) == (2.5, "concurrency")
        with pytest.raises(ValueError, match="reason"):
            GateDecision(admitted=False, retry_after=1.0)

    @pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
    def test_retry_after_must_be_finite_and_non_negative(self, bad: float) -> None:
        """A negative or non-finite Retry-After is refused, naming the field."""
        with pytest.raises(ValueError, match="retry_after"):
            GateDecision(admitted=False, retry_after=bad, reason="kv")


class TestTierFetch:
    def test_defaults_to_a_miss(self) -> None:
        """The default fetch found nothing and costs nothing."""
        assert TierFetch() == TierFetch(blocks=0, seconds=0.0, tier="")

    def test_negative_blocks_refused(self) -> None:
        """Block counts are non-negative."""
        with pytest.raises(ValueError, match="blocks"):
            TierFetch(blocks=-1)


class _OneSlotGate:
    def __init__(self) -> None:
        self.busy: str | None = None

    def check(self, request: Request, time: float) -> GateDecision:
        if self.busy is None:
            self.busy = request.request_id
            return GateDecision(admitted=True)
        return GateDecision(admitted=False, retry_after=1.0, reason="concurrency")

    def release(self, request: Request, time: float) -> None:
        if self.busy == request.request_id:
            self.busy = None


class _DictStore:
    def __init__(self) -> None:
        self.held: set[int] = set()

    def offload(self, block_hashes: Sequence[int], time: float) -> None:
        self.held.update(block_hashes)

    def fetch(self, block_hashes: Sequence[int], time: float) -> TierFetch:
        n = 0
        for h in block_hashes:
            if h not in self.held:
                break
            n += 1
        return TierFetch(blocks=n, seconds=0.001 * n, tier="dram" if n else "")


class TestProtocols:
    def test_small_classes_satisfy_them(self) -> None:
        """Two methods make a gate or a store; the Protocols are runtime-checkable."""
        gate, store = _OneSlotGate(), _DictStore()
        assert isinstance(gate, RequestGate)
        assert isinstance(store, PrefixStore)
        assert not isinstance(store, RequestGate)
        assert not isinstance(store, PromptObserver)  # optional: this store does not learn
        r = Request("r", 4, 4)
        assert gate.check(r, 0.0).admitted
        assert gate.check(Request("s", 4, 4), 0.0).reason == "concurrency"
        store.offload([1, 2], 0.0)
        assert store.fetch([1, 2, 3], 0.0).blocks == 2
