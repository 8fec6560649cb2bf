"""The workload of seed 002: request classes, their mix and the KV memory of one GPU."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import attrs
from attrs import field, frozen

from kvpolicy.kvmodel import Request

__all__ = ["StabilityWorkload"]


def _int_tuple(name: str, values: object) -> tuple[int, ...]:
    if isinstance(values, int | str | bytes) or not isinstance(values, Iterable):
        raise TypeError(f"'{name}' must be a sequence of integers: {values!r}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                raise ValueError(f"'{name}' must hold integers, not floats: {v!r}")
            raise ValueError(f"'{name}' must hold positive integers: {v!r}")
        if v <= 0:
            raise ValueError(f"'{name}' must hold positive integers: {v!r}")
        out.append(int(v))
    if not out:
        raise ValueError(f"'{name}' must not be empty: {values!r}")
    return tuple(out)


def _input_lens(values: object) -> tuple[int, ...]:
    return _int_tuple("input_lens", values)


def _decode_lens(values: object) -> tuple[int, ...]:
    return _int_tuple("decode_lens", values)


def _mix(values: object) -> tuple[float, ...]:
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise TypeError(f"'mix' must be a sequence of proportions: {values!r}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise TypeError(f"'mix' must hold numbers: {v!r}")
        f = float(v)
        if not math.isfinite(f) or f <= 0.0:
            raise ValueError(f"'mix' must hold positive proportions: {v!r}")
        out.append(f)
    if not out:
        raise ValueError(f"'mix' must not be empty: {values!r}")
    return tuple(out)


def _memory(_inst: object, _attr: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"'memory' must be an int: {value!r}")
    if value <= 0:
        raise ValueError(f"'memory' must be positive: {value!r}")


@frozen
class StabilityWorkload:
    """``K`` request classes sharing one GPU of ``M`` KV tokens (seed 002, §2.2 and §4.1).

    Class ``k`` has input length ``l0,k``, decoding length ``l1,k`` and proportion ``p_k``
    of the admissions. At decoding stage ``j`` a class-``k`` request holds
    ``w_kj = l0,k + 1 + j`` tokens.

    Raises:
        ValueError: non-positive or non-integer lengths, lists of different lengths,
            proportions that do not sum to 1, or ``memory <= max(l0,k + l1,k)``.
    """

    input_lens: tuple[int, ...] = field(converter=_input_lens)
    """Input lengths ``l0,k`` in tokens, one per class."""
    decode_lens: tuple[int, ...] = field(converter=_decode_lens)
    """Decoding lengths ``l1,k`` in tokens, one per class."""
    memory: int = field(validator=_memory)
    """KV capacity ``M`` of the GPU in tokens."""
    mix: tuple[float, ...] = field(default=(1.0,), converter=_mix)
    """Admission proportions ``p_k``; they sum to 1."""

    def __attrs_post_init__(self) -> None:
        k = len(self.input_lens)
        if len(self.decode_lens) != k:
            raise ValueError(
                f"'decode_lens' must have one entry per class of 'input_lens' ({k}): "
                f"{self.decode_lens!r}"
            )
        if len(self.mix) != k:
            raise ValueError(
                f"'mix' must have one entry per class of 'input_lens' ({k}): {self.mix!r}"
            )
        if abs(math.fsum(self.mix) - 1.0) > 1e-9:
            raise ValueError(f"'mix' must sum to 1: {self.mix!r} sums to {math.fsum(self.mix)}")
        largest = max(a + b for a, b in zip(self.input_lens, self.decode_lens, strict=True))
        if self.memory <= largest:
            raise ValueError(
                f"'memory' must exceed the largest request footprint max(l0+l1) = {largest}: "
                f"{self.memory!r}"
            )

    @classmethod
    def homogeneous(cls, input_len: int, decode_len: int, memory: int) -> StabilityWorkload:
        """One class (``K = 1``) of §3."""
        return cls(input_lens=(input_len,), decode_lens=(decode_len,), memory=memory)

    @classmethod
    def from_requests(cls, requests: Sequence[Request], memory: int) -> StabilityWorkload:
        """Classes are the distinct ``(prompt_len, decode_len)`` pairs, mixed by count."""
        if not requests:
            raise ValueError(f"'requests' must not be empty: {requests!r}")
        counts: dict[tuple[int, int], int] = {}
        for r in requests:
            key = (r.prompt_len, r.decode_len)
            counts[key] = counts.get(key, 0) + 1
        keys = sorted(counts)
        total = len(requests)
        mix = [counts[key] / total for key in keys]
        mix[-1] = 1.0 - math.fsum(mix[:-1])
        return cls(
            input_lens=tuple(k[0] for k in keys),
            decode_lens=tuple(k[1] for k in keys),
            memory=memory,
            mix=tuple(mix),
        )

    @property
    def num_classes(self) -> int:
        """``K``."""
        return len(self.input_lens)

    @property
    def max_decode_len(self) -> int:
        """``max_k l1,k``: the length of the longest pipeline."""
        return max(self.decode_lens)

    def with_memory(self, memory: int) -> StabilityWorkload:
        """The same classes on a GPU of ``memory`` tokens."""
        return attrs.evolve(self, memory=memory)

    def with_input_len(self, input_len: int) -> StabilityWorkload:
        """Every class given the common input length ``input_len`` (memory unchanged)."""
        return attrs.evolve(self, input_lens=(input_len,) * self.num_classes)
