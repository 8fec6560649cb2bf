"""``python -m kvpolicy.vllm.crosscheck --workload uniform:400 --num-blocks 1024 [--json]``.

kvpolicy-sim's ``vllm`` stack against vLLM's real scheduler on the same requests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> int:
    """Parse the arguments, run both sides, print the comparison."""
    from kvpolicy.vllm._crosscheck import crosscheck, load_workload

    p = argparse.ArgumentParser(prog="python -m kvpolicy.vllm.crosscheck", description=__doc__)
    p.add_argument("--workload", required=True, help="uniform:N[:SEED] or a JSON request file")
    p.add_argument("--num-blocks", type=int, required=True, help="KV blocks (vLLM's count)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-batch", type=int, default=256)
    p.add_argument("--token-budget", type=int, default=2048)
    p.add_argument("--prefix-caching", action="store_true")
    p.add_argument("--kvpolicy", default=None, help="kvpolicy config JSON for both sides")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
