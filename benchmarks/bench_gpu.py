"""GPU benchmark of kvpolicy-kernels: fused scoring against the HBM roofline, eager torch
and ``torch.compile``; selection over 10^6 resident tokens against ``torch.topk``.

Scoring: B = 1, 64, 256 new tokens at V = 49,152 and 128,256, bf16 logits, seed 000's MLP
(V -> 256 -> 1, bf16 W1) and the compact predictor. The roofline is the bytes that must
move (logits once, W1 once, 12 bytes out per token) over the HBM bandwidth, given twice:
the datasheet bandwidth of the kvmodel preset and the device-to-device copy bandwidth
measured in the same run (bytes read + written over the copy's time). Eager torch (fp32
and bf16 dots) and ``torch.compile`` of the bf16 version run the same arithmetic on the
same tensors in the same process. Goals: within 1.5x of the roofline, ahead of
``torch.compile``; seed 000 reports 0.37 ms for B = 256 on an A100.

Selection: g of 10^6 tokens, with heavy ties (1,000 distinct values, 20% below zero) and
continuous (normal, 16% below zero), evicting 10% (budget 900,000) and with the keep
rule; ``torch.topk(k, largest=False)`` on the same g is the baseline (it does not give
evict's tie order, the kernel does). Goal: within 2x of topk.

Every operation has two times (``_gpu_timing``): ``*_ms``, a call as Python issues it
(do_bench, L2 flushed; launch latency included), and ``*_gpu_ms``, its GPU time from CUDA
graph replays with a cold L2 (what the roofline compares with, and what a serving engine
replaying decode steps as graphs pays). ``select_evictions`` syncs with the host once per
call (its NaN check; with the keep rule, the count of g < 0 too): its graph time is that
of the kernels it runs after the checks (``select_evictions_triton``), without the keep
rule.

``--tune`` also sweeps the scoring kernel's launch for both predictors (tile sizes,
vocabulary slices, warps, pipeline stages; ``kvpolicy.kernels._triton.ScoreLaunch``; the
compact predictor's programs per SM) at each shape, checks every
configuration against the torch reference and times it on the GPU (graph replays, cold
L2) and as a call; ``score_launch`` holds what it found. ``*_kernels_us`` is each
kernel's own device time per call (``torch.profiler``): where the GPU time goes.

Where there is no CUDA GPU it prints why and exits 0 without writing figures.

Run: ``python benchmarks/bench_gpu.py [--quick] [--tune] [--out results/bench]``
(``nox -s bench_gpu``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import torch
from _gpu_timing import eager_ms, graph_ms, kernel_us
from _harness import parse_args, write_result

from kvpolicy.kernels import CompactWeights, MLPWeights, ScoreParams, score_tokens, select_evictions
from kvpolicy.kvmodel import GPU_PRESETS, GPUSpec

HIDDEN = 256
PARAMS = ScoreParams(risk_aversion=0.1, price=0.01)


def _gpu_spec(name: str) -> GPUSpec:
    """The kvmodel preset of the device (by name and memory), H100-SXM when unknown."""
    mem = torch.cuda.get_device_properties(0).total_memory
    if "H200" in name:
        return GPU_PRESETS["H200"]
    if "H100" in name:
        return GPU_PRESETS["H100-SXM"]
    if "A100" in name:
        return GPU_PRESETS["A100-80GB" if mem > 50 * 1024**3 else "A100-40GB"]
    if "L40S" in name:
        return GPU_PRESETS["L40S"]
    return GPU_PRESETS["H100-SXM"]


def _copy_bandwidth() -> float:
    """Bytes per second of a 2 GiB device-to-device copy, counting bytes read and written."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = eager_ms(lambda: dst.copy_(src), 50)
    return 2 * 2**30 / (ms / 1e3)


def _eager_mlp(z: torch.Tensor, w1t: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor) -> Any:
    zf = z.float()
    x = zf - torch.logsumexp(zf, dim=1, keepdim=True)
    r = torch.sigmoid(torch.relu(x @ w1t.float() + b1) @ w2 + 0.1)
    return r, r - PARAMS.risk_aversion * 0.01 - PARAMS.price


def _eager_mlp_bf16(z: torch.Tensor, w1t: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor) -> Any:
    # What a practitioner writes on a GPU: the dot in bf16 on tensor cores.
    zf = z.float()
    lse = torch.logsumexp(zf, dim=1, keepdim=True)
    h = (z @ w1t).float() - lse * w1t.float().sum(0) + b1
    r = torch.sigmoid(torch.relu(h) @ w2 + 0.1)
    return r, r - PARAMS.risk_aversion * 0.01 - PARAMS.price


def _both(name: str, fn: Callable[[], Any], row: dict[str, Any], rep_ms: int) -> None:
    """``row[name_ms]`` (a call) and ``row[name_gpu_ms]`` (GPU time, or why none)."""
    row[f"{name}_ms"] = eager_ms(fn, rep_ms)
    row[f"{name}_gpu_ms"] = graph_ms(fn)


def _ratio(a: Any, b: Any) -> float | None:
    return a / b if isinstance(a, float) and isinstance(b, float) and b > 0 else None


def _scoring(spec: GPUSpec, measured_bw: float, quick: bool) -> list[dict[str, Any]]:
    dev = torch.device("cuda")
    rows = []
    rep_ms = 30 if quick else 100
    compiled = torch.compile(_eager_mlp_bf16)
    for v in (49_152, 128_256):
        mlp = MLPWeights(
            torch.randn(HIDDEN, v) / v**0.5, torch.randn(HIDDEN) * 0.1, torch.randn(HIDDEN), 0.1
        )
        w1t, _rowsum, b1, w2 = mlp.prepared(torch.bfloat16, dev)
        compact = CompactWeights((-2.0, -0.3, 1.1, -0.4, 0.8, 3.0, 0.2), 0.6)
        for b in (1, 64, 256):
            z = (torch.randn(b, v) * 2).to(device=dev, dtype=torch.bfloat16)
            pos = torch.arange(b, device=dev)
            att = (torch.rand(b) * 0.05).to(dev)
            nbytes_mlp = b * v * 2 + v * HIDDEN * 2 + 12 * b
            nbytes_compact = b * v * 2 + 16 * b + 12 * b
            row: dict[str, Any] = {"B": b, "V": v, "mlp_bytes": nbytes_mlp}
            _both("mlp", lambda: score_tokens(z, mlp, PARAMS), row, rep_ms)  # noqa: B023
            _both(
                "compact",
                lambda: score_tokens(z, compact, PARAMS, positions=pos, attention=att),  # noqa: B023
                row,
                rep_ms,
            )
            _both("eager_fp32", lambda: _eager_mlp(z, w1t, b1, w2), row, rep_ms)  # noqa: B023
            _both("eager_bf16", lambda: _eager_mlp_bf16(z, w1t, b1, w2), row, rep_ms)  # noqa: B023
            _both("torch_compile", lambda: compiled(z, w1t, b1, w2), row, rep_ms)  # noqa: B023
            # Where the GPU time goes: each kernel's own time (no launch gaps).
            row["mlp_kernels_us"] = kernel_us(lambda: score_tokens(z, mlp, PARAMS))  # noqa: B023
            row["torch_compile_kernels_us"] = kernel_us(lambda: compiled(z, w1t, b1, w2))  # noqa: B023
            for name, nbytes in (("mlp", nbytes_mlp), ("compact", nbytes_compact)):
                roof = nbytes / spec.hbm_bandwidth * 1e3
                row[f"{name}_roofline_ms"] = roof
                row[f"{name}_vs_roofline"] = row[f"{name}_ms"] / roof
                row[f"{name}_gpu_vs_roofline"] = _ratio(row[f"{name}_gpu_ms"], roof)
                row[f"{name}_gpu_vs_measured_copy"] = _ratio(
                    row[f"{name}_gpu_ms"], nbytes / measured_bw * 1e3
                )
            row["speedup_vs_torch_compile"] = row["torch_compile_ms"] / row["mlp_ms"]
            row["gpu_speedup_vs_torch_compile"] = _ratio(
                row["torch_compile_gpu_ms"], row["mlp_gpu_ms"]
            )
            print(row, flush=True)
            rows.append(row)
    return rows


def _selection(quick: bool, tune: bool) -> list[dict[str, Any]]:
    dev = torch.device("cuda")
    n = 1_000_000
    ties = (torch.randint(-200, 800, (n,)).float() / 1024.0).to(dev)
    continuous = (torch.randn(n) + 1.0).to(dev)  # about 16% below zero, no ties
    rep_ms = 30 if quick else 100
    rows = []
    cases = [(d, g, k) for d, g in (("ties", ties), ("continuous", continuous)) for k in (0, 1)]
    for dist, g, keep in cases:
        budget, keep_rule = 900_000, bool(keep)
        k = max(int((g < 0).sum()) if keep_rule else 0, n - budget)
        row: dict[str, Any] = {"g": dist, "N": n, "evicted": k, "keep_rule": keep_rule}
        select = lambda: select_evictions(g, budget, keep_rule=keep_rule)  # noqa: B023, E731
        topk = lambda: torch.topk(g, k, largest=False, sorted=False)  # noqa: B023, E731
        row["select_ms"] = eager_ms(select, rep_ms)
        row["topk_ms"] = eager_ms(topk, rep_ms)
        row["select_vs_topk"] = row["select_ms"] / row["topk_ms"]
        if not keep_rule:  # the keep rule's count of g < 0 syncs with the host
            # The kernels the dispatcher runs after its checks (its NaN check syncs once).
            from kvpolicy.kernels._triton import select_evictions_triton

            row["select_gpu_ms"] = graph_ms(
                lambda: select_evictions_triton(g, budget, False)  # noqa: B023
            )
            row["topk_gpu_ms"] = graph_ms(topk)
            row["select_gpu_vs_topk"] = _ratio(row["select_gpu_ms"], row["topk_gpu_ms"])
        row["torch_reference_ms"] = eager_ms(
            lambda: select_evictions(g, budget, keep_rule=keep_rule, backend="torch"),  # noqa: B023
            rep_ms,
        )
        if tune:
            from kvpolicy.kernels._triton import select_evictions_triton

            row["select_ms_by_block"] = {
                blk: eager_ms(
                    lambda: select_evictions_triton(g, budget, keep_rule, block=blk),  # noqa: B023
                    rep_ms,
                )
                for blk in (1024, 2048, 4096, 8192, 16384)
            }
        print(row, flush=True)
        rows.append(row)
    return rows


def _launches(b: int, v: int, sms: int) -> list[Any]:
    """The scoring launches the sweep tries at (b, v): tiles, slices per SM, warps, stages."""
    from kvpolicy.kernels._triton import ScoreLaunch  # imports triton: GPU runs only

    out = []
    block_bs = {1: (16,), 64: (16, 32, 64)}.get(b, (32, 64, 128))
    for bb in block_bs:
        for bv in (64, 128):
            for warps in (4, 8):
                if bb * HIDDEN // (32 * warps) > 256:
                    continue  # the (BLOCK_B, H) fp32 accumulator alone exceeds the registers
                for stages in (3, 4):
                    row_blocks = -(-b // bb)
                    for per_sm in (1, 2, 4):
                        splits = max(1, min(-(-v // bv), per_sm * sms // row_blocks))
                        out.append(ScoreLaunch(bb, bv, splits, warps, stages))
    return out


def _compact_launches(b: int, v: int, sms: int) -> list[Any]:
    """The compact predictor's launches the sweep tries (no dot, so no pipelined loads: the
    programs in flight per SM are what keeps loads in flight)."""
    from kvpolicy.kernels._triton import ScoreLaunch  # imports triton: GPU runs only

    out = []
    for bb in (16,) if b <= 16 else (16, 64):
        row_blocks = -(-b // bb)
        for bv in (64, 128, 256):
            for per_sm in (2, 4, 8):
                splits = max(1, min(-(-v // bv), per_sm * sms // row_blocks))
                out.append(ScoreLaunch(bb, bv, splits, 4))
    return out


def _sweep(
    b: int,
    v: int,
    launches: list[Any],
    run: Callable[[Any], Any],
    want: Any,
    default: Callable[[], Any],
    rep_ms: int,
) -> dict[str, Any]:
    """Check every launch against ``want``, time those that pass on the GPU and as calls."""
    tried: list[dict[str, Any]] = []
    for launch in launches:
        entry: dict[str, Any] = dict(launch._asdict())
        try:
            got = run(launch)
            for g, w in zip(got, want, strict=True):
                torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-3)
        except Exception as err:  # a launch that fails to compile or run is a finding
            entry["error"] = f"{type(err).__name__}: {str(err)[:120]}"
            tried.append(entry)
            continue
        entry["gpu_ms"] = graph_ms(lambda: run(launch), reps=10)  # noqa: B023
        entry["ms"] = eager_ms(lambda: run(launch), rep_ms)  # noqa: B023
        tried.append(entry)
    timed = [t for t in tried if isinstance(t.get("gpu_ms"), float)]
    best = min(timed, key=lambda t: t["gpu_ms"]) if timed else None
    default_gpu_ms = graph_ms(default, reps=10)
    return {
        "B": b,
        "V": v,
        "default_ms": eager_ms(default, rep_ms),
        "default_gpu_ms": default_gpu_ms,
        "best": best,
        "best_gpu_over_default": _ratio(best["gpu_ms"], default_gpu_ms) if best else None,
        "tried": len(tried),
        "failed": [t for t in tried if "error" in t],
        "top5": sorted(timed, key=lambda t: t["gpu_ms"])[:5],
    }


def _tune(
    quick: bool, dev: torch.device | None = None, shapes: tuple[tuple[int, int], ...] = ()
) -> dict[str, list[dict[str, Any]]]:
    """Sweep the scoring launch of both predictors at each benchmark shape (bf16), every
    launch checked against the torch reference and timed."""
    from kvpolicy.kernels._triton import (  # imports triton: GPU runs only
        _device_limits,
        score_tokens_triton,
    )

    dev = dev or torch.device("cuda")
    interpret = dev.type == "cpu"  # a rehearsal under Triton's interpreter
    sms, _smem = _device_limits(dev)  # the device's SM count; the interpreter's stand-in
    rep_ms = 10 if quick else 20
    shapes = shapes or tuple((b, v) for v in (49_152, 128_256) for b in (1, 64, 256))
    compact = CompactWeights((-2.0, -0.3, 1.1, -0.4, 0.8, 3.0, 0.2), 0.6)
    out: dict[str, list[dict[str, Any]]] = {"mlp": [], "compact": []}
    for b, v in shapes:
        mlp = MLPWeights(
            torch.randn(HIDDEN, v) / v**0.5, torch.randn(HIDDEN) * 0.1, torch.randn(HIDDEN), 0.1
        )
        z = (torch.randn(b, v) * 2).to(device=dev, dtype=torch.bfloat16)
        pos = torch.arange(b, device=dev)
        att = (torch.rand(b) * 0.05).to(dev)
        feats = {"positions": pos, "attention": att}
        cases = (
            ("mlp", mlp, {}, _launches(b, v, sms)),
            ("compact", compact, feats, _compact_launches(b, v, sms)),
        )
        for name, predictor, extra, launches in cases:
            want = score_tokens(z, predictor, PARAMS, backend="torch", **extra)

            def run(launch: Any, p: Any = predictor, kw: Any = extra) -> Any:
                return score_tokens_triton(
                    z,  # noqa: B023
                    p,
                    PARAMS,
                    kw.get("positions"),
                    kw.get("attention"),
                    interpret=interpret,
                    launch=launch,
                )

            def default(p: Any = predictor, kw: Any = extra) -> Any:
                return score_tokens(z, p, PARAMS, **kw)  # noqa: B023

            row = _sweep(b, v, launches, run, want, default, rep_ms)
            show = ("B", "V", "default_gpu_ms", "best", "tried")
            print(name, {k: row[k] for k in show}, flush=True)
            out[name].append(row)
    return out


def main() -> int:
    def more(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--tune", action="store_true", help="sweep the scoring launch")

    args = parse_args(__doc__.splitlines()[0], more)
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA GPU here; nothing measured (figures await a GPU)")
        return 0
    torch.manual_seed(0)
    name = torch.cuda.get_device_name(0)
    spec = _gpu_spec(name)
    measured_bw = _copy_bandwidth()
    print(f"bench_gpu: {name}, preset {spec.name} {spec.hbm_bandwidth / 1e12:.2f} TB/s, "
          f"measured copy {measured_bw / 1e12:.2f} TB/s", flush=True)  # fmt: skip
    figures: dict[str, Any] = {
        "gpu": name,
        "gpu_spec": spec.name,
        "hbm_bandwidth": spec.hbm_bandwidth,
        "measured_copy_bandwidth": measured_bw,
        "selection": _selection(args.quick, args.tune),
    }
    write_result("bench_gpu", figures, args.out)
    figures["scoring"] = _scoring(spec, measured_bw, args.quick)
    write_result("bench_gpu", figures, args.out)
    if args.tune:
        figures["tuning"] = _tune(args.quick)
        write_result("bench_gpu", figures, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
