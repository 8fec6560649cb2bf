"""The optimised integer model matches the direct numpy transcription bit for bit."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.admit import StabilityWorkload, TraceArrivals, simulate_model

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from _reference_model import reference_integer

_FIELDS = ("memory", "admitted", "evicted", "completed", "queue")


@st.composite
def _workloads(draw: st.DrawFn) -> StabilityWorkload:
    k = draw(st.integers(1, 4))
    l0 = tuple(draw(st.lists(st.integers(1, 40), min_size=k, max_size=k)))
    l1 = tuple(draw(st.lists(st.integers(1, 30), min_size=k, max_size=k)))
    raw = draw(st.lists(st.integers(1, 10), min_size=k, max_size=k))
    mix = tuple(r / sum(raw) for r in raw)
    memory = max(a + b for a, b in zip(l0, l1, strict=True)) + draw(st.integers(1, 600))
    return StabilityWorkload(l0, l1, memory, mix)


class TestIntegerMatchesReference:
    """Every per-iteration series is identical to the reference implementation."""

    @settings(max_examples=40, deadline=None)
    @given(
        w=_workloads(),
        policy=st.sampled_from(["greedy", "rate-limited"]),
        seed=st.integers(0, 2**16),
    )
    def test_saturated(self, w: StabilityWorkload, policy: str, seed: int) -> None:
        """Saturated input, both built-in policies, random classes and memory."""
        ours = simulate_model(w, steps=150, mode="integer", policy=policy, seed=seed)  # type: ignore[arg-type]
        ref = reference_integer(w, 150, policy, seed=seed)
        for name in _FIELDS:
            np.testing.assert_array_equal(getattr(ours, name), getattr(ref, name), err_msg=name)

    @settings(max_examples=25, deadline=None)
    @given(w=_workloads(), data=st.data())
    def test_trace(self, w: StabilityWorkload, data: st.DataObject) -> None:
        """A random trace replay: the queue, evictions pushed back to its head, admissions."""
        n = data.draw(st.integers(1, 80))
        steps = sorted(data.draw(st.lists(st.integers(0, 100), min_size=n, max_size=n)))
        classes = data.draw(st.lists(st.integers(0, w.num_classes - 1), min_size=n, max_size=n))
        arrivals = TraceArrivals(steps=steps, classes=classes)
        ours = simulate_model(w, steps=120, mode="integer", arrivals=arrivals)
        ref = reference_integer(w, 120, "greedy", arrivals=arrivals)
        for name in _FIELDS:
            np.testing.assert_array_equal(getattr(ours, name), getattr(ref, name), err_msg=name)

    def test_four_classes_long_decodes(self) -> None:
        """The benchmark's 4-class system (decode lengths up to 512), 3,000 iterations."""
        w = StabilityWorkload((64, 128, 256, 512), (128, 255, 384, 512), 200_000, (0.25,) * 4)
        for policy in ("greedy", "rate-limited"):
            ours = simulate_model(w, steps=3000, mode="integer", policy=policy)  # type: ignore[arg-type]
            ref = reference_integer(w, 3000, policy)
            for name in _FIELDS:
                np.testing.assert_array_equal(getattr(ours, name), getattr(ref, name))
