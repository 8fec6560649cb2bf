"""The small Protocols other kvpolicy packages implement or consume.

Each contract has one or two methods, so a policy is a small class and a composition of
policies is itself a policy. No ``__init__`` is part of any contract.

Token-level eviction works on *streams* (one per running request, or per request and KV
head) and on token *positions* within a stream. Arrays are numpy so that a policy can handle
a million cached tokens per step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from kvpolicy.kvmodel._fleet import FleetView, ReplicaView, RoutingRequest
from kvpolicy.kvmodel._types import GateDecision, Request, SchedulerState, SequenceView, TierFetch

if TYPE_CHECKING:  # numpy only in annotations: importing kvmodel does not import it
    import numpy as np
    from numpy.typing import NDArray

__all__ = [
    "AdmissionPolicy",
    "Autoscaler",
    "CompletionObserver",
    "DemotingPolicy",
    "EvictionPolicy",
    "PreemptionPolicy",
    "PrefixStore",
    "PromptObserver",
    "RequestGate",
    "Router",
    "Scheduled",
    "ThroughputScalable",
    "reads_prefix_blocks",
]


@runtime_checkable
class AdmissionPolicy(Protocol):
    """Decides how many waiting requests join the running batch in one iteration."""

    def admit(self, state: SchedulerState, waiting: Sequence[Request]) -> int:
        """Return how many requests from the head of ``waiting`` to admit now.

        Args:
            state: the server at the start of the iteration.
            waiting: the waiting queue, head first.

        Returns:
            A count in ``[0, len(waiting)]``. The caller admits that many, in order.
        """
        ...


@runtime_checkable
class CompletionObserver(Protocol):
    """Learns from finished requests (online estimation of the length mix)."""

    def observe_completion(self, request: Request, time: float) -> None:
        """Record that ``request`` finished at ``time`` after ``request.decode_len`` tokens."""
        ...


@runtime_checkable
class PreemptionPolicy(Protocol):
    """Orders running requests for preemption when memory runs out."""

    def order(self, running: Sequence[SequenceView]) -> list[str]:
        """Return the request ids of ``running``, the first to preempt first."""
        ...


@runtime_checkable
class EvictionPolicy(Protocol):
    """Batch-global token eviction: one budget across every stream on a GPU.

    The caller reports tokens as they enter the cache (:meth:`insert`), the attention they
    receive (:meth:`observe`), and asks for evictions down to a budget (:meth:`evict`).
    After :meth:`evict` returns, :meth:`resident_tokens` never exceeds the budget.
    """

    def insert(
        self,
        stream: str,
        positions: NDArray[np.int64],
        signals: NDArray[np.float64] | None = None,
    ) -> None:
        """Add tokens to the cache.

        Args:
            stream: stream (request) id; created on first use.
            positions: (n,) int64 token positions within the stream, new to the cache.
            signals: optional (n, k) float64 per-token features (e.g. a predicted return,
                logit entropy); their meaning is the policy's.
        """
        ...

    def observe(
        self, stream: str, positions: NDArray[np.int64], attention: NDArray[np.float64]
    ) -> None:
        """Record attention mass received this step by resident tokens.

        Args:
            stream: stream id.
            positions: (n,) int64 resident positions.
            attention: (n,) float64 attention mass each received this step.
        """
        ...

    def evict(self, budget_tokens: int) -> Mapping[str, NDArray[np.int64]]:
        """Evict tokens until at most ``budget_tokens`` remain resident.

        Returns:
            For each stream that lost tokens, the (m,) int64 evicted positions.
        """
        ...

    def remove(self, stream: str) -> None:
        """Forget a finished or preempted stream and all its tokens."""
        ...

    def resident_tokens(self) -> int:
        """Tokens resident across every stream."""
        ...


@runtime_checkable
class DemotingPolicy(EvictionPolicy, Protocol):
    """An :class:`EvictionPolicy` that also lowers the precision of resident tokens.

    Each resident token is in one *state*: the bits it is held at (16 for fp16/bf16, 8, 4
    or 2 for integer codes with scales, kvmodel's :data:`KV_PRECISIONS`), and an evicted
    token is in state 0. A token enters at the highest precision; a state only goes down
    (a token held at 4 bits has lost what 16 bits said, and evicting is final). The budget
    is in bytes across every stream (what :func:`quantized_token_bytes` counts, scales and
    zero points included). The caller reports tokens and attention as for an
    :class:`EvictionPolicy` and calls :meth:`allocate` where it would call ``evict``; it
    then holds each token as the states returned say (quantizes the K/V of a demoted token,
    drops an evicted one). ``evict(budget_tokens)`` keeps its meaning (a count of tokens,
    at whatever precision each is held), so a demoting policy also runs wherever an
    eviction policy does, and a caller that wants bytes wraps an eviction-only policy
    (kvpolicy-evict's ``UniformPrecision``) instead.
    """

    def allocate(
        self, budget_bytes: float
    ) -> Mapping[str, tuple[NDArray[np.int64], NDArray[np.int64]]]:
        """Demote and evict tokens until at most ``budget_bytes`` are held.

        Args:
            budget_bytes: bytes the resident tokens of every stream may hold, >= 0.

        Returns:
            For each stream whose tokens changed state, ``(positions, bits)``: (m,) int64
            positions, ascending, and (m,) int64 new states (0: evicted; otherwise lower
            than the token's state before the call).
        """
        ...

    def resident_bytes(self) -> float:
        """Bytes the resident tokens of every stream hold in their current states."""
        ...


@runtime_checkable
class Scheduled(Protocol):
    """Optional for an :class:`EvictionPolicy`: a cadence of rounds, not only the budget.

    A policy without it runs a round only when the budget requires one. A policy with it
    (kvpolicy-evict's ``Periodic(policy, interval)``) also wants a round every so many
    steps. The caller counts steps with :meth:`tick` and runs a round once
    :attr:`steps_until_due` reaches 0. :attr:`steps_until_due` falls by ``n`` with
    ``tick(n)`` (never below 0) and changes otherwise only when :meth:`EvictionPolicy.evict`
    runs a round, so a caller may read it once after each round and count on from there.
    """

    @property
    def steps_until_due(self) -> int:
        """Steps until the cadence makes a round due (0: due now)."""
        ...

    def tick(self, n: int = 1) -> None:
        """Count ``n >= 0`` steps."""
        ...


@runtime_checkable
class RequestGate(Protocol):
    """Admission at the gateway, before a request reaches the server (seed 004).

    The gate answers each arriving request with a :class:`GateDecision` and learns when an
    admitted request finishes, so that what it promised (tokens/s, KV bytes, concurrency) is
    released. A denied request holds nothing.
    """

    def check(self, request: Request, time: float) -> GateDecision:
        """Admit ``request`` arriving at ``time`` (seconds), or deny it with a Retry-After."""
        ...

    def release(self, request: Request, time: float) -> None:
        """Record that the admitted ``request`` finished (or was abandoned) at ``time``."""
        ...


@runtime_checkable
class ThroughputScalable(Protocol):
    """Optional for a :class:`RequestGate` sized from an estimate of the server's throughput.

    A caller that observes the server's real service rate (a simulator, a gateway that
    measures its backend) scales every token rate the gate holds by ``factor`` at ``time``.
    """

    @property
    def tokens_per_s(self) -> float:
        """The server's tokens per second the gate assumes now."""
        ...

    def scale_throughput(self, factor: float, time: float) -> None:
        """Multiply the gate's token rates by ``factor`` (> 0) from ``time`` on."""
        ...


@runtime_checkable
class PrefixStore(Protocol):
    """KV prefix blocks kept below HBM (DRAM, disk) after the GPU's prefix cache drops them.

    Blocks are named by their chained prefix hashes (:func:`chain_block_hashes`), so a block
    stands for its whole prefix and a lookup is a run from the first block.
    """

    def offload(self, block_hashes: Sequence[int], time: float) -> None:
        """Offer blocks that HBM's prefix cache just dropped; the store may keep or refuse them."""
        ...

    def fetch(self, block_hashes: Sequence[int], time: float) -> TierFetch:
        """The leading run of ``block_hashes`` held below HBM, loaded back into HBM at ``time``.

        The caller asks only for the blocks HBM misses; the blocks found are promoted (the
        store may keep its copies) and their transfer time is returned.
        """
        ...


@runtime_checkable
class PromptObserver(Protocol):
    """Optional for a :class:`PrefixStore`: learns each prompt's whole block chain.

    A store whose placement depends on which prefix a block belongs to (seed 003's
    per-group TTLs) cannot tell from a block's hash alone; the caller shows it every
    prompt's chain, first block first, before any of its blocks is offloaded.
    """

    def observe_prompt(self, block_hashes: Sequence[int], time: float) -> None:
        """Record that a prompt with these chained block hashes arrived at ``time``."""
        ...


@runtime_checkable
class Router(Protocol):
    """Picks the replica of a fleet that serves one request (after the gateway admitted it).

    A router that never reads :attr:`ReplicaView.prefix_blocks` may say so with a class
    attribute ``reads_prefix_blocks = False`` (optional, not part of the Protocol's check;
    read it with :func:`reads_prefix_blocks`): a caller may then show it views without
    their prefix blocks and spare the work of finding them. Its choices must not depend
    on them. One whose choices read no load at all (neither counts, KV memory, prefix
    blocks nor signal age: round-robin, random) may say ``reads_load = False`` (read it
    with :func:`reads_load`): with a fixed fleet and no gateway a simulator may then serve
    each replica's share apart.

    A router that keeps state between decisions may ask, with ``follows_changed_since =
    True`` (optional likewise), to be shown which views changed: a caller may then pass a
    sequence of views carrying ``changed_since = (the views shown before, positions
    rebuilt since)`` (kvpolicy-tenancy's gateway fleet does, over 16 replicas or more),
    and with it, optionally, ``prefix_shown = positions whose views report prefix
    blocks``: the positions of ``changed_since`` then name only the views showing another
    load (every field but ``prefix_blocks``), not those shown again with other blocks.
    It is a hint: the router's choice must equal what it would pick from the views alone,
    and a router must ignore a hint that does not name the views it was shown last.
    """

    def route(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> str | None:
        """The ``replica_id`` of one of ``replicas`` for ``request``, or None.

        Args:
            request: the request to place.
            replicas: the fleet's replicas as last observed (views may be stale), draining
                ones included.

        Returns:
            The id of a replica in ``replicas`` that is not draining; None only when every
            replica is draining (or there is none): no replica can take the request.
        """
        ...


def reads_prefix_blocks(router: object) -> bool:
    """Whether ``router`` may read its views' prefix blocks: False only for a router that
    says so (``reads_prefix_blocks = False``, see :class:`Router`)."""
    return getattr(router, "reads_prefix_blocks", True) is not False


@runtime_checkable
class Autoscaler(Protocol):
    """Sizes a fleet: the replica count it should have, decided at one time."""

    def target(self, fleet: FleetView) -> int:
        """The number of replicas (>= 1) the fleet should have from ``fleet.time`` on.

        The caller starts replicas (after a provisioning delay) or drains them until up
        plus provisioning replicas equal the target.
        """
        ...
