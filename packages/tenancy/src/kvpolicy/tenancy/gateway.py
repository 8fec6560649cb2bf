"""An OpenAI-compatible token-pool gateway (the ``gateway`` extra).

Starlette + uvicorn serve it and aiohttp calls the backend: Starlette is a small, typed,
well-kept ASGI toolkit whose streaming responses and lifespan hooks are all a proxy needs
(FastAPI would add validation machinery for three endpoints), uvicorn is the ASGI server
vLLM itself runs on, and aiohttp's client streams upstream responses with timeouts; its
compiled HTTP parser cut the gateway's CPU per proxied request by a fifth against httpx
(1.5 to 1.2 ms on the 2-core development machine), which decides how many requests/s one
gateway process can proxy.

API key -> entitlement -> the gate's checks -> proxy to the backend, or 429 with a
Retry-After and an OpenAI-shaped error body. On completion, client disconnect or backend
error, exactly what the request held is released with the tokens it really produced.

:func:`create_app` builds the service; :class:`TokenPoolMiddleware` is the same admission as
ASGI middleware for ``vllm serve --middleware kvpolicy.tenancy.gateway.TokenPoolMiddleware``
(configured by the environment variables ``KVPOLICY_POOL``, ``KVPOLICY_API_KEYS`` and
``KVPOLICY_REDIS``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import anyio
import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from kvpolicy.kvmodel import GateDecision, Request
from kvpolicy.tenancy._entitlements import TokenEntitlement, TokenPool
from kvpolicy.tenancy._errors import UnknownRequestError
from kvpolicy.tenancy._gate import TokenPoolGate
from kvpolicy.tenancy._lease import LeaseRelease, RedisLeaseGate

__all__ = ["Admission", "LocalGate", "TokenPoolMiddleware", "create_app", "load_api_keys"]

_PATHS = ("/v1/chat/completions", "/v1/completions")
_JSON = {"content-type": "application/json"}
_ids = itertools.count()


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
        lim, cap, w = ent.limits, self.pool.capacity, self._gate.config.window_s
        bpt = self._gate.bytes_per_token
        return int(
            min(
                lim.tokens_per_s * w,
                cap.tokens_per_s * w,
                lim.kv_bytes // bpt,
                cap.kv_bytes // bpt,
            )
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
            self._gate.release(attrs.evolve(held, decode_len=decode), time.monotonic() - self._t0)
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


def _error(status: int, message: str, kind: str, code: str, headers: Any = None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def _prompt_tokens(body: Mapping[str, Any]) -> int:
    """A tokenizer-free estimate of the prompt's tokens: 4 characters per token."""
    if "messages" in body:
        text = "".join(str(m.get("content", "")) for m in body["messages"] if isinstance(m, dict))
    else:
        prompt = body.get("prompt", "")
        text = prompt if isinstance(prompt, str) else json.dumps(prompt)
    return max(1, math.ceil(len(text) / 4))


@attrs.define
class Ticket:
    """An admitted request on its way to the backend."""

    request: Request
    tenant: str
    body: bytes
    stream: bool
    max_tokens: int
    started: float
    output_tokens: int = 0
    done: bool = False


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

    async def admit(self, headers: Mapping[str, str], body: bytes) -> Ticket | Response:
        """Check one request; a :class:`Ticket` when admitted, else the error response."""
        auth = headers.get("authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
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
        rid = f"gw-{uuid.uuid4().hex[:12]}-{next(_ids)}"
        req = Request(rid, prompt, mt, tenant=tenant)
        if isinstance(self.gate, LocalGate):  # microseconds: no round trip
            decision = self.gate.check(req, max_output_tokens=mt)
        else:  # one Redis round trip, awaited on the event loop
            decision = await self.gate.acheck(req, max_output_tokens=mt)
        if not decision.admitted:
            self.denied.labels(tenant, decision.reason).inc()
            retry = max(1, math.ceil(decision.retry_after))
            msg = f"Rate limited ({decision.reason}); retry after {decision.retry_after:.2f} s."
            return _error(
                429, msg, "rate_limit_exceeded", decision.reason, {"Retry-After": str(retry)}
            )
        self.admitted.labels(tenant).inc()
        self.in_flight.labels(tenant).inc()
        return Ticket(req, tenant, body, bool(doc.get("stream")), mt, time.monotonic())

    def observe(self, ticket: Ticket, chunk: bytes) -> None:
        """Count output tokens in a response body chunk (SSE events or one JSON body)."""
        for line in chunk.split(b"\n"):
            line = line.strip()
            if line.startswith(b"data:"):
                line = line[5:].strip()
                if line == b"[DONE]":
                    continue
                ticket.output_tokens += 1
            if b'"completion_tokens"' in line:
                with contextlib.suppress(ValueError, AttributeError, TypeError):
                    usage = json.loads(line).get("usage") or {}
                    ticket.output_tokens = int(usage["completion_tokens"])

    def finish(self, ticket: Ticket) -> LeaseRelease | None:
        """Release ``ticket`` once with the tokens it produced; later calls do nothing."""
        if ticket.done:
            return None
        ticket.done = True
        produced = ticket.request.prompt_len + ticket.output_tokens
        return self._booked(ticket, self.gate.release(ticket.request, produced))

    async def afinish(self, ticket: Ticket) -> LeaseRelease | None:
        """:meth:`finish` on the event loop: a Redis release is awaited, shielded from the
        cancellation of a client disconnect so that it always completes."""
        if ticket.done:
            return None
        ticket.done = True
        produced = ticket.request.prompt_len + ticket.output_tokens
        if isinstance(self.gate, LocalGate):
            out = self.gate.release(ticket.request, produced)
        else:
            with anyio.CancelScope(shield=True):
                out = await self.gate.arelease(ticket.request, produced)
        return self._booked(ticket, out)

    def _booked(self, ticket: Ticket, out: LeaseRelease) -> LeaseRelease:
        tenant = ticket.tenant
        self.in_flight.labels(tenant).dec()
        self.tokens.labels(tenant).inc(out.charged_tokens)
        self.latency.labels(tenant).inc(time.monotonic() - ticket.started)
        if out.debt is not None and out.priority is not None:
            self.debt.labels(tenant).set(out.debt)
            self.priority.labels(tenant).set(out.priority)
        return out

    async def aclose(self) -> None:
        """Close the gate's connections on this event loop (at shutdown)."""
        if isinstance(self.gate, RedisLeaseGate):
            await self.gate.aclose()

    def metrics(self) -> Response:
        """The Prometheus exposition of the counters."""
        return Response(generate_latest(self.registry), media_type="text/plain; version=0.0.4")


async def _read_body(request: HttpRequest, limit: int) -> bytes | None:
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > limit:
        return None
    parts: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)


def create_app(
    admission: Admission,
    backend: str,
    *,
    timeout_s: float = 600.0,
    renew_interval_s: float = 5.0,
) -> Starlette:
    """The gateway: OpenAI-compatible endpoints proxied to ``backend`` (a base URL whose
    ``/v1/...`` paths serve the models), plus ``/metrics`` and ``/healthz``."""
    base = backend.rstrip("/")
    state: dict[str, aiohttp.ClientSession] = {}

    async def renew_loop() -> None:
        while True:
            await asyncio.sleep(renew_interval_s)
            with contextlib.suppress(Exception):  # Redis away: the next round retries
                await run_in_threadpool(admission.gate.renew)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        # ``sock_read``: the longest silence between two chunks, so long streams may run.
        timeout = aiohttp.ClientTimeout(total=None, connect=5.0, sock_read=timeout_s)
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60.0)
        state["client"] = aiohttp.ClientSession(
            timeout=timeout, connector=connector, auto_decompress=False
        )
        task = asyncio.create_task(renew_loop())
        try:
            yield
        finally:
            task.cancel()
            await state["client"].close()
            await admission.aclose()

    async def proxy(request: HttpRequest) -> Response:
        body = await _read_body(request, admission.max_body_bytes)
        if body is None:
            return _error(413, "Request body too large.", "invalid_request_error", "too-large")
        got = await admission.admit(request.headers, body)
        if isinstance(got, Response):
            return got
        ticket = got
        url = base + request.url.path
        try:
            upstream = await state["client"].post(url, data=body, headers=_JSON)
        except TimeoutError:
            await admission.afinish(ticket)
            return _error(504, "Backend timed out.", "api_error", "backend-timeout")
        except aiohttp.ClientError as err:
            await admission.afinish(ticket)
            return _error(502, f"Backend unreachable: {err}", "api_error", "backend-error")

        media = upstream.headers.get("content-type", "application/json")
        if not ticket.stream:  # one body: no streaming machinery (a task group) per request
            try:
                content = await upstream.read()
                admission.observe(ticket, content)
            except TimeoutError:
                return _error(504, "Backend timed out.", "api_error", "backend-timeout")
            except aiohttp.ClientError as err:
                return _error(502, f"Backend failed: {err}", "api_error", "backend-error")
            finally:
                await admission.afinish(ticket)
                upstream.release()
            return Response(content, status_code=upstream.status, media_type=media)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.content.iter_any():
                    admission.observe(ticket, chunk)
                    yield chunk
            finally:
                # Completion, client disconnect (cancellation) or backend error alike.
                await admission.afinish(ticket)
                upstream.release()

        return StreamingResponse(relay(), status_code=upstream.status, media_type=media)

    async def list_models(request: HttpRequest) -> Response:
        try:
            async with state["client"].get(base + "/v1/models") as upstream:
                content = await upstream.read()
        except (TimeoutError, aiohttp.ClientError) as err:
            return _error(502, f"Backend unreachable: {err!r}", "api_error", "backend-error")
        return Response(content, upstream.status, media_type="application/json")

    async def healthz(request: HttpRequest) -> Response:
        return JSONResponse({"status": "ok", "held": admission.gate.held()})

    async def metrics(request: HttpRequest) -> Response:
        return admission.metrics()

    routes = [Route(p, proxy, methods=["POST"]) for p in _PATHS]
    routes += [
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


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
        request = HttpRequest(scope, receive)
        body = await _read_body(request, self.admission.max_body_bytes)
        if body is None:
            resp: Response = _error(413, "Request body too large.", "invalid_request_error", "big")
            await resp(scope, receive, send)
            return
        got = await self.admission.admit(request.headers, body)
        if isinstance(got, Response):
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
