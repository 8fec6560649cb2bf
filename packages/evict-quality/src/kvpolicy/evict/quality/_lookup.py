"""A key-value lookup planted early in a long context: where perplexity hides failures.

Perplexity averages over every position, and most positions only need recent tokens, so a
policy that forgets everything old can still score well. The lookup check plants records
("The code of falcon is 48213.") right after the start of a text, pads with the text
itself up to the requested length, and at the end asks for every record again in a
shuffled order. The model is scored, teacher-forced, on the digits of the answers: the
fraction whose most likely next token is the right digit. With the full cache SmolLM2
copies them from the records; a policy that evicted the records cannot.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
from attrs import field, frozen
from attrs.validators import ge, instance_of
from numpy.typing import NDArray

__all__ = ["KEY_WORDS", "LookupTask", "build_lookup", "lookup_accuracy"]

KEY_WORDS = (
    "falcon",
    "copper",
    "meadow",
    "lantern",
    "harbor",
    "violet",
    "glacier",
    "saffron",
    "timber",
    "orchid",
    "quartz",
    "pepper",
)
"""Names of the planted records."""

_HEADER = "Remember these codes.\n"
_QUESTION = "\n\nNow recall the codes.\n"


@frozen
class LookupTask:
    """Token ids of a lookup prompt and the positions scored."""

    input_ids: Any = field()
    """(n,) int64 torch tensor."""
    scored: NDArray[np.int64] = field(eq=False)
    """Positions ``t`` (indices into the (n - 1,) per-step arrays) whose next token
    ``input_ids[t + 1]`` is a digit of an answer."""
    records: int = field(validator=[instance_of(int), ge(1)])
    """Records planted."""
    distance: int = field(validator=[instance_of(int), ge(0)])
    """Tokens between the last record and the first question."""


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def _digit(tokenizer: Any, d: str) -> int:
    piece = _ids(tokenizer, d)
    if len(piece) != 1:
        raise ValueError(f"tokenizer splits digit {d!r} into {len(piece)} tokens")
    return piece[0]


def _find(seq: list[int], sub: list[int]) -> int:
    for i in range(len(seq) - len(sub), -1, -1):
        if seq[i : i + len(sub)] == sub:
            return i
    raise ValueError("the code's digits are not single tokens in the tokenised record")


def build_lookup(
    tokenizer: Any, filler: str, tokens: int, *, records: int = 8, digits: int = 5, seed: int = 0
) -> LookupTask:
    """A lookup prompt of exactly ``tokens`` tokens.

    Args:
        tokenizer: the model's tokenizer (digits must be single tokens, as in SmolLM2's).
        filler: text that pads the middle (its beginning is used).
        tokens: total length.
        records: records planted (at most ``len(KEY_WORDS)``).
        digits: digits per code.
        seed: seed of the codes and of the order of the questions.

    Raises:
        ValueError: bad ``records``/``digits``, or ``tokens`` too short for the records,
            the questions and some filler, or ``filler`` too short.
    """
    if not isinstance(records, int) or not 1 <= records <= len(KEY_WORDS):
        raise ValueError(f"'records' must be an int in [1, {len(KEY_WORDS)}]: {records!r}")
    if not isinstance(digits, int) or not 1 <= digits <= 12:
        raise ValueError(f"'digits' must be an int in [1, 12]: {digits!r}")
    import torch

    rng = random.Random(seed)
    words = KEY_WORDS[:records]
    codes = {w: "".join(rng.choice("0123456789") for _ in range(digits)) for w in words}
    head = _ids(tokenizer, _HEADER)
    for w in words:
        head += _ids(tokenizer, f"The code of {w} is {codes[w]}.\n")
    tail = _ids(tokenizer, _QUESTION)
    scored: list[int] = []
    order = list(words)
    rng.shuffle(order)
    for w in order:
        line = _ids(tokenizer, f"The code of {w} is {codes[w]}.\n")
        start = _find(line, [_digit(tokenizer, d) for d in codes[w]])
        scored += [len(tail) + start + i for i in range(digits)]
        tail += line
    room = tokens - len(head) - len(tail)
    if room < 16:
        raise ValueError(
            f"'tokens' = {tokens} leaves {room} tokens of filler for {records} records; "
            "give more tokens or fewer records"
        )
    pad = _ids(tokenizer, filler)[:room]
    if len(pad) < room:
        raise ValueError(f"'filler' has {len(pad)} tokens, {room} are needed")
    ids = head + pad + tail
    offset = len(head) + len(pad)
    # Position t predicts ids[t + 1]; a digit at index i of ids is scored at t = i - 1.
    positions = np.array([offset + i - 1 for i in scored], dtype=np.int64)
    return LookupTask(
        input_ids=torch.tensor(ids, dtype=torch.long),
        scored=positions,
        records=records,
        distance=len(pad),
    )


def lookup_accuracy(correct: NDArray[np.bool_], task: LookupTask) -> float:
    """Fraction of the scored digits predicted right (``correct`` from a DecodeResult)."""
    arr = np.asarray(correct, dtype=bool)
    if arr.shape != (int(task.input_ids.shape[0]) - 1,):
        raise ValueError(
            f"'correct' must have shape ({int(task.input_ids.shape[0]) - 1},): {arr.shape}"
        )
    return float(arr[task.scored].mean())
