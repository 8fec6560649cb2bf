"""Value types shared by every kvpolicy package.

They are frozen, slotted attrs classes validated when built: a wrong type raises
``TypeError`` and a wrong value ``ValueError``, naming the field and the value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import attrs
from attrs import field, frozen
from attrs.validators import ge, gt, instance_of

__all__ = [
    "GateDecision",
    "MemoryBudget",
    "Request",
    "SchedulerState",
    "SequenceView",
    "TierFetch",
]


def _hashes(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


def _views(value: Iterable[SequenceView]) -> Sequence[SequenceView]:
    # A tuple, or a read-only Sequence an engine builds on first access (building every
    # view at every iteration costs more than a policy that never reads them saves).
    if isinstance(value, tuple) or (isinstance(value, Sequence) and not isinstance(value, list)):
        return value
    return tuple(value)


def _finite(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"'{attribute.name}' must be finite: {value!r}")


@frozen
class Request:
    """One inference request as it arrives at a server.

    ``decode_len`` is the number of tokens the request will generate. A simulator knows it;
    a policy should not peek at it (real requests do not declare it) unless it models an
    oracle on purpose.
    """

    request_id: str = field(validator=instance_of(str))
    """Unique identifier of the request."""
    prompt_len: int = field(validator=[instance_of(int), ge(1)])
    """Input (prefill) length in tokens, ``l0`` of seed 002."""
    decode_len: int = field(validator=[instance_of(int), ge(1)])
    """Output (decode) length in tokens, ``l1`` of seed 002."""
    arrival_time: float = field(default=0.0, converter=float, validator=[_finite, ge(0.0)])
    """Arrival time in seconds since the start of the workload."""
    tenant: str = field(default="default", validator=instance_of(str))
    """Tenant (client) the request belongs to."""
    priority: int = field(default=0, validator=instance_of(int))
    """Larger is more important."""
    prefix_hashes: tuple[int, ...] = field(default=(), converter=_hashes)
    """Chained hashes of the prompt's full blocks, for prefix caching (may be empty)."""
    hash_block_size: int = field(default=16, validator=[instance_of(int), ge(1)])
    """Tokens each of ``prefix_hashes`` covers. An engine with larger blocks (a multiple of
    it) re-chunks them with :func:`rechunk_hashes`; a pool refuses hashes of another
    granularity than its block size."""

    @property
    def total_len(self) -> int:
        """Tokens held at completion: ``prompt_len + decode_len``."""
        return self.prompt_len + self.decode_len


@frozen
class SequenceView:
    """Read-only snapshot of one running sequence, as a policy sees it."""

    request_id: str = field(validator=instance_of(str))
    """Identifier of the request this sequence serves."""
    prompt_len: int = field(validator=[instance_of(int), ge(1)])
    """Input length in tokens."""
    generated: int = field(validator=[instance_of(int), ge(0)])
    """Tokens decoded so far."""
    kv_tokens: int = field(validator=[instance_of(int), ge(0)])
    """Tokens whose KV is resident in GPU memory now (after any token eviction)."""
    tenant: str = field(default="default", validator=instance_of(str))
    """Tenant of the request."""
    priority: int = field(default=0, validator=instance_of(int))
    """Larger is more important."""
    arrival_time: float = field(default=0.0, converter=float, validator=_finite)
    """Arrival time of the request in seconds."""
    admitted_time: float = field(default=0.0, converter=float, validator=_finite)
    """Time the request was (last) admitted to the running batch."""
    computed_tokens: int = field(default=0, validator=[instance_of(int), ge(0)])
    """Prompt and decode tokens computed so far (what preemption by recomputation loses)."""

    @property
    def progress(self) -> int:
        """Decode steps done: seed 002's stage ``j`` of a request."""
        return self.generated


@frozen
class MemoryBudget:
    """KV memory available on one GPU, in tokens and bytes."""

    capacity_tokens: int = field(validator=[instance_of(int), ge(1)])
    """Number of tokens whose KV fits (``M`` of seed 002)."""
    bytes_per_token: int = field(default=1, validator=[instance_of(int), gt(0)])
    """KV bytes of one token (see :meth:`ModelSpec.kv_bytes_per_token`)."""

    @property
    def capacity_bytes(self) -> int:
        """``capacity_tokens * bytes_per_token``."""
        return self.capacity_tokens * self.bytes_per_token


@frozen
class SchedulerState:
    """What an admission policy sees at the start of one iteration."""

    step: int = field(validator=[instance_of(int), ge(0)])
    """Iteration index since the start."""
    time: float = field(converter=float, validator=_finite)
    """Simulated (or wall-clock) time in seconds."""
    used_tokens: int = field(validator=[instance_of(int), ge(0)])
    """KV tokens resident now."""
    capacity_tokens: int = field(validator=[instance_of(int), ge(1)])
    """KV tokens that fit (the hard budget)."""
    running: Sequence[SequenceView] = field(default=(), converter=_views)
    """The running batch (a tuple, or a read-only sequence built when first read)."""

    @property
    def free_tokens(self) -> int:
        """Capacity left now (never negative)."""
        return max(0, self.capacity_tokens - self.used_tokens)


@frozen
class GateDecision:
    """A gateway's answer to one request: admit it, or deny it (HTTP 429) with a Retry-After.

    A denied request carries the seconds after which the client should try again and the
    check that denied it, so a client (real or simulated) can back off and a report can say
    why.
    """

    admitted: bool = field(validator=instance_of(bool))
    """Whether the request may go on to the server."""
    retry_after: float = field(default=0.0, converter=float, validator=[_finite, ge(0.0)])
    """Seconds the client should wait before retrying (0 when admitted)."""
    reason: str = field(default="", validator=instance_of(str))
    """The check that denied the request (empty when admitted), e.g. ``"concurrency"``."""

    def __attrs_post_init__(self) -> None:
        if self.admitted and self.retry_after != 0.0:
            raise ValueError(f"'retry_after' must be 0 for an admitted request: {self.retry_after}")
        if not self.admitted and not self.reason:
            raise ValueError("'reason' must name the check that denied the request")


@frozen
class TierFetch:
    """What the tiers below HBM hold of a prompt's prefix, and the cost of bringing it back."""

    blocks: int = field(default=0, validator=[instance_of(int), ge(0)])
    """Leading blocks found (a run from the first block asked for; stops at the first miss)."""
    seconds: float = field(default=0.0, converter=float, validator=[_finite, ge(0.0)])
    """Transfer time of those blocks into HBM, in seconds."""
    tier: str = field(default="", validator=instance_of(str))
    """Name of the slowest tier the blocks came from (empty when nothing was found)."""
