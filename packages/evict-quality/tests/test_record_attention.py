"""``mean_attention``: the recorded attention that kvpolicy-sim's attention model is fitted to."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from kvpolicy.evict.quality import CausalLM, window_attention  # noqa: E402
from kvpolicy.evict.quality._record import mean_attention  # noqa: E402

pytestmark = pytest.mark.quality

N = 40


def tiny_lm() -> CausalLM:
    """A 3-layer Llama with random weights (4 query heads, 2 KV heads), eager attention."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager"
    ).eval()
    return CausalLM(model=model, name="tiny-llama")


def token_ids() -> object:
    """N random token ids."""
    return torch.randint(0, 97, (N,), generator=torch.Generator().manual_seed(1))


class TestMeanAttention:
    def test_equals_the_mean_of_window_attention(self) -> None:
        """The (n, n) result is window_attention's mean over layers and heads, rows renormalised."""
        lm, ids = tiny_lm(), token_ids()
        _, att = window_attention(lm, ids)
        expected = att.double().mean(dim=(0, 1)).numpy()
        got = mean_attention(lm, ids)
        assert got.shape == (N, N)
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=0, atol=1e-14)

    def test_per_layer(self) -> None:
        """per_layer keeps each layer's head mean; their mean is the averaged matrix."""
        lm, ids = tiny_lm(), token_ids()
        layers = mean_attention(lm, ids, per_layer=True)
        assert layers.shape == (3, N, N)
        assert np.all(np.triu(layers, 1) == 0)
        np.testing.assert_allclose(layers.mean(axis=0), mean_attention(lm, ids), atol=1e-12)

    def test_empty_window(self) -> None:
        """No tokens is refused."""
        with pytest.raises(ValueError, match="'input_ids' must hold at least one token: got 0"):
            mean_attention(tiny_lm(), torch.zeros(0, dtype=torch.long))
