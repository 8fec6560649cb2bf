"""NVIDIA kvpress's presses on the same model, text, tokenisation and budget as ``kvpolicy
evict eval``, writing the same JSON rows (``python -m kvpolicy.evict.quality.kvpress_peers``;
the ``quality_peers`` nox session installs kvpress 0.5.x, which needs transformers < 5.3,
in its own environment).

How a press's budget maps to kvpolicy's (``B = round(budget * tokens)`` tokens):

- Both decode the text one token at a time at its true position (``position_ids = t``);
  the first token is the only "prefill". kvpolicy evicts after every step so that each
  layer holds at most ``B`` tokens and every query attends to at most ``B + 1`` keys.
- A scorer press runs inside kvpress's ``DecodingPress``, which compresses each layer's
  cache to ``target_size`` every ``compression_interval`` decoding steps, after the
  attention of that step. With interval 1 and ``target_size = B`` a press holds exactly
  what kvpolicy holds (``B`` per layer after each step, ``B + 1`` keys per query).
- SnapKV and ExpectedAttention read a buffer of recent hidden states that
  ``DecodingPress`` empties at every compression, so they need an interval ``I`` longer
  than their window (SnapKV's ``window_size``, ExpectedAttention's ``n_sink``). They run
  with ``target_size = B + 1 - I``: the cache then peaks at ``B + 1`` keys per query just
  like kvpolicy's, and holds ``B + 1 - I`` to ``B`` tokens in between (``mean_resident``
  of the row says how many on average), so they get the same peak memory, not more.
- kvpress selects tokens per KV head (SmolLM2 has 3 KV heads per layer, each keeps
  ``B`` tokens), kvpolicy per layer (the 3 KV heads share the ``B`` tokens, scored on the
  attention averaged over the 9 query heads): the same memory, a finer choice for kvpress.
- kvpress 0.5.5's ``ScorerPress.compress`` gathers the kept entries in the order of
  ``topk`` (by score, not by position). Compressed once after a prompt that is harmless
  (attention does not depend on the order of keys), but ``DecodingPress`` compresses again
  and again, and the presses that find tokens by their index (StreamingLLM's sinks and
  window, SnapKV's and LagKV's recent window) then keep the wrong ones after the first
  compression: StreamingLLM at 50% of 64 tokens of ``pydoc_data.topics`` gives perplexity
  118 as shipped against 51.6 for kvpolicy's sink+window. The rows here (``order_kept``)
  wrap each scorer so that its kept entries stay in position order (the same scores and
  the same number kept, sorted indices); ``--as-shipped`` runs kvpress unchanged.
- Prefill presses (compress once after the prompt) do not apply to perplexity over a
  decoded text: nothing would hold the budget as the text grows.

Presses on quantized tokens (``--precision B``, a budget in bytes as ``kvpolicy evict eval
--budget-unit bytes`` counts it): kvpress 0.5.5's ``DecodingPress`` does not compose with
transformers' ``QuantizedCache``. It compresses what ``extract_keys_and_values``
dequantizes, the quantized part alone, and then empties the full-precision residual, which
holds the token just decoded: every decoded token is dropped, and the cache never holds
more than the first token (measured on SmolLM2, 96 tokens of ``docs``, TOVA at 48 tokens
with ``QuantizedCache(backend="quanto", nbits=4)``: perplexity 2,977 at every
``residual_length`` tried, 128, 1 and 0, against 22.09 with ``DynamicCache`` and 19.84 for
the full cache). The rows here therefore run the press over :func:`quantizing_cache`: a
``DynamicCache`` whose layers store each token fake-quantized as it arrives (kvpolicy's
``fake_quantize``, per token, groups of ``group_size`` channels, fp16 scales and zero
points: the quantizer and byte count of ``kvpolicy evict eval``'s ``precision=B`` rows),
the token's own step reading it exact, as in the harness. The press keeps
``min(n, floor(budget * n * cost(16) / cost(B)))`` tokens of ``n``, what the budget's bytes
buy at ``B`` bits.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
import time
from collections.abc import Callable
from importlib.metadata import version as _version
from typing import Any

import numpy as np

from kvpolicy.evict.quality._decode import DecodeResult
from kvpolicy.evict.quality._eval import budget_tokens, cli_texts_and_budgets
from kvpolicy.evict.quality._lookup import build_lookup
from kvpolicy.evict.quality._model import CausalLM, load_smollm2
from kvpolicy.evict.quality._needle import build_needle
from kvpolicy.evict.quality._runs import append_row, read_rows, result_row, row_key
from kvpolicy.evict.quality._texts import EVAL_TEXTS, eval_text

__all__ = ["PRESSES", "decode_with_press", "main", "make_press", "quantizing_cache"]

PRESSES: dict[str, tuple[str, dict[str, Any], int]] = {
    "streaming_llm": ("StreamingLLMPress", {"n_sink": 4}, 1),
    "knorm": ("KnormPress", {}, 1),
    "tova": ("TOVAPress", {}, 1),
    "observed_attention": ("ObservedAttentionPress", {}, 1),
    "keydiff": ("KeyDiffPress", {}, 1),
    "lagkv": ("LagKVPress", {"n_sink": 4, "lag_size": 32}, 1),
    "random": ("RandomPress", {"seed": 0}, 1),
    "snapkv": ("SnapKVPress", {"window_size": 16, "kernel_size": 5}, 17),
    "expected_attention": ("ExpectedAttentionPress", {"n_sink": 4}, 16),
}
"""Press name -> (kvpress class, its parameters, DecodingPress compression interval)."""


def _order_kept(scorer: Any) -> Any:
    """``scorer`` wrapped so that compression keeps its entries in position order."""
    from dataclasses import dataclass, field

    from kvpress import ScorerPress  # type: ignore[import-not-found]
    from kvpress.utils import compute_n_kept  # type: ignore[import-not-found]

    @dataclass
    class OrderKept(ScorerPress):  # type: ignore[misc]
        inner: Any = field(default=None)

        def post_init_from_model(self, model: Any) -> None:
            self.inner.post_init_from_model(model)

        def score(self, *args: Any) -> Any:
            self.inner.compression_ratio = self.compression_ratio
            return self.inner.score(*args)

        def compress(
            self,
            module: Any,
            hidden_states: Any,
            keys: Any,
            values: Any,
            attentions: Any,
            kwargs: dict[str, Any],
        ) -> tuple[Any, Any]:
            if self.compression_ratio == 0:
                return keys, values
            scores = self.score(module, hidden_states, keys, values, attentions, kwargs)
            kept = compute_n_kept(keys.shape[2], self.compression_ratio)
            index = scores.topk(kept, dim=-1).indices.sort(dim=-1).values
            index = index.unsqueeze(-1).expand(-1, -1, -1, module.head_dim)
            return keys.gather(2, index).contiguous(), values.gather(2, index).contiguous()

    return OrderKept(inner=scorer)


def make_press(name: str, budget: int, *, order_kept: bool = True) -> tuple[Any, int, int]:
    """``(DecodingPress, compression_interval, target_size)`` of a press for ``budget``
    tokens per layer (see the module docstring for the mapping).

    Raises:
        ValueError: unknown press, or a budget too small for its interval.
    """
    if name not in PRESSES:
        raise ValueError(f"'press' must be one of {', '.join(PRESSES)}: {name!r}")
    import kvpress

    cls_name, params, interval = PRESSES[name]
    target = budget + 1 - interval
    if target < 8:
        raise ValueError(f"'budget' = {budget} is too small for {name}'s interval {interval}")
    scorer = getattr(kvpress, cls_name)(**params)
    if order_kept:
        scorer = _order_kept(scorer)
    press = kvpress.DecodingPress(
        base_press=scorer, compression_interval=interval, target_size=target
    )
    return press, interval, target


def quantizing_cache(config: Any, bits: int, group_size: int = 32) -> Any:
    """A transformers ``DynamicCache`` whose layers hold every token at ``bits``: a token's
    keys and values are stored fake-quantized as they arrive (per token, groups of
    ``group_size`` channels: :func:`~kvpolicy.evict.fake_quantize`), and the step that
    brings them reads them exact. A press compresses what is stored.

    Raises:
        ValueError: ``bits`` not 8, 4 or 2.
    """
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    from kvpolicy.evict import QUANT_BITS, fake_quantize

    if bits not in QUANT_BITS:
        raise ValueError(f"'bits' must be one of {list(QUANT_BITS)}: {bits!r}")

    class QuantizingLayer(DynamicLayer):  # type: ignore[no-untyped-call]
        def update(
            self, key_states: Any, value_states: Any, cache_kwargs: Any = None
        ) -> tuple[Any, Any]:
            import torch

            me: Any = self
            if not me.is_initialized:
                me.lazy_initialization(key_states, value_states)
            keys = torch.cat([me.keys, key_states], dim=-2)
            values = torch.cat([me.values, value_states], dim=-2)
            me.keys = torch.cat([me.keys, fake_quantize(key_states, bits, group_size)], dim=-2)
            me.values = torch.cat(
                [me.values, fake_quantize(value_states, bits, group_size)], dim=-2
            )
            return keys, values

    cache = DynamicCache(config=config)
    cache.layers = [QuantizingLayer() for _ in cache.layers]  # type: ignore[no-untyped-call]
    return cache


def decode_with_press(
    lm: CausalLM,
    input_ids: Any,
    press: Any,
    progress: Callable[[int], None] | None = None,
    cache: Any = None,
) -> list[DecodeResult]:
    """Decode one token at a time under ``press`` (None: the full cache), as
    :func:`~kvpolicy.evict.quality.decode_perplexity` does.

    ``input_ids`` is (n,) or (texts, n): several texts of the same length decode as one
    batch (a press compresses every sequence of the batch to the same size, so the texts
    do not interact); one result per text, each timed by the whole batch's seconds.
    ``cache``: the cache to decode into (a fresh ``DynamicCache`` when None; e.g.
    :func:`quantizing_cache`).
    """
    import torch
    from transformers import DynamicCache

    ids = torch.as_tensor(input_ids, dtype=torch.long)
    ids = ids.reshape(1, -1) if ids.dim() == 1 else ids
    rows, n = int(ids.shape[0]), int(ids.shape[1])
    if cache is None:
        cache = DynamicCache(config=lm.model.config)
    nll = np.empty((rows, n - 1))
    correct = np.zeros((rows, n - 1), dtype=bool)
    resident_sum = 0
    max_resident = 0
    start = time.perf_counter()
    context = press(lm.model) if press is not None else _NoPress()
    with torch.no_grad(), context:
        for t in range(n - 1):
            out = lm.model(
                input_ids=ids[:, t : t + 1],
                position_ids=torch.full((rows, 1), t),
                cache_position=torch.tensor([t]),
                past_key_values=cache,
                use_cache=True,
            )
            logits = out.logits[:, -1].float()
            logp = torch.log_softmax(logits, dim=-1)
            nxt = ids[:, t + 1]
            nll[:, t] = -logp.gather(1, nxt[:, None])[:, 0].double().numpy()
            correct[:, t] = (logits.argmax(dim=-1) == nxt).numpy()
            held = _held(cache.layers[0])
            resident_sum += held
            max_resident = max(max_resident, held)
            if progress is not None:
                progress(1)
    seconds = time.perf_counter() - start
    return [
        DecodeResult(
            perplexity=math.exp(float(nll[i].mean())),
            tokens=n,
            max_resident=max_resident,
            mean_resident=resident_sum / (n - 1),
            nll=nll[i],
            correct=correct[i],
            seconds=seconds,
        )
        for i in range(rows)
    ]


def _held(layer: Any) -> int:
    """Tokens a cache layer holds: its keys, and for a transformers ``QuantizedLayer`` its
    quantized part too (its full-precision residual may be an empty 1-D tensor)."""
    keys = layer.keys
    held = int(keys.shape[-2]) if keys.dim() == 4 else 0
    quantized = getattr(layer, "_quantized_keys", None)
    return held + (int(quantized.shape[-2]) if quantized is not None else 0)


class _NoPress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--press`` names, ``--budget`` fractions, ``--text`` names,
    ``--tokens``, ``--task``, ``--out`` (JSON lines, appended; finished rows skipped)."""
    parser = argparse.ArgumentParser(prog="python -m kvpolicy.evict.quality.kvpress_peers")
    parser.add_argument("--press", default="streaming_llm,tova,snapkv,expected_attention,knorm")
    parser.add_argument("--budget", default="0.125,0.25,0.5")
    parser.add_argument("--text", default=",".join(EVAL_TEXTS))
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--task", choices=("ppl", "lookup", "needle"), default="ppl")
    parser.add_argument("--full", action="store_true", help="also run the full cache")
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument(
        "--precision",
        type=int,
        choices=(8, 4, 2),
        default=None,
        help="hold every token at this many bits (a budget in bytes; see above)",
    )
    parser.add_argument("--group-size", type=int, default=32, help="channels per group")
    parser.add_argument(
        "--as-shipped",
        action="store_true",
        help="run kvpress's scorers unchanged (kept entries in score order; see above)",
    )
    args = parser.parse_args(argv)
    presses = [p.strip() for p in args.press.split(",") if p.strip()]
    for p in presses:
        if p not in PRESSES:
            parser.error(f"--press: unknown {p!r}; known: {', '.join(PRESSES)}")
    texts, budgets = cli_texts_and_budgets(parser, args.text, args.budget)
    import torch
    import transformers
    from rich.console import Console

    from kvpolicy.commands._evict_progress import progress_for

    torch.set_num_threads(1)
    console = Console(stderr=True)  # a live bar on a terminal, a line a minute in a log
    lm = load_smollm2()
    done = {row_key(r) for r in read_rows(args.out)}
    version = {"kvpress": _version("kvpress"), "transformers": transformers.__version__}
    encoded = []
    lookups: list[Any] = []
    for text in texts:
        content, _source = eval_text(text)
        if args.task in ("lookup", "needle"):
            build = build_needle if args.task == "needle" else build_lookup
            try:
                task = build(lm.tokenizer, content, args.tokens)
            except ValueError as exc:
                parser.error(f"--text {text}: {exc}")
            lookups.append(task)
            encoded.append(task.input_ids)
        else:
            lookups.append(None)
            encoded.append(lm.encode(content, args.tokens))
    batch = torch.stack(encoded)
    runs: list[tuple[str, float]] = [("full", 1.0)] if args.full else []
    suffix = ":as-shipped" if args.as_shipped else ""
    if args.precision is not None:
        suffix += f":precision={args.precision}"
    runs += [(f"kvpress:{p}{suffix}", b) for p in presses for b in budgets]
    costs = None
    if args.precision is not None:
        from kvpolicy.evict import PrecisionCosts
        from kvpolicy.evict.quality._bytes import layer_spec

        costs = PrecisionCosts.of(layer_spec(lm), [16, args.precision], args.group_size)
    for label, b in runs:
        b = 1.0 if label == "full" else b
        keys = [
            {
                "task": args.task,
                "text": text,
                "tokens": args.tokens,
                "policy": label,
                "budget": b,
                "predictor": "-",
                **({"budget_unit": "bytes"} if costs is not None and label != "full" else {}),
            }
            for text in texts
        ]
        if all(row_key(key) in done for key in keys):
            continue
        k = args.tokens if label == "full" else budget_tokens(b, args.tokens)
        extra: dict[str, Any] = {**version, "batch": len(texts)}
        cache = None
        if costs is not None and label != "full":
            c16, cb = costs.token_bytes[16], costs.token_bytes[args.precision]
            k = min(args.tokens, int(b * args.tokens * c16 // cb))
            cache = quantizing_cache(lm.model.config, args.precision, args.group_size)
        press = None
        if label != "full" and k >= args.tokens:
            extra.update(evicts=False)  # the budget's bytes hold every token at B bits
        elif label != "full":
            name = label.split(":")[1]
            press, interval, target = make_press(name, k, order_kept=not args.as_shipped)
            extra.update(
                compression_interval=interval,
                target_size=target,
                order_kept=not args.as_shipped,
            )
        with progress_for(console) as bar:
            task = bar.add_task(f"{label} at {b:g}", total=batch.shape[1] - 1)
            results = decode_with_press(
                lm, batch, press, cache=cache, progress=lambda k, t=task: bar.advance(t, k)
            )
        for text, key, lookup, r in zip(texts, keys, lookups, results, strict=True):
            if row_key(key) in done:
                continue
            if cache is not None and costs is not None:
                layers = lm.num_layers
                cb = costs.token_bytes[args.precision]
                full_bytes = args.tokens * costs.token_bytes[16] * layers
                extra.update(
                    budget_unit="bytes",
                    group_size=args.group_size,
                    budget_bytes=b * full_bytes,
                    full_bytes=full_bytes,
                    bytes_held=r.mean_resident * cb * layers,
                    max_bytes_held=r.max_resident * cb * layers,
                    bytes_fraction=r.max_resident * cb * layers / full_bytes,
                )
            row = result_row(
                task=args.task,
                text=text,
                tokens=args.tokens,
                policy=label,
                budget=b,
                kept=k,
                predictor="-",
                result=r,
                lookup=lookup,
                extra=extra,
                streams=None,
            )
            append_row(args.out, row)
            print(
                f"{text} {label} {b:g}: ppl {r.perplexity:.3f} acc {row['accuracy']} "
                f"resident {r.mean_resident:.1f} {r.ms_per_step:.0f} ms/step",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
