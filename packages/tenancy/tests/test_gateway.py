"""The gateway over loopback, driven by the real ``openai`` client, in front of a small
OpenAI-shaped upstream server started here."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")
pytest.importorskip("httptools")

from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request as HttpRequest  # noqa: E402
from starlette.responses import JSONResponse, Response, StreamingResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

from kvpolicy.kvmodel import Request  # noqa: E402
from kvpolicy.tenancy import (  # noqa: E402
    RedisLeaseGate,
    RefreshConfig,
    Resources,
    SharedThroughputRefresh,
    ThroughputRefresh,
    TokenEntitlement,
    TokenPool,
    TokenPoolGate,
)
from kvpolicy.tenancy._front import front_protocol  # noqa: E402
from kvpolicy.tenancy.gateway import (  # noqa: E402
    Admission,
    FrontLimits,
    LocalGate,
    Reply,
    Ticket,
    TokenPoolMiddleware,
    _request,
    create_admin_app,
    create_app,
    estimate_prompt_tokens,
)

KEYS = {"key-a": "a", "key-s": "s", "key-x": "unbound"}
ADMIN_KEY = "admin-key"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def _upstream() -> Starlette:
    """Echo-ish OpenAI server: ``slow`` sleeps 3 s; ``broken`` answers 500; streams send
    ``max_tokens`` chunks 2 ms apart."""

    async def models(_: HttpRequest) -> Response:
        data = [{"id": m, "object": "model", "owned_by": "t"} for m in ("m", "slow", "broken")]
        return JSONResponse({"object": "list", "data": data})

    async def complete(request: HttpRequest) -> Response:
        doc = await request.json()
        n = int(doc.get("max_tokens", 4))
        if doc["model"] == "broken":
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        if doc["model"] == "slow":
            await asyncio.sleep(3)
        chat = "messages" in doc
        if doc.get("stream"):

            async def events() -> AsyncIterator[bytes]:
                for i in range(n):
                    delta = {"delta": {"content": "x"}} if chat else {"text": "x"}
                    chunk = {"id": "c", "object": "chunk", "created": 0, "model": doc["model"]}
                    chunk["choices"] = [{"index": 0, **delta, "finish_reason": None}]
                    yield f"data: {json.dumps(chunk)}\n\n".encode()
                    await asyncio.sleep(0.002 if i < 3 else 0.05)
                yield b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        if chat:
            choice["message"] = {"role": "assistant", "content": "x" * n}
        else:
            choice["text"] = "x" * n
        kind = "chat.completion" if chat else "text_completion"
        body = {"id": "c", "object": kind, "created": 0, "model": doc["model"]}
        return JSONResponse({**body, "choices": [choice], "usage": usage})

    return Starlette(
        routes=[
            Route("/v1/models", models),
            Route("/v1/chat/completions", complete, methods=["POST"]),
            Route("/v1/completions", complete, methods=["POST"]),
        ]
    )


class _Server:
    def __init__(self, app: Any, limits: FrontLimits | None = None) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        http: Any = "auto" if limits is None else front_protocol(limits)
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error", http=http)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.server.force_exit = True
        self.thread.join(10)


def _pool() -> TokenPool:
    return TokenPool(
        "p",
        Resources(10_000, 10**9, 16),
        [
            TokenEntitlement("a", "elastic", Resources(1000, 10**8, 2), max_output_tokens=64),
            TokenEntitlement("s", "spot", Resources(1000, 10**8, 4), max_output_tokens=64),
        ],
    )


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with _Server(_upstream()) as url:
        yield url


@pytest.fixture
def gateway(upstream: str) -> Iterator[tuple[str, Admission]]:
    adm = Admission(LocalGate(TokenPoolGate(_pool(), 1)), KEYS, models=("m", "slow", "broken"))
    with _Server(create_app(adm, upstream, timeout_s=0.5, admin_key=ADMIN_KEY)) as url:
        yield url, adm


def _client(closing: contextlib.ExitStack, url: str, key: str = "key-a") -> Any:
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
    return closing.enter_context(client)


def _drained(adm: Admission) -> None:
    deadline = time.monotonic() + 5
    while adm.gate.usage()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert adm.gate.usage() == {"in_flight": 0, "kv_bytes": 0, "tokens": 0}


class TestGateway:
    def test_chat_and_completion_round_trip(
        self, closing: contextlib.ExitStack, gateway: tuple[str, Admission]
    ) -> None:
        url, adm = gateway
        client = _client(closing, url)
        chat = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5
        )
        assert chat.choices[0].message.content == "xxxxx"
        text = client.completions.create(model="m", prompt="hello", max_tokens=3)
        assert text.choices[0].text == "xxx"
        assert [m.id for m in client.models.list()] == ["m", "slow", "broken"]
        _drained(adm)
        metrics = httpx.get(url + "/metrics", headers=ADMIN).text
        assert 'kvpolicy_admitted_total{entitlement="a"} 2.0' in metrics
        assert httpx.get(url + "/healthz").json()["status"] == "ok"

    def test_streaming_counts_tokens(
        self, closing: contextlib.ExitStack, gateway: tuple[str, Admission]
    ) -> None:
        url, adm = gateway
        stream = _client(closing, url).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=6, stream=True
        )
        parts = [c.choices[0].delta.content for c in stream]
        assert "".join(p or "" for p in parts) == "x" * 6
        _drained(adm)
        metrics = httpx.get(url + "/metrics", headers=ADMIN).text
        # 8 prompt tokens (3 priming the reply, 4 for the message, 1 of text) and 6 events
        assert 'kvpolicy_tokens_total{entitlement="a"} 14.0' in metrics

    def test_bad_input(self, closing: contextlib.ExitStack, gateway: tuple[str, Admission]) -> None:
        url, adm = gateway
        msgs = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.AuthenticationError):
            _client(closing, url, "nope").chat.completions.create(model="m", messages=msgs)
        with pytest.raises(openai.PermissionDeniedError):
            _client(closing, url, "key-x").chat.completions.create(model="m", messages=msgs)
        with pytest.raises(openai.NotFoundError):
            _client(closing, url).chat.completions.create(model="other", messages=msgs)
        with pytest.raises(openai.BadRequestError, match="can ever fund"):
            _client(closing, url).chat.completions.create(
                model="m", messages=msgs, max_tokens=10**6
            )
        auth = {"authorization": "Bearer key-a", "content-type": "application/json"}
        bad = httpx.post(url + "/v1/chat/completions", content=b"{nope", headers=auth)
        assert bad.status_code == 400
        assert bad.json()["error"]["code"] == "bad-json"
        big = httpx.post(url + "/v1/completions", content=b"x" * (2 << 20), headers=auth)
        assert big.status_code == 413
        body = {"model": "m", "messages": msgs}
        assert httpx.post(url + "/v1/chat/completions", json=body).status_code == 401  # no key
        for bad_max in (-1, 0, 1.5, "8", True):  # null is absent: the default bound
            sent = httpx.post(
                url + "/v1/chat/completions", json={**body, "max_tokens": bad_max}, headers=auth
            )
            assert sent.status_code == 400, bad_max
            assert sent.json()["error"]["code"] == "max_tokens"
            assert "'max_tokens' must be a positive integer" in sent.json()["error"]["message"]
        nan = httpx.post(
            url + "/v1/chat/completions",
            content=b'{"model": "m", "messages": [], "max_tokens": NaN}',
            headers=auth,
        )
        assert nan.status_code == 400
        _drained(adm)

    def test_429_with_retry_after(
        self, closing: contextlib.ExitStack, gateway: tuple[str, Admission]
    ) -> None:
        """``a`` may hold 2; a third request while two streams run is denied."""
        url, adm = gateway
        client = _client(closing, url)
        msgs = [{"role": "user", "content": "hi"}]
        streams = [
            client.chat.completions.create(model="m", messages=msgs, max_tokens=20, stream=True)
            for _ in range(2)
        ]
        with pytest.raises(openai.RateLimitError) as info:
            client.chat.completions.create(model="m", messages=msgs)
        assert int(info.value.response.headers["retry-after"]) >= 1
        assert info.value.body["code"] == "concurrency"  # type: ignore[index]
        for s in streams:
            s.close()
        _drained(adm)
        metrics = httpx.get(url + "/metrics", headers=ADMIN).text
        assert 'kvpolicy_denied_total{entitlement="a",reason="concurrency"} 1.0' in metrics
        assert 'kvpolicy_admitted_total{entitlement="a"} 2.0' in metrics
        assert 'kvpolicy_in_flight{entitlement="a"} 0.0' in metrics
        assert 'kvpolicy_backend_in_flight{backend="' in metrics  # read from the fleet
        assert "} 0.0" in metrics.split("kvpolicy_backend_in_flight{")[1].split("\n")[0]
        routed = metrics.split("kvpolicy_backend_routed_total{")[1].split("\n")[0]
        assert routed.endswith("} 2.0")

    def test_disconnect_backend_error_and_timeout_release(
        self, closing: contextlib.ExitStack, gateway: tuple[str, Admission]
    ) -> None:
        url, adm = gateway
        client = _client(closing, url)
        msgs = [{"role": "user", "content": "hi"}]
        stream = client.chat.completions.create(
            model="m", messages=msgs, max_tokens=50, stream=True
        )
        next(iter(stream))
        stream.close()  # client goes away mid-stream
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="broken", messages=msgs)
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model="slow", messages=msgs)
        assert info.value.status_code == 504
        _drained(adm)


class TestMiddleware:
    def test_middleware_in_front_of_an_app(
        self, closing: contextlib.ExitStack, redis_proc: Any
    ) -> None:
        """The middleware guards the upstream app itself, here over Redis leases."""
        gate = RedisLeaseGate.from_url(_pool(), 1, redis_proc.url, namespace="mw")
        closing.callback(gate.close)
        adm = Admission(gate, KEYS)
        app = TokenPoolMiddleware(_upstream(), adm)
        with _Server(app) as url:
            client = _client(closing, url)
            text = client.completions.create(model="m", prompt="hello", max_tokens=3)
            assert text.choices[0].text == "xxx"
            stream = client.completions.create(model="m", prompt="a", max_tokens=4, stream=True)
            assert "".join(c.choices[0].text for c in stream) == "xxxx"
            with pytest.raises(openai.AuthenticationError):
                _client(closing, url, "nope").completions.create(model="m", prompt="a")
            assert next(m.id for m in client.models.list()) == "m"
        assert gate.usage() == {"in_flight": 0, "kv_bytes": 0, "tokens": 0}
        # Debt and priority come back from Redis with each release (eqs. 1-2).
        metrics = adm.metrics().body.decode()
        weight = gate.priority("a")
        assert f'kvpolicy_priority{{entitlement="a"}} {weight}' in metrics
        assert 'kvpolicy_debt{entitlement="a"} 0.0' in metrics


class TestReplicaGateways:
    def test_two_gateways_share_one_limit_over_redis(
        self, closing: contextlib.ExitStack, upstream: str, redis_proc: Any
    ) -> None:
        """``a`` may hold 2 in all: one stream through each gateway fills it, a third request
        to either is denied, and every counter returns to 0."""
        gates = [
            RedisLeaseGate.from_url(_pool(), 1, redis_proc.url, namespace="two") for _ in range(2)
        ]
        for g in gates:
            closing.callback(g.close)
        apps = [create_app(Admission(g, KEYS), upstream, renew_interval_s=0.2) for g in gates]
        with _Server(apps[0]) as url0, _Server(apps[1]) as url1:
            msgs = [{"role": "user", "content": "hi"}]
            streams = [
                _client(closing, u).chat.completions.create(
                    model="m", messages=msgs, max_tokens=20, stream=True
                )
                for u in (url0, url1)
            ]
            for u in (url0, url1):
                with pytest.raises(openai.RateLimitError):
                    _client(closing, u).chat.completions.create(model="m", messages=msgs)
            assert gates[0].usage("a")["in_flight"] == 2
            for s in streams:
                s.close()
            deadline = time.monotonic() + 5
            while gates[0].usage()["in_flight"] and time.monotonic() < deadline:
                time.sleep(0.01)
        assert gates[1].usage() == {"in_flight": 0, "kv_bytes": 0, "tokens": 0}


class TestObserve:
    def test_counts_text_events_or_the_reported_usage(self) -> None:
        """Role-only and finish events carry no token; a usage block is taken as is."""
        adm = Admission(LocalGate(TokenPoolGate(_pool(), 1)), KEYS)
        ticket = Ticket(Request("t", 3, 8, tenant="a"), b"{}", True, 8)

        def event(doc: dict[str, Any]) -> bytes:
            return b"data: " + json.dumps(doc).encode() + b"\n\n"

        role = event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
        text = event({"choices": [{"index": 0, "delta": {"content": " tok"}}]})
        done = event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        adm.observe(ticket, role + text + text)
        adm.observe(ticket, text + done + b"data: [DONE]\n\n")
        assert ticket.output_tokens == 3
        adm.observe(ticket, b"data: {not json\n\n")  # unreadable: counted as one token
        assert ticket.output_tokens == 4
        usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
        adm.observe(ticket, event(usage))
        assert ticket.output_tokens == 2
        body = Ticket(Request("b", 3, 8, tenant="a"), b"{}", False, 8)
        adm.observe(
            body, json.dumps({"choices": [{"text": "abc"}], "usage": usage["usage"]}).encode()
        )
        assert body.output_tokens == 2


def _chat(**extra: Any) -> bytes:
    return json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    ).encode()


def _budget_pool() -> TokenPool:
    """``b``: 300 tokens/s, a 60 s bucket of 18,000 tokens, 10 slots."""
    ent = TokenEntitlement("b", "elastic", Resources(300, 10**9, 10), max_output_tokens=64)
    return TokenPool("budget", Resources(10_000, 10**10, 16), [ent])


class TestCharging:
    """What is booked is what the backend will honour, on both gates alike."""

    @pytest.mark.parametrize("kind", ["local", "redis"])
    def test_max_tokens_is_charged_on_both_paths(
        self, closing: contextlib.ExitStack, kind: str, request: Any
    ) -> None:
        """Ten requests of ``max_tokens`` 4,000 against an 18,000-token bucket: 4 admitted
        (8 prompt tokens + 4,000 each), in process and over Redis alike."""
        if kind == "local":
            gate: Any = LocalGate(TokenPoolGate(_budget_pool(), 1))
        else:
            url = request.getfixturevalue("redis_proc").url
            gate = RedisLeaseGate.from_url(_budget_pool(), 1, url, namespace="budget")
            closing.callback(gate.close)

        async def run() -> list[bool]:
            adm = Admission(gate, {"k": "b"})
            got = [await adm.admit("Bearer k", _chat(max_tokens=4000)) for _ in range(10)]
            await adm.aclose()
            return [isinstance(t, Ticket) for t in got]

        assert asyncio.run(run()) == [True] * 4 + [False] * 6
        assert gate.usage("b")["tokens"] == 4 * 4008

    @pytest.mark.parametrize(
        ("extra", "charged", "sent"),
        [
            ({"max_tokens": 1, "max_completion_tokens": 500}, 1, (1, 1)),
            ({"max_completion_tokens": 500, "max_tokens": 700}, 500, (500, 500)),
            ({}, 64, (64, 64)),
            ({"max_tokens": None}, 64, (64, 64)),
            ({"max_tokens": 9}, 9, (9, None)),
            ({"max_completion_tokens": 9, "n": 3}, 27, (None, 9)),
        ],
    )
    def test_the_effective_output_bound(
        self, extra: dict[str, Any], charged: int, sent: tuple[int | None, int | None]
    ) -> None:
        """The smaller of ``max_tokens`` and ``max_completion_tokens`` (the entitlement's
        default when both are absent), times ``n``, is charged; the body sent on pins the
        backend to it when the client's does not."""
        gate = LocalGate(TokenPoolGate(_budget_pool(), 1))
        ticket = asyncio.run(Admission(gate, {"k": "b"}).admit("Bearer k", _chat(**extra)))
        assert isinstance(ticket, Ticket)
        assert (ticket.max_tokens, ticket.request.prompt_len) == (charged, 8)
        doc = json.loads(ticket.body)
        assert (doc.get("max_tokens"), doc.get("max_completion_tokens")) == sent
        assert gate.usage("b")["tokens"] == 8 + charged

    def test_requests_are_built_as_validated_ones(self) -> None:
        """The gateway's requests, built without the validators, equal validated ones; a
        configured prompt counter that does not answer a positive int is refused before
        anything is charged."""
        assert _request("gw-1", 3, 4, "t") == Request("gw-1", 3, 4, tenant="t")
        body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 1}).encode()
        for bad in (0, 2.0, None):
            adm = Admission(
                LocalGate(TokenPoolGate(_pool(), 1)), KEYS, prompt_tokens=lambda d, c, bad=bad: bad
            )
            with pytest.raises(ValueError, match="'prompt_tokens' must count"):
                asyncio.run(adm.admit("Bearer key-a", body, "/v1/completions"))
            assert adm.gate.usage()["in_flight"] == 0

    def test_prompt_estimate_counts_the_template(self) -> None:
        """2,000 empty messages are 8,003 tokens (4 each and 3 priming the reply), above
        the 8,000 a backend counting 4 per message books; a completion prompt of token
        ids counts one per id."""
        doc = {"messages": [{"role": "user", "content": ""}] * 2000}
        assert estimate_prompt_tokens(doc, chat=True) == 8003
        named = {"messages": [{"role": "user", "name": "abcdefgh", "content": "x" * 9}]}
        assert estimate_prompt_tokens(named, chat=True) == 3 + 4 + 2 + 3
        assert estimate_prompt_tokens({"prompt": [[1, 2, 3], "abcde"]}, chat=False) == 5

    @pytest.mark.parametrize(
        ("usage", "booked"),
        [
            ({"prompt_tokens": 8, "completion_tokens": -50}, 8 + 64),  # not a count: all
            ({"prompt_tokens": 8, "completion_tokens": 10**30}, 8 + 64),  # absurd: all
            ({"prompt_tokens": 8, "completion_tokens": "7"}, 8 + 64),
            ({"prompt_tokens": -3, "completion_tokens": 7}, 8 + 7),  # bad prompt count: ours
            ({"prompt_tokens": 5, "completion_tokens": 7}, 5 + 7),
            ({"prompt_tokens": 8, "completion_tokens": 900}, 8 + 64),  # clamped to the charge
            (None, 8 + 64),  # no usage: the whole charge stays
        ],
    )
    def test_backend_usage_is_checked_then_booked(
        self, usage: dict[str, Any] | None, booked: int, caplog: Any
    ) -> None:
        """A negative, absurd or missing ``usage`` is logged and never trusted: the release
        books the charge (never a 500, never a lease left held)."""
        gate = LocalGate(TokenPoolGate(_budget_pool(), 1))

        async def run() -> int:
            adm = Admission(gate, {"k": "b"})
            ticket = await adm.admit("Bearer k", _chat())
            assert isinstance(ticket, Ticket)
            answer: dict[str, Any] = {"choices": [{"message": {"content": "x"}}]}
            if usage is not None:
                answer["usage"] = usage
            adm.observe(ticket, json.dumps(answer).encode())
            out = await adm.afinish(ticket)
            assert out is not None
            return out.charged_tokens

        assert asyncio.run(run()) == booked
        assert gate.usage("b") == {"in_flight": 0, "kv_bytes": 0, "tokens": 0}
        assert gate.held() == 0


class TestHostileInput:
    """Input that crashed the gateway is a clear 4xx; tenants never see each other."""

    @pytest.mark.parametrize(
        ("body", "code"),
        [
            (b'{"model": "m", "messages": null}', "invalid-body"),
            (b'{"model": "m", "messages": 7}', "invalid-body"),
            (b'{"model": "m", "messages": [3]}', "invalid-body"),
            (b'{"model": "m", "messages": [{"content": "x"}]}', "invalid-body"),
            (b'{"model": "m", "messages": [{"role": "user", "content": 5}]}', "invalid-body"),
            (b'{"model": "m", "messages": [], "stream": "yes"}', "invalid-body"),
            (b'{"model": "m", "messages": ' + b"[" * 1000 + b"]" * 1000 + b"}", "too-deep"),
            (b"[" * 100_000 + b"]" * 100_000, "too-deep"),
            (b'{"model": "m", "prompt": {"a": 1}}', "invalid-body"),
        ],
    )
    def test_malformed_bodies_are_400(
        self, gateway: tuple[str, Admission], body: bytes, code: str
    ) -> None:
        url, adm = gateway
        path = "/v1/completions" if b"prompt" in body else "/v1/chat/completions"
        auth = {"authorization": "Bearer key-a", "content-type": "application/json"}
        sent = httpx.post(url + path, content=body, headers=auth)
        assert (sent.status_code, sent.json()["error"]["code"]) == (400, code)
        assert len(sent.content) < 400  # the error never echoes a huge value
        assert adm.gate.usage("a")["in_flight"] == 0

    def test_a_websocket_upgrade_is_refused(self, gateway: tuple[str, Admission]) -> None:
        """A websocket handshake gets a 4xx (403 where the server speaks websockets, else
        the plain request is refused), never a 500."""
        url, _ = gateway
        host, port = url[len("http://") :].split(":")
        with socket.create_connection((host, int(port)), timeout=5) as conn:
            conn.sendall(
                b"GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                b"Sec-WebSocket-Version: 13\r\n\r\n"
            )
            status = conn.recv(64).split(b" ")[1]
        assert status in (b"403", b"405")

    def test_admin_pages_need_the_admin_key(
        self, closing: contextlib.ExitStack, gateway: tuple[str, Admission]
    ) -> None:
        """``/metrics`` answers 403 to a tenant's key and to none; ``/healthz`` says only
        ``ok`` without the admin key; a 429 names no other tenant."""
        url, _ = gateway
        _client(closing, url, "key-s").completions.create(model="m", prompt="hello", max_tokens=3)
        for headers in ({}, {"Authorization": "Bearer key-a"}):
            denied = httpx.get(url + "/metrics", headers=headers)
            assert denied.status_code == 403
            assert b'"s"' not in denied.content
            assert httpx.get(url + "/healthz", headers=headers).json() == {"status": "ok"}
        assert httpx.get(url + "/healthz", headers=ADMIN).json() == {"status": "ok", "held": 0}
        assert 'entitlement="s"' in httpx.get(url + "/metrics", headers=ADMIN).text

    def test_admin_app_serves_the_pages_without_a_key(self) -> None:
        adm = Admission(LocalGate(TokenPoolGate(_pool(), 1)), KEYS)
        with _Server(create_admin_app(adm)) as url:
            assert httpx.get(url + "/healthz").json() == {"status": "ok", "held": 0}
            assert "kvpolicy_admitted" in httpx.get(url + "/metrics").text
            assert httpx.get(url + "/v1/models").status_code == 404

    def test_a_vanished_client_frees_its_slot_at_once(self, gateway: tuple[str, Admission]) -> None:
        """A non-streaming client that gives up after 0.3 s on a 3 s answer: the upstream
        request is broken off and the slot is free long before the answer would be."""
        url, adm = gateway
        auth = {"authorization": "Bearer key-a", "content-type": "application/json"}
        started = time.monotonic()
        with pytest.raises(httpx.TimeoutException):
            httpx.post(
                url + "/v1/chat/completions",
                content=json.dumps(
                    {"model": "slow", "messages": [{"role": "user", "content": "x"}]}
                ),
                headers=auth,
                timeout=0.3,
            )
        while adm.gate.usage("a")["in_flight"] and time.monotonic() - started < 5:
            time.sleep(0.01)
        assert adm.gate.usage("a")["in_flight"] == 0
        assert time.monotonic() - started < 2.0


async def _four_served_one_denied(adm: Admission) -> list[Any]:
    """Five requests of ``max_tokens`` 4,000 to ``b``'s 18,000-token bucket: the first four
    served on time (17 tokens each), the fifth denied for tokens."""
    got = [await adm.admit("Bearer k", _chat(max_tokens=4000)) for _ in range(5)]
    for ticket in got[:4]:
        assert isinstance(ticket, Ticket)
        ticket.first = ticket.started + 0.001
        adm.observe(ticket, b'{"usage": {"prompt_tokens": 8, "completion_tokens": 9}}')
        await adm.afinish(ticket)
    return got


class TestRefresh:
    def test_token_denials_with_room_raise_the_estimate(self) -> None:
        """Over an in-process gate the gateway feeds ThroughputRefresh: completions on time,
        429s for tokens and a pool with room make the window's end raise every token rate
        by the probe factor (1.5)."""
        local = LocalGate(TokenPoolGate(_budget_pool(), 1))
        config = RefreshConfig(window_s=0.01, min_completions=1, ttft_s=10.0, tpot_s=10.0)
        adm = Admission(local, {"k": "b"}, refresh=ThroughputRefresh(local, config))

        got = asyncio.run(_four_served_one_denied(adm))
        assert isinstance(got[4], Reply)
        assert json.loads(got[4].body)["error"]["code"] == "tokens"
        assert local.tokens_per_s == 10_000
        time.sleep(0.02)
        adm.tick(busy=False)
        assert local.tokens_per_s == pytest.approx(15_000)
        ent = local.entitlement("b")
        assert ent is not None
        assert ent.limits.tokens_per_s == pytest.approx(450)

    def test_replicas_over_redis_raise_the_estimate_together(
        self, redis_proc: Any, closing: contextlib.ExitStack
    ) -> None:
        """Two gateway replicas over one Redis, each with a SharedThroughputRefresh: the
        token denials and completions one of them saw raise the shared estimate by the
        probe factor, and the replica that saw nothing follows."""
        import redis

        clock = [0.0]
        config = RefreshConfig(window_s=1.0, min_completions=1, ttft_s=10.0, tpot_s=10.0)
        adms = []
        for _ in range(2):
            gate = RedisLeaseGate.from_url(_budget_pool(), 1, redis_proc.url, namespace="rf")
            closing.callback(gate.close)
            client = redis.Redis.from_url(redis_proc.url)
            closing.callback(client.close)
            refresh = SharedThroughputRefresh(
                gate, config, client, namespace="rf", clock=lambda: clock[0]
            )
            adms.append(Admission(gate, {"k": "b"}, refresh=refresh))

        async def run() -> list[Any]:
            adm = adms[0]
            got = await _four_served_one_denied(adm)
            for a in adms:
                await a.aclose()
            return got

        for adm in adms:
            adm.tick(busy=False)  # window 0 starts
        got = asyncio.run(run())
        assert json.loads(got[4].body)["error"]["code"] == "tokens"
        for now in (1.0, 2.0):
            clock[0] = now
            for adm in adms:
                adm.tick(busy=False)
        assert [a.gate.pool.capacity.tokens_per_s for a in adms] == [10_000, 10_000]
        assert [a.gate.tokens_per_s for a in adms] == [pytest.approx(15_000)] * 2  # type: ignore[attr-defined]


class TestFront:
    def test_each_head_of_a_kept_alive_connection_has_its_deadline(self, upstream: str) -> None:
        """One timer per connection: a second head that stalls is answered 408 once its
        own deadline passes (not the first head's, which came in time)."""
        adm = Admission(LocalGate(TokenPoolGate(_pool(), 1)), KEYS)
        limits = FrontLimits(header_timeout_s=0.4)
        with _Server(create_app(adm, upstream), limits) as url:
            port = int(url.rsplit(":", 1)[1])
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                assert sock.recv(65536).startswith(b"HTTP/1.1 200")
                time.sleep(0.25)  # the first head's timer fires 0.15 s into the second
                started = time.monotonic()
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finished
                answer = b""
                while chunk := sock.recv(65536):
                    answer += chunk
                waited = time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 408")
        assert 0.35 <= waited < 3.0
