"""What a token *is*, not only how it is attended: the latest occurrence of each content.

A language model copies: an identifier, a defined term or a code seen once is predicted
again, often hundreds of tokens later, by attending to an earlier occurrence of it (an
induction head attends to the token that followed an earlier occurrence of the current
one). Between the two uses the source may receive no more attention than filler, so a
policy that reads attention alone has no reason to keep it. What it can know is the token
ids: the latest occurrence of each content (a token id, or the ids of the last few tokens)
is the copy source a later repeat will find, and an older occurrence of the same content
adds little beside it.

:class:`LatestOccurrences` keeps that bookkeeping per stream; a policy that uses it
implements :class:`ContentAware`, and a caller that knows the token ids (a decoding loop,
a serving engine) hands them over after each insert.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kvpolicy.evict._table import _as_positions

__all__ = ["ContentAware", "LatestOccurrences", "as_token_ids"]


@runtime_checkable
class ContentAware(Protocol):
    """Optional for an eviction policy: it wants the token ids of the tokens it holds."""

    def tokens(self, stream: str, positions: NDArray[np.int64], token_ids: ArrayLike) -> None:
        """The token ids at resident ``positions`` of ``stream``, given once per token
        right after :meth:`insert`, in position order.

        Args:
            stream: stream id.
            positions: (n,) int64 resident positions, ascending, after every position
                given before for ``stream``.
            token_ids: (n,) int64 token ids (or any non-negative content ids) at them.
        """
        ...


def as_token_ids(token_ids: object, n: int) -> NDArray[np.int64]:
    """``token_ids`` as an (n,) int64 array.

    Raises:
        TypeError: not integers.
        ValueError: not ``n`` of them, or a negative id.
    """
    arr = np.asarray(token_ids)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"'token_ids' must be integers: dtype {arr.dtype}")
    arr = arr.astype(np.int64).reshape(-1)
    if arr.size != n:
        raise ValueError(f"'token_ids' must hold {n} ids (one per position): {arr.size}")
    if arr.size and int(arr.min()) < 0:
        raise ValueError(f"'token_ids' must be >= 0: {arr[arr < 0][:5].tolist()}")
    return arr


class LatestOccurrences:
    """Per stream, the position of the latest occurrence of each content.

    The content of the token at position ``p`` is the tuple of the last ``context`` token
    ids up to and including ``p`` in its stream (fewer at the start): with ``context=1``
    its own id, with 2 the pair an induction head matches.

    Args:
        context: tokens per content, 1 to 4.

    Raises:
        TypeError: ``context`` is not an int.
        ValueError: ``context`` outside 1..4.
    """

    __slots__ = ("_context", "_counts", "_last", "_latest", "_tail")

    def __init__(self, context: int = 1) -> None:
        if isinstance(context, bool) or not isinstance(context, int):
            raise TypeError(f"'context' must be int: {context!r}")
        if not 1 <= context <= 4:
            raise ValueError(f"'context' must be in 1..4: {context!r}")
        self._context = context
        self._latest: dict[str, dict[tuple[int, ...], int]] = {}
        self._counts: dict[str, dict[tuple[int, ...], int]] = {}
        self._tail: dict[str, tuple[int, ...]] = {}
        self._last: dict[str, int] = {}

    @property
    def context(self) -> int:
        """Tokens per content."""
        return self._context

    def check(
        self, stream: str, positions: object, token_ids: object
    ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Validate one :meth:`add` without changing anything; ``(positions, ids)``.

        Raises:
            TypeError: ``stream`` not a str, positions or ids not integers.
            ValueError: lengths differ, a negative id, or positions not ascending after
                the last one added to ``stream``.
        """
        if not isinstance(stream, str):
            raise TypeError(f"'stream' must be str: {stream!r}")
        pos = _as_positions(positions)
        ids = as_token_ids(token_ids, pos.size)
        last = self._last.get(stream, -1)
        if pos.size and (int(pos[0]) <= last or (np.diff(pos) <= 0).any()):
            raise ValueError(
                f"'positions' of {stream!r} must ascend after {last}: {pos.tolist()[:10]}"
            )
        return pos, ids

    def add(
        self, stream: str, positions: object, token_ids: object
    ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Record the tokens at ``positions``; each becomes the latest occurrence of its
        content.

        Returns:
            ``(replaced, counts)``: (m,) int64 positions, ascending, that stopped being the
            latest occurrence of their content (earlier positions, or earlier ones of this
            call); (n,) int64 occurrences of each new token's content so far in the
            stream, itself included (1 for a first occurrence).

        Raises:
            As :meth:`check`; nothing changes then.
        """
        pos, ids = self.check(stream, positions, token_ids)
        latest = self._latest.setdefault(stream, {})
        seen = self._counts.setdefault(stream, {})
        tail = self._tail.get(stream, ())
        keep = self._context - 1
        replaced = []
        counts = np.empty(pos.size, dtype=np.int64)
        for i, (p, tok) in enumerate(zip(pos.tolist(), ids.tolist(), strict=True)):
            content = (*tail, tok)
            prev = latest.get(content)
            if prev is not None:
                replaced.append(prev)
            latest[content] = p
            counts[i] = seen[content] = seen.get(content, 0) + 1
            tail = content[len(content) - keep :] if keep else ()
        self._tail[stream] = tail
        if pos.size:
            self._last[stream] = int(pos[-1])
        return np.array(sorted(replaced), dtype=np.int64), counts

    def is_latest(self, stream: str, positions: object) -> NDArray[np.bool_]:
        """(n,) whether each position is the latest occurrence of its content (False for
        positions never added)."""
        pos = _as_positions(positions)
        current = set(self._latest.get(stream, {}).values())
        return np.array([p in current for p in pos.tolist()], dtype=bool)

    def remove(self, stream: str) -> None:
        """Forget a stream (unknown: no-op)."""
        self._latest.pop(stream, None)
        self._counts.pop(stream, None)
        self._tail.pop(stream, None)
        self._last.pop(stream, None)
