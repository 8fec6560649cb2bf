"""Block-pool operations and planning calls per second (kvpolicy-kvmodel).

Baseline, measured in the same run: a bare Python free list (``list.pop`` / ``list.append``)
doing the same number of block moves, the floor for any allocator written in Python. The
figures are each operation's rate and its cost as a multiple of that floor.
"""

from __future__ import annotations

import time

from _harness import parse_args, write_result

from kvpolicy.kvmodel import BlockPool, chain_block_hashes, get_gpu, get_model, plan_capacity


def _rate(fn: object, n: int) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return n / (time.perf_counter() - start)


def main() -> None:
    args = parse_args(__doc__ or "")
    n_req = 2_000 if args.quick else 20_000
    prompt, decode, bs = 200, 64, 16
    pool = BlockPool(num_blocks=n_req * 20, block_size=bs)
    ids = [f"r{i}" for i in range(n_req)]

    def baseline() -> None:
        free = list(range(n_req * 20))
        held = []
        for _ in range(n_req):
            held.append([free.pop() for _ in range(13)])
        for blocks in held:
            free.extend(blocks)

    def allocate() -> None:
        for rid in ids:
            pool.allocate(rid, prompt)

    def append() -> None:
        for _ in range(decode):
            for rid in ids[: n_req // 10]:
                pool.append(rid, 1)

    def share() -> None:
        for rid in ids[: n_req // 2]:
            pool.fork(rid, rid + "-fork")

    def free() -> None:
        for rid in pool.requests():
            pool.free(rid)

    hashes = chain_block_hashes(list(range(prompt)), bs)

    def prefix_hit() -> None:
        for rid in ids:
            pool.allocate(rid, prompt, prefix_hashes=hashes)

    model, gpu = get_model("Llama-3-8B"), get_gpu("H100-SXM")
    n_plan = 2_000 if args.quick else 20_000

    def plan() -> None:
        for s in range(1, n_plan + 1):
            plan_capacity(model, gpu, 1 + s % 8192)

    base = _rate(baseline, n_req)
    figures = {
        "baseline_freelist_requests_per_s": base,
        "allocate_per_s": _rate(allocate, n_req),
        "append_per_s": _rate(append, decode * (n_req // 10)),
        "share_per_s": _rate(share, n_req // 2),
        "free_per_s": _rate(free, n_req + n_req // 2),
        "prefix_hit_allocate_per_s": _rate(prefix_hit, n_req),
        "plan_calls_per_s": _rate(plan, n_plan),
        "requests": n_req,
        "prompt_tokens": prompt,
        "block_size": bs,
    }
    free()
    figures["allocate_cost_vs_baseline"] = base / figures["allocate_per_s"]
    figures["prefix_hit_cost_vs_baseline"] = base / figures["prefix_hit_allocate_per_s"]
    write_result("kvmodel_pool", figures, args.out)


if __name__ == "__main__":
    main()
