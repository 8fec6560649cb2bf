"""The logits processor records Token-PD's predicted returns without changing logits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.mark.usefixtures("needs_vllm")
class TestReturnSignalProcessor:
    def test_records_signals_per_stream(self, vllm_sched: Callable[..., Any]) -> None:
        """Each tracked row gets (position, R, risk); logits come back unchanged."""
        import torch
        from vllm import SamplingParams
        from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

        from kvpolicy.vllm import ReturnSignalProcessor

        cfg = vllm_sched(num_blocks=16).vllm_config
        proc = ReturnSignalProcessor(cfg, torch.device("cpu"), False)
        ReturnSignalProcessor.signals.clear()
        a = SamplingParams(max_tokens=4, extra_args={"kvpolicy_stream": "a"})
        b = SamplingParams(max_tokens=4, extra_args={"kvpolicy_stream": "b"})
        out_a: list[int] = [1, 2]
        proc.update_state(BatchUpdate(2, [], [(0, a, [5] * 10, out_a), (1, b, [6] * 3, [])], []))
        peaked = torch.full((2, 1024), -10.0)
        peaked[0, 7] = 10.0  # row 0 is certain, row 1 flat
        peaked[1] = 0.0
        before = peaked.clone()
        assert proc.apply(peaked) is peaked
        assert torch.equal(peaked, before)
        assert proc.is_argmax_invariant()
        (pa, ra, va), (pb, rb, vb) = (
            ReturnSignalProcessor.signals["a"][0],
            ReturnSignalProcessor.signals["b"][0],
        )
        assert (pa, pb) == (12, 3)
        assert 0.0 <= min(ra, rb) <= max(ra, rb) <= 1.0
        assert min(va, vb) >= 0.0
        # Swap the rows, drop one: the processor follows vLLM's batch bookkeeping.
        proc.update_state(BatchUpdate(2, [], [], [(0, 1, MoveDirectionality.SWAP)]))
        proc.update_state(BatchUpdate(1, [1], [], []))
        proc.apply(torch.zeros(1, 1024))
        assert len(ReturnSignalProcessor.signals["b"]) == 2
        assert len(ReturnSignalProcessor.signals["a"]) == 1
