"""The selection kernel against the torch reference and evict's keep rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvpolicy.kernels import select_evictions


def _oracle(g: np.ndarray, budget: int, keep_rule: bool) -> list[int]:
    """The keep rule (eq. 4) then the budget, smallest (g, index) first, in plain Python."""
    order = sorted(range(len(g)), key=lambda i: (float(g[i]), i))
    below = int((g < 0).sum()) if keep_rule else 0
    m = min(len(g), max(below, len(g) - budget))
    return sorted(order[:m])


class TestSelect:
    @pytest.mark.parametrize("n", [1, 5, 1023, 3001])
    @pytest.mark.parametrize("keep_rule", [True, False])
    def test_triton_matches_oracle_with_ties(
        self, n: int, keep_rule: bool, device: torch.device
    ) -> None:
        """Indices equal the oracle's for many tied values, -0.0 and +inf included."""
        g = torch.randint(-3, 6, (n,)).float() / 4.0
        g[::5] = -0.0
        g[7::13] = float("inf")
        for budget in (0, n // 3, n - 1, n, n + 5):
            want = _oracle(g.numpy(), budget, keep_rule)
            got = select_evictions(g.to(device), budget, keep_rule=keep_rule, backend="triton")
            ref = select_evictions(g, budget, keep_rule=keep_rule, backend="torch")
            assert got.indices.cpu().tolist() == want
            assert ref.indices.tolist() == want
            assert got.demand == ref.demand == n - (int((g < 0).sum()) if keep_rule else 0)

    def test_distinct_values(self, device: torch.device) -> None:
        """Continuous g: the m smallest, ascending indices, int64."""
        g = torch.randn(4096)
        got = select_evictions(g.to(device), 1000, backend="triton")
        assert got.indices.dtype == torch.int64
        assert got.indices.cpu().tolist() == _oracle(g.numpy(), 1000, True)

    def test_half_precision_input_is_converted(self) -> None:
        """fp16 g selects as its fp32 image."""
        g = torch.tensor([0.5, -0.25, 0.125, 0.0], dtype=torch.float16)
        assert select_evictions(g, 2).indices.tolist() == [1, 3]

    def test_rejects_bad_input(self) -> None:
        """NaN, 2-D, non-contiguous, integer g and a negative budget raise."""
        with pytest.raises(ValueError, match="NaN"):
            select_evictions(torch.tensor([0.0, float("nan")]), 1)
        with pytest.raises(ValueError, match="1-D"):
            select_evictions(torch.zeros(2, 2), 1)
        with pytest.raises(ValueError, match="contiguous"):
            select_evictions(torch.zeros(8)[::2], 1)
        with pytest.raises(TypeError, match="floating"):
            select_evictions(torch.zeros(3, dtype=torch.int64), 1)
        with pytest.raises(ValueError, match="'budget_tokens' must be >= 0: -1"):
            select_evictions(torch.zeros(3), -1)
