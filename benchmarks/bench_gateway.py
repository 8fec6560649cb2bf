"""kvpolicy-tenancy gateway: decision latency, Redis decisions, replica exactness, overhead.

* ``decision_p50_us`` / ``decision_p99_us``: one ``TokenPoolGate.check`` in process (the
  in-memory store), each followed by its release (not timed). Goal p99 < 20 us.
* ``redis_decision_p50_us`` / ``redis_decision_p99_us``: one ``RedisLeaseGate.check`` (one
  Lua script, one round trip) against a ``redis-server`` on loopback started here; and
  ``redis_release_p50_us``. Goal p99 < 500 us.
* ``replica_violations``: 4 replica processes x ``decisions`` decisions on one entitlement
  of concurrency 8, each holding up to 4 requests; an independent Redis counter raised after
  each admission and lowered before each release counts the times it passed 8, per 10,000
  decisions. Goal 0.
* ``overhead_p50_ms`` / ``overhead_p99_ms``: latency through the gateway minus latency of
  calling the upstream directly, at ``rate_rps`` requests/s paced (500 by default), both
  processes on this machine (``_at_100rps``: the same at 100 requests/s). Until the
  simulated backend exists the upstream is a small OpenAI-shaped Starlette server
  (``_UPSTREAM`` below) answering at once.
* ``sustained_rps``: completed requests/s through the gateway with 32 concurrent clients.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _harness import parse_args, write_result

from kvpolicy.kvmodel import Request
from kvpolicy.tenancy import (
    RedisLeaseGate,
    Resources,
    TokenEntitlement,
    TokenPool,
    TokenPoolGate,
)

CONCURRENCY = 8


def _pool(tenants: int = 1, conc: int = CONCURRENCY) -> TokenPool:
    ents = [
        TokenEntitlement(f"t{i}", "elastic", Resources(1e9, 10**15, conc), max_output_tokens=16)
        for i in range(tenants)
    ]
    return TokenPool("bench", Resources(1e10, 10**16, 10**6), ents)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"nothing listens on {port}") from None
            time.sleep(0.05)


def bench_in_process(n: int) -> dict[str, float]:
    gate = TokenPoolGate(_pool(200), 1)
    times: list[float] = []
    clock = time.perf_counter_ns
    for i in range(n):
        req = Request(f"r{i}", 64, 16, tenant=f"t{i % 200}")
        now = i * 1e-4
        start = clock()
        gate.check(req, now)
        times.append((clock() - start) / 1e3)
        gate.release(req, now)
    return {"decision_p50_us": _pct(times, 0.5), "decision_p99_us": _pct(times, 0.99)}


def bench_redis(url: str, n: int) -> dict[str, float]:
    gate = RedisLeaseGate.from_url(_pool(200), 1, url, namespace="bench-latency")
    checks: list[float] = []
    releases: list[float] = []
    clock = time.perf_counter_ns
    for i in range(n):
        req = Request(f"r{i}", 64, 16, tenant=f"t{i % 200}")
        start = clock()
        gate.check(req)
        mid = clock()
        gate.release(req, 70)
        releases.append((clock() - mid) / 1e3)
        checks.append((mid - start) / 1e3)
    return {
        "redis_decision_p50_us": _pct(checks, 0.5),
        "redis_decision_p99_us": _pct(checks, 0.99),
        "redis_release_p50_us": _pct(releases, 0.5),
    }


def _replica(url: str, index: int, decisions: int, out: Any) -> None:
    import random

    import redis

    rng = random.Random(index)
    gate = RedisLeaseGate.from_url(_pool(1), 1, url, namespace="bench-replicas")
    probe = redis.Redis.from_url(url)
    held: list[Request] = []
    violations = 0
    for n in range(decisions):
        req = Request(f"{index}-{n}", 8, 1, tenant="t0")
        if gate.check(req).admitted:
            violations += int(probe.incr("bench-probe")) > CONCURRENCY
            held.append(req)
        if len(held) >= 4 or (held and rng.random() < 0.3):
            done = held.pop(rng.randrange(len(held)))
            probe.decr("bench-probe")
            gate.release(done, 9)
    for done in held:
        probe.decr("bench-probe")
        gate.release(done)
    out.put(violations)


def bench_replicas(url: str, decisions: int) -> dict[str, float]:
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_replica, args=(url, i, decisions, out)) for i in range(4)]
    start = time.perf_counter()
    for p in procs:
        p.start()
    violations = sum(out.get(timeout=600) for _ in procs)
    for p in procs:
        p.join()
    elapsed = time.perf_counter() - start
    total = 4 * decisions
    return {
        "replica_decisions": total,
        "replica_violations": violations * 10_000 / total,
        "replica_decisions_per_s": total / elapsed,
    }


_UPSTREAM = """
import sys, uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
async def complete(request):
    await request.body()
    return JSONResponse({"id": "c", "object": "text_completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
app = Starlette(routes=[Route("/v1/completions", complete, methods=["POST"])])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error")
"""

_GATEWAY = """
import sys, uvicorn
from kvpolicy.tenancy import Resources, TokenEntitlement, TokenPool, TokenPoolGate
from kvpolicy.tenancy.gateway import Admission, LocalGate, create_app
ent = TokenEntitlement("a", "elastic", Resources(1e9, 10**15, 10**5), max_output_tokens=16)
pool = TokenPool("bench", Resources(1e10, 10**16, 10**6), [ent])
adm = Admission(LocalGate(TokenPoolGate(pool, 1)), {"k": "a"})
app = create_app(adm, sys.argv[2])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error")
"""


async def _paced(url: str, n: int, rate: float) -> list[float]:
    import httpx

    body = {"model": "m", "prompt": "hello", "max_tokens": 1}
    headers = {"authorization": "Bearer k"}
    times: list[float] = []
    async with httpx.AsyncClient(timeout=30) as client:
        for _ in range(20):  # warm up the connection pool
            await client.post(url, json=body, headers=headers)

        async def one() -> None:
            start = time.perf_counter()
            r = await client.post(url, json=body, headers=headers)
            r.raise_for_status()
            times.append(time.perf_counter() - start)

        tasks = []
        t0 = time.perf_counter()
        for i in range(n):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
    return times


async def _sustained(url: str, seconds: float, clients: int) -> float:
    import httpx

    body = {"model": "m", "prompt": "hello", "max_tokens": 1}
    headers = {"authorization": "Bearer k"}
    done = 0
    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        stop = time.perf_counter() + seconds

        async def loop() -> None:
            nonlocal done
            while time.perf_counter() < stop:
                r = await client.post(url, json=body, headers=headers)
                r.raise_for_status()
                done += 1

        start = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(clients)))
        return done / (time.perf_counter() - start)


def bench_overhead(n: int, rates: tuple[float, ...]) -> dict[str, float]:
    up_port, gw_port = _free_port(), _free_port()
    upstream = subprocess.Popen([sys.executable, "-c", _UPSTREAM, str(up_port)])
    gateway = subprocess.Popen(
        [sys.executable, "-c", _GATEWAY, str(gw_port), f"http://127.0.0.1:{up_port}"]
    )
    try:
        _wait_port(up_port, upstream)
        _wait_port(gw_port, gateway)
        out: dict[str, float] = {}
        for rate in rates:
            suffix = "" if rate == rates[0] else f"_at_{rate:g}rps"
            direct = asyncio.run(_paced(f"http://127.0.0.1:{up_port}/v1/completions", n, rate))
            via = asyncio.run(_paced(f"http://127.0.0.1:{gw_port}/v1/completions", n, rate))
            out[f"direct_p50_ms{suffix}"] = _pct(direct, 0.5) * 1e3
            out[f"gateway_p50_ms{suffix}"] = _pct(via, 0.5) * 1e3
            out[f"overhead_p50_ms{suffix}"] = (_pct(via, 0.5) - _pct(direct, 0.5)) * 1e3
            out[f"overhead_p99_ms{suffix}"] = (_pct(via, 0.99) - _pct(direct, 0.99)) * 1e3
        out["rate_rps"] = rates[0]
        out["sustained_rps"] = asyncio.run(
            _sustained(f"http://127.0.0.1:{gw_port}/v1/completions", 3.0, 32)
        )
    finally:
        for proc in (gateway, upstream):
            proc.terminate()
            proc.wait(10)
    return out


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def main() -> None:
    args = parse_args(__doc__ or "")
    n = 5_000 if args.quick else 50_000
    figures: dict[str, Any] = {"cpu_cores": os.cpu_count()}
    figures.update(bench_in_process(n))
    binary = shutil.which("redis-server")
    missing = [m for m in ("redis", "starlette", "uvicorn", "httpx") if not _has(m)]
    if missing:  # the bench session must install kvpolicy-tenancy[gateway]
        figures["skipped"] = (
            f"not installed: {missing} (pip install --find-links dist 'kvpolicy-tenancy[gateway]')"
        )
    elif binary is None:
        figures["redis"] = "redis-server not installed: Redis figures skipped"
    else:
        port = _free_port()
        cmd = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        server = subprocess.Popen(
            [*cmd, "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            _wait_port(port, server)
            url = f"redis://127.0.0.1:{port}/0"
            figures.update(bench_redis(url, n // 5))
            figures.update(bench_replicas(url, 2_500 if args.quick else 10_000))
        finally:
            server.terminate()
            server.wait(10)
    if not missing:
        figures.update(bench_overhead(500 if args.quick else 2_000, (500.0, 100.0)))
    path = write_result("bench_gateway", figures, args.out)
    for key, value in figures.items():
        print(f"{key}: {value}")
    print(path)


if __name__ == "__main__":
    main()
