"""Token-PD's cost in a decode step at serving scale, on a CUDA GPU.

The model is Llama-3-8B-shaped (32 layers, hidden 4096, 32 query and 8 KV heads of 128,
SwiGLU 14,336, vocabulary 128,256: the kvmodel preset's KV shape and parameter count) with
random bf16 weights (no download), written as a plain torch decode step: RMSNorm, fused
QKV, rotary embedding, grouped-query attention over a KV cache of ``--context`` tokens per
stream, SwiGLU, the LM head. 256 streams decode one token each per step.

Token-PD's work per step, on the GPU and batch-global (seed 000 §4-5): the fused scoring
kernel on the step's (256, 128,256) logits (the logits MLP V -> 256 -> 1), the new tokens'
g written into the slots freed by the last step, and the selection of the tokens to evict
over every resident token of every stream (N = 256 x context), holding the cache at its
budget (256 evicted per step, the budget rule; the keep rule's host sync is timed apart),
then the dual price update (eq. 5).

Figures: median ms per step without and with Token-PD (eager, and replayed as CUDA graphs,
as serving engines run decode), the difference, and Token-PD's part alone (do_bench, L2
flushed) at N = 256 x context and at 10^6 tokens. Seed 000 claims Token-PD adds < 1 ms per
step at 256 streams (its fused kernel 0.37 ms on an A100).

Run: ``python benchmarks/bench_gpu_step.py [--quick] [--context 1024] [--out results/bench]``
(``nox -s bench_gpu``). Without a CUDA GPU it prints why and exits 0.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import Any

import torch
from _gpu_timing import capture, eager_ms, graph_ms
from _harness import parse_args, write_result

from kvpolicy.kernels import MLPWeights, ScoreParams, score_tokens, select_evictions
from kvpolicy.kvmodel import MODEL_PRESETS

STREAMS = 256
HIDDEN, HEADS, FFN, VOCAB = 4096, 32, 14_336, 128_256
SPEC = MODEL_PRESETS["Llama-3-8B"]
LAYERS, KV_HEADS, HEAD_DIM = SPEC.num_layers, SPEC.num_kv_heads, SPEC.head_dim
MLP_HIDDEN = 256
ETA = 0.05  # eq. 5's step size
PARAMS = ScoreParams(risk_aversion=0.1)  # the price moves on the device (TokenPDOnGPU)


class Llama8BShape:
    """Random bf16 weights and a KV cache of ``context`` tokens for each of 256 streams."""

    def __init__(self, context: int, device: torch.device) -> None:
        def w(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, device=device, dtype=torch.bfloat16) * 0.02

        q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
        self.embed = w(VOCAB, HIDDEN)
        self.layers = [
            {
                "n1": torch.ones(HIDDEN, device=device, dtype=torch.bfloat16),
                "wqkv": w(HIDDEN, q + 2 * kv),
                "wo": w(q, HIDDEN),
                "n2": torch.ones(HIDDEN, device=device, dtype=torch.bfloat16),
                "wgu": w(HIDDEN, 2 * FFN),
                "wd": w(FFN, HIDDEN),
                "k": w(STREAMS, KV_HEADS, context, HEAD_DIM),
                "v": w(STREAMS, KV_HEADS, context, HEAD_DIM),
            }
            for _ in range(LAYERS)
        ]
        self.norm = torch.ones(HIDDEN, device=device, dtype=torch.bfloat16)
        self.head = w(HIDDEN, VOCAB)
        self.context = context
        inv = 1.0 / (500_000.0 ** (torch.arange(0, HEAD_DIM, 2, device=device) / HEAD_DIM))
        angle = (context - 1) * inv
        self.cos = torch.cat((angle.cos(), angle.cos())).to(torch.bfloat16)
        self.sin = torch.cat((angle.sin(), angle.sin())).to(torch.bfloat16)

    def parameters(self) -> int:
        """Parameters held (the KV cache excluded)."""
        n = self.embed.numel() + self.norm.numel() + self.head.numel()
        for layer in self.layers:
            n += sum(t.numel() for k, t in layer.items() if k not in ("k", "v"))
        return n

    def _rope(self, x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * self.cos + rotated * self.sin

    @staticmethod
    def _rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * weight

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """One decode step: tokens (256,) int64 -> logits (256, 128,256) bf16.

        The new K/V go to the cache's last slot (its length stays ``context``).
        """
        x = self.embed[tokens]
        q_dim, kv_dim = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
        group = HEADS // KV_HEADS
        for layer in self.layers:
            qkv = self._rms(x, layer["n1"]) @ layer["wqkv"]
            q = self._rope(qkv[:, :q_dim].view(STREAMS, KV_HEADS, group, HEAD_DIM))
            k = self._rope(qkv[:, q_dim : q_dim + kv_dim].view(STREAMS, KV_HEADS, HEAD_DIM))
            layer["k"][:, :, -1] = k
            layer["v"][:, :, -1] = qkv[:, q_dim + kv_dim :].view(STREAMS, KV_HEADS, HEAD_DIM)
            att = (q @ layer["k"].transpose(-1, -2)).float() / math.sqrt(HEAD_DIM)
            out = att.softmax(-1).to(torch.bfloat16) @ layer["v"]  # (S, KV, group, D)
            x = x + out.reshape(STREAMS, q_dim) @ layer["wo"]
            gate, up = (self._rms(x, layer["n2"]) @ layer["wgu"]).chunk(2, dim=-1)
            x = x + (torch.nn.functional.silu(gate) * up) @ layer["wd"]
        return self._rms(x, self.norm) @ self.head


class TokenPDOnGPU:
    """Token-PD's batch-global state on the GPU: g of every resident token and the price.

    Each step scores the new tokens, writes their g into the slots the last step freed,
    evicts down to the budget and moves the dual price by eq. 5. ``keep_rule`` adds seed
    000's eq. 4 (evict every g < 0), whose count needs one host sync per step.
    ``checked``: the selection through ``select_evictions``, whose NaN check syncs with
    the host once a step; False runs its kernels directly (``select_evictions_triton``),
    as an engine that replays the step as a CUDA graph must.
    """

    def __init__(
        self, resident: int, device: torch.device, keep_rule: bool = False, checked: bool = True
    ) -> None:
        self.mlp = MLPWeights(
            torch.randn(MLP_HIDDEN, VOCAB) / VOCAB**0.5,
            torch.randn(MLP_HIDDEN) * 0.1,
            torch.randn(MLP_HIDDEN),
            0.1,
            risk=0.01,
        )
        # Drawn on the CPU: the device generator may not be used once a graph was captured.
        self.g = torch.rand(resident).to(device)
        self.free = torch.arange(STREAMS, device=device)
        self.price = torch.zeros((), device=device)
        self.budget = resident - STREAMS
        self.keep_rule = keep_rule
        self.checked = checked

    def step(self, logits: torch.Tensor) -> None:
        """Score, insert, select, price: all on the device."""
        # The price moves on the device; the kernel's scalar price stays 0 and g is shifted.
        scores = score_tokens(logits, self.mlp, PARAMS)
        self.g[self.free] = scores.excess - self.price
        if self.checked:
            sel = select_evictions(self.g, self.budget, keep_rule=self.keep_rule)
        else:
            from kvpolicy.kernels._triton import select_evictions_triton

            sel = select_evictions_triton(self.g, self.budget, self.keep_rule)
        # Under a CUDA graph, each replay writes the slots captured (same work per step).
        self.free = sel.indices[:STREAMS]
        # eq. 5: exponentiated dual update of the price on the demand/budget ratio.
        demand = float(sel.demand)
        self.price = (self.price + 1e-3) * math.exp(ETA * (demand / self.budget - 1.0))


def _paired_ms(a: Callable[[], Any], b: Callable[[], Any], steps: int) -> tuple[float, float]:
    """Median ms of ``a`` and of ``b``, alternated step by step (CUDA events around each),
    so that a change of clocks or of memory placement falls on both alike."""
    for _ in range(5):
        a()
        b()
    torch.cuda.synchronize()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(steps):
        for fn, out in ((a, times[0]), (b, times[1])):
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()  # type: ignore[no-untyped-call]
            fn()
            end.record()  # type: ignore[no-untyped-call]
            end.synchronize()  # type: ignore[no-untyped-call]
            out.append(float(start.elapsed_time(end)))  # type: ignore[no-untyped-call]
    return sorted(times[0])[steps // 2], sorted(times[1])[steps // 2]


def _graph(fn: Callable[[], Any]) -> Callable[[], Any] | str:
    """``fn`` captured as a CUDA graph (its replay), or why capture failed."""
    try:
        return capture(fn).replay
    except Exception as err:  # a step that cannot be captured is a finding
        torch.cuda.synchronize()
        return f"{type(err).__name__}: {str(err)[:160]}"


def main() -> int:
    def more(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--context", type=int, default=1024, help="KV tokens per stream")

    args = parse_args(__doc__.splitlines()[0], more)
    if not torch.cuda.is_available():
        print("bench_gpu_step: no CUDA GPU here; nothing measured (figures await a GPU)")
        return 0
    if args.context < 2:
        print(f"bench_gpu_step: --context must be >= 2, got {args.context}", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    torch.manual_seed(0)
    steps = 10 if args.quick else 30
    model = Llama8BShape(args.context, dev)
    resident = STREAMS * args.context
    pd = TokenPDOnGPU(resident, dev)
    tokens = torch.randint(0, VOCAB, (STREAMS,), device=dev)
    logits = model.step(tokens)

    def plain() -> None:
        model.step(tokens)

    def with_pd() -> None:
        pd.step(model.step(tokens))

    figures: dict[str, Any] = {
        "model": f"Llama-3-8B-shaped, random bf16 weights, {model.parameters():,} parameters",
        "streams": STREAMS,
        "context_per_stream": args.context,
        "resident_tokens": resident,
        "kv_cache_bytes": 2 * LAYERS * STREAMS * KV_HEADS * args.context * HEAD_DIM * 2,
    }
    eager = _paired_ms(plain, with_pd, steps)
    figures["eager_step_ms"], figures["eager_step_with_tokenpd_ms"] = eager
    figures["eager_tokenpd_added_ms"] = eager[1] - eager[0]
    print(figures, flush=True)
    # As serving engines run decode: each step replayed as a CUDA graph.
    unchecked = TokenPDOnGPU(resident, dev, checked=False)
    replays = [_graph(plain), _graph(lambda: unchecked.step(model.step(tokens)))]
    if isinstance(replays[0], str) or isinstance(replays[1], str):
        figures["graph_error"] = [r for r in replays if isinstance(r, str)]
    else:
        graphs = _paired_ms(replays[0], replays[1], steps)
        figures["graph_step_ms"], figures["graph_step_with_tokenpd_ms"] = graphs
        figures["graph_tokenpd_added_ms"] = graphs[1] - graphs[0]
    print(figures, flush=True)
    # Token-PD's part alone on the step's logits: a call (L2 flushed) and its GPU time.
    parts: dict[str, Any] = {}
    parts["score_ms"] = eager_ms(lambda: score_tokens(logits, pd.mlp, PARAMS), 200)
    parts["score_gpu_ms"] = graph_ms(lambda: score_tokens(logits, pd.mlp, PARAMS))
    for n in (resident, 1_000_000):
        checked = TokenPDOnGPU(n, dev)
        parts[f"step_{n}_ms"] = eager_ms(lambda: checked.step(logits), 200)  # noqa: B023
        kernels = TokenPDOnGPU(n, dev, checked=False)
        parts[f"step_{n}_gpu_ms"] = graph_ms(lambda: kernels.step(logits))  # noqa: B023
        keep = TokenPDOnGPU(n, dev, keep_rule=True)
        parts[f"step_keep_rule_{n}_ms"] = eager_ms(lambda: keep.step(logits), 200)  # noqa: B023
        print(parts, flush=True)
    figures["tokenpd_alone"] = parts
    step_gpu = parts[f"step_{resident}_gpu_ms"]
    figures["claim_under_1ms_per_step_gpu"] = isinstance(step_gpu, float) and step_gpu < 1.0
    figures["claim_under_1ms_per_step_call"] = parts[f"step_{resident}_ms"] < 1.0
    print(figures, flush=True)
    write_result("bench_gpu_step", figures, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
