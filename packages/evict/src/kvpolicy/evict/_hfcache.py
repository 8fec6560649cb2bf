"""The machinery of :class:`kvpolicy.evict.hf.PolicyCache`: one transformers cache layer per
decoder layer, held to a token budget by a kvpolicy eviction policy, and the attention
function that feeds the policy.

How a step runs in one layer (the order of the quality harness, kvpolicy-evict-quality's
``kvpolicy.evict.quality._decode``):

1. the model calls ``cache.update(keys, values, layer)``: the layer appends the new keys
   and values to its resident ones and hands them to the attention function (a
   thread-local handoff; the function checks it gets the very tensors the cache returned);
2. the attention function (eager attention, registered as :data:`ATTENTION`) masks what
   is not resident (the padding of rows that hold fewer tokens than the longest row, and
   of the left-padded prompt), computes the weights and the output;
3. the layer replays the new tokens in order: each row's token is inserted into the
   policy (stream ``"row{r}"``), the row observes that query's attention on its resident
   tokens (the mean over query heads, renormalised over what is resident: exactly the
   softmax over the resident keys alone), and the policy evicts down to the budget across
   all rows; then the kept keys and values are packed to the front of each row.

So a decode step (one query per row) is the harness's step, and a prompt of ``q`` tokens is
``q`` such steps replayed on the prompt's attention (the prompt's own forward pass attends
to all of it; the cache holds at most the budget once it returns).

Under a budget in bytes (:class:`ByteBudget`) step 3 calls the policy's ``allocate`` (kvmodel's
``DemotingPolicy``; an eviction-only policy runs as ``UniformPrecision(policy, 16)``) where it
would call ``evict``, and applies the state changes as the harness's byte loop
(``kvpolicy.evict.quality._bytes``) does: an evicted token leaves, a demoted token's keys and
values are replaced by their quantized-then-dequantized values at its new precision
(:func:`~kvpolicy.evict.fake_quantize`, groups of channels per token and KV head), so every
later query reads the quantization error; a token demoted twice is re-quantized from what it
held. Bytes are counted from each token's state with kvmodel's cost model.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any, cast

import numpy as np
import torch
from attrs import define, field, frozen
from numpy.typing import NDArray
from transformers.cache_utils import CacheLayerMixin

from kvpolicy.evict._gqa import grouped_output, grouped_scores
from kvpolicy.evict._precision import EVICTED, PrecisionCosts
from kvpolicy.evict._quantize import fake_quantize
from kvpolicy.evict._replay import Residency, replay
from kvpolicy.kvmodel import DemotingPolicy, EvictionPolicy, ModelSpec

__all__ = [
    "ATTENTION",
    "ByteBudget",
    "PolicyLayer",
    "Replayed",
    "layer_costs",
    "policy_attention",
    "register_attention",
    "replay_states",
]

ATTENTION = "kvpolicy_policy_cache"
"""Name of the attention implementation a :class:`PolicyCache` needs
(``model.set_attn_implementation(ATTENTION)``; ``PolicyCache.attached(model)`` does it)."""

_HANDOFF = threading.local()


def register_attention() -> None:
    """Register :func:`policy_attention` (and the eager mask it reads) with transformers."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    AttentionInterface.register(ATTENTION, policy_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, eager_mask)


def _row_positions() -> NDArray[np.int64]:
    return np.empty(0, dtype=np.int64)


def layer_costs(num_kv_heads: int, head_dim: int, group_size: int = 32) -> PrecisionCosts:
    """Bytes of one token of one decoder layer (every KV head, K and V) at 16, 8, 4 and 2
    bits, scales and zero points of ``group_size`` channels included (kvmodel's
    ``quantized_token_bytes``; 16 bits counts 2 bytes per element whatever dtype the model
    computes in): what a :class:`PolicyLayer` held to bytes counts."""
    spec = ModelSpec(f"one layer, {num_kv_heads} KV heads of {head_dim}", 1, num_kv_heads, head_dim)
    return PrecisionCosts.of(spec, group_size=group_size)


@frozen
class ByteBudget:
    """A budget in bytes for one layer, over the rows of a batch."""

    budget_bytes: float = field()
    """Bytes the layer may hold after every token, summed over the rows."""
    group_size: int = field(default=32)
    """Channels per quantization group of a demoted token (what the costs assume)."""


@define
class Replayed:
    """What :func:`replay_states` did in one forward pass."""

    evicted: int = 0
    """Tokens evicted."""
    most_tokens: int = 0
    """The most tokens held (all rows) after any step."""
    most_bytes: float = 0.0
    """The most bytes held (all rows) after any step."""
    demoted: list[tuple[int, int, int]] = field(factory=list)
    """``(row, slot, bits)`` of every demotion, in the order they happened."""


def _changed(
    r: int,
    change: tuple[NDArray[np.int64], NDArray[np.int64]],
    state: Residency,
    bits: list[list[int]],
    price: dict[int, float],
    out: Replayed,
) -> float:
    """Apply one row's state changes to ``state`` and ``bits``; the bytes they add."""
    positions, new_bits = (np.asarray(x, dtype=np.int64) for x in change)
    held = np.asarray(state.positions[r], dtype=np.int64)
    where = np.searchsorted(held, positions)
    if (
        positions.shape != new_bits.shape
        or (where >= held.size).any()
        or not np.array_equal(held[np.minimum(where, held.size - 1)], positions)
    ):
        raise RuntimeError(
            f"the policy changed the state of positions row {r} does not hold: "
            f"{positions[:5].tolist()}"
        )
    delta = 0.0
    for k, b in zip(where.tolist(), new_bits.tolist(), strict=True):
        old = bits[r][k]
        if b not in price:
            raise ValueError(
                f"the policy put a token at {b} bits, which the cache's costs do not price: "
                f"{sorted(price)}"
            )
        if b != EVICTED and b >= old:
            raise RuntimeError(f"the policy raised a token of row {r} from {old} to {b} bits")
        delta += price[b] - price[old]
        if b == EVICTED:
            out.evicted += 1
        else:
            bits[r][k] = b
            out.demoted.append((r, state.slots[r][k], b))
    gone = set(where[new_bits == EVICTED].tolist())
    if gone:
        keep = [k for k in range(held.size) if k not in gone]
        state.slots[r] = [state.slots[r][k] for k in keep]
        state.positions[r] = [state.positions[r][k] for k in keep]
        bits[r] = [bits[r][k] for k in keep]
    return delta


def replay_states(
    policy: DemotingPolicy,
    budget: ByteBudget,
    costs: PrecisionCosts,
    attention: NDArray[np.float64],
    real: NDArray[np.bool_],
    state: Residency,
    bits: list[list[int]],
    first_slot: int,
    streams: list[str],
) -> Replayed:
    """:func:`~kvpolicy.evict._replay.replay` under a budget in bytes: insert, observe and
    ``allocate`` for each new token in order; ``state`` and ``bits`` (per row, the bits of
    each resident token) are updated in place.

    Returns:
        What was evicted, the most tokens and bytes held after any step, and the demotions
        (their slots are those of the layer's key tensor before this forward's packing).

    Raises:
        RuntimeError: the policy goes over the budget, raises a token's precision, names a
            position the row does not hold, or its counts disagree with the cache's.
        ValueError: the policy chooses a precision ``costs`` does not price.
    """
    rows, queries = int(attention.shape[0]), int(attention.shape[1])
    price = {int(b): float(c) for b, c in costs.token_bytes.items()}
    price[EVICTED] = 0.0
    held = sum(price[b] for row in bits for b in row)
    out = Replayed()
    limit = budget.budget_bytes * (1 + 1e-9)
    for i in range(queries):
        for r in range(rows):
            if not real[r, i]:
                continue
            p = int(state.next_position[r])
            state.next_position[r] += 1
            policy.insert(streams[r], np.array([p], dtype=np.int64), None)
            state.slots[r].append(first_slot + i)
            state.positions[r].append(p)
            bits[r].append(16)
            held += price[16]
            a = attention[r, i, state.slots[r]]
            total = a.sum()
            policy.observe(
                streams[r],
                np.array(state.positions[r], dtype=np.int64),
                a / total if total > 0 else a,
            )
        changes = policy.allocate(budget.budget_bytes)
        for r in range(rows):
            change = changes.get(streams[r])
            if change is not None and len(change[0]):
                held += _changed(r, change, state, bits, price, out)
        if held > limit:
            raise RuntimeError(
                f"the policy holds {held:g} bytes after a step, over the budget of "
                f"{budget.budget_bytes:g}"
            )
        out.most_tokens = max(out.most_tokens, state.held)
        out.most_bytes = max(out.most_bytes, held)
    if policy.resident_tokens() != state.held:
        raise RuntimeError(
            f"policy reports {policy.resident_tokens()} resident tokens, the cache holds "
            f"{state.held}"
        )
    counted = float(sum(price[b] for row in bits for b in row))
    if abs(policy.resident_bytes() - counted) > 1e-6 * (1.0 + counted):
        raise RuntimeError(
            f"policy reports {policy.resident_bytes():g} bytes, the cache holds {counted:g} "
            f"at the cache's costs {dict(costs.token_bytes)}: build the policy with the "
            "cache's costs (PolicyCache.layer_costs(model.config))"
        )
    return out


def _quantize_slots(
    tensors: tuple[Any, Any], demoted: list[tuple[int, int, int]], group_size: int
) -> None:
    """Replace, in place, the keys and values of every ``(row, slot, bits)`` in ``demoted``
    by their fake-quantized values; a slot demoted twice is quantized twice, in order
    (groups are per token and KV head, so slots quantized together get what each gets
    alone)."""
    rounds: list[dict[int, list[tuple[int, int]]]] = []
    seen: Counter[tuple[int, int]] = Counter()
    for row, slot, b in demoted:
        k = seen[row, slot]
        seen[row, slot] += 1
        while len(rounds) <= k:
            rounds.append({})
        rounds[k].setdefault(b, []).append((row, slot))
    for step in rounds:
        for b, where in sorted(step.items(), reverse=True):
            device = tensors[0].device
            r = torch.tensor([w[0] for w in where], dtype=torch.long, device=device)
            s = torch.tensor([w[1] for w in where], dtype=torch.long, device=device)
            for t in tensors:
                part = t[r, :, s, :]  # (n, kv_heads, head_dim)
                flat = part.reshape(-1, part.shape[-1])
                t[r, :, s, :] = fake_quantize(flat, b, group_size, "token").reshape(part.shape)


class PolicyLayer(CacheLayerMixin):  # type: ignore[no-untyped-call]
    """One decoder layer's keys and values, padded per row, and its policy.

    ``keys``/``values`` are ``(rows, kv_heads, slots, head_dim)``; row ``r`` holds
    ``held[r]`` resident tokens in slots ``[0, held[r])`` (the rest is padding), whose true
    positions are ``positions[r]`` and precisions ``bits[r]`` (16 unless a demoting policy
    under a :class:`ByteBudget` lowered them). ``get_seq_length`` is the number of tokens
    the layer has seen (padding of a left-padded prompt included), as transformers'
    sliding-window layers report it, so that ``generate`` and the model place new tokens
    right however many were evicted.

    Args:
        index: the decoder layer.
        policy: its policy (a ``DemotingPolicy`` when ``budget`` is a :class:`ByteBudget`).
        budget: tokens (an int) or bytes the layer may hold after every token, all rows.
        costs: bytes of one token of this layer at each precision (what is counted).
    """

    is_sliding = False
    is_croppable = False

    def __init__(
        self,
        index: int,
        policy: EvictionPolicy,
        budget: int | ByteBudget,
        costs: PrecisionCosts | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        if isinstance(budget, ByteBudget) and not isinstance(policy, DemotingPolicy):
            raise TypeError(f"a budget in bytes needs a DemotingPolicy: {policy!r}")
        axis = getattr(policy, "key_axis", "token")
        if axis != "token":
            raise ValueError(
                f"'key_axis' = {axis!r}: the cache quantizes keys per token; keys per "
                "channel (a UniformPrecision residual) run in the quality harness"
            )
        if isinstance(budget, ByteBudget) and costs is None:
            raise ValueError("a budget in bytes needs the 'costs' of a token")
        self.index = index
        self.policy = policy
        self.budget = budget
        self.costs = costs
        self.bits: list[list[int]] = []
        self.max_bytes = 0.0
        self.demoted = 0
        self.keys: Any = None
        self.values: Any = None
        self.rows = 0
        self.held = np.zeros(0, dtype=np.int64)
        self.positions: list[NDArray[np.int64]] = []
        self.next_position = np.zeros(0, dtype=np.int64)
        self.seen = 0
        self.max_resident = 0
        self.evicted = 0
        self._slots_before = 0

    def lazy_initialization(self, key_states: Any, value_states: Any) -> None:
        """Start empty, with the rows, dtype and device of the first keys."""
        rows = int(key_states.shape[0])
        self.device = key_states.device
        self.rows = rows
        self.held = np.zeros(rows, dtype=np.int64)
        self.positions = [_row_positions() for _ in range(rows)]
        self.bits = [[] for _ in range(rows)]
        self.next_position = np.zeros(rows, dtype=np.int64)
        self.keys, self.values = key_states[:, :, :0], value_states[:, :, :0]
        self.is_initialized = True

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """The slots the next forward's attention spans (resident and new), offset 0."""
        return self.slots + query_length, 0

    def get_seq_length(self) -> int:
        """Tokens seen so far (not the resident count): where the next token goes."""
        return self.seen

    def get_max_length(self) -> int:
        """-1: no fixed maximum (the policy holds the budget)."""
        return -1

    def reset(self) -> None:
        """Forget every token (the policy too is replaced by the cache)."""
        self.keys = self.values = None
        self.is_initialized = False
        self.seen = 0
        self.bits = []

    def reorder_cache(self, beam_idx: Any) -> None:
        """Beam search is not supported: the policy's streams are per row."""
        raise NotImplementedError(
            "PolicyCache does not support beam search (num_beams > 1): each row's tokens "
            "are a policy stream"
        )

    def crop(self, tokens_to_remove: int) -> None:
        """Assisted decoding is not supported: evicted tokens cannot be restored."""
        raise NotImplementedError(
            "PolicyCache cannot crop (assisted or speculative decoding): evicted tokens are gone"
        )

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Allowed only before the first forward (``num_return_sequences``)."""
        if self.seen:
            raise NotImplementedError("PolicyCache cannot repeat the rows of a filled cache")

    def batch_select_indices(self, indices: Any) -> None:
        """Not supported: the rows are policy streams."""
        raise NotImplementedError("PolicyCache cannot select rows of a filled cache")

    def bytes_held(self) -> NDArray[np.float64]:
        """(rows,) bytes each row's resident tokens hold at their precisions.

        Raises:
            ValueError: the layer was built without costs.
        """
        if self.costs is None:
            raise ValueError(f"PolicyCache layer {self.index} has no costs to count bytes with")
        return np.array(
            [self.costs.cost(np.array(b, dtype=np.int64)).sum() for b in self.bits],
            dtype=np.float64,
        ).reshape(len(self.bits))

    @property
    def slots(self) -> int:
        """Slots per row in ``keys`` (the most any row holds)."""
        return 0 if self.keys is None else int(self.keys.shape[2])

    def update(self, key_states: Any, value_states: Any) -> tuple[Any, Any]:
        """Append one forward's new keys and values after each row's slots; the attention
        function then reads them (and must be :func:`policy_attention`)."""
        rows = int(key_states.shape[0])
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        elif rows != self.rows:
            raise ValueError(
                f"PolicyCache layer {self.index} holds {self.rows} rows, the forward passes "
                f"{rows}: a cache serves one batch (build a new PolicyCache per generate call)"
            )
        self._slots_before = self.slots
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        self.seen += int(key_states.shape[-2])
        _HANDOFF.layer = self
        return self.keys, self.values

    def mask(self, queries: int, model_mask: Any, device: Any) -> tuple[Any, NDArray[np.bool_]]:
        """``(allowed (rows, 1, queries, slots) bool tensor, real (rows, queries))``: which
        keys each query may attend to, and which new tokens are real (not padding).

        The model's own mask is right only on the first forward (nothing evicted yet); it
        tells which prompt tokens are left padding. Later forwards (decode steps, or a
        continued prompt) have no padding.
        """
        before = self._slots_before
        total = before + queries
        real = np.ones((self.rows, queries), dtype=bool)
        if before == 0 and model_mask is not None and self.seen == queries:
            block = model_mask[..., -queries:]
            ok = block == 0 if block.dtype.is_floating_point else block.bool()
            real = ok.any(dim=-2)[:, 0].cpu().numpy().astype(bool)
        slot = torch.arange(total, device=device)
        resident = slot[None, :] < torch.as_tensor(self.held, device=device)[:, None]
        causal = torch.ones(queries, queries, dtype=torch.bool, device=device).tril()
        new = torch.as_tensor(real, device=device)[:, None, :] & causal[None]
        allowed = torch.cat(
            [resident[:, None, :].expand(-1, queries, -1)[..., :before], new], dim=-1
        )
        return allowed[:, None], real

    def after_attention(self, weights: Any, real: NDArray[np.bool_]) -> None:
        """Replay the new tokens through the policy (insert, observe, evict to the budget
        across rows: :func:`~kvpolicy.evict._replay.replay`) and pack each row's kept keys
        and values to the front.

        This is where a policy's decisions reach the tensors: under a :class:`ByteBudget`
        the policy allocates (:func:`replay_states`) and the kept slots it demoted are
        replaced by their fake-quantized keys and values.
        """
        state = Residency(
            [list(range(int(h))) for h in self.held],
            [list(p) for p in self.positions],
            self.next_position,
        )
        att = weights.float().mean(dim=1).double().cpu().numpy()  # (rows, q, slots)
        streams = [f"row{r}" for r in range(self.rows)]
        bits = [list(b) for b in self.bits]
        if isinstance(self.budget, ByteBudget):
            assert self.costs is not None  # checked at construction
            done = replay_states(
                cast(DemotingPolicy, self.policy),
                self.budget,
                self.costs,
                att,
                real,
                state,
                bits,
                self._slots_before,
                streams,
            )
            evicted, most, demoted = done.evicted, done.most_tokens, done.demoted
            self.max_bytes = max(self.max_bytes, done.most_bytes)
        else:
            evicted, most = replay(
                self.policy, self.budget, att, real, state, self._slots_before, streams
            )
            bits = [[16] * len(c) for c in state.slots]
            demoted = []
            if self.costs is not None:
                self.max_bytes = max(self.max_bytes, most * self.costs.token_bytes[16])
        self.evicted += evicted
        self.max_resident = max(self.max_resident, most)
        width = max((len(c) for c in state.slots), default=0)
        index = torch.zeros(self.rows, width, dtype=torch.long)
        moved: dict[tuple[int, int], int] = {}
        for r, c in enumerate(state.slots):
            index[r, : len(c)] = torch.as_tensor(c, dtype=torch.long)
            self.held[r] = len(c)
            self.positions[r] = np.array(state.positions[r], dtype=np.int64)
            moved.update(((r, old), new) for new, old in enumerate(c))
        self.bits = bits
        gather = index.to(self.keys.device)[:, None, :, None]
        shape = (-1, self.keys.shape[1], -1, self.keys.shape[3])
        self.keys = self.keys.gather(2, gather.expand(*shape))
        self.values = self.values.gather(2, gather.expand(*shape))
        # Demotions of tokens still held, at their slots after packing.
        kept = [(r, moved[r, s], b) for r, s, b in demoted if (r, s) in moved]
        if kept:
            assert isinstance(self.budget, ByteBudget)
            _quantize_slots((self.keys, self.values), kept, self.budget.group_size)
            self.demoted += len(kept)


def _take_handoff(key: Any) -> PolicyLayer | None:
    layer: PolicyLayer | None = getattr(_HANDOFF, "layer", None)
    _HANDOFF.layer = None
    if layer is not None and layer.keys is not key:
        raise RuntimeError(
            "the attention function got keys other than those the PolicyCache returned: "
            "the model transforms cached keys before attention, which PolicyCache does not "
            "support"
        )
    return layer


def policy_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float,
    dropout: float = 0.0,
    **_kwargs: Any,
) -> tuple[Any, Any]:
    """Eager attention that masks what a :class:`PolicyLayer` does not hold and then lets
    its policy evict; with any other cache (or none) it is plain eager attention.

    Args:
        query: (rows, heads, q, head_dim); key, value: (rows, kv_heads, k, head_dim).

    Returns:
        ``(output (rows, q, heads, head_dim), weights (rows, heads, q, k))``.
    """
    layer = _take_handoff(key)
    scores = grouped_scores(query, key).float() * scaling
    queries = int(query.shape[2])
    real = None
    if layer is not None:
        allowed, real = layer.mask(queries, attention_mask, scores.device)
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    elif attention_mask is not None:
        block = attention_mask[..., : key.shape[-2]]
        if block.dtype == torch.bool:
            scores = scores.masked_fill(~block, torch.finfo(scores.dtype).min)
        else:
            scores = scores + block.float()
    weights = torch.softmax(scores, dim=-1).to(query.dtype)
    out = grouped_output(weights, value).transpose(1, 2).contiguous()
    if layer is not None and real is not None:
        layer.after_attention(weights, real)
    return out, weights
