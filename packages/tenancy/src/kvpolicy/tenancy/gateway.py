"""An OpenAI-compatible token-pool gateway (the ``gateway`` extra).

API key -> entitlement -> the gate's checks -> proxy to the backend, or 429 with a
Retry-After and an OpenAI-shaped error body. On completion, client disconnect or backend
error, exactly what the request held is released with the tokens it really produced.

:func:`create_app` builds the service, a plain ASGI application served by uvicorn (the ASGI
server vLLM itself runs on; its ``standard`` extra brings uvloop and the httptools parser).
The gateway adds a hop to every request, so what it costs per request is what its users
pay: the app speaks ASGI directly, without a framework's routing and request and response
objects, and calls the backend with :class:`~kvpolicy.tenancy._upstream.Upstream`, a
keep-alive client on asyncio protocols and httptools. On the 2-core development machine
that took the gateway's CPU per proxied request from 0.45-0.65 ms (Starlette with aiohttp's
client) to about half of it; ``benchmarks/bench_gateway.py`` measures the added latency.

:class:`TokenPoolMiddleware` is the same admission as ASGI middleware for
``vllm serve --middleware kvpolicy.tenancy.gateway.TokenPoolMiddleware`` (configured by the
environment variables ``KVPOLICY_POOL``, ``KVPOLICY_API_KEYS`` and ``KVPOLICY_REDIS``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from kvpolicy.kvmodel import GateDecision, Request
from kvpolicy.tenancy._entitlements import TokenEntitlement, TokenPool, fundable_tokens
from kvpolicy.tenancy._errors import UnknownRequestError
from kvpolicy.tenancy._gate import TokenPoolGate
from kvpolicy.tenancy._lease import LeaseRelease, RedisLeaseGate
from kvpolicy.tenancy._upstream import Upstream, UpstreamError, UpstreamReply, UpstreamTimeoutError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

__all__ = [
    "Admission",
    "LocalGate",
    "Reply",
    "Ticket",
    "TokenPoolMiddleware",
    "create_app",
    "load_api_keys",
]

_PATHS = ("/v1/chat/completions", "/v1/completions")
_JSON = {"content-type": "application/json"}
_ids = itertools.count()
_RUN = os.urandom(4).hex()  # request ids unique across gateway processes and restarts
_PROMETHEUS = b"text/plain; version=0.0.4; charset=utf-8"


class LocalGate:
    """A :class:`TokenPoolGate` of one process behind :class:`RedisLeaseGate`'s interface:
    the gateway's choice when no Redis is given (one replica)."""

    def __init__(self, gate: TokenPoolGate) -> None:
        """Wrap ``gate``; time is this process's monotonic clock."""
        self._gate = gate
        self._t0 = time.monotonic()
        self._held: dict[str, Request] = {}

    @property
    def pool(self) -> TokenPool:
        """The pool and its entitlements."""
        return self._gate.pool

    def entitlement(self, tenant: str) -> TokenEntitlement | None:
        """The entitlement governing ``tenant``."""
        return self._gate.entitlement(tenant)

    def max_request_tokens(self, tenant: str) -> int:
        """The largest ``prompt_len + max_output_tokens`` the entitlement can ever fund."""
        ent = self.entitlement(tenant)
        if ent is None:
            return 0
        gate = self._gate
        return fundable_tokens(
            ent.limits, self.pool.capacity, gate.config.window_s, gate.bytes_per_token
        )

    def check(self, request: Request, *, max_output_tokens: int | None = None) -> GateDecision:
        """Admit or deny ``request`` now (the entitlement's ``max_output_tokens`` is charged)."""
        decision = self._gate.check(request, time.monotonic() - self._t0)
        if decision.admitted:
            self._held[request.request_id] = request
        return decision

    def release(self, request: Request | str, produced_tokens: int | None = None) -> LeaseRelease:
        """Release what ``request`` holds, booking ``produced_tokens`` (clamped to the charge)."""
        rid = request.request_id if isinstance(request, Request) else request
        held = self._held.pop(rid, None)
        if held is None:
            return LeaseRelease(False, 0)
        ent = self._gate.entitlement(held.tenant)
        most = held.prompt_len + (ent.max_output_tokens if ent else 1)
        produced = most if produced_tokens is None else produced_tokens
        clamped = produced > most
        produced = min(produced, most)
        decode = max(1, produced - held.prompt_len)
        try:
            self._gate.release(held, time.monotonic() - self._t0, tokens=held.prompt_len + decode)
        except UnknownRequestError:
            return LeaseRelease(False, 0)
        tenant = held.tenant
        return LeaseRelease(
            True, held.prompt_len + decode, clamped, self.debt(tenant), self.priority(tenant)
        )

    def held(self) -> int:
        """Requests this gate holds now."""
        return len(self._held)

    def renew(self) -> tuple[int, int, int]:
        """Nothing to renew in one process."""
        return (len(self._held), 0, 0)

    def usage(self, tenant: str | None = None) -> dict[str, int]:
        """In-flight counters of ``tenant`` (or of the pool)."""
        if tenant is None:
            ps = self._gate.pool_state()
            return {"in_flight": ps.in_flight, "kv_bytes": ps.kv_bytes, "tokens": ps.tokens}
        s = self._gate.usage(tenant)
        return {"in_flight": s.in_flight, "kv_bytes": s.kv_bytes, "tokens": s.tokens}

    def priority(self, tenant: str) -> float:
        """Priority weight of ``tenant``."""
        return self._gate.priority(tenant)

    def debt(self, tenant: str) -> float:
        """Service debt of ``tenant``."""
        return self._gate.usage(tenant).debt


Gate = LocalGate | RedisLeaseGate


def load_api_keys(source: str | os.PathLike[str] | Mapping[str, str]) -> dict[str, str]:
    """API key -> tenant, from a mapping or a JSON/YAML file of one."""
    if isinstance(source, Mapping):
        doc: Any = dict(source)
    else:
        text = open(source, encoding="utf-8").read()  # noqa: SIM115
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            import yaml

            doc = yaml.safe_load(text)
    if not isinstance(doc, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in doc.items()
    ):
        raise ValueError(f"'api_keys' must map key strings to tenant strings: {source!r}")
    return doc


class Reply:
    """A whole HTTP answer (status, body, headers), itself an ASGI application."""

    __slots__ = ("body", "headers", "status")

    def __init__(
        self,
        body: bytes,
        status: int = 200,
        content_type: bytes = b"application/json",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """``headers`` are added to ``Content-Type`` and ``Content-Length``."""
        self.body = body
        self.status = status
        self.headers = [(b"content-type", content_type)]
        if headers:
            self.headers += [(k.lower().encode(), v.encode()) for k, v in headers.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send it."""
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})


def _json(doc: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Reply:
    return Reply(json.dumps(doc).encode(), status, headers=headers)


def _error(status: int, message: str, kind: str, code: str, headers: Any = None) -> Reply:
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return _json(body, status, headers)


def _prompt_tokens(body: Mapping[str, Any]) -> int:
    """A tokenizer-free estimate of the prompt's tokens: 4 characters per token."""
    if "messages" in body:
        text = "".join(str(m.get("content", "")) for m in body["messages"] if isinstance(m, dict))
    else:
        prompt = body.get("prompt", "")
        text = prompt if isinstance(prompt, str) else json.dumps(prompt)
    return max(1, math.ceil(len(text) / 4))


def _has_text(choice: Any) -> bool:
    """Whether a streamed choice carries generated text (a completion's ``text`` or a chat
    delta's ``content``)."""
    if not isinstance(choice, dict):
        return False
    delta = choice.get("delta")
    text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
    return isinstance(text, str) and text != ""


class Ticket:
    """An admitted request on its way to the backend."""

    __slots__ = ("body", "done", "max_tokens", "output_tokens", "request", "started", "stream")

    def __init__(self, request: Request, body: bytes, stream: bool, max_tokens: int) -> None:
        """Admitted now."""
        self.request = request
        self.body = body
        self.stream = stream
        self.max_tokens = max_tokens
        self.started = time.monotonic()
        self.output_tokens = 0
        self.done = False

    @property
    def tenant(self) -> str:
        """Whose request it is."""
        return self.request.tenant


class _Labelled:
    """One Prometheus metric's per-entitlement children, looked up once each."""

    __slots__ = ("children", "metric")

    def __init__(self, metric: Any) -> None:
        self.metric = metric
        self.children: dict[tuple[str, ...], Any] = {}

    def __call__(self, *labels: str) -> Any:
        child = self.children.get(labels)
        if child is None:
            child = self.children[labels] = self.metric.labels(*labels)
        return child


class Admission:
    """Authentication, validation, admission and release: shared by the gateway and the
    middleware. ``models`` (``None``: any) names the models served."""

    def __init__(
        self,
        gate: Gate,
        api_keys: Mapping[str, str],
        *,
        models: tuple[str, ...] | None = None,
        max_body_bytes: int = 1 << 20,
    ) -> None:
        """See the class docstring."""
        self.gate = gate
        self.api_keys = dict(api_keys)
        self.models = models
        self.max_body_bytes = max_body_bytes
        self.registry = CollectorRegistry()
        labels = ["entitlement"]
        reg = self.registry
        self.admitted = Counter("kvpolicy_admitted", "Requests admitted", labels, registry=reg)
        self.denied = Counter(
            "kvpolicy_denied", "Requests denied", [*labels, "reason"], registry=reg
        )
        self.in_flight = Gauge("kvpolicy_in_flight", "Requests in flight", labels, registry=reg)
        self.tokens = Counter("kvpolicy_tokens", "Tokens served", labels, registry=reg)
        self.debt = Gauge("kvpolicy_debt", "Service debt (eq. 2)", labels, registry=reg)
        self.priority = Gauge("kvpolicy_priority", "Priority weight (eq. 1)", labels, registry=reg)
        self.latency = Counter(
            "kvpolicy_latency_seconds", "Summed request latency", labels, registry=reg
        )
        self._admitted, self._denied = _Labelled(self.admitted), _Labelled(self.denied)
        self._in_flight, self._tokens = _Labelled(self.in_flight), _Labelled(self.tokens)
        self._debt, self._priority = _Labelled(self.debt), _Labelled(self.priority)
        self._latency = _Labelled(self.latency)

    async def admit(self, auth: str, body: bytes) -> Ticket | Reply:
        """Check one request (``auth``: its ``Authorization`` header); a :class:`Ticket` when
        admitted, else the error reply."""
        key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        tenant = self.api_keys.get(key)
        if tenant is None:
            return _error(401, "Missing or unknown API key.", "invalid_request_error", "auth")
        ent = self.gate.entitlement(tenant)
        if ent is None:
            msg = f"Entitlement of {tenant!r} is not Bound to the pool."
            return _error(403, msg, "permission_error", "not-bound")
        if len(body) > self.max_body_bytes:
            return _error(413, "Request body too large.", "invalid_request_error", "too-large")
        try:
            doc = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            return _error(400, f"Malformed JSON: {err}", "invalid_request_error", "bad-json")
        if not isinstance(doc, dict):
            return _error(400, "Body must be a JSON object.", "invalid_request_error", "bad-json")
        model = doc.get("model")
        if self.models is not None and model not in self.models:
            return _error(404, f"Unknown model {model!r}.", "invalid_request_error", "model")
        mt = doc.get("max_tokens", doc.get("max_completion_tokens", ent.max_output_tokens))
        if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
            msg = f"'max_tokens' must be a positive integer: {mt!r}"
            return _error(400, msg, "invalid_request_error", "max_tokens")
        prompt = _prompt_tokens(doc)
        most = self.gate.max_request_tokens(tenant)
        if prompt + mt > most:
            msg = (
                f"'max_tokens' {mt} plus about {prompt} prompt tokens exceeds what the "
                f"entitlement of {tenant!r} can ever fund ({most} tokens)."
            )
            return _error(400, msg, "invalid_request_error", "oversized")
        req = Request(f"gw-{_RUN}-{next(_ids)}", prompt, mt, tenant=tenant)
        if isinstance(self.gate, LocalGate):  # microseconds: no round trip
            decision = self.gate.check(req, max_output_tokens=mt)
        else:  # one Redis round trip, awaited on the event loop
            decision = await self.gate.acheck(req, max_output_tokens=mt)
        if not decision.admitted:
            self._denied(tenant, decision.reason).inc()
            retry = max(1, math.ceil(decision.retry_after))
            msg = f"Rate limited ({decision.reason}); retry after {decision.retry_after:.2f} s."
            return _error(
                429, msg, "rate_limit_exceeded", decision.reason, {"Retry-After": str(retry)}
            )
        self._admitted(tenant).inc()
        self._in_flight(tenant).inc()
        return Ticket(req, body, bool(doc.get("stream")), mt)

    def observe(self, ticket: Ticket, chunk: bytes) -> None:
        """Count output tokens in a response body chunk: the ``usage`` a body or an event
        reports when there is one, else one token per streamed event that carries text
        (role-only and finish events carry none)."""
        for line in chunk.split(b"\n"):
            line = line.strip()
            event = line.startswith(b"data:")
            if event:
                line = line[5:].strip()
                if line == b"[DONE]" or not line:
                    continue
            elif b'"completion_tokens"' not in line:
                continue
            try:
                doc = json.loads(line)
            except ValueError:
                ticket.output_tokens += event  # an event we cannot read: one token
                continue
            usage = doc.get("usage") if isinstance(doc, dict) else None
            if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                ticket.output_tokens = usage["completion_tokens"]
            elif event and isinstance(doc, dict):
                ticket.output_tokens += sum(map(_has_text, doc.get("choices") or ()))

    def finish(self, ticket: Ticket) -> LeaseRelease | None:
        """Release ``ticket`` once with the tokens it produced; later calls do nothing."""
        if ticket.done:
            return None
        ticket.done = True
        produced = ticket.request.prompt_len + ticket.output_tokens
        return self._booked(ticket, self.gate.release(ticket.request, produced))

    async def afinish(self, ticket: Ticket) -> LeaseRelease | None:
        """:meth:`finish` on the event loop: a Redis release is awaited, shielded from the
        cancellation of a client disconnect so that it always completes (and is booked)."""
        if ticket.done:
            return None
        ticket.done = True
        produced = ticket.request.prompt_len + ticket.output_tokens
        if isinstance(self.gate, LocalGate):
            return self._booked(ticket, self.gate.release(ticket.request, produced))
        task = asyncio.ensure_future(self.gate.arelease(ticket.request, produced))
        try:
            out = await asyncio.shield(task)
        except asyncio.CancelledError:  # the release goes on, and is booked when done
            task.add_done_callback(lambda t: self._booked_when_done(ticket, t))
            raise
        return self._booked(ticket, out)

    def _booked_when_done(self, ticket: Ticket, task: asyncio.Future[LeaseRelease]) -> None:
        if not task.cancelled() and task.exception() is None:
            self._booked(ticket, task.result())

    def _booked(self, ticket: Ticket, out: LeaseRelease) -> LeaseRelease:
        tenant = ticket.request.tenant
        self._in_flight(tenant).dec()
        self._tokens(tenant).inc(out.charged_tokens)
        self._latency(tenant).inc(time.monotonic() - ticket.started)
        if out.debt is not None and out.priority is not None:
            self._debt(tenant).set(out.debt)
            self._priority(tenant).set(out.priority)
        return out

    async def aclose(self) -> None:
        """Close the gate's connections on this event loop (at shutdown)."""
        if isinstance(self.gate, RedisLeaseGate):
            await self.gate.aclose()

    def metrics(self) -> Reply:
        """The Prometheus exposition of the counters."""
        return Reply(generate_latest(self.registry), content_type=_PROMETHEUS)


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope["headers"]:
        if key == name:  # uvicorn gives header names in lower case
            return str(value.decode("latin-1"))
    return ""


async def _read_body(scope: Scope, receive: Receive, limit: int) -> bytes | None:
    """The request's body, or ``None`` when it exceeds ``limit`` bytes."""
    size = _header(scope, b"content-length")
    if size.isdigit() and int(size) > limit:
        return None
    message = await receive()
    body: bytes = message.get("body", b"")
    if not message.get("more_body"):
        return body if len(body) <= limit else None
    parts = [body]
    total = len(body)
    while message.get("more_body"):
        message = await receive()
        chunk = message.get("body", b"")
        total += len(chunk)
        if total > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)


_NOT_FOUND = _error(404, "Not found.", "invalid_request_error", "not-found")
_NOT_ALLOWED = _error(405, "Method not allowed.", "invalid_request_error", "method")


class _Gateway:
    """The gateway's ASGI application (see :func:`create_app`)."""

    def __init__(self, admission: Admission, upstream: Upstream, renew_interval_s: float) -> None:
        self.admission = admission
        self.upstream = upstream
        self.renew_interval_s = renew_interval_s
        self._renewer: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path, method = scope["path"], scope["method"]
            if path in _PATHS:
                if method != "POST":
                    await _NOT_ALLOWED(scope, receive, send)
                    return
                await self.proxy(scope, receive, send)
                return
            handler = self._pages.get(path)
            if handler is None:
                await _NOT_FOUND(scope, receive, send)
            elif method not in ("GET", "HEAD"):
                await _NOT_ALLOWED(scope, receive, send)
            else:
                reply = await handler(self)
                await reply(scope, receive, send)
        elif kind == "lifespan":
            await self.lifespan(receive, send)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        """Start the lease renewals; at shutdown (or when cancelled) stop them and close
        every connection."""
        try:
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    self._renewer = asyncio.create_task(self._renew_loop())
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self._close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        finally:
            await self._close()

    async def _close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            self._renewer = None
        self.upstream.close()
        await self.admission.aclose()

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.renew_interval_s)
            with contextlib.suppress(Exception):  # Redis away: the next round retries
                await asyncio.to_thread(self.admission.gate.renew)

    async def proxy(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Admit, proxy and release one request."""
        adm = self.admission
        body = await _read_body(scope, receive, adm.max_body_bytes)
        if body is None:
            reply = _error(413, "Request body too large.", "invalid_request_error", "too-large")
            await reply(scope, receive, send)
            return
        got = await adm.admit(_header(scope, b"authorization"), body)
        if isinstance(got, Reply):
            await got(scope, receive, send)
            return
        ticket = got
        try:
            upstream = await self.upstream.request("POST", scope["path"], body)
        except UpstreamTimeoutError:
            await adm.afinish(ticket)
            await _error(504, "Backend timed out.", "api_error", "backend-timeout")(
                scope, receive, send
            )
            return
        except UpstreamError as err:
            await adm.afinish(ticket)
            reply = _error(502, f"Backend unreachable: {err}", "api_error", "backend-error")
            await reply(scope, receive, send)
            return
        if ticket.stream:
            await self._relay(ticket, upstream, receive, send)
            return
        try:  # one body: nothing but the answer to wait for
            content = await upstream.read()
            adm.observe(ticket, content)
        except UpstreamTimeoutError:
            reply = _error(504, "Backend timed out.", "api_error", "backend-timeout")
        except UpstreamError as err:
            reply = _error(502, f"Backend failed: {err}", "api_error", "backend-error")
        else:
            reply = Reply(content, upstream.status, upstream.content_type or b"application/json")
        finally:
            upstream.release()
            await adm.afinish(ticket)
        await reply(scope, receive, send)

    async def _relay(
        self, ticket: Ticket, upstream: UpstreamReply, receive: Receive, send: Send
    ) -> None:
        """Stream the answer as it comes; a client that goes away breaks off the upstream
        answer at once (its ``http.disconnect`` is watched beside the relay)."""
        adm = self.admission

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            upstream.fail(UpstreamError("the client went away"))

        watcher = asyncio.ensure_future(watch())
        headers = [(b"content-type", upstream.content_type or b"text/event-stream")]
        try:
            await send(
                {"type": "http.response.start", "status": upstream.status, "headers": headers}
            )
            while chunk := await upstream.chunk():
                adm.observe(ticket, chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        except UpstreamError:  # the client went away, or the backend broke off: end here
            with contextlib.suppress(Exception):
                await send({"type": "http.response.body", "body": b""})
        finally:
            watcher.cancel()
            upstream.release()
            # Completion, client disconnect or backend error alike.
            await adm.afinish(ticket)

    async def _models(self) -> Reply:
        try:
            upstream = await self.upstream.request("GET", "/v1/models")
            try:
                content = await upstream.read()
                status, ctype = upstream.status, upstream.content_type or b"application/json"
            finally:
                upstream.release()
        except UpstreamError as err:
            return _error(502, f"Backend unreachable: {err}", "api_error", "backend-error")
        return Reply(content, status, ctype)

    async def _healthz(self) -> Reply:
        return _json({"status": "ok", "held": self.admission.gate.held()})

    async def _metrics(self) -> Reply:
        return self.admission.metrics()

    _pages: Mapping[str, Callable[[_Gateway], Awaitable[Reply]]] = {
        "/v1/models": _models,
        "/healthz": _healthz,
        "/metrics": _metrics,
    }


def create_app(
    admission: Admission,
    backend: str,
    *,
    timeout_s: float = 600.0,
    renew_interval_s: float = 5.0,
) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """The gateway: OpenAI-compatible endpoints proxied to ``backend`` (a base URL whose
    ``/v1/...`` paths serve the models), plus ``/metrics`` and ``/healthz``. An ASGI
    application (serve it with uvicorn).

    ``timeout_s`` is the longest silence of the backend (before its answer, or between two
    chunks of a stream); ``renew_interval_s`` how often the leases held are renewed.

    Raises:
        ValueError: ``backend`` is not an ``http://`` URL, or a time is not positive.
    """
    if not renew_interval_s > 0:
        raise ValueError(f"'renew_interval_s' must be > 0: {renew_interval_s!r}")
    return _Gateway(admission, Upstream(backend, read_timeout_s=timeout_s), renew_interval_s)


def _from_env() -> Admission:
    from kvpolicy.tenancy._manifest import load_gate, load_lease_gate

    source = os.environ["KVPOLICY_POOL"]
    keys = load_api_keys(os.environ["KVPOLICY_API_KEYS"])
    bpt = int(os.environ.get("KVPOLICY_BYTES_PER_TOKEN", "1"))
    url = os.environ.get("KVPOLICY_REDIS")
    gate: Gate = load_lease_gate(source, bpt, url) if url else LocalGate(load_gate(source, bpt))
    return Admission(gate, keys)


class TokenPoolMiddleware:
    """Token-pool admission in front of any ASGI app (``vllm serve --middleware``).

    Requests to ``/v1/chat/completions`` and ``/v1/completions`` pass the same checks as the
    gateway; admitted ones reach the wrapped app with their body replayed, and their tokens
    are counted from the response and released when it ends or the client goes away.
    """

    def __init__(self, app: Callable[..., Awaitable[None]], admission: Admission | None = None):
        """Wrap ``app``; ``admission`` defaults to one built from the environment."""
        self.app = app
        self.admission = _from_env() if admission is None else admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point."""
        if scope["type"] == "lifespan":  # it lasts the server's life: close at its end
            try:
                await self.app(scope, receive, send)
            finally:
                await self.admission.aclose()
            return
        if scope["type"] != "http" or scope["path"] not in _PATHS or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body = await _read_body(scope, receive, self.admission.max_body_bytes)
        if body is None:
            reply = _error(413, "Request body too large.", "invalid_request_error", "too-large")
            await reply(scope, receive, send)
            return
        got = await self.admission.admit(_header(scope, b"authorization"), body)
        if isinstance(got, Reply):
            await got(scope, receive, send)
            return
        ticket = got
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.body":
                self.admission.observe(ticket, message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, replay, counting_send)
        finally:
            await self.admission.afinish(ticket)
