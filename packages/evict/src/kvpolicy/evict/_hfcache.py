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
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from transformers.cache_utils import CacheLayerMixin

from kvpolicy.evict._replay import Residency, replay
from kvpolicy.kvmodel import EvictionPolicy

__all__ = ["ATTENTION", "PolicyLayer", "policy_attention", "register_attention"]

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


class PolicyLayer(CacheLayerMixin):  # type: ignore[no-untyped-call]
    """One decoder layer's keys and values, padded per row, and its eviction policy.

    ``keys``/``values`` are ``(rows, kv_heads, slots, head_dim)``; row ``r`` holds
    ``held[r]`` resident tokens in slots ``[0, held[r])`` (the rest is padding), whose true
    positions are ``positions[r]``. ``get_seq_length`` is the number of tokens the layer
    has seen (padding of a left-padded prompt included), as transformers' sliding-window
    layers report it, so that ``generate`` and the model place new tokens right however
    many were evicted.
    """

    is_sliding = False
    is_croppable = False

    def __init__(self, index: int, policy: EvictionPolicy, budget: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.index = index
        self.policy = policy
        self.budget = budget
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

        This is where a policy's decisions reach the tensors: a policy that also demotes
        tokens to a lower precision would quantize the kept slots it names here.
        """
        state = Residency(
            [list(range(int(h))) for h in self.held],
            [list(p) for p in self.positions],
            self.next_position,
        )
        att = weights.float().mean(dim=1).double().cpu().numpy()  # (rows, q, slots)
        streams = [f"row{r}" for r in range(self.rows)]
        evicted, most = replay(
            self.policy, self.budget, att, real, state, self._slots_before, streams
        )
        self.evicted += evicted
        self.max_resident = max(self.max_resident, most)
        width = max((len(c) for c in state.slots), default=0)
        index = torch.zeros(self.rows, width, dtype=torch.long)
        for r, c in enumerate(state.slots):
            index[r, : len(c)] = torch.as_tensor(c, dtype=torch.long)
            self.held[r] = len(c)
            self.positions[r] = np.array(state.positions[r], dtype=np.int64)
        gather = index.to(self.keys.device)[:, None, :, None]
        shape = (-1, self.keys.shape[1], -1, self.keys.shape[3])
        self.keys = self.keys.gather(2, gather.expand(*shape))
        self.values = self.values.gather(2, gather.expand(*shape))


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
    groups = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(groups, dim=1)
    v = value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, k.transpose(2, 3)).float() * scaling
    queries = int(query.shape[2])
    real = None
    if layer is not None:
        allowed, real = layer.mask(queries, attention_mask, scores.device)
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    elif attention_mask is not None:
        block = attention_mask[..., : k.shape[-2]]
        if block.dtype == torch.bool:
            scores = scores.masked_fill(~block, torch.finfo(scores.dtype).min)
        else:
            scores = scores + block.float()
    weights = torch.softmax(scores, dim=-1).to(query.dtype)
    out = torch.matmul(weights, v).transpose(1, 2).contiguous()
    if layer is not None and real is not None:
        layer.after_attention(weights, real)
    return out, weights
