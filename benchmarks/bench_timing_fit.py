"""Fit the simulator's roofline time model to iterations measured on a real model.

SmolLM2-135M (the model of the quality harness, kvpolicy-evict-quality) runs decode and prefill
iterations with plain torch on this machine's device (CPU here, CUDA where one is present),
over a grid of batch sizes, context lengths and prefill chunks. The device's peaks are
measured in the same run (a large tensor copy for memory bandwidth, a large matmul for
FLOP/s) and stand in for a GPUSpec, so that the fitted efficiencies are fractions of what
this device sustains. Half of the rows fit :func:`kvpolicy.sim.fit_timing`; the other half
measure the fit's error. The measurements go to ``timing_measurements.csv`` (the format of
``kvpolicy sim fit-timing``) next to the JSON.

Run: ``nox -s bench -- benchmarks/bench_timing_fit.py`` (add ``--quick`` for a smaller grid).
"""

from __future__ import annotations

import csv
import statistics
import time
from typing import Any

import attrs
import numpy as np
from _harness import parse_args, write_result

from kvpolicy.kvmodel import GPUSpec, get_model
from kvpolicy.sim import TimingModel, fit_error, fit_timing


def _timed(fn: Any, repeats: int) -> float:
    """Median seconds of ``repeats`` calls after one warm-up."""
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _device_peaks(torch: Any, device: str, sync: Any) -> tuple[float, float]:
    """Sustained memory bandwidth (B/s, read + write of a copy) and matmul FLOP/s."""
    n = 64 * 2**20  # 256 MiB of float32
    a = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    b = torch.empty_like(a)

    def copy() -> None:
        b.copy_(a)
        sync()

    bw = 2 * a.numel() * 4 / _timed(copy, 5)
    m = 2048
    x = torch.randn(m, m, device=device)
    y = torch.randn(m, m, device=device)

    def mm() -> None:
        torch.mm(x, y)
        sync()

    flops = 2 * m**3 / _timed(mm, 5)
    return bw, flops


def _measure(quick: bool) -> tuple[list[list[float]], dict[str, Any]]:
    import torch
    from transformers import DynamicCache

    from kvpolicy.evict.quality import load_smollm2

    device = "cuda" if torch.cuda.is_available() else "cpu"

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    lm = load_smollm2()
    model = lm.model.to(device).eval()
    # The harness loads eager attention (to read the weights); serving uses fused attention.
    model.set_attn_implementation("sdpa")
    cfg = model.config
    kv_heads = int(cfg.num_key_value_heads)
    head_dim = int(cfg.hidden_size // cfg.num_attention_heads)
    layers = int(cfg.num_hidden_layers)
    vocab = int(cfg.vocab_size)
    repeats = 3 if quick else 5
    batches = (1, 4, 16) if quick else (1, 2, 4, 8, 16, 32)
    contexts = (128, 1024) if quick else (64, 256, 512, 1024, 2048)
    chunks = (16, 128, 512) if quick else (8, 32, 64, 128, 256, 512, 1024)
    rows: list[list[float]] = []
    gen = torch.Generator(device="cpu").manual_seed(0)
    with torch.inference_mode():
        # Decode: one new token per request over a random KV cache of `ctx` tokens (the
        # time of attention does not depend on the cached values).
        for b in batches:
            for ctx in contexts:
                cache = DynamicCache()
                for layer in range(layers):
                    k = torch.randn(b, kv_heads, ctx, head_dim, generator=gen).to(device)
                    cache.update(k, torch.randn_like(k), layer)
                ids = torch.randint(0, vocab, (b, 1), generator=gen).to(device)
                pos = torch.full((b, 1), ctx, dtype=torch.long, device=device)

                def step(ids: Any = ids, cache: Any = cache, pos: Any = pos) -> None:
                    model(input_ids=ids, past_key_values=cache, position_ids=pos, use_cache=True)
                    cache.crop(-1)  # back to `ctx` tokens for the next repeat
                    sync()

                rows.append([b, b, _timed(step, repeats), b * ctx])
        # Prefill: one request's chunk of `q` prompt tokens with no cache.
        for q in chunks:
            ids = torch.randint(0, vocab, (1, q), generator=gen).to(device)

            def prefill(ids: Any = ids) -> None:
                model(input_ids=ids, use_cache=False)
                sync()

            rows.append([1, q, _timed(prefill, repeats), q])
    bw, flops = _device_peaks(torch, device, sync)
    info = {
        "device": device if device == "cpu" else torch.cuda.get_device_name(),
        "measured_bandwidth_Bps": bw,
        "measured_matmul_flops": flops,
        "dtype": str(next(model.parameters()).dtype),
    }
    return rows, info


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    rows, info = _measure(args.quick)
    # The model as measured: fp32 weights and KV on this device.
    spec = attrs.evolve(get_model("SmolLM2-135M"), kv_dtype_bytes=4.0, weight_dtype_bytes=4.0)
    device = GPUSpec(
        f"{info['device']}-measured",
        hbm_bytes=2**35,
        hbm_bandwidth=info["measured_bandwidth_Bps"],
        peak_flops=info["measured_matmul_flops"],
    )
    arr = np.asarray(rows, dtype=np.float64)
    train, test = arr[0::2], arr[1::2]
    fit = fit_timing(spec, device, train)

    held_out = fit_error(fit, test)
    defaults = fit_error(TimingModel(spec, device), test)

    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / "timing_measurements.csv"
    with csv_path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["batch", "tokens", "seconds", "kv_tokens"])
        w.writerows(rows)
    figures = {
        **info,
        "rows": len(rows),
        "measurements_csv": str(csv_path),
        "fitted": {
            "bandwidth_efficiency": fit.bandwidth_efficiency,
            "flops_efficiency": fit.flops_efficiency,
            "overhead_s": fit.overhead_s,
        },
        "held_out_median_rel_error": held_out["median_rel_error"],
        "held_out_max_rel_error": held_out["max_rel_error"],
        "held_out_r2": held_out["r2"],
        "default_constants_median_rel_error": defaults["median_rel_error"],
        "error_ratio_default_over_fitted": defaults["median_rel_error"]
        / max(held_out["median_rel_error"], 1e-12),
    }
    write_result("timing_fit", figures, args.out)


if __name__ == "__main__":
    main()
