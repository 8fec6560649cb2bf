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
import hmac
import itertools
import json
import logging
import math
import os
import re
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

import attrs
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kvpolicy.kvmodel import GateDecision, Request
from kvpolicy.tenancy._backends import FleetSettings, fleet_settings
from kvpolicy.tenancy._entitlements import Resources, TokenEntitlement, TokenPool, fundable_tokens
from kvpolicy.tenancy._errors import UnknownRequestError
from kvpolicy.tenancy._front import FrontLimits, front_protocol
from kvpolicy.tenancy._gate import TokenPoolGate
from kvpolicy.tenancy._lease import LeaseRelease, OutagePolicy
from kvpolicy.tenancy._refresh import RefreshConfig, SharedThroughputRefresh, ThroughputRefresh
from kvpolicy.tenancy._upstream import (
    Upstream,
    UpstreamConnectError,
    UpstreamError,
    UpstreamNoAnswerError,
    UpstreamTimeoutError,
)

_NOTHING_SEEN = (UpstreamConnectError, UpstreamNoAnswerError)  # may go to another backend

if TYPE_CHECKING:
    from kvpolicy.kvmodel import Autoscaler, Router
    from kvpolicy.tenancy._backends import BackendSpec, RoutingConfig
    from kvpolicy.tenancy._fleet import Backend, Fleet

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

__all__ = [
    "Admission",
    "FleetSettings",
    "FrontLimits",
    "Gate",
    "LocalGate",
    "Reply",
    "Ticket",
    "TokenPoolMiddleware",
    "create_admin_app",
    "create_app",
    "estimate_prompt_tokens",
    "fleet_settings",
    "load_api_keys",
    "main",
    "serve",
]

_log = logging.getLogger("kvpolicy.tenancy")

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
        self._held: dict[str, tuple[Request, int]] = {}  # id -> (request, tokens charged)
        # tenant -> (its limits, the pool's capacity, the largest charge they fund)
        self._fundable: dict[str, tuple[Resources, Resources, int]] = {}

    @property
    def pool(self) -> TokenPool:
        """The pool and its entitlements."""
        return self._gate.pool

    def entitlement(self, tenant: str) -> TokenEntitlement | None:
        """The entitlement governing ``tenant``."""
        return self._gate.entitlement(tenant)

    def max_request_tokens(self, tenant: str) -> int:
        """The largest ``prompt_len + max_output_tokens`` the entitlement can ever fund."""
        gate = self._gate
        ent = gate.entitlement(tenant)
        if ent is None:
            return 0
        limits, capacity = ent.limits, gate.pool.capacity
        known = self._fundable.get(tenant)
        if known is not None and known[0] is limits and known[1] is capacity:
            return known[2]  # the same limits (a rescale replaces them): the same answer
        most = fundable_tokens(limits, capacity, gate.config.window_s, gate.bytes_per_token)
        self._fundable[tenant] = (limits, capacity, most)
        return most

    def check(
        self,
        request: Request,
        time: float | None = None,
        *,
        max_output_tokens: int | None = None,
    ) -> GateDecision:
        """Admit or deny ``request`` now, charging ``prompt_len + max_output_tokens`` (the
        entitlement's ``max_output_tokens`` when ``None``); ``time`` is ignored (the
        process's clock decides)."""
        decision = self._gate.check(request, _now(self._t0), max_output_tokens=max_output_tokens)
        if decision.admitted:
            ent = self._gate.entitlement(request.tenant)
            assert ent is not None  # admitted under an entitlement
            out = ent.max_output_tokens if max_output_tokens is None else max_output_tokens
            self._held[request.request_id] = (request, request.prompt_len + out)
        return decision

    async def acheck(
        self,
        request: Request,
        time: float | None = None,
        *,
        max_output_tokens: int | None = None,
    ) -> GateDecision:
        """:meth:`check` (microseconds: nothing to await)."""
        return self.check(request, time, max_output_tokens=max_output_tokens)

    def release(
        self, request: Request | str, produced_tokens: int | None = None, *, time: None = None
    ) -> LeaseRelease:
        """Release what ``request`` holds, booking ``produced_tokens`` (prompt and output;
        ``None``: the whole charge). More than the charge is clamped to it and logged."""
        rid = request.request_id if isinstance(request, Request) else request
        entry = self._held.pop(rid, None)
        if entry is None:
            return LeaseRelease(False, 0)
        held, most = entry
        produced = most if produced_tokens is None else max(0, produced_tokens)
        clamped = produced > most
        if clamped:
            _log.warning(
                "release of %r reports %d tokens, more than its charge %d: clamped",
                rid,
                produced,
                most,
            )
        produced = min(produced, most)
        try:
            self._gate.release(held, _now(self._t0), tokens=produced)
        except UnknownRequestError:
            return LeaseRelease(False, 0)
        tenant = held.tenant
        return LeaseRelease(True, produced, clamped, self.debt(tenant), self.priority(tenant))

    async def arelease(
        self, request: Request | str, produced_tokens: int | None = None, *, time: None = None
    ) -> LeaseRelease:
        """:meth:`release` (nothing to await)."""
        return self.release(request, produced_tokens)

    async def aclose(self) -> None:
        """Nothing to close."""

    def held(self) -> int:
        """Requests this gate holds now."""
        return len(self._held)

    @property
    def tokens_per_s(self) -> float:
        """The pool's tokens per second the gate assumes now (kvmodel's
        ``ThroughputScalable``, what :class:`~kvpolicy.tenancy.ThroughputRefresh` adjusts)."""
        return self._gate.tokens_per_s

    def scale_throughput(self, factor: float, time: float) -> None:
        """Multiply every token rate by ``factor`` now (``time`` is ignored: the process's
        clock decides, as for :meth:`check`)."""
        self._gate.scale_throughput(factor, _now(self._t0))

    def renew(self, time: None = None) -> tuple[int, int, int]:
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


def _now(t0: float) -> float:
    return time.monotonic() - t0


class Gate(Protocol):
    """What the gateway needs of a gate: :class:`LocalGate` (one replica) and
    :class:`~kvpolicy.tenancy.RedisLeaseGate` (replicas sharing Redis) both are one."""

    @property
    def pool(self) -> TokenPool:
        """The pool and its entitlements."""
        ...

    def entitlement(self, tenant: str) -> TokenEntitlement | None:
        """The entitlement governing ``tenant`` (``None``: not bound)."""
        ...

    def max_request_tokens(self, tenant: str) -> int:
        """The largest charge the entitlement can ever fund."""
        ...

    async def acheck(
        self, request: Request, time: float | None = None, *, max_output_tokens: int | None = None
    ) -> GateDecision:
        """Admit ``request`` (charging ``prompt_len + max_output_tokens``) or deny it."""
        ...

    async def arelease(
        self, request: Request | str, produced_tokens: int | None = None, *, time: None = None
    ) -> LeaseRelease:
        """Free what ``request`` holds, booking ``produced_tokens`` (clamped to the charge)."""
        ...

    def renew(self, time: None = None) -> tuple[int, int, int]:
        """Keep the leases held alive; ``(renewed, adopted, reclaimed)``."""
        ...

    def held(self) -> int:
        """Requests this replica holds."""
        ...

    def usage(self, tenant: str | None = None) -> dict[str, int]:
        """In-flight counters of ``tenant`` (of the pool when ``None``)."""
        ...

    async def aclose(self) -> None:
        """Close connections at the end of the event loop."""
        ...


def load_api_keys(source: str | os.PathLike[str] | Mapping[str, str]) -> dict[str, str]:
    """API key -> tenant, from a mapping or a JSON/YAML file of one."""
    if isinstance(source, Mapping):
        doc: Any = dict(source)
    else:
        text = open(source, encoding="utf-8").read()  # noqa: SIM115
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            from kvpolicy.tenancy._manifest import load_yaml

            doc = load_yaml(text, str(source))
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


def estimate_prompt_tokens(doc: Mapping[str, Any], chat: bool) -> int:
    """An upper estimate of the prompt tokens a backend counts for a request body, without
    a tokenizer.

    Text is taken at one token per 4 characters, rounded up per piece (English with the
    Llama and GPT tokenizers runs 4-5 characters a token). A chat request adds what the
    chat template adds: 4 tokens per message (its role and the template's markers) and 3
    priming the reply, and the text of each message's ``name``, the tool calls it carries
    and the ``tools`` offered. A completion prompt given as token ids counts one per id.
    Configure a tokenizer (``Admission(prompt_tokens=...)``) for an exact count.

    ``doc`` must have passed the gateway's validation (``messages`` a list of objects,
    ``prompt`` a string or a list).
    """
    if chat:
        total = 3
        for m in doc["messages"]:
            total += 4
            for key in ("content", "name", "tool_calls", "function_call"):
                value = m.get(key)
                if isinstance(value, str):
                    total += -(-len(value) // 4)
                elif isinstance(value, list):
                    for part in value:
                        text = part.get("text") if isinstance(part, dict) else None
                        piece = text if isinstance(text, str) else json.dumps(part)
                        total += -(-len(piece) // 4)
                elif value is not None:
                    total += -(-len(json.dumps(value)) // 4)
        for key in ("tools", "functions"):
            if doc.get(key) is not None:
                total += -(-len(json.dumps(doc[key])) // 4)
        return total
    prompt = doc["prompt"]
    if isinstance(prompt, str):
        return max(1, -(-len(prompt) // 4))
    total = 0
    for item in prompt:
        if isinstance(item, str):
            total += -(-len(item) // 4)
        elif isinstance(item, list):
            total += len(item)
        else:
            total += 1
    return max(1, total)


_REQUEST_NAMES = tuple(a.name for a in attrs.fields(Request))
if _REQUEST_NAMES[:5] != ("request_id", "prompt_len", "decode_len", "arrival_time", "tenant"):
    raise ImportError("kvpolicy-tenancy's gateway requests do not match kvmodel's Request")
_REQUEST_SET = tuple(Request.__dict__[name].__set__ for name in _REQUEST_NAMES)
_REQUEST_TEMPLATE = Request("template", 1, 1)  # the other fields' defaults, as built
_REQUEST_REST = tuple(getattr(_REQUEST_TEMPLATE, name) for name in _REQUEST_NAMES[5:])
_ARRIVAL = _REQUEST_TEMPLATE.arrival_time


def _request(request_id: str, prompt_len: int, max_tokens: int, tenant: str) -> Request:
    """``Request(request_id, prompt_len, max_tokens, tenant=tenant)`` built without its
    validators and converters (microseconds on every request): :meth:`Admission.admit`
    checked each value (the prompt count and the output bound positive ints, the tenant a
    key file's string), and the other fields take the defaults a validated ``Request``
    has."""
    new = object.__new__(Request)
    values = (request_id, prompt_len, max_tokens, _ARRIVAL, tenant, *_REQUEST_REST)
    for set_field, value in zip(_REQUEST_SET, values, strict=True):
        set_field(new, value)
    return new


def _positive(doc: Mapping[str, Any], key: str) -> int | str | None:
    """``doc[key]`` as a positive int, ``None`` when absent or null, else an error message."""
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"'{key}' must be a positive integer: {_short(value)}"
    return value


def _short(value: Any) -> str:
    """``repr(value)`` cut to 60 characters (an error never echoes a huge value)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _invalid(doc: Mapping[str, Any], chat: bool) -> str | None:
    """Why a request body cannot be served (``None``: it can), naming the field."""
    if chat:
        messages = doc.get("messages")
        if not isinstance(messages, list) or not messages:
            return f"'messages' must be a non-empty list of objects: {_short(messages)}"
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                return f"'messages[{i}]' must be an object: {_short(m)}"
            if not isinstance(m.get("role"), str):
                return f"'messages[{i}].role' must be a string: {_short(m.get('role'))}"
            content = m.get("content")
            if content is not None and not isinstance(content, str | list):
                return f"'messages[{i}].content' must be a string or a list: {_short(content)}"
    else:
        prompt = doc.get("prompt")
        if isinstance(prompt, list):
            if not prompt or not all(
                isinstance(p, str | list) or (isinstance(p, int) and not isinstance(p, bool))
                for p in prompt
            ):
                return (
                    f"'prompt' must be a non-empty list of strings or token ids: {_short(prompt)}"
                )
        elif not isinstance(prompt, str):
            return f"'prompt' must be a string or a list: {_short(prompt)}"
    stream = doc.get("stream")
    if stream is not None and not isinstance(stream, bool):
        return f"'stream' must be true or false: {_short(stream)}"
    n = doc.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 128):
        return f"'n' must be an integer in [1, 128]: {_short(n)}"
    return None


def _too_deep(doc: Any, limit: int) -> bool:
    """Whether ``doc`` nests arrays and objects deeper than ``limit``."""
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values() if isinstance(v, dict | list))
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value if isinstance(v, dict | list))
    return False


def _has_text(choice: Any) -> bool:
    """Whether a streamed choice carries generated text (a completion's ``text`` or a chat
    delta's ``content``)."""
    if not isinstance(choice, dict):
        return False
    delta = choice.get("delta")
    text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
    return isinstance(text, str) and text != ""


_USAGE_MAX = 10**9  # a count beyond this is absurd: not believed
_TAIL = 4096  # bytes of a whole answer kept to read its usage from
_USAGE_RE = re.compile(rb'"(prompt_tokens|completion_tokens)"\s*:\s*([^,}\s]*)')


def _count(value: Any, what: str, ticket: Ticket) -> int | None:
    """A backend's reported token count, or ``None`` (logged) when it is not one."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _USAGE_MAX:
        return value
    _log.warning(
        "backend usage of %r: %s %s is not a count: ignored",
        ticket.request.request_id,
        what,
        _short(value),
    )
    return None


class Ticket:
    """An admitted request on its way to the backend.

    ``max_tokens`` is the output bound charged (what the backend will honour);
    ``output_tokens`` the output counted so far (the backend's ``usage`` once reported,
    else one per streamed event with text); ``prompt_tokens`` the backend's prompt count
    once reported.
    """

    __slots__ = (
        "body",
        "chat",
        "doc",
        "done",
        "first",
        "max_tokens",
        "output_tokens",
        "partial",
        "prompt_tokens",
        "reported",
        "request",
        "started",
        "stream",
        "tail",
    )

    def __init__(self, request: Request, body: bytes, stream: bool, max_tokens: int) -> None:
        """Admitted now."""
        self.request = request
        self.body = body
        self.stream = stream
        self.max_tokens = max_tokens
        self.started = time.monotonic()
        self.output_tokens = 0
        self.prompt_tokens: int | None = None
        self.reported = False
        self.partial = b""
        self.tail = b""
        self.done = False
        self.first = 0.0  # when the answer's first bytes came (0: none yet)
        self.doc: Mapping[str, Any] | None = None  # the parsed body (a fleet routes on it)
        self.chat = False

    @property
    def tenant(self) -> str:
        """Whose request it is."""
        return self.request.tenant

    def produced(self) -> int | None:
        """Prompt and output tokens to book at release; ``None`` books the whole charge (a
        whole answer that reported no usage: nothing to tell what it cost)."""
        if not (self.reported or self.stream):
            return None
        prompt = self.request.prompt_len if self.prompt_tokens is None else self.prompt_tokens
        return prompt + self.output_tokens


class _Stats:
    """One entitlement's counters in the gateway (plain numbers, read at scrape time)."""

    __slots__ = (
        "admitted",
        "booked",
        "debt",
        "denied",
        "in_flight",
        "latency",
        "priority",
        "tokens",
    )

    def __init__(self) -> None:
        self.admitted = 0
        self.denied: dict[str, int] = {}
        self.in_flight = 0
        self.booked = 0  # releases booked (tokens and latency are shown from the first)
        self.tokens = 0
        self.latency = 0.0
        self.debt: float | None = None
        self.priority: float | None = None


class _AdmissionMetrics:
    """The Prometheus families of :class:`Admission`'s counters, built when ``/metrics`` is
    read: a request only adds to plain numbers (a ``prometheus_client`` metric takes a lock
    and a label lookup per update, ten of them per request)."""

    def __init__(self, stats: dict[str, _Stats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        """The counters now (the ``Collector`` protocol)."""
        label = ["entitlement"]
        admitted = CounterMetricFamily("kvpolicy_admitted", "Requests admitted", labels=label)
        denied = CounterMetricFamily(
            "kvpolicy_denied", "Requests denied", labels=[*label, "reason"]
        )
        in_flight = GaugeMetricFamily("kvpolicy_in_flight", "Requests in flight", labels=label)
        tokens = CounterMetricFamily("kvpolicy_tokens", "Tokens served", labels=label)
        debt = GaugeMetricFamily("kvpolicy_debt", "Service debt (eq. 2)", labels=label)
        priority = GaugeMetricFamily("kvpolicy_priority", "Priority weight (eq. 1)", labels=label)
        latency = CounterMetricFamily(
            "kvpolicy_latency_seconds", "Summed request latency", labels=label
        )
        for tenant, s in list(self._stats.items()):
            for reason, n in list(s.denied.items()):
                denied.add_metric([tenant, reason], n)
            if s.admitted:
                admitted.add_metric([tenant], s.admitted)
                in_flight.add_metric([tenant], s.in_flight)
            if s.booked:
                tokens.add_metric([tenant], s.tokens)
                latency.add_metric([tenant], s.latency)
            if s.debt is not None and s.priority is not None:
                debt.add_metric([tenant], s.debt)
                priority.add_metric([tenant], s.priority)
        return iter((admitted, denied, in_flight, tokens, debt, priority, latency))


class Admission:
    """Authentication, validation, admission and release: shared by the gateway and the
    middleware.

    Args:
        gate: the gate deciding.
        api_keys: API key -> tenant.
        models: the models served (``None``: any).
        max_body_bytes: the largest request body.
        max_json_depth: the deepest nesting of arrays and objects in a body.
        prompt_tokens: ``(body, chat) -> tokens`` counting a prompt as the backend will (a
            tokenizer and the chat template); :func:`estimate_prompt_tokens` by default.
        refresh: keeps the gate's throughput estimate honest
            (:class:`~kvpolicy.tenancy.ThroughputRefresh` over a ``ThroughputScalable`` gate,
            such as :class:`LocalGate`): fed each completion (its tokens, time to first
            byte and per output token), each 429 and, from :meth:`tick`, whether the pool
            was full.
    """

    def __init__(
        self,
        gate: Gate,
        api_keys: Mapping[str, str],
        *,
        models: tuple[str, ...] | None = None,
        max_body_bytes: int = 1 << 20,
        max_json_depth: int = 32,
        prompt_tokens: Callable[[Mapping[str, Any], bool], int] | None = None,
        refresh: ThroughputRefresh | None = None,
    ) -> None:
        """See the class docstring."""
        for name, value in (("max_body_bytes", max_body_bytes), ("max_json_depth", max_json_depth)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"'{name}' must be a positive int: {value!r}")
        self.gate = gate
        self.api_keys = dict(api_keys)
        self.models = models
        self.max_body_bytes = max_body_bytes
        self.max_json_depth = max_json_depth
        self.prompt_tokens = estimate_prompt_tokens if prompt_tokens is None else prompt_tokens
        self.refresh = refresh
        self._t0 = time.monotonic()
        self._ticked = 0.0
        self.registry = CollectorRegistry()
        self.stats: dict[str, _Stats] = {}
        """Each entitlement's counters (exported as ``kvpolicy_admitted``, ``_denied``,
        ``_in_flight``, ``_tokens``, ``_debt``, ``_priority`` and ``_latency_seconds``)."""
        self.registry.register(_AdmissionMetrics(self.stats))

    async def admit(self, auth: str, body: bytes, path: str | None = None) -> Ticket | Reply:
        """Check one request (``auth``: its ``Authorization`` header; ``path``: its endpoint,
        ``None`` telling a chat request by its ``messages``); a :class:`Ticket` when
        admitted, else the error reply.

        The output bound charged is the smaller of ``max_tokens`` and
        ``max_completion_tokens`` (the entitlement's ``max_output_tokens`` when both are
        absent), times ``n``; when the body does not pin the backend to that bound (both
        absent, or both given and unequal), the body sent on carries it in both fields.
        """
        key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        tenant = self.api_keys.get(key)
        if tenant is None:
            return _error(401, "Missing or unknown API key.", "invalid_request_error", "auth")
        ent = self.gate.entitlement(tenant)
        if ent is None:
            msg = "The entitlement of this API key is not Bound to the pool."
            return _error(403, msg, "permission_error", "not-bound")
        if len(body) > self.max_body_bytes:
            return _error(413, "Request body too large.", "invalid_request_error", "too-large")
        try:
            doc = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            return _error(400, f"Malformed JSON: {err}", "invalid_request_error", "bad-json")
        except RecursionError:
            doc = None
            depth = True
        else:
            depth = body.count(b"[") + body.count(b"{") > self.max_json_depth and _too_deep(
                doc, self.max_json_depth
            )
        if depth:
            msg = f"JSON nested deeper than {self.max_json_depth} levels."
            return _error(400, msg, "invalid_request_error", "too-deep")
        if not isinstance(doc, dict):
            return _error(400, "Body must be a JSON object.", "invalid_request_error", "bad-json")
        model = doc.get("model")
        if self.models is not None and model not in self.models:
            return _error(404, f"Unknown model {_short(model)}.", "invalid_request_error", "model")
        chat = "messages" in doc if path is None else path.endswith("/chat/completions")
        why = _invalid(doc, chat)
        if why is not None:
            return _error(400, why, "invalid_request_error", "invalid-body")
        bounds = [_positive(doc, "max_tokens"), _positive(doc, "max_completion_tokens")]
        for b in bounds:
            if isinstance(b, str):
                return _error(400, b, "invalid_request_error", "max_tokens")
        given = [b for b in bounds if isinstance(b, int)]
        out = min(given) if given else ent.max_output_tokens
        if not given or (len(given) == 2 and given[0] != given[1]):
            doc["max_tokens"] = out
            if chat:
                doc["max_completion_tokens"] = out
            body = json.dumps(doc).encode()
        mt = out * (doc.get("n") or 1)
        prompt = self.prompt_tokens(doc, chat)
        if type(prompt) is not int or prompt < 1:  # a configured counter's answer
            raise ValueError(f"'prompt_tokens' must count a positive int of tokens: {prompt!r}")
        most = self.gate.max_request_tokens(tenant)
        if prompt + mt > most:
            msg = (
                f"'max_tokens' {mt} plus about {prompt} prompt tokens exceeds what the "
                f"entitlement of this API key can ever fund ({most} tokens)."
            )
            return _error(400, msg, "invalid_request_error", "oversized")
        req = _request(f"gw-{_RUN}-{next(_ids)}", prompt, mt, tenant)
        decision = await self.gate.acheck(req, max_output_tokens=mt)
        if not decision.admitted:
            stats = self._stats(tenant)
            stats.denied[decision.reason] = stats.denied.get(decision.reason, 0) + 1
            if self.refresh is not None:
                self.refresh.denied(decision.reason)
            retry = max(1, math.ceil(decision.retry_after))
            msg = f"Rate limited ({decision.reason}); retry after {decision.retry_after:.2f} s."
            return _error(
                429, msg, "rate_limit_exceeded", decision.reason, {"Retry-After": str(retry)}
            )
        stats = self._stats(tenant)
        stats.admitted += 1
        stats.in_flight += 1
        ticket = Ticket(req, body, bool(doc.get("stream")), mt)
        ticket.doc, ticket.chat = doc, chat
        return ticket

    def observe(self, ticket: Ticket, chunk: bytes) -> None:
        """Count output tokens in a response body chunk.

        A stream's events are read line by line (a line split across chunks is joined):
        the ``usage`` an event reports is taken when there is one, else one token per event
        that carries text (role-only and finish events carry none; an unreadable event
        counts one). Of a whole answer only the last bytes are kept, to read its
        ``usage`` from. A count that is negative, not an integer or absurd is logged and
        ignored.
        """
        if not ticket.stream:
            tail = ticket.tail + chunk if ticket.tail else chunk
            ticket.tail = tail[-_TAIL:]
            for name, raw in _USAGE_RE.findall(ticket.tail):
                if raw.isdigit():  # the usual count, without the JSON parser
                    value: Any = int(raw)
                else:
                    try:
                        value = json.loads(raw)
                    except ValueError:
                        value = raw.decode("latin-1")
                self._report(ticket, name.decode(), value)
            return
        data = ticket.partial + chunk if ticket.partial else chunk
        lines = data.split(b"\n")
        ticket.partial = lines.pop()
        if len(ticket.partial) > 1 << 20:  # no line is that long: count it and move on
            ticket.partial = b""
            ticket.output_tokens += 1
        for line in lines:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            line = line[5:].strip()
            if line == b"[DONE]" or not line:
                continue
            try:
                doc = json.loads(line)
            except (ValueError, RecursionError):
                ticket.output_tokens += 1  # an event we cannot read: one token
                continue
            usage = doc.get("usage") if isinstance(doc, dict) else None
            if isinstance(usage, dict):
                for name in ("prompt_tokens", "completion_tokens"):
                    if name in usage:
                        self._report(ticket, name, usage[name])
            elif isinstance(doc, dict):
                choices = doc.get("choices")
                if isinstance(choices, list):
                    ticket.output_tokens += sum(map(_has_text, choices))

    @staticmethod
    def _report(ticket: Ticket, name: str, value: Any) -> None:
        count = _count(value, name, ticket)
        if count is None:
            return
        if name == "completion_tokens":
            ticket.output_tokens = count
            ticket.reported = True
        else:
            ticket.prompt_tokens = count

    async def afinish(self, ticket: Ticket) -> LeaseRelease | None:
        """Release ``ticket`` once with the tokens it produced (later calls do nothing): the
        release is awaited shielded from the cancellation of a client disconnect, so that
        it always completes (and is booked). It never raises: a release that fails is
        logged and retried with the whole charge."""
        if ticket.done:
            return None
        ticket.done = True
        task = asyncio.ensure_future(self._release(ticket))
        try:
            out = await asyncio.shield(task)
        except asyncio.CancelledError:  # the release goes on, and is booked when done
            task.add_done_callback(lambda t: self._booked_when_done(ticket, t))
            raise
        return self._booked(ticket, out)

    async def _release(self, ticket: Ticket) -> LeaseRelease:
        gate, req = self.gate, ticket.request
        try:
            return await gate.arelease(req, ticket.produced())
        except Exception:
            _log.exception("release of %r failed: releasing its whole charge", req.request_id)
            return await gate.arelease(req, None)

    def _booked_when_done(self, ticket: Ticket, task: asyncio.Future[LeaseRelease]) -> None:
        if not task.cancelled() and task.exception() is None:
            self._booked(ticket, task.result())

    def tick(self, busy: bool) -> None:
        """Tell the refresh the time since the last tick passed, with the pool full
        (``busy``) or not; a window's end rescales the gate."""
        if self.refresh is not None:
            now = time.monotonic() - self._t0
            self.refresh.iteration(self._ticked, now, busy)
            self._ticked = now

    def _booked(self, ticket: Ticket, out: LeaseRelease) -> LeaseRelease:
        tenant = ticket.request.tenant
        if self.refresh is not None and ticket.first and out.released:
            end = time.monotonic()
            ttft = ticket.first - ticket.started
            tpot = (end - ticket.first) / max(1, ticket.output_tokens - 1)
            self.refresh.completed(out.charged_tokens, ttft, tpot)
        stats = self._stats(tenant)
        stats.in_flight -= 1
        stats.booked += 1
        stats.tokens += out.charged_tokens
        stats.latency += time.monotonic() - ticket.started
        if out.debt is not None and out.priority is not None:
            stats.debt, stats.priority = out.debt, out.priority
        return out

    def _stats(self, tenant: str) -> _Stats:
        stats = self.stats.get(tenant)
        if stats is None:
            stats = self.stats[tenant] = _Stats()
        return stats

    async def aclose(self) -> None:
        """Close the gate's connections on this event loop (at shutdown)."""
        await self.gate.aclose()

    def metrics(self) -> Reply:
        """The Prometheus exposition of the counters."""
        return Reply(generate_latest(self.registry), content_type=_PROMETHEUS)


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope["headers"]:
        if key == name:  # uvicorn gives header names in lower case
            return str(value.decode("latin-1"))
    return ""


class _ClientGoneError(Exception):
    """The client disconnected before its request body was whole."""


async def _read_body(scope: Scope, receive: Receive, limit: int) -> bytes | None:
    """The request's body, or ``None`` when it exceeds ``limit`` bytes.

    Raises:
        _ClientGoneError: the client disconnected first.
    """
    size = _header(scope, b"content-length")
    if size.isdigit() and int(size) > limit:
        return None
    parts: list[bytes] = []
    total = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGoneError
        chunk = message.get("body", b"")
        total += len(chunk)
        if total > limit:
            return None
        if not message.get("more_body"):
            if not parts:
                return bytes(chunk)
            parts.append(chunk)
            return b"".join(parts)
        parts.append(chunk)


_NOT_FOUND = _error(404, "Not found.", "invalid_request_error", "not-found")
_NOT_ALLOWED = _error(405, "Method not allowed.", "invalid_request_error", "method")
_TOO_LARGE = _error(413, "Request body too large.", "invalid_request_error", "too-large")
_TOO_SLOW = _error(408, "Request body not received in time.", "invalid_request_error", "timeout")
_ADMIN_ONLY = _error(403, "Needs the admin key.", "permission_error", "admin")


async def _refuse_websocket(receive: Receive, send: Send) -> None:
    """No websocket is served: close the handshake (the server answers 403)."""
    message = await receive()
    if message["type"] == "websocket.connect":
        await send({"type": "websocket.close", "code": 1008})


class _Late:
    """A request body's deadline: when called, cancels the request's task and says so."""

    __slots__ = ("fired", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.fired = False

    def __call__(self) -> None:
        self.fired = True
        self.task.cancel()


class _Gateway:
    """The gateway's ASGI application (see :func:`create_app`)."""

    def __init__(
        self,
        admission: Admission,
        fleet: Fleet,
        renew_interval_s: float,
        body_timeout_s: float,
        admin_key: str | None,
    ) -> None:
        self.admission = admission
        self.fleet = fleet
        self.renew_interval_s = renew_interval_s
        self.body_timeout_s = body_timeout_s
        self.admin_key = admin_key.encode() if admin_key else None
        self._renewer: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None

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
                reply = await handler(self, self._is_admin(scope))
                await reply(scope, receive, send)
        elif kind == "lifespan":
            await self.lifespan(receive, send)
        elif kind == "websocket":
            await _refuse_websocket(receive, send)

    def _is_admin(self, scope: Scope) -> bool:
        if self.admin_key is None:
            return False
        auth = _header(scope, b"authorization").encode("latin-1")
        return auth[:7].lower() == b"bearer " and hmac.compare_digest(
            auth[7:].strip(), self.admin_key
        )

    async def lifespan(self, receive: Receive, send: Send) -> None:
        """Start the lease renewals; at shutdown (or when cancelled) stop them and close
        every connection."""
        try:
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    self._renewer = asyncio.create_task(self._renew_loop())
                    self.fleet.start()
                    if self.admission.refresh is not None:
                        self._ticker = asyncio.create_task(self._tick_loop())
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self._close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        finally:
            await self._close()

    async def _close(self) -> None:
        for task in (self._renewer, self._ticker):
            if task is not None:
                task.cancel()
        self._renewer = self._ticker = None
        await self.fleet.stop()
        await self.admission.aclose()

    async def _renew_loop(self) -> None:
        wait = self.renew_interval_s
        while True:
            await asyncio.sleep(wait)
            try:
                await asyncio.to_thread(self.admission.gate.renew)
            except Exception as err:  # Redis away: retry soon, to reconcile once it is back
                _log.warning("lease renewal failed (%s): retrying", err)
                wait = min(self.renew_interval_s, 0.25)
            else:
                wait = self.renew_interval_s

    async def _tick_loop(self) -> None:
        """Every 0.25 s: was the pool full (every slot in flight)? The refresh's busy time."""
        adm = self.admission
        slots = adm.gate.pool.capacity.concurrency
        while True:
            await asyncio.sleep(0.25)
            adm.tick(adm.gate.usage()["in_flight"] >= slots)

    async def proxy(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Admit, proxy and release one request.

        The body must arrive within ``body_timeout_s``. Once admitted, the answer is
        relayed as it comes (a whole answer too: it is never buffered), and a client that
        disconnects, before or during the answer, breaks off the upstream request at once
        (its connection is closed, which a backend takes as a cancellation); the request's
        lease is released in every case, exactly once.
        """
        adm = self.admission
        task = asyncio.current_task()
        assert task is not None
        # The body's deadline: a timer cancelling this task (asyncio.timeout's context
        # manager costs three times as much, on every request).
        late = _Late(task)
        timer = asyncio.get_running_loop().call_later(self.body_timeout_s, late)
        try:
            body = await _read_body(scope, receive, adm.max_body_bytes)
        except asyncio.CancelledError:
            if not late.fired:
                raise
            task.uncancel()
            await _TOO_SLOW(scope, receive, send)
            return
        except _ClientGoneError:
            return
        finally:
            timer.cancel()
        if body is None:
            await _TOO_LARGE(scope, receive, send)
            return
        got = await adm.admit(_header(scope, b"authorization"), body, scope["path"])
        if isinstance(got, Reply):
            await got(scope, receive, send)
            return
        ticket = got
        gone = False

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            task.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await self._forward(ticket, scope["path"], send)
        except asyncio.CancelledError:
            if not gone:
                raise
            task.uncancel()  # the client went away: nothing left to answer
        finally:
            watcher.cancel()
            await adm.afinish(ticket)

    async def _forward(self, ticket: Ticket, path: str, send: Send) -> None:
        """Send the request to the backend the fleet picks and relay its answer. A backend
        that cannot be connected to (nothing of the request reached it), or that closes
        the connection before a byte of its answer (it died: the client has seen nothing),
        is ejected and the request goes to another backend, once; any other failure (a
        timeout, a broken answer) ends the request there and is reported: it is released
        once, never charged twice."""
        fleet = self.fleet
        req = ticket.request
        charge = req.prompt_len + ticket.max_tokens
        hashes = fleet.hashes(ticket.doc, ticket.chat)
        tried: Backend | None = None
        while True:
            backend = fleet.pick(req.request_id, req.prompt_len, hashes, req.tenant, tried)
            if backend is None:
                await _send_reply(send, self._no_backend(tried is not None))
                return
            fleet.begin(backend, charge, hashes)
            try:
                upstream = await backend.upstream.request("POST", path, ticket.body)
            except UpstreamError as err:
                fleet.end(backend, charge)
                timeout = isinstance(err, UpstreamTimeoutError)
                fleet.failed(backend, "timeout" if timeout else "connect", str(err))
                if isinstance(err, _NOTHING_SEEN) and tried is None:
                    tried = backend
                    if len(fleet.backends) > 1:
                        fleet.m_failovers.inc()
                        _log.warning("%r goes to another backend: %s", req.request_id, err)
                        continue
                if timeout:
                    reply = _error(504, "Backend timed out.", "api_error", "backend-timeout")
                else:
                    reply = _error(502, f"Backend unreachable: {err}", "api_error", "backend-error")
                await _send_reply(send, reply)
                return
            except BaseException:
                fleet.end(backend, charge)
                raise
            try:
                await self._relay(ticket, backend, upstream, send)
            finally:
                fleet.end(backend, charge, ticket.produced() or 0)
            return

    def _no_backend(self, failed: bool) -> Reply:
        if failed:
            msg = "Backend unreachable, and no other backend can take the request."
            return _error(502, msg, "api_error", "backend-error")
        retry = str(math.ceil(self.fleet.retry_after_s()))
        msg = "No backend can take requests now (all ejected or draining)."
        return _error(503, msg, "api_error", "no-backend", {"Retry-After": retry})

    async def _relay(self, ticket: Ticket, backend: Backend, upstream: Any, send: Send) -> None:
        adm = self.admission
        default = b"text/event-stream" if ticket.stream else b"application/json"
        headers = [(b"content-type", upstream.content_type or default)]
        if upstream.status >= 500:
            self.fleet.failed(backend, "5xx", f"status {upstream.status}")
        try:
            await send(
                {"type": "http.response.start", "status": upstream.status, "headers": headers}
            )
            ok = upstream.status == 200
            while chunk := await upstream.chunk():
                if ok and not ticket.first:
                    ticket.first = time.monotonic()
                adm.observe(ticket, chunk)
                if upstream.complete:  # the answer's last bytes end the reply: one write
                    await send({"type": "http.response.body", "body": chunk})
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            else:
                await send({"type": "http.response.body", "body": b""})
            if upstream.status < 500:
                self.fleet.succeeded(backend)
        except UpstreamError as err:  # the backend broke off or fell silent: end here
            _log.warning("backend broke off %r: %s", ticket.request.request_id, err)
            kind = "timeout" if isinstance(err, UpstreamTimeoutError) else "broken"
            self.fleet.failed(backend, kind, str(err))
            with contextlib.suppress(Exception):
                await send({"type": "http.response.body", "body": b""})
        finally:
            upstream.release()

    async def _models(self, admin: bool) -> Reply:
        backend = self.fleet.pick("models", 1)
        if backend is None:
            return self._no_backend(False)
        try:
            upstream = await backend.upstream.request("GET", "/v1/models")
            try:
                content = await upstream.read()
                status, ctype = upstream.status, upstream.content_type or b"application/json"
            finally:
                upstream.release()
        except UpstreamError as err:
            return _error(502, f"Backend unreachable: {err}", "api_error", "backend-error")
        return Reply(content, status, ctype)

    async def _healthz(self, admin: bool) -> Reply:
        if not admin:  # alive, and nothing more: the load is the operator's to see
            return _json({"status": "ok"})
        doc: dict[str, Any] = {"status": "ok", "held": self.admission.gate.held()}
        if len(self.fleet.backends) > 1:
            doc["backends"] = self.fleet.state()
        return _json(doc)

    async def _metrics(self, admin: bool) -> Reply:
        return self.admission.metrics() if admin else _ADMIN_ONLY

    _pages: Mapping[str, Callable[[_Gateway, bool], Awaitable[Reply]]] = {
        "/v1/models": _models,
        "/healthz": _healthz,
        "/metrics": _metrics,
    }


async def _send_reply(send: Send, reply: Reply) -> None:
    await send({"type": "http.response.start", "status": reply.status, "headers": reply.headers})
    await send({"type": "http.response.body", "body": reply.body})


def create_app(
    admission: Admission,
    backend: str | Sequence[str | BackendSpec],
    *,
    timeout_s: float = 600.0,
    connect_timeout_s: float = 5.0,
    body_timeout_s: float = 30.0,
    renew_interval_s: float = 5.0,
    admin_key: str | None = None,
    routing: RoutingConfig | None = None,
    router: Router | None = None,
    autoscaler: Autoscaler | None = None,
) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """The gateway: OpenAI-compatible endpoints proxied to ``backend`` (a base URL whose
    ``/v1/...`` paths serve the models), plus ``/metrics`` and ``/healthz``. An ASGI
    application (serve it with uvicorn; :func:`kvpolicy.tenancy.serve_gateway` adds the
    limits on request heads).

    ``timeout_s`` is the longest silence of the backend (before its answer, or between two
    chunks of it); ``connect_timeout_s`` the longest wait for a connection to it;
    ``body_timeout_s`` the longest a client may take to send a request body;
    ``renew_interval_s`` how often the leases held are renewed. ``/metrics`` and the load
    in ``/healthz`` (``held``) answer only to ``Authorization: Bearer <admin_key>`` (with no
    admin key, to nobody: serve :func:`create_admin_app` on a private listener instead);
    without it ``/healthz`` says only that the gateway is up.

    Several backends (a list of URLs or :class:`~kvpolicy.tenancy.BackendSpec`) are routed
    over by ``router`` (default: the one ``routing`` names, built from the
    ``kvpolicy.routing`` entry points), scraped, health-checked and ejected as ``routing``
    says; the gate's token rates follow the healthy share of the fleet, and ``autoscaler``'s
    target is exported as ``kvpolicy_desired_replicas``. One backend given as a URL is
    proxied to as before: no scrapes or checks unless ``routing`` asks for them.

    Raises:
        ValueError: a backend that is not an ``http(s)://`` URL, given twice, none, an
            unknown router (the known ones listed), or a time that is not positive.
    """
    from kvpolicy.tenancy._backends import RoutingConfig, build_router, load_backends
    from kvpolicy.tenancy._fleet import Fleet
    from kvpolicy.tenancy._fleet_pool import PoolFollower
    from kvpolicy.tenancy._health import HealthConfig

    for name, value in (("renew_interval_s", renew_interval_s), ("body_timeout_s", body_timeout_s)):
        if not value > 0:
            raise ValueError(f"'{name}' must be > 0: {value!r}")
    specs = load_backends([backend] if isinstance(backend, str) else backend)
    if routing is None and len(specs) == 1:  # one backend: proxied to as before
        routing = RoutingConfig(scrape_interval_s=0.0, health=HealthConfig(interval_s=0.0))
    routing = RoutingConfig() if routing is None else routing
    if router is None and len(specs) > 1:
        router = build_router(routing)

    def upstream(url: str) -> Upstream:
        return Upstream(url, read_timeout_s=timeout_s, connect_timeout_s=connect_timeout_s)

    fleet = Fleet(
        specs,
        routing,
        router,
        admission.registry,
        pool_name=admission.gate.pool.name,
        follower=PoolFollower(admission.gate) if len(specs) > 1 else None,
        autoscaler=autoscaler,
        upstream=upstream,
    )
    return _Gateway(admission, fleet, renew_interval_s, body_timeout_s, admin_key)


def create_admin_app(
    admission: Admission, fleet: Fleet | None = None
) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """``/metrics`` and ``/healthz`` (with the load) of ``admission``, without a key: an ASGI
    application for a listener that only operators reach (a loopback or cluster-internal
    port), beside :func:`create_app`'s on the public one. With the gateway's ``fleet``
    (``app.fleet``), also ``GET /backends`` (each backend's state, load and signals) and
    ``POST /backends/drain?url=URL`` (``/backends/undrain``): a draining backend finishes
    what it has and gets nothing new (before scaling it down)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await _refuse_websocket(receive, send)
            return
        path = scope["path"]
        if fleet is not None and path.startswith("/backends"):
            reply = _backends_page(fleet, path, scope)
        elif path == "/metrics":
            reply = admission.metrics()
        elif path == "/healthz":
            reply = _json({"status": "ok", "held": admission.gate.held()})
        else:
            reply = _NOT_FOUND
        await reply(scope, receive, send)

    return app


def _backends_page(fleet: Fleet, path: str, scope: Scope) -> Reply:
    if path == "/backends":
        return _json({"backends": fleet.state(), "healthy_share": fleet.share()})
    if path not in ("/backends/drain", "/backends/undrain"):
        return _NOT_FOUND
    if scope["method"] != "POST":
        return _NOT_ALLOWED
    query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
    url = (query.get("url") or [""])[0].rstrip("/")
    if not fleet.drain(url, path.endswith("/drain")):
        return _error(404, f"No backend {_short(url)}.", "invalid_request_error", "backend")
    return _json({"backends": fleet.state()})


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
        try:
            body = await _read_body(scope, receive, self.admission.max_body_bytes)
        except _ClientGoneError:
            return
        if body is None:
            await _TOO_LARGE(scope, receive, send)
            return
        got = await self.admission.admit(_header(scope, b"authorization"), body, scope["path"])
        if isinstance(got, Reply):
            await got(scope, receive, send)
            return
        ticket = got
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": ticket.body, "more_body": False}
            return await receive()

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.body":
                self.admission.observe(ticket, message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, replay, counting_send)
        finally:
            await self.admission.afinish(ticket)


def serve(
    app: Callable[[Scope, Receive, Send], Awaitable[None]],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    limits: FrontLimits | None = None,
    admin_app: Callable[[Scope, Receive, Send], Awaitable[None]] | None = None,
    admin_host: str = "127.0.0.1",
    admin_port: int | None = None,
    limit_concurrency: int | None = None,
) -> None:
    """Serve ``app`` with uvicorn until a signal stops it, request heads bounded by
    ``limits`` (:class:`FrontLimits`), at most ``limit_concurrency`` connections and
    requests at once (503 beyond; uvicorn's own setting), and ``admin_app`` (if given) on
    ``admin_host:admin_port``: a listener for operators only."""
    import uvicorn

    proto = front_protocol(FrontLimits() if limits is None else limits)
    # No access log or proxy-header rewriting: the gateway uses neither, and each costs
    # CPU on every request.
    common: dict[str, Any] = {
        "http": proto,
        "log_level": "warning",
        "access_log": False,
        "proxy_headers": False,
    }
    main = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, limit_concurrency=limit_concurrency, **common)
    )
    if admin_app is None:
        main.run()
        return
    if admin_port is None:
        raise ValueError("'admin_port' is required with an admin app: None")
    admin = uvicorn.Server(
        uvicorn.Config(admin_app, host=admin_host, port=admin_port, lifespan="off", **common)
    )

    async def both() -> None:
        tasks = [asyncio.ensure_future(s.serve()) for s in (main, admin)]
        _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        main.should_exit = admin.should_exit = True  # one stopped (a signal): stop both
        await asyncio.gather(*pending)

    factory = main.config.get_loop_factory()
    if factory is None:
        asyncio.run(both())
    else:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(both())


def main(argv: list[str] | None = None) -> None:
    """``python -m kvpolicy.tenancy.gateway``: serve the gateway (``--help`` lists the
    settings). The admin key is read from ``KVPOLICY_ADMIN_KEY``, never from the command
    line (where every user of the host can read it)."""
    import argparse

    from kvpolicy.tenancy._manifest import load_gate, load_lease_gate

    p = argparse.ArgumentParser(prog="python -m kvpolicy.tenancy.gateway")
    p.add_argument("--config", required=True, help="pool manifest (JSON or YAML)")
    p.add_argument(
        "--backend",
        action="append",
        default=[],
        help="base URL of a backend (repeat for several; or the manifest's 'backends:')",
    )
    p.add_argument("--router", default=None, help="kvpolicy.routing entry point (several backends)")
    p.add_argument("--autoscaler", default=None, help="kvpolicy.autoscaling entry point")
    p.add_argument("--api-keys", required=True, help="API key -> tenant file")
    p.add_argument("--redis", default=None, help="redis://host:port/db (replicas)")
    p.add_argument("--namespace", default="kvpolicy", help="Redis key prefix of the pool")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--admin-port", type=int, default=None, help="loopback admin listener")
    p.add_argument("--bytes-per-token", type=int, default=1)
    p.add_argument("--model", action="append", default=None, help="a model served")
    p.add_argument("--timeout", type=float, default=600.0, help="backend silence, s")
    p.add_argument("--body-timeout", type=float, default=30.0, help="request body, s")
    p.add_argument("--header-timeout", type=float, default=10.0, help="request head, s")
    p.add_argument("--max-header-bytes", type=int, default=16_384)
    p.add_argument("--max-headers", type=int, default=100)
    p.add_argument("--max-body-bytes", type=int, default=1 << 20)
    p.add_argument("--max-json-depth", type=int, default=32)
    p.add_argument("--limit-concurrency", type=int, default=None)
    p.add_argument("--renew-interval", type=float, default=5.0, help="lease renewals, s")
    p.add_argument("--recovery", type=float, default=None, help="Redis recovery window, s")
    p.add_argument("--lease-ttl", type=float, default=30.0, help="Redis lease lifetime, s")
    p.add_argument(
        "--refresh-window",
        type=float,
        default=0.0,
        help="seconds between throughput refreshes from the service observed (0: never; "
        "with --redis pooled across the replicas)",
    )
    p.add_argument(
        "--outage",
        action="append",
        default=None,
        metavar="CLASS=FRACTION",
        help="baseline concurrency a replica admits alone while Redis is away, per service "
        "class (repeat; by default every class fails closed, which keeps every limit exact; "
        "e.g. guaranteed=0.5 keeps serving half of each reservation per replica, and may "
        "exceed a limit by that much per other replica)",
    )
    args = p.parse_args(argv)
    fleet = fleet_settings(args.config, args.backend, args.router, args.autoscaler)
    keys = load_api_keys(args.api_keys)
    gate: Gate
    refresh: ThroughputRefresh | None = None
    if args.redis:
        lease = load_lease_gate(
            args.config,
            args.bytes_per_token,
            args.redis,
            namespace=args.namespace,
            recovery_s=args.recovery,
            lease_ttl_s=args.lease_ttl,
            outage=_outage(args.outage),
        )
        if args.refresh_window > 0:  # pooled with the other replicas through Redis
            import redis

            refresh = SharedThroughputRefresh(
                lease,
                RefreshConfig(window_s=args.refresh_window),
                redis.Redis.from_url(args.redis, socket_timeout=0.25),
                namespace=args.namespace,
            )
        gate = lease
    else:
        local = LocalGate(load_gate(args.config, args.bytes_per_token))
        if args.refresh_window > 0:
            refresh = ThroughputRefresh(local, RefreshConfig(window_s=args.refresh_window))
        gate = local
    admission = Admission(
        gate,
        keys,
        models=tuple(args.model) if args.model else None,
        max_body_bytes=args.max_body_bytes,
        max_json_depth=args.max_json_depth,
        refresh=refresh,
    )
    app = create_app(
        admission,
        fleet.backends,
        timeout_s=args.timeout,
        body_timeout_s=args.body_timeout,
        renew_interval_s=args.renew_interval,
        admin_key=os.environ.get("KVPOLICY_ADMIN_KEY") or None,
        routing=fleet.routing,
        autoscaler=fleet.autoscaler,
    )
    limits = FrontLimits(args.max_header_bytes, args.max_headers, args.header_timeout)
    serve(
        app,
        host=args.host,
        port=args.port,
        limits=limits,
        admin_app=create_admin_app(admission, cast(_Gateway, app).fleet)
        if args.admin_port is not None
        else None,
        admin_port=args.admin_port,
        limit_concurrency=args.limit_concurrency,
    )


def _outage(pairs: list[str] | None) -> OutagePolicy:
    if pairs is None:
        return OutagePolicy()
    fractions: dict[str, float] = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        try:
            fractions[name] = float(value)
        except ValueError:
            raise ValueError(f"'--outage' must be CLASS=FRACTION: {pair!r}") from None
    return OutagePolicy(fractions)


if __name__ == "__main__":
    main()
