"""Naive against paged utilisation (seed 001 §4)."""

from __future__ import annotations

import numpy as np
import pytest

from kvpolicy.kvmodel import (
    BlockPool,
    naive_utilisation,
    paged_utilisation,
    utilisation_sweep,
)


class TestUtilisation:
    def test_exact_small_case(self) -> None:
        """Lengths 16 and 17 with blocks of 16: 33 tokens in 48 slots; naive 33/64."""
        assert paged_utilisation([16, 17], 16) == 33 / 48
        assert naive_utilisation([16, 17], 32) == 33 / 64

    def test_seed001_sweep(self) -> None:
        """Seed 001: ~24% naive, ~98% paged across batch sizes 10 to 200."""
        points = utilisation_sweep((10, 25, 50, 100, 200))
        assert [p.batch_size for p in points] == [10, 25, 50, 100, 200]
        for p in points:
            assert 0.20 <= p.naive <= 0.28
            assert 0.975 <= p.paged <= 0.995
        mean_naive = np.mean([p.naive for p in points])
        assert abs(mean_naive - 500 / 2048) < 0.02

    def test_shared_system_prompt_holds_13_pages(self) -> None:
        """10 requests sharing a 200-token system prompt hold 13 pages, not 130."""
        pool = BlockPool(num_blocks=200, block_size=16)
        pool.allocate("r0", 200)
        for i in range(1, 10):
            pool.fork("r0", f"r{i}")
        assert pool.stats().used_blocks == 13
        unshared = BlockPool(num_blocks=200, block_size=16)
        for i in range(10):
            unshared.allocate(f"r{i}", 200)
        assert unshared.stats().used_blocks == 130

    @pytest.mark.parametrize(
        ("lengths", "match"),
        [([], "non-empty"), ([0, 3], "must be > 0"), ([1.5], "integers")],
    )
    def test_bad_lengths(self, lengths: list[float], match: str) -> None:
        """Empty, non-positive or fractional lengths are rejected."""
        with pytest.raises((ValueError, TypeError), match=match):
            paged_utilisation(lengths)  # type: ignore[arg-type]

    def test_length_beyond_reservation(self) -> None:
        """A request longer than the naive reservation is rejected."""
        with pytest.raises(ValueError, match="max_len=100"):
            naive_utilisation([101], 100)
