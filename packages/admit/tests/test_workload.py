"""StabilityWorkload validation: bad input raises a clear error naming the argument."""

from __future__ import annotations

import pytest

from kvpolicy.admit import StabilityWorkload
from kvpolicy.kvmodel import Request


class TestWorkload:
    """StabilityWorkload construction and validation."""

    def test_homogeneous_has_one_class(self) -> None:
        """homogeneous() builds K = 1 with mix (1.0,)."""
        w = StabilityWorkload.homogeneous(2, 3, 24)
        assert (w.input_lens, w.decode_lens, w.mix, w.memory) == ((2,), (3,), (1.0,), 24)
        assert w.num_classes == 1
        assert w.max_decode_len == 3

    @pytest.mark.parametrize("memory", [5, 4, 1])
    def test_memory_must_exceed_largest_request(self, memory: int) -> None:
        """M <= max(l0 + l1) is rejected, naming 'memory'."""
        with pytest.raises(ValueError, match=r"'memory' must exceed .* = 5"):
            StabilityWorkload.homogeneous(2, 3, memory)

    def test_mix_must_sum_to_one(self) -> None:
        """Proportions summing to 0.9 are rejected, naming 'mix'."""
        with pytest.raises(ValueError, match="'mix' must sum to 1"):
            StabilityWorkload((5, 5), (2, 3), 100, (0.5, 0.4))

    @pytest.mark.parametrize(
        ("field", "kwargs"),
        [
            ("input_lens", {"input_lens": (0, 5), "decode_lens": (2, 3)}),
            ("input_lens", {"input_lens": (-1, 5), "decode_lens": (2, 3)}),
            ("decode_lens", {"input_lens": (5, 5), "decode_lens": (2.5, 3)}),
            ("decode_lens", {"input_lens": (5, 5), "decode_lens": (2.0, 3)}),
        ],
    )
    def test_lengths_must_be_positive_integers(self, field: str, kwargs: dict[str, object]) -> None:
        """Zero, negative and non-integer lengths are rejected, naming the argument."""
        with pytest.raises(ValueError, match=f"'{field}'"):
            StabilityWorkload(memory=100, mix=(0.5, 0.5), **kwargs)  # type: ignore[arg-type]

    def test_mismatched_lengths(self) -> None:
        """Lists of different lengths are rejected, naming the shorter one."""
        with pytest.raises(ValueError, match="'decode_lens' must have one entry per class"):
            StabilityWorkload((5, 5), (2,), 100, (0.5, 0.5))
        with pytest.raises(ValueError, match="'mix' must have one entry per class"):
            StabilityWorkload((5, 5), (2, 3), 100, (1.0,))

    def test_negative_proportion(self) -> None:
        """A non-positive proportion is rejected."""
        with pytest.raises(ValueError, match="'mix' must hold positive"):
            StabilityWorkload((5, 5), (2, 3), 100, (1.5, -0.5))

    def test_scalar_lengths_are_a_type_error(self) -> None:
        """A bare int where a sequence is needed is a TypeError."""
        with pytest.raises(TypeError, match="'input_lens'"):
            StabilityWorkload(5, (2,), 100)  # type: ignore[arg-type]

    def test_from_requests_counts_classes(self) -> None:
        """Distinct (prompt, decode) pairs become classes mixed by their counts."""
        reqs = [
            Request(request_id=str(i), prompt_len=p, decode_len=d)
            for i, (p, d) in enumerate([(5, 2), (5, 2), (5, 3), (7, 2)])
        ]
        w = StabilityWorkload.from_requests(reqs, 100)
        assert w.input_lens == (5, 5, 7)
        assert w.decode_lens == (2, 3, 2)
        assert w.mix == (0.5, 0.25, 0.25)
