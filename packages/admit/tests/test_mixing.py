"""Request mixing across GPUs (§5.2), on the paper's Table 2, 4 and 5 configurations."""

from __future__ import annotations

import pytest

from kvpolicy.admit import RequestClass, mix_verdict, plan_routing


def _classes(lens: tuple[int, ...], l0: int) -> list[RequestClass]:
    return [RequestClass(l0, d, 1 / len(lens)) for d in lens]


class TestPlanRouting:
    """Routing plans and their verdicts."""

    def test_table_2_repaired_with_little_traffic(self) -> None:
        """{5,10} and {6,12} at l0=300: both segregated GPUs unstable; a 7.5% move fixes both."""
        plan = plan_routing(_classes((5, 10, 6, 12), 300), 2, home=(0, 0, 1, 1))
        assert [(v.gcd, v.stable) for v in plan.segregated] == [(5, False), (6, False)]
        assert (plan.mixed.gcd, plan.mixed.stable) == (1, True)
        assert plan.stable
        assert all(v.gcd == 1 for v in plan.verdicts)
        assert plan.moved_traffic == pytest.approx(0.075)
        for column in zip(*plan.fractions, strict=True):
            assert sum(column) == pytest.approx(1.0)

    def test_table_4_falls_back_to_full_mix(self) -> None:
        """{6,10} and {9,15} at l0=30: only the pooled mix (gcd 1, rho 0.991) is stable."""
        plan = plan_routing(_classes((6, 10, 9, 15), 30), 2, home=(0, 0, 1, 1))
        assert [v.gcd for v in plan.segregated] == [2, 3]
        assert plan.stable
        assert plan.fractions == ((0.5, 0.5, 0.5, 0.5), (0.5, 0.5, 0.5, 0.5))
        assert plan.mixed.spectral_radius == pytest.approx(0.991, abs=5e-4)

    def test_table_5_partial_gcd_stays_unstable(self) -> None:
        """{20,40} and {25,50}: pooling leaves gcd 5, so no plan is stable."""
        plan = plan_routing(_classes((20, 40, 25, 50), 30), 2, home=(0, 0, 1, 1))
        assert plan.mixed.gcd == 5
        assert not plan.mixed.stable
        assert not plan.stable

    def test_default_home_is_contiguous_by_decode_length(self) -> None:
        """Without a home, sorted classes fill GPUs by equal memory load, then get repaired."""
        plan = plan_routing(_classes((4, 7), 40), 2)
        # Loads 0.5*4*42 = 84 and 0.5*7*43.5 = 152.25: GPU 0 takes class 0 and a slice of 1.
        assert [v.decode_lens for v in plan.segregated] == [(4, 7), (7,)]
        assert [v.stable for v in plan.segregated] == [True, False]
        assert plan.stable

    def test_margin_is_enforced(self) -> None:
        """A margin larger than the spectral gap makes a gcd-1 mix unstable."""
        verdict = mix_verdict(_classes((6, 9, 10, 15), 30), [0.25] * 4, margin=0.05)
        assert verdict.gcd == 1
        assert not verdict.stable

    def test_bad_input(self) -> None:
        """Zero GPUs, wrong home length and bad shares raise."""
        with pytest.raises(ValueError, match="'gpus'"):
            plan_routing(_classes((4, 7), 40), 0)
        with pytest.raises(ValueError, match="'home'"):
            plan_routing(_classes((4, 7), 40), 2, home=(0,))
        with pytest.raises(ValueError, match="shares must sum to 1"):
            plan_routing([RequestClass(4, 4, 0.3)], 1)


def test_plan_routing_bounds_its_work() -> None:
    """1,000 GPUs would search for minutes: refused with the bound named."""
    classes = [RequestClass(50, 2, 0.5), RequestClass(50, 3, 0.5)]
    with pytest.raises(ValueError, match=r"'gpus' must be in \[1, 128\]: 1000"):
        plan_routing(classes, 1000)
