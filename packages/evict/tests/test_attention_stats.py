"""attention_statistics: the one definition of the attention statistics, numpy only."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from kvpolicy.evict import (
    attention_statistics,
    heavy_hitter_statistics,
    validate_attention,
)


def _uniform(n: int) -> np.ndarray:
    return np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]


def _random_causal(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = np.tril(rng.lognormal(0.0, 1.5, (n, n)))
    return a / a.sum(axis=1, keepdims=True)


def _reference(mass: np.ndarray, warmup: int) -> dict[str, float]:
    """The per-query loops the statistics were first defined by (kvpolicy evict stats)."""
    n = mass.shape[0]
    queries = np.arange(warmup, n)
    out = {
        "sink_mass_first_token": float(mass[queries, 0].mean()),
        "sink_mass_first_4": float(mass[queries, :4].sum(axis=1).mean()),
        "recent_mass_last_16": float(
            np.mean([mass[q, max(0, q - 15) : q + 1].sum() for q in queries])
        ),
    }
    for d in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        qs = np.arange(max(warmup, d + 4), n)
        if len(qs):
            out[f"attention_at_distance_{d}"] = float(mass[qs, qs - d].mean())
    for p in (1, 5, 10):
        shares = []
        for q in queries:
            row = np.sort(mass[q, : q + 1])[::-1]
            top = max(1, int(np.ceil(len(row) * p / 100)))
            shares.append(row[:top].sum() / row.sum())
        out[f"per_query_top_{p}pct_mass"] = float(np.mean(shares))
        col = np.sort(mass.sum(axis=0))[::-1]
        top = max(1, int(np.ceil(n * p / 100)))
        out[f"accumulated_top_{p}pct_mass"] = float(col[:top].sum() / col.sum())
    return out


class TestDefinitions:
    """The statistics of known matrices."""

    def test_uniform_matrix(self) -> None:
        """A uniform causal matrix: key 0 gets 1/(t+1), the 16 newest 16/(t+1), every query's
        top 1% one key's share, the accumulated mass is the harmonic column sums'."""
        n = 100
        s = attention_statistics(_uniform(n), warmup=20)
        q = np.arange(20, n)
        assert s["tokens"] == 100.0
        assert s["sink_mass_first_token"] == pytest.approx(float(np.mean(1 / (q + 1))))
        assert s["recent_mass_last_16"] == pytest.approx(float(np.mean(16 / (q + 1))))
        assert s["attention_at_distance_1"] == pytest.approx(float(np.mean(1 / (q + 1))))
        assert s["per_query_top_1pct_mass"] == pytest.approx(float(np.mean(1 / (q + 1))))
        col = _uniform(n).sum(axis=0)
        assert s["accumulated_top_1pct_mass"] == pytest.approx(col[0] / n)
        assert s["accumulated_top_10pct_mass"] == pytest.approx(col[:10].sum() / n)

    @pytest.mark.parametrize("seed", [0, 1])
    def test_matches_the_per_query_loops(self, seed: int) -> None:
        """The vectorised statistics equal the loops they were defined by."""
        a = _random_causal(300, seed)
        got = attention_statistics(a, warmup=32)
        for key, value in _reference(a, 32).items():
            assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-15), key

    def test_decay_exponent_of_a_power_law(self) -> None:
        """Weights d^-1 above the sinks give a decay exponent of 1."""
        n = 400
        d = np.subtract.outer(np.arange(n), np.arange(n)).astype(np.float64)
        w = np.where(d >= 0, np.maximum(d, 1.0) ** -1.0, 0.0)
        s = attention_statistics(w / w.sum(axis=1, keepdims=True))
        assert s["decay_exponent"] == pytest.approx(1.0, abs=0.02)

    def test_heavy_hitter_part(self) -> None:
        """heavy_hitter_statistics is the heavy-hitter part of attention_statistics."""
        a = _random_causal(200, 0)
        s = attention_statistics(a)
        part = heavy_hitter_statistics(a)
        assert list(part) == [
            "per_query_top_1pct_mass",
            "per_query_top_5pct_mass",
            "per_query_top_10pct_mass",
            "accumulated_top_1pct_mass",
            "accumulated_top_5pct_mass",
            "accumulated_top_10pct_mass",
            "persistence",
        ]
        assert part == {k: s[k] for k in part}
        assert -1.0 <= part["persistence"] <= 1.0


class TestInput:
    """Bad matrices are refused, naming the problem."""

    @pytest.mark.parametrize(
        ("matrix", "message"),
        [
            (np.ones((3, 4)), "square"),
            (np.full((100, 100), np.nan), "finite"),
            (np.ones((100, 100)) / 100, "causal"),
            (np.tril(np.ones((100, 100))), "rows must sum to 1"),
        ],
    )
    def test_not_an_attention_matrix(self, matrix: np.ndarray, message: str) -> None:
        """A matrix that is not causal row-stochastic raises ValueError."""
        with pytest.raises(ValueError, match=message):
            attention_statistics(matrix)
        with pytest.raises(ValueError, match=message):
            validate_attention(matrix)

    def test_too_short(self) -> None:
        """A matrix no longer than warmup + 8 is refused."""
        with pytest.raises(ValueError, match="longer than warmup \\+ 8 = 72: 40"):
            attention_statistics(_uniform(40))

    def test_bad_warmup(self) -> None:
        """A warmup that is not an int >= 0 is refused."""
        with pytest.raises(TypeError, match="'warmup' must be an int"):
            attention_statistics(_uniform(40), warmup=2.0)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="'warmup' must be >= 0"):
            attention_statistics(_uniform(40), warmup=-1)


def test_importable_without_torch() -> None:
    """The statistics need numpy only: importing them loads no torch."""
    code = "import sys, kvpolicy.evict; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
