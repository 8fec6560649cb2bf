"""Needle in the middle: records planted at 25%, 50% and 75% of a long context of filler.

The key-value lookup (``_lookup.py``) plants its records right after the prompt's start, so a
policy that keeps the first tokens (attention sinks, a large ``num_sink``) recalls them
without judging anything. Here the records sit inside the filler, far from both ends:
``records_per_depth`` records ("The code of falcon is 48213.") start at each depth ``d``
(a fraction of the context before the questions), and the prompt ends with every record
asked again in a shuffled order. The model is scored, teacher-forced, on the digits of the
answers, and the accuracy is reported per depth: a policy that keeps only the start and the
end of the context recalls none of them.

The filler is a text of the harness (``--text``: GPL-3, ``argparse.py``, pydoc topics) cut
at token boundaries; codes and question order come from ``seed``: the prompt is the same on
every run and offline.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
from attrs import field, frozen
from attrs.validators import instance_of
from numpy.typing import NDArray

from kvpolicy.evict.quality._lookup import KEY_WORDS

__all__ = ["DEPTHS", "NeedleTask", "build_needle"]

DEPTHS = (0.25, 0.5, 0.75)
"""Depths of the planted records, fractions of the context before the questions."""

_QUESTION = "\n\nNow recall the codes mentioned in the text above.\n"


@frozen
class NeedleTask:
    """Token ids of a needle prompt, the positions scored and the depth each belongs to."""

    input_ids: Any = field()
    """(n,) int64 torch tensor."""
    scored: NDArray[np.int64] = field(eq=False)
    """Positions ``t`` (indices into the (n - 1,) per-step arrays) whose next token
    ``input_ids[t + 1]`` is a digit of an answer."""
    scored_depth: NDArray[np.float64] = field(eq=False)
    """(len(scored),) the depth of the record each scored digit answers."""
    depths: tuple[float, ...] = field(validator=instance_of(tuple))
    """The depths asked for, in order."""
    starts: tuple[int, ...] = field(validator=instance_of(tuple))
    """Token index where the records of each depth begin (``depths`` order)."""
    context: int = field(validator=instance_of(int))
    """Tokens before the questions (filler and records); the depths are fractions of it."""

    def accuracy(self, correct: NDArray[np.bool_]) -> float:
        """Fraction of all scored digits predicted right (``correct`` from a DecodeResult).

        Raises:
            ValueError: ``correct`` is not ``(n - 1,)``.
        """
        return float(_check_correct(correct, self)[self.scored].mean())

    def depth_accuracy(self, correct: NDArray[np.bool_]) -> dict[str, float]:
        """Fraction of the scored digits predicted right at each depth, keyed by the depth
        written as ``f"{d:g}"`` (``"0.25"``), for JSON rows.

        Raises:
            ValueError: ``correct`` is not ``(n - 1,)``.
        """
        arr = _check_correct(correct, self)
        hits = arr[self.scored]
        return {f"{d:g}": float(hits[self.scored_depth == d].mean()) for d in self.depths}


def _check_correct(correct: NDArray[np.bool_], task: NeedleTask) -> NDArray[np.bool_]:
    arr = np.asarray(correct, dtype=bool)
    n = int(task.input_ids.shape[0]) - 1
    if arr.shape != (n,):
        raise ValueError(f"'correct' must have shape ({n},): {arr.shape}")
    return arr


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def _digit_start(tokenizer: Any, line: list[int], code: str) -> int:
    digits = []
    for d in code:
        piece = _ids(tokenizer, d)
        if len(piece) != 1:
            raise ValueError(f"tokenizer splits digit {d!r} into {len(piece)} tokens")
        digits.append(piece[0])
    for i in range(len(line) - len(digits), -1, -1):
        if line[i : i + len(digits)] == digits:
            return i
    raise ValueError("the code's digits are not single tokens in the tokenised record")


def build_needle(
    tokenizer: Any,
    filler: str,
    tokens: int,
    *,
    depths: Sequence[float] = DEPTHS,
    records_per_depth: int = 2,
    digits: int = 5,
    seed: int = 0,
) -> NeedleTask:
    """A needle prompt of exactly ``tokens`` tokens.

    Layout: filler, with ``records_per_depth`` records inserted where each depth's fraction
    of the context falls (the context is everything before the questions), then the
    question line and every record again in a shuffled order (their digits are scored).

    Args:
        tokenizer: the model's tokenizer (digits must be single tokens, as in SmolLM2's).
        filler: the text the records are planted in (its beginning is used).
        tokens: total length.
        depths: strictly increasing fractions in (0, 1).
        records_per_depth: records at each depth (``len(depths) * records_per_depth`` at
            most ``len(KEY_WORDS)``).
        digits: digits per code.
        seed: seed of the codes and of the order of the questions.

    Raises:
        ValueError: bad ``depths``, ``records_per_depth`` or ``digits`` (named with the
            value), ``tokens`` too short to separate the depths, or ``filler`` too short.
    """
    ds = tuple(depths)
    if not ds or any(
        isinstance(d, bool) or not isinstance(d, int | float) or not 0 < d < 1 for d in ds
    ):
        raise ValueError(f"'depths' must be fractions in (0, 1): {depths!r}")
    if any(b <= a for a, b in itertools.pairwise(ds)):
        raise ValueError(f"'depths' must be strictly increasing: {depths!r}")
    ds = tuple(float(d) for d in ds)
    if not isinstance(records_per_depth, int) or records_per_depth < 1:
        raise ValueError(f"'records_per_depth' must be an int >= 1: {records_per_depth!r}")
    if len(ds) * records_per_depth > len(KEY_WORDS):
        raise ValueError(
            f"'records_per_depth' = {records_per_depth} at {len(ds)} depths needs "
            f"{len(ds) * records_per_depth} names, {len(KEY_WORDS)} exist"
        )
    if not isinstance(digits, int) or not 1 <= digits <= 12:
        raise ValueError(f"'digits' must be an int in [1, 12]: {digits!r}")
    import torch

    rng = random.Random(seed)
    words = KEY_WORDS[: len(ds) * records_per_depth]
    codes = {w: "".join(rng.choice("0123456789") for _ in range(digits)) for w in words}
    depth_of = {w: ds[i // records_per_depth] for i, w in enumerate(words)}
    blocks: list[list[int]] = []
    for i in range(len(ds)):
        block: list[int] = []
        for w in words[i * records_per_depth : (i + 1) * records_per_depth]:
            block += _ids(tokenizer, f"\nThe code of {w} is {codes[w]}.\n")
        blocks.append(block)
    tail = _ids(tokenizer, _QUESTION)
    scored: list[tuple[int, float]] = []
    order = list(words)
    rng.shuffle(order)
    for w in order:
        line = _ids(tokenizer, f"The code of {w} is {codes[w]}.\n")
        start = _digit_start(tokenizer, line, codes[w])
        scored += [(len(tail) + start + i, depth_of[w]) for i in range(digits)]
        tail += line
    context = tokens - len(tail)
    room = context - sum(len(b) for b in blocks)
    # Each record block starts where its depth falls in the context; the filler between
    # two blocks (and before the first) must be non-empty so the depths stay apart.
    starts = [round(d * context) for d in ds]
    cuts: list[int] = []
    used = 0
    for start, block in zip(starts, blocks, strict=True):
        cut = start - used
        if cut < 1 or (cuts and cut <= cuts[-1]):
            raise ValueError(
                f"'tokens' = {tokens} is too short for records at depths {list(ds)}: "
                "give more tokens or fewer records"
            )
        cuts.append(cut)
        used += len(block)
    if room < 16 or cuts[-1] > room:
        raise ValueError(
            f"'tokens' = {tokens} leaves {room} tokens of filler for the records at depths "
            f"{list(ds)}; give more tokens or fewer records"
        )
    pad = _ids(tokenizer, filler)[:room]
    if len(pad) < room:
        raise ValueError(f"'filler' has {len(pad)} tokens, {room} are needed")
    ids: list[int] = []
    begin = 0
    placed = []
    for cut, block in zip(cuts, blocks, strict=True):
        ids += pad[begin:cut]
        placed.append(len(ids))
        ids += block
        begin = cut
    ids += pad[begin:]
    offset = len(ids)
    ids += tail
    # Position t predicts ids[t + 1]; a digit at index i of ids is scored at t = i - 1.
    return NeedleTask(
        input_ids=torch.tensor(ids, dtype=torch.long),
        scored=np.array([offset + i - 1 for i, _ in scored], dtype=np.int64),
        scored_depth=np.array([d for _, d in scored], dtype=np.float64),
        depths=ds,
        starts=tuple(placed),
        context=offset,
    )
