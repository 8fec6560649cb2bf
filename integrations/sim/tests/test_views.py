"""Replica views made from the simulator's counts equal the checked constructor's."""

from __future__ import annotations

import attrs

from kvpolicy.kvmodel import ReplicaView
from kvpolicy.sim._views import make_view, replace_view, with_free_blocks


def _checked() -> ReplicaView:
    return ReplicaView(
        replica_id="r3",
        running=5,
        waiting=2,
        kv_usage=1.0 - 30 / 120,
        free_blocks=30,
        block_size=16,
        prefix_blocks={"gpu": frozenset({7, 9})},
        draining=False,
        signal_age_s=0.0,
        model="Llama-3-8B",
        gpu="L40S",
    )


class TestViews:
    def test_make_view_equals_the_checked_view(self) -> None:
        """Every field as ReplicaView(...) sets it (its prefix blocks as sorted pairs)."""
        made = make_view("r3", 5, 2, 30, 120, 16, frozenset({7, 9}), False, 0, "Llama-3-8B", "L40S")
        assert made == _checked()
        assert type(made.signal_age_s) is float

    def test_replace_view_equals_evolve(self) -> None:
        """Draining, age and resident blocks replaced as attrs.evolve replaces them."""
        got = replace_view(_checked(), draining=True, signal_age_s=0.25, gpu_blocks=frozenset({1}))
        want = attrs.evolve(
            _checked(), draining=True, signal_age_s=0.25, prefix_blocks={"gpu": {1}}
        )
        assert got == want

    def test_with_free_blocks_moves_the_usage(self) -> None:
        """Fewer free blocks, the usage they give; nothing else changes."""
        got = with_free_blocks(_checked(), 12, 120)
        assert got == attrs.evolve(_checked(), free_blocks=12, kv_usage=1.0 - 12 / 120)
