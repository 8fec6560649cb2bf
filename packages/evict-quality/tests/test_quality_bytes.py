"""Decoding under a budget in bytes with tokens at several precisions, on the tiny random
Llama (no download)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvpolicy.evict import (
    PRECISIONS,
    GroupedPrecision,
    MixedConfig,
    PrecisionCosts,
    TokenPDMixed,
    UniformPrecision,
)
from kvpolicy.evict.quality import CausalLM, decode_batch, demoting_factory, policy_factory
from kvpolicy.evict.quality._bytes import decode_bytes, layer_spec
from kvpolicy.evict.quality._runs import bytes_rows, decode_rows, row_key

from .test_quality import make_peaked_lm

N = 32


@pytest.fixture(scope="module")
def lm() -> CausalLM:
    return make_peaked_lm(2)


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(0, 97, (2, N), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def costs(lm: CausalLM) -> PrecisionCosts:
    return PrecisionCosts.of(layer_spec(lm), PRECISIONS)


class TestDecodeBytes:
    """The decoding loop under a byte budget."""

    @pytest.mark.heavy
    def test_sixteen_bits_equals_the_token_budget(
        self, lm: CausalLM, ids: torch.Tensor, costs: PrecisionCosts
    ) -> None:
        """An eviction-only policy under B tokens' bytes decodes exactly as under B tokens."""
        factory = policy_factory("h2o")
        assert factory is not None
        tokens = decode_batch(lm, ids, lambda: factory(10), 10)
        by_bytes = decode_bytes(lm, ids, lambda: factory(10), 10 * costs.token_bytes[16], costs)
        for a, b in zip(tokens, by_bytes, strict=True):
            assert b.result.nll.tolist() == a.nll.tolist()
            assert b.result.mean_resident == a.mean_resident

    @pytest.mark.heavy
    def test_full_cache_matches(
        self, lm: CausalLM, ids: torch.Tensor, costs: PrecisionCosts
    ) -> None:
        """No policy: the full cache, every token at 16 bits."""
        full = decode_batch(lm, ids, None, N)
        mine = decode_bytes(lm, ids, None, 0.0, costs)
        assert [m.result.perplexity for m in mine] == [f.perplexity for f in full]
        # Held after step t: t + 1 tokens of 2 layers at 16 bits.
        c16 = costs.token_bytes[16]
        assert mine[0].bytes_mean == pytest.approx(2 * c16 * (N / 2))
        assert mine[0].bytes_max == 2 * c16 * (N - 1)

    @pytest.mark.heavy
    def test_quantized_tokens_change_what_the_model_reads(
        self, lm: CausalLM, ids: torch.Tensor, costs: PrecisionCosts
    ) -> None:
        """int2 for every token changes the losses; int8 barely; bytes follow the costs."""
        full = decode_bytes(lm, ids, None, 0.0, costs)[0].result.nll
        out = {}
        for bits in (8, 2):
            got = decode_bytes(
                lm, ids[:1], lambda b=bits: UniformPrecision(_Fifo(), b, costs), 1e12, costs
            )[0]
            out[bits] = got
            assert got.bytes_max == 2 * costs.token_bytes[bits] * (N - 1)
        d8 = np.abs(out[8].result.nll - full).max()
        d2 = np.abs(out[2].result.nll - full).max()
        assert 0 < d8 < d2

    @pytest.mark.heavy
    def test_rows_of_a_batch_equal_rows_alone(
        self, lm: CausalLM, ids: torch.Tensor, costs: PrecisionCosts
    ) -> None:
        """Texts and policies that keep different counts share a padded batch without
        changing each other's losses."""
        make, _, _ = demoting_factory(
            "token-pd:precisions=16+8+4+2:keep_rule=false", layer_spec(lm)
        )
        assert make is not None
        budget = 0.25 * N * costs.token_bytes[16]
        alone = decode_bytes(lm, ids[:1], lambda: make(budget), budget, costs)[0]
        batch = decode_bytes(
            lm,
            torch.stack([ids[0], ids[1], ids[0]]),
            [lambda: make(budget), None, lambda: make(budget / 2)],
            [budget, 0.0, budget / 2],
            costs,
        )
        assert batch[0].result.nll == pytest.approx(alone.result.nll, rel=1e-5, abs=1e-6)
        assert batch[0].bytes_mean == alone.bytes_mean
        assert batch[2].bytes_max <= 2 * budget / 2

    @pytest.mark.heavy
    def test_budget_is_held_at_every_step(
        self, lm: CausalLM, ids: torch.Tensor, costs: PrecisionCosts
    ) -> None:
        """The most bytes held after any step stay within the budget (2 layers)."""
        budget = 0.2 * N * costs.token_bytes[16]
        got = decode_bytes(
            lm, ids, lambda: TokenPDMixed(mixed=MixedConfig(costs=costs)), budget, costs
        )
        for g in got:
            assert g.bytes_max <= 2 * budget

    def test_policy_costs_must_match_the_cache(
        self, lm: CausalLM, ids: torch.Tensor, costs: PrecisionCosts
    ) -> None:
        """A policy that prices bytes unlike the harness is caught at the first step."""
        with pytest.raises(RuntimeError, match="bytes in layer0, the cache holds"):
            decode_bytes(lm, ids, lambda: TokenPDMixed(), 1e9, costs)

    def test_bad_budgets(self, lm: CausalLM, ids: torch.Tensor, costs: PrecisionCosts) -> None:
        """A negative budget or a budget list of the wrong length is refused."""
        with pytest.raises(ValueError, match="'budget_bytes' must be finite and >= 0"):
            decode_bytes(lm, ids, None, -1.0, costs)
        with pytest.raises(ValueError, match="lists 1 budgets for 2 rows"):
            decode_bytes(lm, ids, None, [1.0], costs)


class TestKeysPerChannel:
    """KIVI's layout in the harness: keys per channel over whole groups of tokens."""

    def test_demoted_groups_match_the_reference(self) -> None:
        """A demoted group's keys are its per-channel fake-quantized keys, its values the
        per-token ones, each within half a scale of the fp32 original; nothing else of
        the cache changes."""
        from types import SimpleNamespace

        from kvpolicy.evict import fake_quantize, quantize
        from kvpolicy.evict.quality._bytes import _quantize_demoted

        gen = torch.Generator().manual_seed(0)
        keys = torch.randn(2, 3, 16, 8, generator=gen)
        keys[..., 5] *= 40.0  # an outlier channel, as keys have
        values = torch.randn(2, 3, 16, 8, generator=gen)
        layer = SimpleNamespace(keys=keys.clone(), values=values.clone())
        cache = SimpleNamespace(layers=[layer])
        slots = np.arange(4, 12)
        _quantize_demoted(cache, [(0, 1, slots, 4, "channel")], 4)
        want_k = fake_quantize(keys[1][:, 4:12], 4, 4, "channel")
        want_v = fake_quantize(values[1][:, 4:12].reshape(-1, 8), 4, 4, "token")
        assert torch.equal(layer.keys[1][:, 4:12], want_k)
        assert torch.equal(layer.values[1][:, 4:12], want_v.reshape(3, 8, 8))
        q = quantize(keys[1][:, 4:12], 4, 4, "channel")
        bound = q.scale.float().amax() / 2 + 1e-5
        assert float((layer.keys[1][:, 4:12] - keys[1][:, 4:12]).abs().max()) <= bound
        assert torch.equal(layer.keys[0], keys[0])
        assert torch.equal(layer.keys[1][:, :4], keys[1][:, :4])
        assert torch.equal(layer.keys[1][:, 12:], keys[1][:, 12:])
        # Per channel keeps the outlier's scale off the other channels; per token does not.
        per_token = fake_quantize(keys[1][:, 4:12].reshape(-1, 8), 4, 4, "token")
        plain = [c for c in range(8) if c != 5]
        err_c = (want_k - keys[1][:, 4:12])[..., plain].pow(2).mean()
        err_t = (per_token.reshape(3, 8, 8) - keys[1][:, 4:12])[..., plain].pow(2).mean()
        assert err_c < err_t / 4

    def test_a_partial_group_is_refused(self) -> None:
        """Keys per channel need whole groups: anything else is a RuntimeError."""
        from types import SimpleNamespace

        from kvpolicy.evict.quality._bytes import _quantize_demoted

        layer = SimpleNamespace(keys=torch.zeros(1, 1, 8, 4), values=torch.zeros(1, 1, 8, 4))
        with pytest.raises(RuntimeError, match="whole groups of 4 tokens: 3 demoted"):
            _quantize_demoted(
                SimpleNamespace(layers=[layer]), [(0, 0, np.arange(3), 4, "channel")], 4
            )

    @pytest.mark.heavy
    def test_uniform_int4_keys_per_channel(self, lm: CausalLM, ids: torch.Tensor) -> None:
        """``full:precision=4:key_axis=channel``: the newest tokens wait at 16 bits until a
        group is whole (bytes say so), and the losses differ from keys per token."""
        spec = layer_spec(lm)
        make_c, costs_c, group = demoting_factory(
            "full:precision=4:key_axis=channel:group_size=8", spec
        )
        make_t, costs_t, _ = demoting_factory("full:precision=4:group_size=8", spec)
        assert make_c is not None
        assert make_t is not None
        assert group == 8
        big = 1e12
        chan = decode_bytes(lm, ids[:1], lambda: make_c(big), big, costs_c, group_size=8)[0]
        tok = decode_bytes(lm, ids[:1], lambda: make_t(big), big, costs_t, group_size=8)[0]
        c4, c16 = costs_c.token_bytes[4], costs_c.token_bytes[16]
        held, waiting = N - 1, (N - 1) % 8
        assert chan.bytes_max == 2 * ((held - waiting) * c4 + waiting * c16)
        assert tok.bytes_max == 2 * held * c4
        assert chan.result.nll.tolist() != tok.result.nll.tolist()

    @pytest.mark.heavy
    def test_mixed_token_pd_keys_per_channel(self, lm: CausalLM, ids: torch.Tensor) -> None:
        """``token-pd:precisions=16+8+4:key_axis=channel``: Token-PD's demotions come in
        whole groups of ``group_size`` tokens a layer (the decoder refuses anything else),
        the bytes held stay within the budget and the losses differ from keys per token."""
        spec = layer_spec(lm)
        label = "token-pd:keep_rule=false:precisions=16+8+4:group_size=8"
        make_c, costs, group = demoting_factory(label + ":key_axis=channel", spec)
        make_t, _, _ = demoting_factory(label, spec)
        assert make_c is not None
        assert make_t is not None
        budget = 0.25 * (N - 1) * costs.token_bytes[16]
        first = make_c(budget)
        assert isinstance(first, GroupedPrecision)
        assert first.key_axis == "channel"
        chan = decode_bytes(lm, ids[:1], lambda: make_c(budget), budget, costs, group_size=group)[0]
        tok = decode_bytes(lm, ids[:1], lambda: make_t(budget), budget, costs, group_size=group)[0]
        assert chan.bytes_max <= 2 * budget + 1e-6  # two layers, each within the budget
        assert chan.result.nll.tolist() != tok.result.nll.tolist()

    def test_bad_key_axis_labels(self, lm: CausalLM) -> None:
        """key_axis only with precision=B below 16, and only token or channel."""
        for label, match in (
            ("full:key_axis=channel", "needs precision=B below 16"),
            ("h2o:precision=4:key_axis=1", "'key_axis' must be token or channel: 1"),
            ("token-pd:precisions=16+4:key_axis=2", "'key_axis' must be token or channel: 2"),
        ):
            with pytest.raises(ValueError, match=match):
                demoting_factory(label, layer_spec(lm))


class _Fifo(UniformPrecision):
    """FIFO as a stand-in base (never asked to evict under a huge budget)."""

    def __init__(self) -> None:
        from kvpolicy.evict import FIFOPolicy

        super().__init__(FIFOPolicy(), 16)


class TestLabelsAndRows:
    """Policy labels under a budget in bytes, and the rows."""

    @pytest.mark.parametrize(
        ("label", "match"),
        [
            ("h2o:precisions=16+8", "token-pd only"),
            ("token-pd:precision=4:precisions=16+4", "not both"),
            ("token-pd:precisions=16+3", "among"),
            ("h2o:loss_scale=2", "loss_scale needs precisions"),
            ("full:memory=3", "only precision, group_size, key_axis and window"),
            ("h2o:group_size=0", "'group_size' must be an int >= 1"),
            ("full:window=8", "window needs precision=B with keys per token"),
            ("full:precision=4:key_axis=channel:window=8", "window needs precision=B"),
            ("token-pd:precisions=16+8+4:window=8", "window needs precision=B"),
            ("full:precision=16:window=8", "'window' = 8 needs precision=B below 16"),
            ("h2o:precision=4:window=-1", "'window' must be an int >= 0: -1"),
        ],
    )
    def test_bad_labels_are_named(self, lm: CausalLM, label: str, match: str) -> None:
        """Bad combinations of precision params are a ValueError naming them."""
        with pytest.raises(ValueError, match=match):
            demoting_factory(label, layer_spec(lm))

    def test_window_label_builds_a_sliding_residual(self, lm: CausalLM) -> None:
        """``window=W`` with ``precision=B`` gives the uniform policy a 16-bit window of W
        newest tokens with keys per token (a ``residual`` of 0)."""
        from kvpolicy.evict import UniformPrecision

        factory, _, _ = demoting_factory("h2o:precision=4:window=16", layer_spec(lm))
        assert factory is not None
        policy = factory(1e6)
        assert isinstance(policy, UniformPrecision)
        assert (policy.bits, policy.window, policy.residual, policy.key_axis) == (
            4,
            16,
            0,
            "token",
        )

    def test_precision_params_need_bytes(self) -> None:
        """A precision param under a token budget is refused."""
        with pytest.raises(ValueError, match="needs a budget in bytes"):
            policy_factory("h2o:precision=4")

    @pytest.mark.heavy
    def test_rows_carry_bytes(self, lm: CausalLM, ids: torch.Tensor) -> None:
        """Rows carry bytes_held and the budget unit; full runs at 1.0 and both ways of
        building a row agree."""
        rows = bytes_rows(
            lm,
            [ids[0], ids[1]],
            task="ppl",
            texts=["a", "b"],
            runs=[("full:precision=4", 0.25), ("h2o:precision=4", 0.25)],
            predictor=None,
            predictor_name="none",
        )
        assert [(r["policy"], r["budget"], r["text"]) for r in rows] == [
            ("full:precision=4", 1.0, "a"),
            ("full:precision=4", 1.0, "b"),
            ("h2o:precision=4", 0.25, "a"),
            ("h2o:precision=4", 0.25, "b"),
        ]
        assert all(r["budget_unit"] == "bytes" and r["bytes_held"] > 0 for r in rows)
        assert rows[2]["max_bytes_held"] <= rows[2]["budget_bytes"]
        single = decode_rows(
            lm,
            [ids[0], ids[1]],
            task="ppl",
            texts=["a", "b"],
            policy="h2o:precision=4",
            budget=0.25,
            predictor=None,
            predictor_name="none",
            budget_unit="bytes",
        )
        assert single[0]["nll"] == rows[2]["nll"]
        assert row_key(single[0]) == row_key(rows[2])
        assert row_key(single[0]) != row_key({**single[0], "budget_unit": "tokens"})
