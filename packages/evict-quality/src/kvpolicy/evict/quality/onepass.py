"""What a quantization layout costs with every token kept, in one pass over a text.

``python -m kvpolicy.evict.quality.onepass --text license,code,docs --tokens 1024 --bits 4
--key-axis token,channel --window 1,8,32`` runs one teacher-forced forward pass per row in
which each query reads the keys and values of its newest ``window`` tokens (itself
included) as the model computed them and every older token's as a quantized cache holds
them: ``bits``-bit round-to-nearest with fp16 scales and zero points
(:func:`kvpolicy.evict.fake_quantize`), keys per token (groups of ``group_size`` channels)
or per channel (groups of ``group_size`` consecutive tokens from position 0, KIVI's layout),
values per token. Nothing is evicted and no policy runs, so the perplexity against the
full cache's, with the paired block-bootstrap interval, is the layout's own cost; a 2,048-
token row takes seconds, against minutes for ``kvpolicy evict eval``'s token-by-token
decode.

``--task needle`` reads the needle prompt instead (records planted at 25%, 50% and 75% of
the text as filler, ``kvpolicy evict eval --task needle``'s prompt) and adds the recall of
the planted digits per depth to each row: a uniform layout's needle row at 4,096 tokens in
minutes.

It is not the decode harness: there a token is quantized after the step that wrote it
(``window`` 1 here), and a per-channel group when its ``group_size`` tokens are all
written, so its newest 1 to ``group_size`` tokens are at 16 bits (a window that moves in
steps); here a per-channel group's tokens are quantized as soon as they leave the window.
Use it to see where quantization error hurts (RESULTS.md, "What int4 loses is the newest
tokens"), and the harness to rank policies.

``--perturb-runs N`` runs each quantized layout ``N`` more times with the keys and values
entering the quantizer multiplied by ``1 + scale * z`` (``z`` standard normal, seeds 1..N,
``--perturb-scale``, default 1e-7: about one float32 rounding). Round-to-nearest is not
continuous: an element that lies within a rounding of a step's midpoint flips to the next
step, the next tokens' hidden states move, and more elements flip in the layers above; so
two computations of one layout that differ only in float rounding (a batched against a
single-row product, a one-pass forward against a token-by-token decode) give different
perplexities. The spread of the perturbed runs is that numerical spread, which the paired
bootstrap interval (over positions) does not contain (RESULTS.md, "Rounding-level
spread").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import pathlib
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import numpy as np
from numpy.typing import NDArray

from kvpolicy.evict import AXES, QUANT_BITS, fake_quantize
from kvpolicy.evict.quality._bootstrap import bootstrap_ratio
from kvpolicy.evict.quality._decode import _ragged_eager, _register_attention
from kvpolicy.evict.quality._model import CausalLM

__all__ = ["Layout", "main", "onepass_nll", "onepass_scores"]

_ATTENTION = "kvpolicy_onepass"


@attrs.frozen
class Layout:
    """How the keys and values older than the window are held."""

    bits: int = attrs.field(validator=attrs.validators.in_((16, *QUANT_BITS)))
    """Bits per element (16: as computed, the full cache)."""
    key_axis: str = attrs.field(default="token", validator=attrs.validators.in_(AXES))
    """``"token"``: keys per token, groups of channels; ``"channel"``: per channel, groups
    of consecutive tokens."""
    window: int = attrs.field(default=1, validator=[attrs.validators.instance_of(int)])
    """Newest tokens of each query (itself included) read as computed; at least 1."""
    group_size: int = attrs.field(default=32, validator=attrs.validators.instance_of(int))
    """Elements per quantization group."""

    def __attrs_post_init__(self) -> None:
        if isinstance(self.window, bool) or self.window < 1:
            raise ValueError(f"'window' must be an int >= 1: {self.window!r}")
        if isinstance(self.group_size, bool) or self.group_size < 1:
            raise ValueError(f"'group_size' must be an int >= 1: {self.group_size!r}")

    @property
    def label(self) -> str:
        """``int4 keys per token, window 32`` and the like (``full`` at 16 bits)."""
        if self.bits == 16:
            return "full"
        return f"int{self.bits} keys per {self.key_axis}, window {self.window}"


PERTURB_SCALE = 1e-7
"""The command line's default relative perturbation (about one float32 rounding: its unit
roundoff is 6e-8)."""


@attrs.frozen
class _Pass:
    """What the registered attention applies in one pass."""

    layout: Layout
    perturb: float
    """Relative scale of the perturbation of the quantizer's inputs (0: none)."""
    generator: Any
    """The seeded ``torch.Generator`` of the perturbation (None when ``perturb`` is 0)."""

    def quantized(self, x: Any, key_axis: str) -> Any:
        """``x`` as the layout's quantized cache holds it (perturbed first, if asked)."""
        import torch

        layout = self.layout
        if self.perturb:
            noise = torch.randn(x.shape, generator=self.generator, dtype=x.dtype)
            x = x * (1 + self.perturb * noise)
        return fake_quantize(x, layout.bits, layout.group_size, key_axis)


_ACTIVE: list[_Pass] = []
"""The pass the registered attention applies (the innermost :func:`_applied`)."""


def _onepass_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float,
    dropout: float = 0.0,
    **_kwargs: Any,
) -> tuple[Any, Any]:
    """Eager attention whose queries read their window as computed and the rest quantized.

    Args:
        query: (batch, heads, q, head_dim); key, value: (batch, kv_heads, k, head_dim),
            the last ``q`` of the ``k`` positions being the queries'.
    """
    import torch

    active = _ACTIVE[-1]
    layout = active.layout
    if layout.bits == 16:  # nothing quantized: the harness's eager attention
        return _ragged_eager(module, query, key, value, attention_mask, scaling)
    from kvpolicy.evict.hf import grouped_output, grouped_scores

    k_len, q_len = key.shape[-2], query.shape[-2]
    kq = active.quantized(key, layout.key_axis)
    vq = active.quantized(value, "token")
    rows = torch.arange(k_len - q_len, k_len).unsqueeze(1)
    near = (rows - torch.arange(k_len).unsqueeze(0)) < layout.window
    scores = torch.where(
        near,
        grouped_scores(query, key) * scaling,
        grouped_scores(query, kq) * scaling,
    )
    if attention_mask is not None:
        scores = scores + attention_mask[..., :k_len]
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = grouped_output(weights * near, value) + grouped_output(weights * ~near, vq)
    return out.transpose(1, 2).contiguous(), weights


@contextlib.contextmanager
def _applied(lm: CausalLM, active: _Pass) -> Iterator[None]:
    _register_attention(_ATTENTION, _onepass_attention)
    previous = lm.model.config._attn_implementation
    _ACTIVE.append(active)
    lm.model.set_attn_implementation(_ATTENTION)
    try:
        yield
    finally:
        lm.model.set_attn_implementation(previous)
        _ACTIVE.pop()


def onepass_nll(
    lm: CausalLM, input_ids: Any, layout: Layout, *, perturb: float = 0.0, seed: int = 0
) -> NDArray[np.float64]:
    """Per-token losses of positions 1..n-1 of one text read through ``layout``.

    Args:
        lm: the model.
        input_ids: (1, n) or (n,) token ids, n >= 2.
        layout: how the tokens older than each query's window are held.
        perturb: relative scale of a perturbation of the keys and values entering the
            quantizer, each multiplied by ``1 + perturb * z`` with ``z`` standard normal
            (0: none; the window's tokens are read unperturbed). See the module docstring.
        seed: the perturbation's seed.

    Raises:
        ValueError: fewer than 2 tokens, or more than one text; ``perturb`` negative, not
            finite or 0.01 or more.
        TypeError: ``perturb`` not a number or ``seed`` not an int.
    """
    return onepass_scores(lm, input_ids, layout, perturb=perturb, seed=seed)[0]


def onepass_scores(
    lm: CausalLM, input_ids: Any, layout: Layout, *, perturb: float = 0.0, seed: int = 0
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """:func:`onepass_nll`'s losses, and whether the model's most likely next token was
    the text's (``correct``, as a decode's: what the needle's accuracy reads)."""
    import torch

    if isinstance(perturb, bool) or not isinstance(perturb, int | float):
        raise TypeError(f"'perturb' must be a number: {perturb!r}")
    if not (math.isfinite(perturb) and 0 <= perturb < 0.01):
        raise ValueError(f"'perturb' must be finite, >= 0 and < 0.01: {perturb!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"'seed' must be an int: {seed!r}")
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] < 2:
        raise ValueError(f"'input_ids' must be one text of >= 2 tokens: shape {tuple(ids.shape)}")
    generator = torch.Generator().manual_seed(seed) if perturb else None
    with _applied(lm, _Pass(layout, float(perturb), generator)), torch.no_grad():
        logits = lm.model(input_ids=ids, use_cache=False).logits[0, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")
    correct = (logits.argmax(dim=-1) == ids[0, 1:]).numpy()
    return nll.double().numpy(), correct


def _recall(needle: Any, correct: NDArray[np.bool_]) -> str:
    """``, recall 93% (80/100/100 by depth)`` for a needle prompt, else nothing."""
    if needle is None:
        return ""
    by_depth = "/".join(f"{100 * v:.0f}" for v in needle.depth_accuracy(correct).values())
    return f", recall {100 * needle.accuracy(correct):.0f}% ({by_depth} by depth)"


def _ints(parser: argparse.ArgumentParser, flag: str, raw: str) -> list[int]:
    try:
        out = [int(p) for p in raw.split(",") if p.strip()]
    except ValueError:
        parser.error(f"{flag} must be comma-separated ints: {raw!r}")
    if not out:
        parser.error(f"{flag} names nothing: {raw!r}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Command line (module docstring): one line per (text, layout), JSON rows to
    ``--out`` if given."""
    parser = argparse.ArgumentParser(
        prog="python -m kvpolicy.evict.quality.onepass", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--text", default="license,code,docs")
    parser.add_argument(
        "--task",
        choices=("ppl", "needle"),
        default="ppl",
        help="ppl: the text itself; needle: records planted at 25/50/75%% of it as filler, "
        "scored as `kvpolicy evict eval --task needle` scores them",
    )
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--bits", default="4", help="comma-separated: 8, 4, 2")
    parser.add_argument("--key-axis", default="token,channel", help="token, channel or both")
    parser.add_argument("--window", default="1,8,32", help="comma-separated, each >= 1")
    parser.add_argument("--group-size", type=int, default=32)
    parser.add_argument(
        "--perturb-runs",
        type=int,
        default=0,
        help="run each quantized layout this many more times, its quantizer's inputs "
        "perturbed at --perturb-scale (seeds 1..N): the numerical spread (docstring)",
    )
    parser.add_argument("--perturb-scale", type=float, default=PERTURB_SCALE)
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args(argv)
    if args.tokens < 2:
        parser.error(f"--tokens must be >= 2: {args.tokens}")
    if args.perturb_runs < 0:
        parser.error(f"--perturb-runs must be >= 0: {args.perturb_runs}")
    if not (math.isfinite(args.perturb_scale) and 0 < args.perturb_scale < 0.01):
        parser.error(f"--perturb-scale must be > 0 and < 0.01: {args.perturb_scale}")
    axes = [a.strip() for a in args.key_axis.split(",") if a.strip()]
    layouts = []
    for bits in _ints(parser, "--bits", args.bits):
        for axis in axes:
            for window in _ints(parser, "--window", args.window):
                try:
                    layouts.append(Layout(bits, axis, window, args.group_size))
                except (ValueError, TypeError) as exc:
                    parser.error(f"--bits {bits} --key-axis {axis} --window {window}: {exc}")
    texts = [t.strip() for t in args.text.split(",") if t.strip()]

    from kvpolicy.evict.quality._model import load_smollm2
    from kvpolicy.evict.quality._texts import eval_text

    for name in texts:  # every name checked before the model loads
        try:
            eval_text(name)
        except (ValueError, FileNotFoundError) as exc:
            parser.error(f"--text: {exc}")
    lm = load_smollm2()
    for name in texts:
        text, source = eval_text(name)
        needle = None
        if args.task == "needle":
            from kvpolicy.evict.quality._needle import build_needle

            try:
                needle = build_needle(lm.tokenizer, text, args.tokens)
            except ValueError as exc:
                parser.error(f"--text {name}: {exc}")
            ids = needle.input_ids
        else:
            ids = lm.encode(text, args.tokens)
        full, full_correct = onepass_scores(lm, ids, Layout(16))
        base = math.exp(float(full.mean()))
        print(
            f"{name}: full cache {base:.3f} over {full.size + 1} tokens"
            + _recall(needle, full_correct),
            flush=True,
        )
        for layout in layouts:
            nll, correct = onepass_scores(lm, ids, layout)
            ratio = bootstrap_ratio(nll, full)
            ppl = math.exp(float(nll.mean()))
            pct = [100 * (x - 1) for x in (ratio.value, ratio.low, ratio.high)]
            print(
                f"{name}: {layout.label}: {ppl:.3f} "
                f"({pct[0]:+.2f}% [{pct[1]:+.2f}, {pct[2]:+.2f}])" + _recall(needle, correct),
                flush=True,
            )
            perturbed: list[float] = []
            for seed in range(1, args.perturb_runs + 1):
                other = onepass_nll(lm, ids, layout, perturb=args.perturb_scale, seed=seed)
                perturbed.append(math.exp(float(other.mean())))
            if perturbed:
                low, high = min(perturbed) / base - 1, max(perturbed) / base - 1
                print(
                    f"{name}: {layout.label}: perturbed at {args.perturb_scale:g}, "
                    f"{len(perturbed)} runs: {100 * low:+.2f}% to {100 * high:+.2f}%",
                    flush=True,
                )
            if args.out is not None:
                row = {
                    "task": "onepass",
                    "prompt": args.task,
                    "text": name,
                    "source": source,
                    "tokens": full.size + 1,
                    **attrs.asdict(layout),
                    "perplexity": ppl,
                    "full_perplexity": base,
                    "vs_full": [ratio.value, ratio.low, ratio.high],
                }
                if perturbed:
                    row.update(perturb_scale=args.perturb_scale, perturbed_perplexity=perturbed)
                if needle is not None:
                    row.update(
                        accuracy=needle.accuracy(correct),
                        depth_accuracy=needle.depth_accuracy(correct),
                        full_accuracy=needle.accuracy(full_correct),
                        full_depth_accuracy=needle.depth_accuracy(full_correct),
                    )
                with args.out.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
