"""kvpolicy's press inside kvpress (``kvpolicy.evict.kvpress.policy_press``) on the tiny
random Llama: runs where kvpress is installed (the ``quality_peers`` nox session; kvpress
0.5.x needs transformers < 5.3), skips with that message elsewhere. The argument checks
run everywhere."""

from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytest
import torch

from kvpolicy.evict import H2OPolicy, SinkWindowPolicy, TokenPDPolicy
from kvpolicy.evict._replay import Residency, replay
from kvpolicy.evict.kvpress import policy_press

HAVE_KVPRESS = importlib.util.find_spec("kvpress") is not None
if HAVE_KVPRESS:
    # kvpress imports fire, whose 0.6 releases import the deprecated `pipes` module.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import kvpress  # noqa: F401
needs_kvpress = pytest.mark.skipif(
    not HAVE_KVPRESS,
    reason="kvpress is installed only by the quality_peers session (it needs transformers < 5.3)",
)


class TestArguments:
    @pytest.mark.parametrize("ratio", [-0.1, 1.0, 1.5, True, "0.5"])
    def test_bad_ratio_is_named(self, ratio: object) -> None:
        with pytest.raises(ValueError, match="'compression_ratio' must be a number in"):
            policy_press(TokenPDPolicy, ratio)  # type: ignore[arg-type]

    def test_bad_policy_and_decoding(self) -> None:
        with pytest.raises(TypeError, match="'policy' must build a policy"):
            policy_press(TokenPDPolicy(), 0.5)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="'decoding' must be a bool"):
            policy_press(TokenPDPolicy, 0.5, decoding=1)  # type: ignore[arg-type]

    @pytest.mark.skipif(HAVE_KVPRESS, reason="kvpress is installed here")
    def test_without_kvpress_says_how_to_get_it(self) -> None:
        with pytest.raises(ImportError, match="quality_peers"):
            policy_press(TokenPDPolicy, 0.5)


class TestReplay:
    """The replay both the press and the transformers cache run, on made-up attention."""

    def test_holds_the_budget_across_rows_after_every_step(self) -> None:
        rng = np.random.default_rng(0)
        att = rng.random((2, 12, 12))
        real = np.ones((2, 12), dtype=bool)
        real[1, :4] = False  # left padding of row 1
        state = Residency.empty(2)
        policy = H2OPolicy(recent_window=1)
        evicted, most = replay(policy, 6, att, real, state, 0, ["a", "b"])
        assert most <= 6
        assert state.held == 6 == policy.resident_tokens()
        assert evicted == 12 + 8 - 6
        assert state.next_position.tolist() == [12, 8]
        for r, stream in enumerate(["a", "b"]):
            assert sorted(state.positions[r]) == sorted(
                np.asarray(policy.resident_positions(stream)).tolist()
            )
        # row 1's slots are never its padding
        assert all(s >= 4 for s in state.slots[1])

    def test_sink_window_keeps_the_sinks_and_the_newest(self) -> None:
        att = np.full((1, 10, 10), 0.1)
        state = Residency.empty(1)
        replay(SinkWindowPolicy(num_sink=2), 5, att, np.ones((1, 10), bool), state, 0, ["r"])
        assert state.positions[0] == [0, 1, 7, 8, 9]
        assert state.slots[0] == [0, 1, 7, 8, 9]


@pytest.fixture
def model(peaked_llama: object) -> object:
    """The 2-layer tiny Llama with peaked attention, eager."""
    return peaked_llama


@needs_kvpress
class TestInKvpress:
    def test_prefill_keeps_the_policy_s_tokens(self, model: object) -> None:
        """A 40-token context at compression 0.75 keeps int(40 * 0.25) = 10 tokens per layer:
        the keys sink+window keeps (2 sinks, the 8 newest), in position order."""
        from transformers import DynamicCache

        ids = torch.randint(1, 97, (1, 40), generator=torch.Generator().manual_seed(1))
        full = DynamicCache()
        with torch.no_grad():
            model(input_ids=ids, past_key_values=full, use_cache=True)  # type: ignore[operator]
        cache = DynamicCache()
        press = policy_press(lambda: SinkWindowPolicy(num_sink=2), 0.75)
        with torch.no_grad(), press(model):
            model(input_ids=ids, past_key_values=cache, use_cache=True)  # type: ignore[operator]
        keep = [0, 1, *range(32, 40)]
        for layer in range(2):
            assert cache.layers[layer].keys.shape[2] == 10
            assert torch.equal(cache.layers[layer].keys, full.layers[layer].keys[:, :, keep])
            assert torch.equal(cache.layers[layer].values, full.layers[layer].values[:, :, keep])

    def test_decoding_holds_the_budget(self, model: object) -> None:
        """With ``decoding=True`` every generated token is a policy step and the layers
        hold the prefill's count."""
        from transformers import DynamicCache

        ids = torch.randint(1, 97, (1, 24), generator=torch.Generator().manual_seed(2))
        cache = DynamicCache()
        press = policy_press(TokenPDPolicy, 0.5, decoding=True)
        with torch.no_grad(), press(model):
            out = model(input_ids=ids, past_key_values=cache, use_cache=True)  # type: ignore[operator]
            assert cache.layers[0].keys.shape[2] == 12
            nxt = out.logits[:, -1:].argmax(-1)
            for t in range(6):
                out = model(  # type: ignore[operator]
                    input_ids=nxt,
                    past_key_values=cache,
                    use_cache=True,
                    cache_position=torch.tensor([24 + t]),
                    position_ids=torch.tensor([[24 + t]]),
                )
                nxt = out.logits[:, -1:].argmax(-1)
                assert all(cache.layers[i].keys.shape[2] == 12 for i in range(2))
