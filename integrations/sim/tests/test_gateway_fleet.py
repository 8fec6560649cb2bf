"""The token-pool gateway in front of a fleet, on loopback: three ``kvpolicy sim backend``
processes behind one gateway, driven by the real ``openai`` client; the routers are the
simulator's classes (``kvpolicy.routing`` entry points)."""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from kvpolicy.kvmodel import AUTOSCALING, ROUTING, build

openai = pytest.importorskip("openai", reason="the end-to-end tests need the openai client")
uvicorn = pytest.importorskip("uvicorn", reason="the backend needs uvicorn (extra 'backend')")
pytest.importorskip("prometheus_client", reason="the gateway needs kvpolicy-tenancy[gateway]")
httpx = pytest.importorskip("httpx", reason="the gateway needs httpx")

from kvpolicy.tenancy import (  # noqa: E402
    BackendSpec,
    HealthConfig,
    Resources,
    RoutingConfig,
    TokenEntitlement,
    TokenPool,
    TokenPoolGate,
    load_routing,
)
from kvpolicy.tenancy._kv_events import kv_events_missing  # noqa: E402
from kvpolicy.tenancy.gateway import (  # noqa: E402
    Admission,
    LocalGate,
    create_admin_app,
    create_app,
)

MODEL = "Llama-3-8B"
KEYS = {"key-a": "a"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes] | None, what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port}")


class SimBackend:
    """One ``kvpolicy sim backend`` process (Llama-3-8B on ``gpu``, real time), publishing
    its KV cache events on a loopback port when ``kv_events``."""

    def __init__(
        self,
        gpu: str = "H100-SXM",
        speed: float = 1.0,
        *,
        stack: str | None = None,
        kv_events: bool = False,
    ) -> None:
        self.gpu = gpu
        self.speed = speed
        self.stack = stack
        self.port = _free_port()
        self.events = f"tcp://127.0.0.1:{_free_port()}" if kv_events else ""
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spec(self) -> BackendSpec:
        return BackendSpec(self.url, kv_events=self.events)

    def start(self) -> None:
        cmd = [sys.executable, "-c", "from kvpolicy.sim.cli import main; main()"]
        cmd += ["sim", "backend", "--model", MODEL, "--gpu", self.gpu, "--port", str(self.port)]
        cmd += ["--speed", str(self.speed)]
        if self.stack is not None:
            cmd += ["--stack", self.stack]
        if self.events:
            cmd += ["--kv-events", self.events]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def ready(self) -> None:
        _wait_port(self.port, self.proc, f"sim backend on {self.port}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def metric(self, name: str) -> float:
        text = httpx.get(f"{self.url}/metrics", timeout=5).text
        for line in text.splitlines():
            if line.startswith(name):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"{name} not exported")


def _three(gpu: str, speed: float = 1.0) -> Iterator[list[SimBackend]]:
    fleet = [SimBackend(gpu, speed) for _ in range(3)]
    try:
        for b in fleet:
            b.start()
        for b in fleet:
            b.ready()
        yield fleet
    finally:
        for b in fleet:
            b.kill()


@pytest.fixture(scope="module")
def backends() -> Iterator[list[SimBackend]]:
    """Three simulated servers on H100s, started together."""
    yield from _three("H100-SXM")


def _pool() -> TokenPool:
    return TokenPool(
        "fleet",
        Resources(30_000, 10**10, 64),
        [TokenEntitlement("a", "guaranteed", Resources(15_000, 10**9, 32))],
    )


class Gateway:
    """The gateway app served by uvicorn in a thread of this process."""

    def __init__(
        self,
        backends: list[SimBackend],
        router: str,
        autoscaler: Any = None,
        *,
        pool: TokenPool | None = None,
        keys: dict[str, str] | None = None,
        **routing: Any,
    ) -> None:
        self.gate = LocalGate(TokenPoolGate(pool or _pool(), 1))
        self.admission = Admission(self.gate, keys or KEYS, models=(MODEL,))
        health = routing.pop("health", HealthConfig(interval_s=0.2, backoff_s=0.5))
        config = RoutingConfig(router=router, health=health, **routing)
        self.app: Any = create_app(
            self.admission,
            [b.spec() for b in backends],
            routing=config,
            timeout_s=30,
            autoscaler=autoscaler,
        )
        self.fleet = self.app.fleet
        self.port = _free_port()
        cfg = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error")
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Gateway:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("gateway did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def client(self, closing: contextlib.ExitStack, key: str = "key-a") -> Any:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=key)
        client = client.with_options(max_retries=0, timeout=30)
        closing.callback(client.close)
        return client

    def routed(self) -> list[int]:
        return [b.routed for b in self.fleet.backends]

    def drained(self) -> None:
        for _ in range(400):
            if self.gate.held() == 0 and all(b.in_flight == 0 for b in self.fleet.backends):
                return
            time.sleep(0.025)
        raise AssertionError(f"still in flight: {[b.in_flight for b in self.fleet.backends]}")


@pytest.fixture
def closing() -> Iterator[contextlib.ExitStack]:
    with contextlib.ExitStack() as stack:
        yield stack


def _chat(client: Any, text: str, max_tokens: int = 4, **kw: Any) -> Any:
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=max_tokens, **kw
    )


class TestRouters:
    def test_round_robin_goes_around(
        self, backends: list[SimBackend], closing: contextlib.ExitStack
    ) -> None:
        """round-robin: six requests, one after another, go to backends 0 1 2 0 1 2."""
        with Gateway(backends, "round-robin") as gw:
            client = gw.client(closing)
            order = []
            for i in range(6):
                before = gw.routed()
                assert _chat(client, f"hello {i}").choices[0].finish_reason == "length"
                after = gw.routed()
                order.append([a - b for a, b in zip(after, before, strict=True)].index(1))
            assert order == [0, 1, 2, 0, 1, 2]
            gw.drained()

    def test_least_requests_spreads_open_streams(
        self, backends: list[SimBackend], closing: contextlib.ExitStack
    ) -> None:
        """least-requests: three streams held open land on three different backends; the
        gateway's in-flight count per backend is exact while they stream and after."""
        with Gateway(backends, "least-requests") as gw:
            client = gw.client(closing)
            streams = []
            for i in range(3):
                stream = _chat(client, f"long answer {i}", max_tokens=2000, stream=True)
                closing.callback(stream.close)
                next(iter(stream))  # streaming: the backend has it
                streams.append(stream)
            assert [b.in_flight for b in gw.fleet.backends] == [1, 1, 1]
            for stream in streams:
                stream.close()
            gw.drained()

    def test_prefix_aware_keeps_a_conversation_on_its_backend(
        self, backends: list[SimBackend], closing: contextlib.ExitStack
    ) -> None:
        """prefix-aware: later turns of a conversation go where its prefix is, and that
        backend's prefix cache serves them (vllm:prefix_cache_hits_total grows)."""
        with Gateway(backends, "prefix-aware") as gw:
            client = gw.client(closing)
            prefixes = [f"conversation {c}: " + f"context {c} " * 200 for c in range(3)]
            home = []
            for p in prefixes:
                before = gw.routed()
                _chat(client, p)
                after = gw.routed()
                home.append([a - b for a, b in zip(after, before, strict=True)].index(1))
            hits = [b.metric("vllm:prefix_cache_hits_total") for b in backends]
            for turn in range(3):
                for c, p in enumerate(prefixes):
                    before = gw.routed()
                    _chat(client, p + f" and turn {turn}")
                    after = gw.routed()
                    got = [a - b for a, b in zip(after, before, strict=True)].index(1)
                    assert got == home[c], (c, turn, home)
            for i in set(home):
                assert backends[i].metric("vllm:prefix_cache_hits_total") > hits[i]
            gw.drained()

    @pytest.mark.parametrize("router", ["power-of-two", "random", "least-kv", "weighted"])
    def test_the_router_decides(
        self, backends: list[SimBackend], closing: contextlib.ExitStack, router: str
    ) -> None:
        """Each router's live choices are the class's own: the same router built anew and
        shown the same views and requests picks the same backends."""
        with Gateway(backends, router) as gw:
            seen: list[tuple[Any, Any, str | None]] = []
            live = gw.fleet.router

            class Recording:
                def route(self, request: Any, replicas: Any) -> str | None:
                    out = live.route(request, replicas)
                    seen.append((request, tuple(replicas), out))
                    return out

            gw.fleet.router = Recording()
            client = gw.client(closing)
            for i in range(8):
                _chat(client, f"request {i}")
            gw.drained()
        fresh = build(ROUTING, router, {})
        assert len(seen) == 8
        assert [fresh.route(req, views) for req, views, _ in seen] == [out for *_, out in seen]


class TestSignals:
    def test_scraped_metrics_reach_the_views(
        self, backends: list[SimBackend], closing: contextlib.ExitStack
    ) -> None:
        """The backends' vLLM gauges are scraped: each view's signal is fresh, and the KV
        blocks the backend reports size its prefix index."""
        with Gateway(backends, "least-requests", scrape_interval_s=0.1) as gw:
            _chat(gw.client(closing), "hi")
            deadline = time.monotonic() + 5
            while any(b.scraped is None for b in gw.fleet.backends):
                assert time.monotonic() < deadline, "no scrape"
                time.sleep(0.05)
            for b in gw.fleet.backends:
                assert b.scrape_error == ""
                assert b.kv_capacity_tokens is not None
                assert b.kv_capacity_tokens > 0
                assert b.index.capacity == b.kv_capacity_tokens // 16
            gw.drained()

    def test_garbage_or_missing_metrics_fall_back(
        self,
        backends: list[SimBackend],
        closing: contextlib.ExitStack,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """A metrics path that answers JSON (garbage to Prometheus) or 404 is ignored and
        logged once per backend; the router sees the gateway's own counts and serves on."""
        caplog.set_level(logging.WARNING, "kvpolicy.tenancy")
        for path in ("/v1/models", "/no-metrics"):
            with Gateway(
                backends, "least-requests", scrape_interval_s=0.05, metrics_path=path
            ) as gw:
                client = gw.client(closing)
                for i in range(3):
                    _chat(client, f"x {i}")
                time.sleep(0.3)
                for b in gw.fleet.backends:
                    assert b.scraped is None
                    assert b.scrape_error
                    view = b.view(time.monotonic(), gw.fleet.config, frozenset())
                    assert (view.signal_age_s, view.running) == (0.0, b.in_flight)
                gw.drained()
            ignored = [r for r in caplog.records if "metrics of" in r.getMessage()]
            assert len(ignored) == 3, [r.getMessage() for r in ignored]
            caplog.clear()


class TestOperations:
    def test_a_draining_backend_gets_nothing_new(
        self, backends: list[SimBackend], closing: contextlib.ExitStack
    ) -> None:
        """Drained through the admin page, backend 0 gets no request; undrained, it does;
        the pool's healthy share follows."""
        import asyncio

        with Gateway(backends, "round-robin") as gw:
            admin = create_admin_app(gw.admission, gw.fleet)

            async def post(path: str, url: str = backends[0].url) -> Any:
                transport = httpx.ASGITransport(app=admin)
                async with httpx.AsyncClient(transport=transport, base_url="http://a") as c:
                    return await c.post(path, params={"url": url})

            r = asyncio.run(post("/backends/drain"))
            assert r.status_code == 200
            assert [b["state"] for b in r.json()["backends"]] == ["draining", "up", "up"]
            assert gw.fleet.share() == pytest.approx(2 / 3)
            client = gw.client(closing)
            for i in range(4):
                _chat(client, f"while draining {i}")
            assert gw.routed() == [0, 2, 2]
            assert asyncio.run(post("/backends/undrain")).status_code == 200
            for i in range(3):
                _chat(client, f"after {i}")
            assert gw.routed()[0] > 0
            assert gw.fleet.share() == 1.0
            assert asyncio.run(post("/backends/drain", "http://nowhere")).status_code == 404
            gw.drained()

    def test_desired_replicas_is_exported(
        self, backends: list[SimBackend], closing: contextlib.ExitStack
    ) -> None:
        """The token-pool autoscaler's target appears as kvpolicy_desired_replicas{pool}."""
        scaler = build(
            AUTOSCALING,
            "token-pool",
            {"pool": _pool(), "replica": Resources(10_000, 10**9, 16), "max_replicas": 8},
        )
        with Gateway(backends, "least-requests", autoscaler=scaler) as gw:
            _chat(gw.client(closing), "hello")
            deadline = time.monotonic() + 5
            while True:
                text = gw.admission.metrics().body.decode()
                line = [x for x in text.splitlines() if x.startswith("kvpolicy_desired_")]
                if line:
                    break
                assert time.monotonic() < deadline, "no kvpolicy_desired_replicas"
                time.sleep(0.1)
            # 15,000 committed tokens/s over 10,000 per replica: 2 replicas.
            assert line == ['kvpolicy_desired_replicas{pool="fleet"} 2.0']
            gw.drained()


def _load(
    gw: Gateway, closing: contextlib.ExitStack, n: int, during: Callable[[int], None]
) -> list[dict[str, Any]]:
    """``n`` streamed requests, 6 at a time; ``during(i)`` runs as request ``i`` starts."""
    client = gw.client(closing)
    results: list[dict[str, Any]] = [{} for _ in range(n)]

    def one(i: int) -> None:
        during(i)
        res = results[i]
        res["started"] = False
        try:
            stream = _chat(client, f"load {i} " * 20, max_tokens=40, stream=True)
            text, finish = "", None
            for chunk in stream:
                res["started"] = True
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                    finish = chunk.choices[0].finish_reason or finish
            res["ok"] = finish == "length" and text == " tok" * 40
        except openai.APIError as err:
            res["ok"] = False
            res["error"] = repr(err)

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(one, range(n)))
    return results


@pytest.mark.slow
class TestFailover:
    def test_a_backend_killed_mid_run(
        self, backends: list[SimBackend], closing: contextlib.ExitStack
    ) -> None:
        """Killing a backend under load loses no request that had not started streaming
        (those go to another backend); the pool shrinks to two thirds and, once the
        backend is back, recovers; in-flight counts end at zero everywhere."""
        with Gateway(backends, "least-requests") as gw:
            full = gw.gate.tokens_per_s
            victim = backends[1]

            def kill_at(i: int) -> None:
                if i == 30:  # while the victim streams
                    deadline = time.monotonic() + 5
                    while gw.fleet.backends[1].in_flight < 1 and time.monotonic() < deadline:
                        time.sleep(0.001)
                    victim.kill()

            results = _load(gw, closing, 90, kill_at)
            lost = [r for r in results if not r["ok"]]
            assert all(r["started"] for r in lost), lost
            assert len(lost) <= 6  # at most the requests streaming from the victim
            failovers = gw.fleet.m_failovers._value.get()
            print(f"\nkilled mid-run: {len(lost)} lost (all streaming), {failovers:.0f} failovers")
            gw.drained()
            assert gw.fleet.backends[1].health.ejected
            assert gw.fleet.share() == pytest.approx(2 / 3)
            assert gw.gate.tokens_per_s == pytest.approx(full * 2 / 3)
            assert sum(b.routed for b in gw.fleet.backends) >= 90

            victim.start()
            victim.ready()
            deadline = time.monotonic() + 20
            while gw.fleet.share() < 1.0:
                assert time.monotonic() < deadline, "the backend was not re-admitted"
                time.sleep(0.1)
            assert gw.gate.tokens_per_s == pytest.approx(full)
            routed = gw.fleet.backends[1].routed
            assert all(r["ok"] for r in _load(gw, closing, 12, lambda i: None))
            assert gw.fleet.backends[1].routed > routed
            gw.drained()


REPLAY_SPEED = 0.25
WORDS = ("the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be",
         "by", "on", "not", "he", "this", "are", "or", "his")  # fmt: skip


def _replay(seed: int, convs: int = 5, turns: int = 4, gap_s: float = 0.25) -> list[Any]:
    """A prefix-heavy replay: ``convs`` conversations of ``turns`` turns, each with a long
    system prompt (about 1,000 tokens) and the whole history resent every turn; the turns
    interleave, one request every ``gap_s`` (5 conversations over 3 backends: round-robin
    sends a conversation's turns to each backend in turn). Each item: ``(arrival_s,
    messages)``."""
    import random

    rng = random.Random(seed)

    def text(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    history = [[{"role": "system", "content": f"conversation {seed}-{c}: " + text(1300)}]
               for c in range(convs)]  # fmt: skip
    out = []
    for _ in range(turns):
        for c in range(convs):
            history[c].append({"role": "user", "content": text(80)})
            out.append((len(out) * gap_s, [dict(m) for m in history[c]]))
            history[c].append({"role": "assistant", "content": " tok" * 8})
    return out


def _predicted(replay: list[Any], router: str) -> tuple[float, int]:
    """``kvpolicy sim``'s median TTFT (s) and prefix-hit tokens for ``replay`` on three
    replicas like the backends (Llama-3-8B on an L40S, the ``vllm`` stack)."""
    import attrs

    from kvpolicy.kvmodel import Request, get_gpu, get_model
    from kvpolicy.sim import FleetConfig, TimingModel, get_stack, simulate
    from kvpolicy.sim.backend import count_prompt_tokens
    from kvpolicy.sim.backend._app import prompt_block_hashes

    cfg = get_stack("vllm")
    tm = TimingModel(get_model(MODEL), get_gpu("L40S"), **cfg.timing.constants())
    reqs = []
    for i, (t, messages) in enumerate(replay):
        body = {"messages": messages}
        prompt = count_prompt_tokens(body, True)
        hashes = prompt_block_hashes(body, True, cfg.engine.block_size)
        reqs.append(
            Request(f"r{i}", prompt, 8, t, prefix_hashes=hashes[: prompt // cfg.engine.block_size])
        )
    config = attrs.evolve(cfg, fleet=FleetConfig(replicas=3, router=router))
    out = simulate(reqs, tm.model, tm.gpu, config, timing=tm)
    rec = out.record
    ttft = [rec.first_token[i] - r.arrival_time for i, r in enumerate(rec.requests)]
    return statistics.median(ttft), int(rec.prefix_hit_tokens)


@pytest.fixture(scope="class")
def l40s() -> Iterator[list[SimBackend]]:
    """Three simulated servers on L40S GPUs (a prefill long enough to see), at a quarter of
    real time (``--speed 0.25``): the CPU a shared machine lends them is late less often."""
    yield from _three("L40S", REPLAY_SPEED)


@pytest.mark.slow
class TestPrefixReplay:
    def test_prefix_aware_beats_round_robin_as_the_simulator_predicts(
        self, l40s: list[SimBackend], closing: contextlib.ExitStack
    ) -> None:
        """The prefix-heavy replay through the gateway: prefix-aware routing gets more
        prefix-cache hits and a lower median TTFT than round-robin, and the TTFT it saves is
        within 20% of what ``kvpolicy sim`` predicts for the same fleet and requests (the
        backends run at a quarter of real time; times are in their simulated seconds)."""
        live: dict[str, tuple[float, float]] = {}
        sim: dict[str, tuple[float, int]] = {}
        for seed, router in enumerate(("round-robin", "prefix-aware")):
            replay = _replay(seed)  # new texts: nothing cached from the other run
            sim[router] = _predicted(replay, router)
            hits0 = sum(b.metric("vllm:prefix_cache_hits_total") for b in l40s)
            with Gateway(l40s, router) as gw:
                client = gw.client(closing)
                for i in range(3):  # warm: a connection to each backend
                    _chat(client, f"warm {seed} {i}", max_tokens=1)
                ttft: list[float] = [0.0] * len(replay)
                t0 = time.perf_counter() + 0.2

                def one(
                    i: int,
                    replay: list[Any] = replay,
                    t0: float = t0,
                    ttft: list[float] = ttft,
                    client: Any = client,
                ) -> None:
                    at, messages = replay[i]
                    time.sleep(max(0.0, t0 + at / REPLAY_SPEED - time.perf_counter()))
                    start = time.perf_counter()
                    stream = client.chat.completions.create(
                        model=MODEL, messages=messages, max_tokens=8, stream=True
                    )
                    for chunk in stream:
                        if chunk.choices and chunk.choices[0].delta.content:
                            # In the backends' simulated seconds, as kvpolicy sim counts.
                            ttft[i] = (time.perf_counter() - start) * REPLAY_SPEED
                            break
                    stream.close()

                with ThreadPoolExecutor(8) as pool:
                    list(pool.map(one, range(len(replay))))
                gw.drained()
            hits = sum(b.metric("vllm:prefix_cache_hits_total") for b in l40s) - hits0
            live[router] = (statistics.median(ttft), hits)
        rr, pa = live["round-robin"], live["prefix-aware"]
        saved_live = rr[0] - pa[0]
        saved_sim = sim["round-robin"][0] - sim["prefix-aware"][0]
        print(f"\nlive median TTFT s, prefix-hit tokens: {live}\nkvpolicy sim: {sim}")
        print(f"TTFT saved: live {saved_live * 1e3:.1f} ms, sim {saved_sim * 1e3:.1f} ms")
        assert pa[1] > rr[1]
        assert saved_live > 0
        assert abs(saved_live - saved_sim) <= 0.2 * saved_sim


def _until(what: Callable[[], bool], why: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, why
        time.sleep(0.05)


class TestKVEvents:
    @pytest.mark.heavy
    def test_an_evicted_prefix_leaves_the_index(
        self, tmp_path: Any, closing: contextlib.ExitStack
    ) -> None:
        """Two backends publish their KV cache events (a pool of 64 blocks each). A prompt
        served by backend 1 straight, not through the gateway, reaches the gateway's index
        by its BlockStored events alone, and prefix-aware sends the prompt there although
        backend 0 comes first; once other prompts sent straight to backend 1 evict it,
        its BlockRemoved events take it out of the index and the prompt goes to backend 0
        (least requests, the first on a tie)."""
        missing = kv_events_missing()
        if missing is not None:
            pytest.skip(missing)
        stack = tmp_path / "small.yaml"
        stack.write_text("engine:\n  kv_capacity_tokens: 1024\n")  # 64 blocks of 16
        fleet = [SimBackend(speed=10.0, stack=str(stack), kv_events=True) for _ in range(2)]
        closing.callback(lambda: [b.kill() for b in fleet])
        for b in fleet:
            b.start()
        for b in fleet:
            b.ready()
        home = fleet[1]
        direct = httpx.Client(base_url=f"{home.url}/v1", timeout=30)
        closing.callback(direct.close)

        def straight(text: str) -> None:
            body = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
            reply = direct.post("/chat/completions", json={**body, "max_tokens": 4})
            assert reply.status_code == 200, reply.text

        with Gateway(fleet, "prefix-aware", scrape_interval_s=0.2) as gw:
            events = gw.fleet.backends[1].events
            assert events is not None
            warm = iter(range(1000))
            # ZMQ drops what is published before the subscription is up: warm up first.
            _until(  # a prompt of 2 blocks at least: one that the cache stores
                lambda: straight(f"warm-up {next(warm)} " + "w" * 128) or events.batches > 0,
                "no event",
            )
            prompt = "the same long shared context " * 44  # 20 blocks of 64 characters
            doc = {"messages": [{"role": "user", "content": prompt}]}
            hashes = gw.fleet.hashes(doc, True)
            assert len(hashes) >= 16
            holders = gw.fleet.prefix.holders
            assert not holders(hashes[0])
            straight(prompt)
            _until(lambda: home.url in holders(hashes[0]), "BlockStored did not reach the index")
            assert set(hashes[:16]) <= set(gw.fleet.backends[1].index.blocks())
            client = gw.client(closing)
            before = gw.routed()
            _chat(client, prompt)
            assert [a - b for a, b in zip(gw.routed(), before, strict=True)] == [0, 1]
            for i in range(8):  # 8 x 18 blocks through a pool of 64: the prompt's go
                straight(f"filler {i} " + "other words " * 95)
            _until(lambda: home.url not in holders(hashes[0]), "BlockRemoved left it indexed")
            gw.drained()
            before = gw.routed()
            _chat(client, prompt)
            assert [a - b for a, b in zip(gw.routed(), before, strict=True)] == [1, 0]
            assert events.errors == 0
            assert gw.fleet.state()[1]["kv_events"]["batches"] == events.batches
            gw.drained()


MIX_MANIFEST: dict[str, Any] = {
    "routing": {
        "router": "mixing",
        "params": {
            "classes": [
                {"input_len": 20, "decode_len": 200, "share": 0.25},
                {"input_len": 400, "decode_len": 8, "share": 0.75},
            ],
            "labels": ["chat", "rag"],
        },
    }
}


class TestMixing:
    def test_classes_land_in_the_plans_fractions(
        self, backends: list[SimBackend], closing: contextlib.ExitStack
    ) -> None:
        """``--router mixing`` with its classes from the manifest: each tenant is a class
        (the gateway routes by the request's entitlement), and over 24 requests of each,
        interleaved, each backend gets its fraction of each class from seed 002's plan for
        two replicas to within one request: the router sends a class's request to the
        replica furthest behind its share (``fraction * n - sent``), which keeps every
        replica within one request of its share while the set of backends stays the same
        (no failover here: every request is answered, and the gateway counts each)."""
        config = load_routing(MIX_MANIFEST, router="mixing")
        assert config.params == MIX_MANIFEST["routing"]["params"]
        pool = TokenPool(
            "fleet",
            Resources(30_000, 10**10, 64),
            [
                TokenEntitlement("chat", "guaranteed", Resources(10_000, 10**9, 16)),
                TokenEntitlement("rag", "guaranteed", Resources(10_000, 10**9, 16)),
            ],
        )
        keys = {"key-chat": "chat", "key-rag": "rag"}
        two = backends[:2]
        with Gateway(two, config.router, pool=pool, keys=keys, params=config.params) as gw:
            plan = gw.fleet.router.plan(2)  # type: ignore[union-attr]
            clients = {label: gw.client(closing, f"key-{label}") for label in ("chat", "rag")}
            sent = {label: [0, 0] for label in clients}
            n = 24
            for i in range(n):
                for label, client in clients.items():
                    before = gw.routed()
                    _chat(client, f"{label} request {i}", max_tokens=2)
                    moved = [a - b for a, b in zip(gw.routed(), before, strict=True)]
                    sent[label][moved.index(1)] += 1
            gw.drained()
        for k, label in enumerate(("chat", "rag")):
            share = [plan.fractions[g][k] * n for g in range(2)]
            assert all(abs(c - e) <= 1.0 for c, e in zip(sent[label], share, strict=True)), (
                label,
                sent[label],
                share,
            )
        assert plan.fractions[0][0] not in (0.0, 1.0)  # a class really is split
