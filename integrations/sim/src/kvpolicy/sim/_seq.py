"""The engine's record of one admitted (or preempted) request, shared by its phases."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from typing import overload

from kvpolicy.kvmodel import Request

__all__ = ["Seq", "WaitingView"]


class Seq:
    """Engine-side state of one request between its admission at the gateway and its end.

    The phases share it as a plain record: the batch moves it between queues, the step
    advances ``computed``/``generated`` and grows ``pool_tokens``, the residency ledger
    shrinks ``pool_tokens`` after evictions.
    """

    __slots__ = (
        "admitted_at",
        "computed",
        "generated",
        "hashes",
        "idx",
        "order",
        "pool_reserved",
        "pool_tokens",
        "req",
        "rid",
        "target",
    )

    def __init__(self, idx: int, req: Request, hashes: tuple[int, ...]) -> None:
        self.idx = idx
        """Index of the request in the workload."""
        self.req = req
        self.rid = req.request_id
        self.hashes = hashes
        """Prefix hashes of the prompt's full blocks at the engine's block size."""
        self.generated = 0
        """Output tokens produced."""
        self.target = req.prompt_len
        """Tokens to compute before the next output token."""
        self.computed = 0
        """Of ``target``, computed (or found cached)."""
        self.pool_tokens = 0
        """Tokens of KV held for this request in the block pool."""
        self.pool_reserved = 0
        """Tokens the pool has recorded: ``pool_tokens`` up to its block end."""
        self.order = 0
        """Admission counter (vLLM preempts the largest first)."""
        self.admitted_at = 0.0
        """Time of its last admission to the running batch."""

    @property
    def decoding(self) -> bool:
        """Whether the prompt (and any recomputation) is done."""
        return self.computed >= self.target

    @property
    def written(self) -> int:
        """Logical positions whose KV has been written (prompt computed, outputs fed back)."""
        if self.computed < self.target:
            return self.computed
        return self.req.prompt_len + self.generated - 1


class WaitingView(Sequence[Request]):
    """The waiting queue as the admission policy sees it: requests, head first."""

    __slots__ = ("_q",)

    def __init__(self, q: deque[Seq]) -> None:
        self._q = q

    def __len__(self) -> int:
        return len(self._q)

    @overload
    def __getitem__(self, i: int) -> Request: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Request]: ...
    def __getitem__(self, i: int | slice) -> Request | Sequence[Request]:
        if isinstance(i, slice):
            return [s.req for s in list(self._q)[i]]
        return self._q[i].req

    def __iter__(self) -> Iterator[Request]:
        return (s.req for s in self._q)
