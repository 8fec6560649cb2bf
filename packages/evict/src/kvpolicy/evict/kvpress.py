"""A kvpress press that runs any kvpolicy eviction policy, so that kvpress's pipeline and
evaluation scripts can run Token-PD (or H2O, sink+window, ...) beside their own presses.

```python
from transformers import pipeline
from kvpolicy.evict import TokenPDPolicy
from kvpolicy.evict.kvpress import policy_press

pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)  # eager attention
press = policy_press(TokenPDPolicy, compression_ratio=0.75)   # keep 25% of the context
answer = pipe(context, question=question, press=press)["answer"]
```

kvpress is imported only when a press is built (it is optional: kvpress 0.5.x needs
transformers < 5.3, the ``quality_peers`` nox session's environment).

How the policy sees the context: kvpress calls a press after each attention layer of the
prefill with that layer's keys, values and attention weights. The press replays the context
through one fresh policy per layer exactly as the quality harness decodes a text (token by
token: insert, observe that query's attention on the resident tokens, evict), on the
prefill's own attention (:func:`kvpolicy.evict._replay.replay`), and keeps what the policy
keeps: ``int(n * (1 - compression_ratio))`` tokens of an ``n``-token context per layer (the
count kvpress's scorer presses keep), summed over the rows of a batch (batch-global). With
``decoding=True`` it also holds that many tokens per layer during generation, one policy
step per generated token (kvpress's ``DecodingPress`` at interval 1 does the same with a
scorer).

It needs the attention weights: load the model with ``attn_implementation="eager"``
(kvpress's ``ObservedAttentionPress`` has the same need). The rows of a batch must keep
equal counts in each layer (one key tensor holds them): kvpress's pipeline runs one context
at a time, and budget-filling policies always do. Not supported: ``QuantizedCache``, and
with ``decoding=True`` several questions on one compressed context (kvpress crops the
cache back to the context after each answer, which assumes the context was not touched).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kvpolicy.evict._replay import Residency, replay
from kvpolicy.kvmodel import EvictionPolicy

__all__ = ["policy_press"]


class _LayerState:
    """One layer's policy and what it holds (slots ``[0, held)`` of each row)."""

    def __init__(self, policy: EvictionPolicy, rows: int) -> None:
        self.policy = policy
        self.state = Residency.empty(rows)
        self.budget = 0


def _check(compression_ratio: object, decoding: object, policy: object) -> None:
    if not callable(policy):
        raise TypeError(f"'policy' must build a policy (a class or function): {policy!r}")
    if (
        isinstance(compression_ratio, bool)
        or not isinstance(compression_ratio, int | float)
        or not 0 <= compression_ratio < 1
    ):
        raise ValueError(f"'compression_ratio' must be a number in [0, 1): {compression_ratio!r}")
    if not isinstance(decoding, bool):
        raise ValueError(f"'decoding' must be a bool: {decoding!r}")


def policy_press(
    policy: Callable[[], EvictionPolicy],
    compression_ratio: float = 0.0,
    *,
    decoding: bool = False,
) -> Any:
    """A kvpress press (a ``kvpress.BasePress``) that evicts with a kvpolicy policy.

    Args:
        policy: builds one fresh policy per layer and per context (``TokenPDPolicy``,
            ``lambda: H2OPolicy(recent_window=64)``).
        compression_ratio: fraction of the context to evict, kvpress's convention (0.75
            keeps 25%).
        decoding: also hold the kept count during generation (one policy step per token).

    Raises:
        TypeError: ``policy`` is not callable.
        ValueError: ``compression_ratio`` outside [0, 1) or ``decoding`` not a bool.
        ImportError: kvpress is not installed (the message says how to get it).
    """
    _check(compression_ratio, decoding, policy)
    try:
        import kvpress  # type: ignore[import-not-found]
    except ImportError as exc:
        raise ImportError(
            "policy_press needs kvpress (pip install 'kvpress==0.5.5' 'transformers<5.3'; "
            "the quality_peers nox session builds that environment)"
        ) from exc
    return _press_class(kvpress.BasePress)(
        policy=policy, compression_ratio=float(compression_ratio), decoding=decoding
    )


def _press_class(base: type) -> type:
    """The press class, built on kvpress's ``BasePress`` (imported only when needed)."""
    from dataclasses import dataclass, field

    import torch

    @dataclass
    class KVPolicyPress(base):  # type: ignore[misc]
        """kvpress press driven by a kvpolicy eviction policy (see
        :func:`kvpolicy.evict.kvpress.policy_press`)."""

        policy: Callable[[], EvictionPolicy] = field(default=lambda: _no_policy())
        compression_ratio: float = 0.0
        decoding: bool = False
        layers: dict[int, _LayerState] = field(default_factory=dict, repr=False)

        def forward_hook(self, module: Any, input: Any, kwargs: dict[str, Any], output: Any) -> Any:
            hidden = kwargs["hidden_states"]
            cache: Any = kwargs.get("past_key_values", kwargs.get("cache"))
            queries = int(hidden.shape[1])
            position = kwargs.get("cache_position")
            prefill = position is None or int(position[-1]) <= queries
            index = int(module.layer_idx)
            if prefill:
                self.layers.pop(index, None)
            elif not self.decoding or index not in self.layers:
                return output
            if type(cache).__name__ == "QuantizedCache":
                raise ValueError("the kvpolicy press does not support QuantizedCache")
            weights = output[1]
            if weights is None:
                raise ValueError(
                    "the kvpolicy press needs the attention weights: load the model with "
                    "attn_implementation='eager'"
                )
            layer = cache.layers[index]
            rows = int(layer.keys.shape[0])
            if prefill:
                entry = _LayerState(self.policy(), rows)
                entry.budget = rows * max(1, int(queries * (1 - self.compression_ratio)))
                self.layers[index] = entry
            entry = self.layers[index]
            first = int(layer.keys.shape[2]) - queries
            kept = len(entry.state.slots[0]) if rows else 0
            if first != kept:
                raise ValueError(
                    f"layer {index} holds {first} tokens before this step, the press kept "
                    f"{kept}: something else changed the cache between steps"
                )
            att = weights.float().mean(dim=1).double().cpu().numpy()
            real = np.ones((rows, queries), dtype=bool)
            streams = [f"row{r}" for r in range(rows)]
            replay(entry.policy, entry.budget, att, real, entry.state, first, streams)
            counts = {len(s) for s in entry.state.slots}
            if len(counts) != 1:
                raise ValueError(
                    f"the rows of the batch keep different numbers of tokens in layer "
                    f"{index} ({sorted(counts)}): run one context at a time"
                )
            index_t = torch.as_tensor(entry.state.slots, dtype=torch.long, device=layer.keys.device)
            gather = index_t[:, None, :, None].expand(
                -1, layer.keys.shape[1], -1, layer.keys.shape[3]
            )
            layer.keys = layer.keys.gather(2, gather).contiguous()
            layer.values = layer.values.gather(2, gather).contiguous()
            held = counts.pop()
            entry.state.slots = [list(range(held)) for _ in range(rows)]
            return output

    return KVPolicyPress


def _no_policy() -> EvictionPolicy:
    raise TypeError("'policy' must build a policy (a class or function)")
