"""A vLLM v1 logits processor that feeds Token-PD's return predictor from the logits.

``vllm serve --logits-processors kvpolicy.vllm:ReturnSignalProcessor``. At every decode
step vLLM hands the processor the batch's next-token logits; the processor turns each row
into kvpolicy-evict's compact features (entropy, top probability, position; the arrival
attention is not exposed to logits processors, so the uniform share ``1 / (position + 1)``
stands in for it), predicts the token's return ``R̂`` and risk ``σ̂²`` with the shipped
:class:`~kvpolicy.evict.predictors.CompactReturnPredictor`, and records them per stream in
:attr:`ReturnSignalProcessor.signals`. The logits are returned unchanged (greedy and
sampled outputs are unaffected).

These ``(R̂, σ̂²)`` pairs are the ``signals`` an ``EvictionPolicy.insert`` takes. In vLLM
the logits processor runs in the worker process and the KV cache manager in the engine-core
process, so a full integration must ship them across (see DESIGN.md); in one process (the
tests, the block-level prototype) they are read directly.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from numpy.typing import NDArray

from kvpolicy.evict.predictors import CompactReturnPredictor, compact_features, default_compact
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

__all__ = ["ReturnSignalProcessor"]

STREAM_KEY = "kvpolicy_stream"
"""``SamplingParams.extra_args`` key naming a request's stream (else a per-process id)."""


class _Slot:
    __slots__ = ("outputs", "prompt_len", "stream")

    def __init__(self, stream: str, prompt_len: int, outputs: list[int]) -> None:
        self.stream = stream
        self.prompt_len = prompt_len
        self.outputs = outputs  # vLLM's live list of the request's output token ids


class ReturnSignalProcessor(LogitsProcessor):  # type: ignore[misc,unused-ignore]
    """Per-token predicted return and risk from the next-token logits (argmax-invariant).

    Args:
        vllm_config: vLLM's config (unused: the predictor is the shipped compact one).
        device: the logits' device.
        is_pin_memory: unused.
    """

    signals: ClassVar[dict[str, list[tuple[int, float, float]]]] = {}
    """stream -> ``(position, R̂, σ̂²)`` per decoded token, shared in one process."""
    _streams = 0

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self._predictor: CompactReturnPredictor = default_compact()
        self._slots: dict[int, _Slot] = {}

    def is_argmax_invariant(self) -> bool:
        """True: the logits are never changed."""
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Track which request sits at each row of the persistent batch."""
        if batch_update is None:
            return
        for index in batch_update.removed:
            self._slots.pop(index, None)
        for index, params, prompt, outputs in batch_update.added:
            extra = getattr(params, "extra_args", None) or {}
            stream = extra.get(STREAM_KEY)
            if stream is None:
                ReturnSignalProcessor._streams += 1
                stream = f"stream-{ReturnSignalProcessor._streams}"
            self._slots[index] = _Slot(str(stream), len(prompt or ()), outputs)
        for a, b, direction in batch_update.moved:
            sa, sb = self._slots.pop(a, None), self._slots.pop(b, None)
            if sa is not None:
                self._slots[b] = sa
            if direction == MoveDirectionality.SWAP and sb is not None:
                self._slots[a] = sb

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Record ``(R̂, σ̂²)`` for each tracked row of ``logits``.

        Args:
            logits: (batch_size, vocab_size) float next-token logits.

        Returns:
            ``logits``, unchanged.
        """
        rows = [i for i in sorted(self._slots) if i < logits.shape[0]]
        if not rows:
            return logits
        z: NDArray[np.float64] = logits[rows].detach().to(torch.float64).cpu().numpy()
        slots = [self._slots[i] for i in rows]
        pos = np.array([s.prompt_len + len(s.outputs) for s in slots], dtype=np.int64)
        feats = compact_features(z, pos, 1.0 / (pos + 1.0))
        returns, risks = self._predictor.predict(feats)
        for s, p, r, v in zip(slots, pos, returns, risks, strict=True):
            self.signals.setdefault(s.stream, []).append((int(p), float(r), float(v)))
        return logits
