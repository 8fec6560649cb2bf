"""The decoding loop hands each token's id to a ContentAware policy (Token-PD's
``copy_bonus``), per layer, per KV head and pooled, on a tiny random Llama."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch
from numpy.typing import ArrayLike

from kvpolicy.evict import TokenPDConfig, TokenPDPolicy
from kvpolicy.evict.quality import CausalLM, decode_batch, decode_perplexity, policy_factory

from .test_quality import make_peaked_lm

N = 40


class _Spy(TokenPDPolicy):
    """Token-PD that records the ids it is given, per stream."""

    def __init__(self) -> None:
        super().__init__(TokenPDConfig(keep_rule=False, memory=8, copy_bonus=2.0))
        self.seen: dict[str, list[tuple[int, int]]] = {}

    def tokens(self, stream: str, positions: np.ndarray, token_ids: ArrayLike) -> None:
        super().tokens(stream, positions, token_ids)
        self.seen.setdefault(stream, []).extend(
            zip(positions.tolist(), np.asarray(token_ids).tolist(), strict=True)
        )


@pytest.fixture(scope="module")
def lm() -> CausalLM:
    return make_peaked_lm(2)


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    # Repeats, so that some contents have several occurrences.
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, 12, (2, N), generator=g)


class TestTokenIdsReachThePolicy:
    @pytest.mark.heavy
    @pytest.mark.parametrize("streams", ["layer", "kv-head"])
    def test_every_stream_gets_every_token_id_in_order(
        self, lm: CausalLM, ids: torch.Tensor, streams: str
    ) -> None:
        """Each stream of each text is told the id at every position it decodes."""
        spies: list[_Spy] = []

        def make() -> _Spy:
            spies.append(_Spy())
            return spies[-1]

        decode_batch(lm, ids, [make, make], 10, streams=streams)
        per_text = len(spies) // 2
        for r in range(2):
            expect = list(enumerate(ids[r, : N - 1].tolist()))
            for spy in spies[r * per_text : (r + 1) * per_text]:
                assert len(spy.seen) == 1
                assert next(iter(spy.seen.values())) == expect

    @pytest.mark.heavy
    def test_mixed_batch_gives_ids_to_the_content_aware_rows_only(
        self, lm: CausalLM, ids: torch.Tensor
    ) -> None:
        """Rows of one batch may hold different policies: a ContentAware row after a row
        that is not (sink+window) still gets its ids, and the other row is left alone."""
        plain = policy_factory("sink-window")
        assert plain is not None
        spies: list[_Spy] = []

        def make() -> _Spy:
            spies.append(_Spy())
            return spies[-1]

        decode_batch(lm, ids, [partial(plain, 10), make], 10)
        expect = list(enumerate(ids[1, : N - 1].tolist()))
        assert spies
        assert all(next(iter(spy.seen.values())) == expect for spy in spies)

    def test_pooled_gives_every_layer_the_ids(self, lm: CausalLM, ids: torch.Tensor) -> None:
        """One pooled policy is told the ids of each layer's stream."""
        spy = _Spy()
        decode_batch(lm, ids[:1], [lambda: spy], 10, pooled=True)
        expect = list(enumerate(ids[0, : N - 1].tolist()))
        assert sorted(spy.seen) == ["layer0", "layer1"]
        assert all(seen == expect for seen in spy.seen.values())

    @pytest.mark.heavy
    def test_the_bonus_changes_what_is_kept(self, lm: CausalLM, ids: torch.Tensor) -> None:
        """The same label with and without copy_bonus keeps different tokens (so a
        different perplexity), within the same budget."""
        out = {}
        for label in (
            "token-pd:keep_rule=false:memory=8",
            "token-pd:keep_rule=false:memory=8:copy_bonus=4",
        ):
            factory = policy_factory(label)
            assert factory is not None
            out[label] = decode_perplexity(lm, ids[0], partial(factory, 8), 8)
        plain, copy = out.values()
        assert plain.max_resident == copy.max_resident == 8
        assert plain.perplexity != copy.perplexity
