"""``python -m kvpolicy.vllm.compare [--blocks N] [--json]``: stock vs kvpolicy in vLLM."""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> int:
    """Run the preemption-heavy comparison on vLLM's real scheduler and print it."""
    from kvpolicy.vllm._compare import compare, preemption_heavy

    p = argparse.ArgumentParser(prog="python -m kvpolicy.vllm.compare", description=__doc__)
    p.add_argument("--blocks", type=int, default=256, help="KV blocks of 16 tokens")
    p.add_argument("--requests", type=int, default=100, help="requests in the workload")
    p.add_argument("--json", action="store_true", help="print JSON (finish orders included)")
    args = p.parse_args()
    result = compare(preemption_heavy(args.requests), args.blocks)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{'config':<24} {'steps':>6} {'preempt':>8} {'recomputed':>11} {'change':>8}")
    for name, row in result.items():
        change = row.get("recomputed_change")
        shown = "" if change is None else f"{change:+.1%}"
        print(
            f"{name:<24} {row['steps']:>6} {row['preemptions']:>8} "
            f"{row['recomputed_tokens']:>11} {shown:>8}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
