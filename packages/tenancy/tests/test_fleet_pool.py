"""The pool follows the fleet: its token rates are the healthy backends' share."""

from __future__ import annotations

import pytest

from kvpolicy.tenancy import Resources, TokenEntitlement, TokenPool, TokenPoolGate
from kvpolicy.tenancy._fleet_pool import PoolFollower, healthy_share
from kvpolicy.tenancy.gateway import LocalGate


def test_healthy_share_by_weight() -> None:
    """The healthy weights over all weights; 0 for an empty fleet."""
    assert healthy_share([(1.0, True), (1.0, False), (2.0, True)]) == 0.75
    assert healthy_share([]) == 0.0


class TestPoolFollower:
    def _gate(self) -> LocalGate:
        pool = TokenPool(
            "p",
            Resources(300, 10**9, 30),
            [TokenEntitlement("a", "guaranteed", Resources(150, 10**8, 10))],
        )
        return LocalGate(TokenPoolGate(pool, 1))

    def test_losing_and_regaining_a_backend(self) -> None:
        """Two of three backends healthy: two thirds of the rates; all back: all of them."""
        gate = self._gate()
        follow = PoolFollower(gate)
        assert follow.follow(2 / 3) == pytest.approx(2 / 3)
        assert gate.tokens_per_s == pytest.approx(200)
        assert gate.entitlement("a").baseline.tokens_per_s == pytest.approx(100)  # type: ignore[union-attr]
        assert follow.follow(0.0) == 1.0  # nothing healthy: the last rates stay
        assert gate.tokens_per_s == pytest.approx(200)
        follow.follow(1.0)
        assert gate.tokens_per_s == pytest.approx(300)

    def test_a_gate_that_cannot_scale_is_left_alone(self, caplog: pytest.LogCaptureFixture) -> None:
        """A gate that is not ThroughputScalable is logged once and never scaled."""
        follow = PoolFollower(object())
        assert "cannot scale its token rates" in caplog.text
        assert follow.follow(0.5) == 1.0

    def test_bad_share(self) -> None:
        """A share outside [0, 1] is refused."""
        with pytest.raises(ValueError, match=r"'share' must be in \[0, 1\]: 1.5"):
            PoolFollower(self._gate()).follow(1.5)


def test_losing_a_backend_lengthens_retry_after() -> None:
    """With a third of the fleet gone a token-denied request waits half as long again for
    its bucket to refill; with the backend back, as long as before."""
    from kvpolicy.kvmodel import Request

    pool = TokenPool(
        "p",
        Resources(300, 10**9, 30),
        [TokenEntitlement("a", "elastic", Resources(30, 10**8, 10), max_output_tokens=100)],
    )
    gate = LocalGate(TokenPoolGate(pool, 1))
    follow = PoolFollower(gate)

    def retry() -> float:
        for i in range(1000):  # empty the bucket, then one more
            decision = gate.check(Request(f"r{i}", 100, 100, tenant="a"))
            if not decision.admitted:
                for j in range(i):
                    gate.release(f"r{j}")
                return decision.retry_after
        raise AssertionError("never denied")

    before = retry()
    follow.follow(2 / 3)
    during = retry()
    follow.follow(1.0)
    assert during > before
    assert retry() == pytest.approx(before, rel=0.2)
