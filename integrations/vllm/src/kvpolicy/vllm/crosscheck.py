"""``python -m kvpolicy.vllm.crosscheck --workload uniform:400 --num-blocks 1024 [--json]``.

kvpolicy-sim's ``vllm`` stack against vLLM's real scheduler on the same requests.
``--suite [--trace PATH] [--out FILE]`` runs every row of the package README's table
(the rows on a trace are skipped, said so, without ``--trace`` or when the file is absent),
prints it as Markdown and writes the rows as JSON to ``FILE``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> int:
    """Parse the arguments, run both sides, print the comparison."""
    from kvpolicy.vllm._crosscheck import crosscheck, load_workload, markdown_table, run_suite

    p = argparse.ArgumentParser(prog="python -m kvpolicy.vllm.crosscheck", description=__doc__)
    p.add_argument(
        "--workload",
        help="uniform:N[:SEED[:GAP]], shared:N[:SEED[:GAP]], trace:N:STEP_MS:PATH or a JSON "
        "request file",
    )
    p.add_argument("--num-blocks", type=int, help="KV blocks (vLLM's count)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-batch", type=int, default=256)
    p.add_argument("--token-budget", type=int, default=2048)
    p.add_argument("--prefix-caching", action="store_true")
    p.add_argument("--kvpolicy", default=None, help="kvpolicy config JSON for both sides")
    p.add_argument("--json", action="store_true")
    p.add_argument("--suite", action="store_true", help="every row of the README's table")
    p.add_argument("--trace", default=None, help="trace file of the suite's trace rows")
    p.add_argument("--out", default=None, help="write the suite's rows as JSON here")
    a = p.parse_args()
    if a.suite:

        def save(rows: list[dict[str, object]]) -> None:
            if a.out:
                pathlib.Path(a.out).parent.mkdir(parents=True, exist_ok=True)
                pathlib.Path(a.out).write_text(json.dumps(rows, indent=2))

        rows = run_suite(
            a.trace, log=lambda line: print(line, file=sys.stderr, flush=True), on_row=save
        )
        print(markdown_table(rows))
        return 0
    if a.workload is None or a.num_blocks is None:
        p.error("--workload and --num-blocks are required (or --suite)")
    out = crosscheck(
        load_workload(a.workload),
        a.num_blocks,
        block_size=a.block_size,
        max_batch=a.max_batch,
        token_budget=a.token_budget,
        prefix_caching=a.prefix_caching,
        kvpolicy=None if a.kvpolicy is None else json.loads(a.kvpolicy),
    )
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{'':<18} {'vLLM':>10} {'sim':>10} {'diff':>8}")
    for k in ("steps", "preemptions", "recomputed_tokens"):
        d = out["relative_difference"][k]
        shown = "n/a" if d is None else f"{d:+.1%}"
        print(f"{k:<18} {out['vllm'][k]:>10} {out['sim'][k]:>10} {shown:>8}")
    print(f"finish-step rank correlation: {out['finish_rank_correlation']:.4f}")
    ratio = out["speed_ratio"]
    print(
        f"CPU seconds: vLLM {out['seconds']['vllm']:.2f}, sim {out['seconds']['sim']:.2f}"
        + ("" if ratio is None else f" (sim {ratio:.1f}x faster)")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
