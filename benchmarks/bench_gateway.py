"""kvpolicy-tenancy gateway: decision latency, Redis decisions, replica exactness, overhead.

* ``decision_p50_us`` / ``decision_p99_us``: one ``TokenPoolGate.check`` in process (the
  in-memory store), each followed by its release (not timed). Goal p99 < 20 us.
* ``redis_decision_p50_us`` / ``redis_decision_p99_us``: one ``RedisLeaseGate.check`` (one
  Lua script, one round trip) against a ``redis-server`` on loopback started here; and
  ``redis_release_p50_us``. Goal p99 < 500 us. ``redis_contended_decision_p50_us`` /
  ``_p99_us``: the same over a contended pool, where the priority check runs
  (``redis_contended_priority_denials``: the share of decisions it denied).
* ``replica_violations``: 4 replica processes x ``decisions`` decisions on one entitlement
  of concurrency 8, each holding up to 4 requests; an independent Redis counter raised after
  each admission and lowered before each release counts the times it passed 8, per 10,000
  decisions. Goal 0.
* The gateway processes run as ``kvpolicy tenancy serve`` runs them: ``serve`` (uvicorn,
  with uvloop and httptools where installed, and the front's limits on request heads).
  ``--gateway-src DIR`` puts ``DIR`` first on their ``PYTHONPATH``: another version of
  kvpolicy-tenancy (the code before a change) measured under the same load generator.
* ``overhead_p50_ms`` / ``overhead_p99_ms``: latency through the gateway minus latency of
  calling the simulated backend (``kvpolicy sim backend --model Llama-3-8B --gpu H100-SXM``)
  directly, in the same run, paced at ``rate_rps`` requests/s (500); ``_at_100rps`` and
  ``_at_300rps`` at those rates; ``_redis`` through a gateway over a ``RedisLeaseGate``.
  All processes (load generator, gateway, backend, Redis) share this machine's cores.
  Median over ``rounds`` rounds; ``_best`` the smallest round; ``_rounds`` every round.
  ``None`` where the backend called directly already queues at that rate
  (``saturated_rps``): there the difference measures the backend, not the gateway.
* ``overhead_p50_ms_instant_backend``: the same at 500 requests/s in front of an upstream
  that answers at once: the gateway's own cost, without the simulated server's iterations
  (a request waits for the iteration under way, so its latency moves with the timing of its
  arrival and with what else runs on the cores).
  ``overhead_p50_ms_instant_backend_redis``: the same through a gateway over a
  ``RedisLeaseGate``. ``gateway_cpu_ms_per_request_instant_backend`` (``_redis``): the
  gateway process's CPU time per request over those paced runs (on a shared machine,
  steadier than latencies). ``--overhead-only`` runs just the overhead figures (these, the
  simulated backend's, and the fleet's at 1 and 4 backends) into
  ``bench_gateway_overhead.json``; ``load_average_before`` / ``_after``: the machine's
  load averages around them.
* ``upstream_client_cpu_us_per_request`` / ``httpcore_client_cpu_us_per_request``: CPU of
  the client process per request, sequential POSTs on one kept-alive connection to the
  instant upstream, with the gateway's hand-written client and with httpcore (median of 3
  rounds in alternating order): what a well-kept client would cost the gateway.
* ``sustained_rps``: completed requests/s through the gateway with 32 concurrent clients
  (``direct_sustained_rps``: the backend alone).

In front of a fleet (issue 26; ``--fleet-only`` runs just these, into
``bench_gateway_fleet.json``):

* ``routing_p50_us_<router>_<n>`` / ``routing_p99_us_<router>_<n>``: one routing decision
  of the gateway in process (``Fleet.pick``: the views rebuilt where they changed, the
  prefix index looked up, the router called) over ``n`` = 4 and 64 backends, on a
  prefix-heavy stream (64 conversations, 8 shared blocks and 2 of their own each) with up
  to ``2 n`` requests in flight; ``routing_cpu_*``: the same in the thread's CPU time (on
  a shared machine the wall clock also counts the time other processes hold the core; the
  CPU clock, a system call, is read outside the wall clock's window, and the request's id
  formatted before it, which they were not before 2026-11-26: about 1 us, more at the
  tail);
  ``router_only_cpu_*``: the router's ``route`` alone on the same views (the
  kvpolicy-admit class's own cost). Goal p99 <= 50 us at 64 backends.
  ``compiled`` (at the JSON's top) says whether kvpolicy-admit's and kvpolicy-tenancy's
  routing modules ran compiled (mypyc: as ``nox -s bench`` builds them where a C compiler
  is found); when they
  did, ``routing_interpreted_*_weighted_<n>`` are ``weighted``'s figures with the same
  sources interpreted, in a child process of the same run.
  ``routing_update_cpu_*``: what keeping the views current costs per request, outside
  the decision (``Fleet.begin`` of the routed request and, for about a third of them,
  ``Fleet.end`` of one in flight: each rebuilds that backend's view).
  ``load_average``: the machine's 1-minute load when they ran.
* ``fleet_overhead_p50_ms_instant_4_backends``: as ``overhead_p50_ms_instant_backend``, at
  500 requests/s, through a gateway spreading over 4 instant upstreams with
  ``least-requests`` (scrapes and health checks on), against one upstream called directly;
  goal < 1 ms, as with one backend (``..._1_backends``: the same gateway over one upstream,
  in the same run; ``_best``: the smallest round). ``fleet_sustained_rps_4_backends``:
  requests/s through that gateway with 32 concurrent clients
  (``fleet_direct_sustained_rps_4_backends``: one upstream alone);
  ``fleet_gateway_cpu_ms_per_request_<n>_backends``: the gateway process's CPU time over
  that sustained run per request served (on a shared machine, steadier than latencies),
  ``..._paced_<n>_backends`` over the paced rounds. ``--overhead-only`` also measures
  each through a gateway over a ``RedisLeaseGate`` (``..._<n>_backends_redis``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
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

from _harness import compiled_core, parse_args, run_interpreted, write_result

from kvpolicy.kvmodel import Request
from kvpolicy.tenancy import (
    GateConfig,
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
    return TokenPool("bench", Resources(1e10, 2**53, 10**6), ents)


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


def bench_redis_contended(url: str, n: int) -> dict[str, float]:
    """Decisions over a contended pool: 200 tenants share 64 slots, contended from 48 on
    (``contention_level`` 0.75), and want 96 requests in flight, so most decisions take the
    priority check; a 0.1 s control interval makes the threshold refresh (one per interval,
    over the tenants in flight) frequent."""
    from collections import deque

    ents = [
        TokenEntitlement(f"t{i}", "elastic", Resources(1e9, 10**15, 8), max_output_tokens=16)
        for i in range(200)
    ]
    pool = TokenPool("contended", Resources(1e10, 2**53, 64), ents)
    config = GateConfig(update_interval_s=0.1, contention_level=0.75)
    gate = RedisLeaseGate.from_url(pool, 1, url, namespace="bench-contended", config=config)
    held: deque[Request] = deque()
    times: list[float] = []
    by_priority = 0
    clock = time.perf_counter_ns
    for i in range(n):
        req = Request(f"c{i}", 64, 16, tenant=f"t{(i * 7) % 200}")
        start = clock()
        decision = gate.check(req)
        times.append((clock() - start) / 1e3)
        by_priority += decision.reason == "priority"
        if decision.admitted:
            held.append(req)
        if held and (len(held) > 96 or i % 3 == 0):  # 2 admissions per release
            gate.release(held.popleft(), 70)
    for req in held:
        gate.release(req)
    return {
        "redis_contended_decision_p50_us": _pct(times, 0.5),
        "redis_contended_decision_p99_us": _pct(times, 0.99),
        "redis_contended_priority_denials": by_priority / n,
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


_BACKEND = "from kvpolicy.sim.cli import main; main()"
MODEL = "Llama-3-8B"

# The gateway as ``kvpolicy tenancy serve`` runs it: ``serve`` (uvicorn with the front's
# limits on request heads) over a LocalGate, or a RedisLeaseGate with a Redis URL;
# ``python -c _GATEWAY PORT BACKEND[,BACKEND...] [REDIS_URL [ROUTER]]``. With several
# backends, scrapes and health checks are on (the router: least-requests by default).
_GATEWAY = """
import sys
from kvpolicy.tenancy import HealthConfig, RedisLeaseGate, Resources, RoutingConfig
from kvpolicy.tenancy import TokenEntitlement, TokenPool, TokenPoolGate
from kvpolicy.tenancy.gateway import Admission, LocalGate, create_app, serve
ent = TokenEntitlement("a", "elastic", Resources(1e9, 10**15, 10**5), max_output_tokens=16)
pool = TokenPool("bench", Resources(1e10, 2**53, 10**6), [ent])
if len(sys.argv) > 3 and sys.argv[3]:
    gate = RedisLeaseGate.from_url(pool, 1, sys.argv[3], namespace="bench-gateway")
else:
    gate = LocalGate(TokenPoolGate(pool, 1))
backends = sys.argv[2].split(",")
if len(backends) > 1:
    router = sys.argv[4] if len(sys.argv) > 4 else "least-requests"
    routing = RoutingConfig(router=router, health=HealthConfig(path="/v1/models"))
    app = create_app(Admission(gate, {"k": "a"}), backends, routing=routing)
else:
    app = create_app(Admission(gate, {"k": "a"}), backends[0])
serve(app, host="127.0.0.1", port=int(sys.argv[1]))
"""


_BODY = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 1}).encode()
_AUTH = b"Authorization: Bearer k\r\n"


def _client(url: str) -> tuple[Any, str]:
    """The load generator's client and the request path of ``url``.

    It is the gateway's own upstream client (keep-alive connections, the httptools parser):
    at about a third of aiohttp's CPU per request, the load generator leaves more of the
    shared cores to the gateway and the backend, for both paths measured alike.
    """
    from kvpolicy.tenancy._upstream import Upstream

    base, _, path = url.partition("/v1/")
    return Upstream(base, read_timeout_s=60.0), "/v1/" + path


async def _post(client: Any, path: str) -> None:
    reply = await client.request("POST", path, _BODY, headers=_AUTH)
    try:
        await reply.read()
        if reply.status != 200:
            raise RuntimeError(f"HTTP {reply.status}")
    finally:
        reply.release()


async def _paced(url: str, n: int, rate: float) -> tuple[list[float], int]:
    """Latencies (s) of ``n`` requests sent at ``rate`` per second, and how many failed."""
    from kvpolicy.tenancy._upstream import UpstreamError

    times: list[float] = []
    errors = 0
    client, path = _client(url)
    for _ in range(20):  # warm up: a kept-alive connection
        await _post(client, path)

    async def one() -> None:
        nonlocal errors
        start = time.perf_counter()
        try:
            await _post(client, path)
        except (UpstreamError, RuntimeError):
            errors += 1
            return
        times.append(time.perf_counter() - start)

    tasks = []
    t0 = time.perf_counter()
    for i in range(n):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)
    client.close()
    return times, errors


async def _sustained(url: str, seconds: float, clients: int) -> float:
    done = 0
    client, path = _client(url)
    stop = time.perf_counter() + seconds

    async def loop() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await _post(client, path)
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(clients)))
    client.close()
    return done / (time.perf_counter() - start)


GATEWAY_SRC: str | None = None
"""``--gateway-src``: a directory put first on the gateway processes' ``PYTHONPATH`` (to
measure another version of kvpolicy-tenancy, such as the code before a change, under the
same load generator and backends)."""


def _start(args: list[str], port: int) -> subprocess.Popen[bytes]:
    env = None
    if GATEWAY_SRC is not None and args[0] == _GATEWAY:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (GATEWAY_SRC, env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen([sys.executable, "-c", *args], env=env)
    _wait_port(port, proc)
    return proc


def bench_overhead(
    n: int, rates: tuple[float, ...], rounds: int, redis_url: str | None
) -> dict[str, Any]:
    """Gateway overhead against the simulated backend (``kvpolicy sim backend``).

    Rates are measured from the lowest up. Each round sends ``n * rate / max(rates)``
    paced requests (at least 500) straight to the backend and as many through the gateway,
    in alternating order (the backend sees the same load both times); a round's overhead is
    the difference of the two p50s (p99s). The figures are the median over ``rounds``
    rounds, ``_best`` the smallest, ``_rounds`` all. When calling the backend directly
    already queues (its p50 over 3x the one at the lowest rate, or failures), the machine
    cannot serve that rate and the overhead there is ``None`` (``saturated_rps`` lists it).
    With ``redis_url`` a second gateway, over a ``RedisLeaseGate``, is measured the same way
    (``_redis``).
    """
    be_port, gw_port = _free_port(), _free_port()
    backend_cmd = [_BACKEND, "sim", "backend", "--model", MODEL, "--gpu", "H100-SXM"]
    backend = _start([*backend_cmd, "--port", str(be_port)], be_port)
    backend_url = f"http://127.0.0.1:{be_port}"
    direct_url = f"{backend_url}/v1/completions"
    procs = [backend]
    try:
        gateways = [("", gw_port, _start([_GATEWAY, str(gw_port), backend_url], gw_port))]
        procs.append(gateways[0][2])
        if redis_url is not None:
            port = _free_port()
            proc = _start([_GATEWAY, str(port), backend_url, redis_url], port)
            procs.append(proc)
            gateways.append(("_redis", port, proc))
        top = max(rates)
        out: dict[str, Any] = {
            "backend": f"kvpolicy sim backend --model {MODEL} --gpu H100-SXM",
            "rate_rps": top,
            "rounds": rounds,
            "saturated_rps": [],
        }
        floor: float | None = None
        for rate in sorted(rates):
            count = max(500, int(n * rate / top))
            for tag, port, _ in gateways:
                suffix = ("" if rate == top else f"_at_{rate:g}rps") + tag
                via_url = f"http://127.0.0.1:{port}/v1/completions"
                p50s: list[float] = []
                p99s: list[float] = []
                direct_p50: list[float] = []
                via_p50: list[float] = []
                saturated = False
                for r in range(rounds):
                    order = (direct_url, via_url) if r % 2 == 0 else (via_url, direct_url)
                    runs = {u: asyncio.run(_paced(u, count, rate)) for u in order}
                    (direct, d_err), (via, v_err) = runs[direct_url], runs[via_url]
                    d50 = _pct(direct, 0.5) * 1e3 if direct else math.inf
                    floor = d50 if floor is None else floor
                    if d_err or v_err or d50 > 3 * floor:
                        saturated = True
                        out[f"direct_p50_ms{suffix}"] = d50
                        out[f"failed{suffix}"] = d_err + v_err
                        break
                    direct_p50.append(d50)
                    via_p50.append(_pct(via, 0.5) * 1e3)
                    p50s.append(via_p50[-1] - d50)
                    p99s.append((_pct(via, 0.99) - _pct(direct, 0.99)) * 1e3)
                if saturated:
                    out["saturated_rps"].append(f"{rate:g}{tag}")
                    out[f"overhead_p50_ms{suffix}"] = None
                    continue
                out[f"direct_p50_ms{suffix}"] = _pct(direct_p50, 0.5)
                out[f"gateway_p50_ms{suffix}"] = _pct(via_p50, 0.5)
                out[f"overhead_p50_ms{suffix}"] = _pct(p50s, 0.5)
                out[f"overhead_p50_ms{suffix}_best"] = min(p50s)
                out[f"overhead_p99_ms{suffix}"] = _pct(p99s, 0.5)
                out[f"overhead_p50_ms{suffix}_rounds"] = [round(v, 3) for v in p50s]
        out["direct_sustained_rps"] = asyncio.run(_sustained(direct_url, 3.0, 32))
        out["sustained_rps"] = asyncio.run(
            _sustained(f"http://127.0.0.1:{gw_port}/v1/completions", 3.0, 32)
        )
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(10)
    return out


# An upstream that answers at once: what the gateway adds by itself, without the simulated
# server's iterations (whose timing moves with the load and the shared cores).
_INSTANT = """
import sys, uvicorn
BODY = (b'{"id":"x","object":"text_completion","choices":[{"index":0,"text":" tok",'
        b'"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,'
        b'"total_tokens":2}}')
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": BODY})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error", access_log=False)
"""


def _paired_p50s(direct: str, via: str, n: int, rate: float, rounds: int) -> list[float]:
    """Per round, p50 latency via the gateway minus p50 direct (ms), alternating order."""
    p50s = []
    for r in range(rounds):
        order = (direct, via) if r % 2 == 0 else (via, direct)
        runs = {u: asyncio.run(_paced(u, n, rate)) for u in order}
        p50s.append((_pct(runs[via][0], 0.5) - _pct(runs[direct][0], 0.5)) * 1e3)
    return p50s


def bench_overhead_instant(
    n: int, rate: float, rounds: int, redis_url: str | None = None
) -> dict[str, Any]:
    """Gateway overhead in front of an upstream that answers at once (``_INSTANT``), paced
    at ``rate``: the gateway's own cost, the same way as :func:`bench_overhead`; with
    ``redis_url`` through a gateway over a ``RedisLeaseGate`` (``..._redis``). Also the
    gateway process's CPU time per request over the paced runs (``gateway_cpu_ms_...``:
    on a shared machine steadier than latencies)."""
    be_port, gw_port = _free_port(), _free_port()
    procs = [_start([_INSTANT, str(be_port)], be_port)]
    tag = "" if redis_url is None else "_redis"
    try:
        args = [_GATEWAY, str(gw_port), f"http://127.0.0.1:{be_port}"]
        procs.append(_start([*args, *([redis_url] if redis_url else [])], gw_port))
        direct = f"http://127.0.0.1:{be_port}/v1/completions"
        via = f"http://127.0.0.1:{gw_port}/v1/completions"
        asyncio.run(_paced(via, 200, rate))  # warm up (a Redis gate loads its scripts)
        cpu0 = _cpu_s(procs[-1].pid)
        p50s = _paired_p50s(direct, via, n, rate, rounds)
        cpu_ms = (_cpu_s(procs[-1].pid) - cpu0) * 1e3 / (n * rounds)
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(10)
    return {
        f"overhead_p50_ms_instant_backend{tag}": _pct(p50s, 0.5),
        f"overhead_p50_ms_instant_backend{tag}_rounds": [round(v, 3) for v in p50s],
        f"gateway_cpu_ms_per_request_instant_backend{tag}": cpu_ms,
    }


async def _client_cpu(url: str, n: int, which: str) -> float:
    """CPU seconds of this process per request for ``n`` sequential POSTs to ``url`` on
    one kept-alive connection: the gateway's own upstream client or httpcore's."""
    body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 4}).encode()
    if which == "kvpolicy":
        from kvpolicy.tenancy._upstream import Upstream

        up = Upstream(url.rsplit("/v1", 1)[0])

        async def one() -> None:
            reply = await up.request("POST", "/v1/completions", body)
            await reply.read()
            reply.release()

        close = up.close
    else:
        import httpcore

        pool = httpcore.AsyncConnectionPool(max_connections=1)
        headers = [(b"Content-Type", b"application/json")]

        async def one() -> None:
            async with pool.stream("POST", url, headers=headers, content=body) as resp:
                await resp.aread()

        def close() -> None:
            pass

    for _ in range(50):  # connect and warm up
        await one()
    start = time.process_time()
    for _ in range(n):
        await one()
    cpu = time.process_time() - start
    close()
    return cpu / n


def bench_clients(n: int, rounds: int) -> dict[str, Any]:
    """CPU per proxied request of the upstream client, the hand-written one against httpcore
    (a well-kept client), each sending ``n`` requests to the instant upstream in turn."""
    if not _has("httpcore"):
        return {"httpcore": "not installed: client comparison skipped"}
    be_port = _free_port()
    proc = _start([_INSTANT, str(be_port)], be_port)
    url = f"http://127.0.0.1:{be_port}/v1/completions"
    cpu: dict[str, list[float]] = {"kvpolicy": [], "httpcore": []}
    try:
        for r in range(rounds):
            for which in ("kvpolicy", "httpcore") if r % 2 == 0 else ("httpcore", "kvpolicy"):
                cpu[which].append(asyncio.run(_client_cpu(url, n, which)) * 1e6)
    finally:
        proc.terminate()
        proc.wait(10)
    import httpcore

    return {
        "upstream_client_cpu_us_per_request": _pct(cpu["kvpolicy"], 0.5),
        "httpcore_client_cpu_us_per_request": _pct(cpu["httpcore"], 0.5),
        "httpcore_version": httpcore.__version__,
        "client_cpu_rounds_us": {k: [round(v, 1) for v in vs] for k, vs in cpu.items()},
    }


ROUTERS = (
    "round-robin",
    "random",
    "least-requests",
    "least-kv",
    "power-of-two",
    "prefix-aware",
    "weighted",
)
"""The routers timed (``mixing`` is not: making its plan for 64 replicas, once per replica
count, took 33 s here)."""


def bench_routing(n: int, sizes: tuple[int, ...] = (4, 64)) -> dict[str, Any]:
    """Routing decisions in process (see the module docstring)."""
    import random

    from prometheus_client import CollectorRegistry

    from kvpolicy.kvmodel import ROUTING, RoutingRequest, build, names
    from kvpolicy.tenancy import BackendSpec, HealthConfig, RoutingConfig, text_block_hashes
    from kvpolicy.tenancy._fleet import Fleet

    installed = set(names(ROUTING))
    out: dict[str, Any] = {"routing_decisions": n, "load_average": os.getloadavg()[0]}
    rng = random.Random(0)
    convs = [f"system prompt of conversation {c}: " + "x" * 600 for c in range(64)]
    prompts = [convs[rng.randrange(64)] + f"turn {i} " + "y" * 120 for i in range(n)]
    hashes = [text_block_hashes(p, 64) for p in prompts]
    for size in sizes:
        specs = [BackendSpec(f"http://10.0.{i // 250}.{i % 250 + 1}:8000") for i in range(size)]
        for name in ROUTERS:
            if name not in installed:
                out[f"routing_{name}"] = "not installed (kvpolicy-admit)"
                continue
            config = RoutingConfig(router=name, health=HealthConfig(interval_s=0.0))
            fleet = Fleet(specs, config, build(ROUTING, name), CollectorRegistry())
            held: list[tuple[Any, int]] = []
            times: list[float] = []
            cpu: list[float] = []
            alone: list[float] = []
            updates: list[float] = []
            clock, cpu_clock = time.perf_counter_ns, time.thread_time_ns
            router = fleet.router
            assert router is not None
            for i in range(n):
                h, rid = hashes[i], f"r{i}"
                # The CPU clock (a system call) read outside the wall clock's window.
                cpu_start = cpu_clock()
                start = clock()
                backend = fleet.pick(rid, 200, h)
                end = clock()
                cpu.append((cpu_clock() - cpu_start) / 1e3)
                times.append((end - start) / 1e3)
                assert backend is not None
                if i % 16 == 0:  # the router alone, on the views it was just shown
                    now = time.monotonic()
                    views = [b.view(now, config, b.index.matching(h)) for b in fleet.backends]
                    req = RoutingRequest(f"r{i}", 200, h)
                    start = cpu_clock()
                    router.route(req, views)
                    alone.append((cpu_clock() - start) / 1e3)
                cpu_start = cpu_clock()
                fleet.begin(backend, 264, h)
                held.append((backend, 264))
                if len(held) > 2 * size or rng.random() < 0.3:
                    b, t = held.pop(rng.randrange(len(held)))
                    fleet.end(b, t)
                updates.append((cpu_clock() - cpu_start) / 1e3)
            key = f"{name}_{size}"
            out[f"routing_p50_us_{key}"] = round(_pct(times, 0.5), 2)
            out[f"routing_p99_us_{key}"] = round(_pct(times, 0.99), 2)
            out[f"routing_cpu_p50_us_{key}"] = round(_pct(cpu, 0.5), 2)
            out[f"routing_cpu_p99_us_{key}"] = round(_pct(cpu, 0.99), 2)
            out[f"router_only_cpu_p50_us_{key}"] = round(_pct(alone, 0.5), 2)
            out[f"router_only_cpu_p99_us_{key}"] = round(_pct(alone, 0.99), 2)
            out[f"routing_update_cpu_p50_us_{key}"] = round(_pct(updates, 0.5), 2)
            out[f"routing_update_cpu_p99_us_{key}"] = round(_pct(updates, 0.99), 2)
    return out


def _interpreted_routing(n: int) -> dict[str, Any]:
    """``weighted``'s routing figures with kvmodel's, admit's and tenancy's sources of this
    tree interpreted (a child process whose path puts them before the installed compiled
    modules: :func:`run_interpreted`), keyed ``routing_interpreted_...``."""
    child = run_interpreted(__file__, ["--routing-child", str(n)], ("kvmodel", "admit", "tenancy"))
    return {
        k.replace("routing_", "routing_interpreted_", 1): v
        for k, v in child["figures"].items()
        if k.startswith("routing_p")
    }


def _routing_child(n: int) -> None:
    global ROUTERS
    ROUTERS = ("weighted",)
    figures = bench_routing(n)
    compiled = compiled_core(("kvmodel", "admit", "tenancy"))
    print(json.dumps({"compiled": compiled, "figures": figures}))


def _cpu_s(pid: int) -> float:
    """CPU seconds (user and system) process ``pid`` used so far (Linux ``/proc``)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_fleet_overhead(
    n: int, rate: float, rounds: int, backends: int = 4, redis_url: str | None = None
) -> dict[str, Any]:
    """Gateway overhead over ``backends`` instant upstreams (least-requests with several),
    paced at ``rate``, against one upstream called directly; then sustained requests/s.
    With ``redis_url`` the gateway is over a ``RedisLeaseGate`` (figures ``..._redis``)."""
    ports = [_free_port() for _ in range(backends)]
    procs = [_start([_INSTANT, str(p)], p) for p in ports]
    gw_port = _free_port()
    urls = ",".join(f"http://127.0.0.1:{p}" for p in ports)
    tag = "" if redis_url is None else "_redis"
    try:
        procs.append(_start([_GATEWAY, str(gw_port), urls, redis_url or ""], gw_port))
        direct = f"http://127.0.0.1:{ports[0]}/v1/completions"
        via = f"http://127.0.0.1:{gw_port}/v1/completions"
        asyncio.run(_paced(via, 200, rate))  # warm up (a Redis gate loads its scripts)
        cpu_paced = _cpu_s(procs[-1].pid)
        p50s = _paired_p50s(direct, via, n, rate, rounds)
        cpu_paced = (_cpu_s(procs[-1].pid) - cpu_paced) * 1e3 / (n * rounds)
        direct_rps = asyncio.run(_sustained(direct, 3.0, 32))
        cpu0 = _cpu_s(procs[-1].pid)
        start = time.perf_counter()
        via_rps = asyncio.run(_sustained(via, 3.0, 32))
        served = via_rps * (time.perf_counter() - start)
        cpu_ms = (_cpu_s(procs[-1].pid) - cpu0) * 1e3 / served
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(10)
    key = f"{backends}_backends{tag}"
    return {
        f"fleet_overhead_p50_ms_instant_{key}": _pct(p50s, 0.5),
        f"fleet_overhead_p50_ms_instant_{key}_best": min(p50s),
        f"fleet_overhead_p50_ms_instant_{key}_rounds": [round(v, 3) for v in p50s],
        f"fleet_gateway_cpu_ms_per_request_paced_{key}": cpu_paced,
        f"fleet_sustained_rps_{key}": via_rps,
        f"fleet_gateway_cpu_ms_per_request_{key}": cpu_ms,
        f"fleet_direct_sustained_rps_{key}": direct_rps,
    }


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def main() -> None:
    def more(p: Any) -> None:
        p.add_argument("--fleet-only", action="store_true", help="only the fleet figures")
        p.add_argument(
            "--overhead-only",
            action="store_true",
            help="only the overhead figures (1 and 4 backends), into bench_gateway_overhead.json",
        )
        p.add_argument(
            "--gateway-src",
            default=None,
            help="a directory put first on the gateway processes' PYTHONPATH (another "
            "version of kvpolicy-tenancy, measured under the same load generator)",
        )
        p.add_argument("--tag", default="", help="a suffix of the JSON file's name")
        p.add_argument("--routing-child", type=int, default=0, help=argparse.SUPPRESS)

    args = parse_args(__doc__ or "", more)
    if args.routing_child:
        _routing_child(args.routing_child)
        return
    global GATEWAY_SRC
    GATEWAY_SRC = args.gateway_src
    n = 5_000 if args.quick else 50_000
    figures: dict[str, Any] = {"cpu_cores": os.cpu_count()}
    if args.gateway_src:
        figures["gateway_src"] = args.gateway_src
    if args.fleet_only:
        figures.update(bench_routing(n // 5))
        if "mypyc" in compiled_core(("admit", "tenancy")).values():
            figures.update(_interpreted_routing(n // 5))
        if _has("uvicorn") and _has("httptools"):
            count, rounds = (500, 1) if args.quick else (2_000, 3)
            figures.update(bench_fleet_overhead(count, 500.0, rounds, backends=1))
            figures.update(bench_fleet_overhead(count, 500.0, rounds, backends=4))
        path = write_result("bench_gateway_fleet" + args.tag, figures, args.out)
        for key, value in figures.items():
            print(f"{key}: {value}")
        print(path)
        return
    if not args.overhead_only:
        figures.update(bench_in_process(n))
    binary = shutil.which("redis-server")
    missing = [m for m in ("redis", "uvicorn", "httptools") if not _has(m)]
    if not _has("kvpolicy.sim"):
        missing.append("kvpolicy.sim")
    server = None
    url = None
    try:
        if missing:  # the bench session must install kvpolicy-tenancy[gateway] and the sim
            figures["skipped"] = (
                f"not installed: {missing} (pip install --find-links dist "
                "'kvpolicy-tenancy[gateway]' 'kvpolicy-sim[backend]')"
            )
        elif binary is None:
            figures["redis"] = "redis-server not installed: Redis figures skipped"
        else:
            port = _free_port()
            cmd = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
            server = subprocess.Popen(
                [*cmd, "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            _wait_port(port, server)
            url = f"redis://127.0.0.1:{port}/0"
            if not args.overhead_only:
                figures.update(bench_redis(url, n // 5))
                figures.update(bench_redis_contended(url, n // 5))
                figures.update(bench_replicas(url, 2_500 if args.quick else 10_000))
        if not missing:
            figures["load_average_before"] = os.getloadavg()
            count, rounds = (500, 1) if args.quick else (2_000, 3)
            figures.update(bench_overhead(count, (100.0, 300.0, 500.0), rounds, url))
            for redis_url in (None, url) if url else (None,):
                figures.update(bench_overhead_instant(count, 500.0, rounds, redis_url))
            if args.overhead_only:
                for redis_url in (None, url) if url else (None,):
                    for backends in (1, 4):
                        figures.update(
                            bench_fleet_overhead(count, 500.0, rounds, backends, redis_url)
                        )
            else:
                figures.update(bench_clients(1_000 if args.quick else 5_000, 3))
            figures["load_average_after"] = os.getloadavg()
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
    name = "bench_gateway_overhead" if args.overhead_only else "bench_gateway"
    path = write_result(name + args.tag, figures, args.out)
    for key, value in figures.items():
        print(f"{key}: {value}")
    print(path)


if __name__ == "__main__":
    main()
