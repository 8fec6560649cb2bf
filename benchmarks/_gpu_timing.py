"""GPU timing shared by the GPU benchmarks: a call as Python issues it, and its GPU time.

Three figures per operation, because they answer different questions:

* ``eager_ms``: ``triton.testing.do_bench`` (median; the L2 flushed before each call). It
  includes the time the GPU waits for Python to launch the kernels, which dominates
  operations of tens of microseconds: what a caller pays without CUDA graphs.
* ``graph_ms``: the operation captured in a CUDA graph 8 times, each after an L2 flush,
  replayed, less a graph of the 8 flushes alone, over 8. No launch gaps, a cold L2: the
  GPU's own time, what a serving engine that replays decode steps as graphs pays, and
  what a roofline compares with. A message instead of a time where the operation cannot
  be captured (it synchronises with the host, or copies from it).
* ``kernel_us``: each kernel's own device time per call (``torch.profiler``, L2 flushed):
  where a multi-kernel operation's GPU time goes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_FLUSH: list[torch.Tensor] = []
REPEATS = 8


def eager_ms(fn: Callable[[], Any], rep_ms: int = 100) -> float:
    """Median ms of one call of ``fn`` as Python issues it (do_bench, L2 flushed)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median"))


def capture(body: Callable[[], Any]) -> torch.cuda.CUDAGraph:
    """``body`` captured in a CUDA graph, after a warm-up run on a side stream."""
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()  # warm-up outside the capture: compiles, caches, allocator
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return graph


def _replay_ms(graph: torch.cuda.CUDAGraph, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()  # type: ignore[no-untyped-call]
        graph.replay()
        end.record()  # type: ignore[no-untyped-call]
        end.synchronize()  # type: ignore[no-untyped-call]
        times.append(float(start.elapsed_time(end)))  # type: ignore[no-untyped-call]
    return sorted(times)[len(times) // 2]


def _flush_buffer() -> torch.Tensor:
    if not _FLUSH:
        _FLUSH.append(torch.empty(256 * 2**20, dtype=torch.int8, device="cuda"))
    return _FLUSH[0]


def kernel_us(fn: Callable[[], Any], reps: int = 20) -> dict[str, float] | str:
    """Device microseconds per call of each CUDA kernel ``fn`` runs, by kernel name, from
    ``torch.profiler`` over ``reps`` calls each after an L2 flush (the flush's own fill
    kernel left out). Kernel time alone: no launch gaps. Or why the profiler failed."""
    from torch.profiler import ProfilerActivity, profile

    flush = _flush_buffer()
    fn()
    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                flush.zero_()
                fn()
            torch.cuda.synchronize()
        out: dict[str, float] = {}
        for entry in prof.key_averages():
            total = getattr(entry, "device_time_total", None)
            if total is None:
                total = getattr(entry, "cuda_time_total", 0.0)
            if not total or "FillFunctor" in entry.key or entry.count < reps:
                continue
            out[entry.key[:80]] = float(total) / reps
        return out
    except Exception as err:  # a profiler that cannot read the device is a finding
        return f"profiler failed: {type(err).__name__}: {str(err)[:160]}"


def graph_ms(fn: Callable[[], Any], reps: int = 20) -> float | str:
    """GPU ms of one call of ``fn`` with a cold L2 (see the module), or why it failed."""
    flush = _flush_buffer()

    def with_fn() -> None:
        for _ in range(REPEATS):
            flush.zero_()
            fn()

    def flushes() -> None:
        for _ in range(REPEATS):
            flush.zero_()

    try:
        graphs = [capture(with_fn), capture(flushes)]
    except Exception as err:  # an operation that cannot be captured is a finding
        torch.cuda.synchronize()
        return f"not capturable: {type(err).__name__}: {str(err)[:160]}"
    # Interleaved, so that a change of clocks falls on both alike.
    a, b = [], []
    for _ in range(reps):
        a.append(_replay_ms(graphs[0], 1))
        b.append(_replay_ms(graphs[1], 1))
    med_a, med_b = sorted(a)[reps // 2], sorted(b)[reps // 2]
    return max(0.0, (med_a - med_b) / REPEATS)
