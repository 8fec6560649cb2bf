"""An OpenAI-compatible HTTP server over :class:`LiveEngine` (Starlette, served by uvicorn).

``POST /v1/chat/completions`` and ``POST /v1/completions`` (``stream: true`` answers with
server-sent events, as the OpenAI API does), ``GET /v1/models``, ``GET /health`` (vLLM's
name; ``/healthz`` too) and ``GET /metrics``: vLLM's gauges in the Prometheus text format
under vLLM's names (``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc``, ``vllm:cache_config_info`` with ``block_size`` and
``num_gpu_blocks``, the counter ``vllm:prefix_cache_hits_total`` in tokens), so that a
gateway routes over simulated servers as over vLLM ones; with a
:class:`~kvpolicy.sim.backend.KVEventPublisher` its prefix cache's changes go out as vLLM's
KV cache events.

The prefix cache works on the prompt's text: each full block of ``block_size`` tokens is
``4 * block_size`` characters of the prompt (each chat message's role and text in order),
hashed and chained, so that requests sharing a prefix share KV blocks.

What is simulated: a prompt counts one token per 4 characters of its text (plus 4 per chat
message for the role markup), the common rule of thumb for English text; a request always
produces ``max_tokens`` (``max_completion_tokens``) tokens, default 256 for chat and 16 for
completions (the API's default), each a placeholder word. Timing is the simulator's.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from kvpolicy.sim.backend._events import KVEventPublisher
from kvpolicy.sim.backend._live import LiveEngine, RequestTooLongError
from kvpolicy.tenancy import prompt_text, text_block_hashes

__all__ = ["count_prompt_tokens", "create_app", "metrics_text", "prompt_block_hashes"]

_CHAT_DEFAULT = 256
_COMPLETION_DEFAULT = 16
_WORD = " tok"


def count_prompt_tokens(body: dict[str, Any], chat: bool) -> int:
    """Prompt tokens of a request body (see the module docstring).

    Raises:
        ValueError: no ``messages`` (chat) or ``prompt`` (completions) of the right shape.
    """
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("'messages' must be a non-empty list")
        total = 0
        for m in messages:
            if not isinstance(m, dict):
                raise ValueError("each of 'messages' must be an object")
            content = m.get("content", "")
            if isinstance(content, list):  # content parts: count the text ones
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            if not isinstance(content, str):
                raise ValueError("a message's 'content' must be a string or a list of parts")
            total += 4 + len(content) // 4
        return max(total, 1)
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = " ".join(str(p) for p in prompt)
    if not isinstance(prompt, str):
        raise ValueError("'prompt' must be a string or a list of strings")
    return max(len(prompt) // 4, 1)


def prompt_block_hashes(body: dict[str, Any], chat: bool, block_size: int) -> tuple[int, ...]:
    """Chained hashes of the prompt text's full blocks of ``4 * block_size`` characters
    (see the module docstring): the text and hashes of the gateway's approximate prefix
    index (kvpolicy-tenancy), at this server's block granularity."""
    return text_block_hashes(prompt_text(body, chat), 4 * block_size)


def metrics_text(engine: LiveEngine, model_name: str) -> str:
    """vLLM's gauges of ``engine`` now, in the Prometheus text format (vLLM's names)."""
    running, waiting, usage, blocks = engine.load()
    label = f'model_name="{model_name}"'
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{label}}} {running}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{label}}} {waiting}",
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{label}}} {usage!r}",
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{block_size="{engine.block_size}",num_gpu_blocks="{blocks}"}} 1.0',
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in cached tokens.",
        "# TYPE vllm:prefix_cache_hits_total counter",
        f"vllm:prefix_cache_hits_total{{{label}}} {engine.prefix_hit_tokens}",
    ]
    return "\n".join(lines) + "\n"


def _max_tokens(body: dict[str, Any], chat: bool) -> int:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return _CHAT_DEFAULT if chat else _COMPLETION_DEFAULT
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"'max_tokens' must be an integer >= 1: {value!r}")
    return value


def create_app(engine: LiveEngine, model_name: str, events: KVEventPublisher | None = None) -> Any:
    """The ASGI app serving ``engine`` as model ``model_name``; ``events`` (if given)
    publishes the changes of its prefix cache after each iteration.

    Raises:
        ImportError: Starlette is not installed (``pip install --find-links dist
            'kvpolicy-sim[backend]'`` after ``nox -s build``).
    """
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    def error(status: int, message: str, kind: str, code: str | None = None) -> Response:
        body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
        return JSONResponse(body, status_code=status)

    async def models(_request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": model_name, "object": "model", "created": 0, "owned_by": "kvpolicy"}
                ],
            }
        )

    async def healthz(_request: Request) -> Response:
        return JSONResponse({"status": "ok", "in_flight": engine.in_flight})

    async def metrics(_request: Request) -> Response:
        return Response(metrics_text(engine, model_name), media_type="text/plain; version=0.0.4")

    def handler(chat: bool) -> Callable[[Request], Any]:
        async def handle(request: Request) -> Response:
            try:
                body = await request.json()
            except ValueError:
                return error(400, "the request body is not valid JSON", "invalid_request_error")
            if not isinstance(body, dict):
                return error(400, "the request body must be a JSON object", "invalid_request_error")
            if body.get("model") != model_name:
                return error(
                    404,
                    f"model {body.get('model')!r} not found; this server serves {model_name!r}",
                    "invalid_request_error",
                    "model_not_found",
                )
            try:
                prompt = count_prompt_tokens(body, chat)
                out = _max_tokens(body, chat)
            except ValueError as exc:
                return error(400, str(exc), "invalid_request_error")
            tenant = str(body.get("user") or "default")
            try:
                hashes = prompt_block_hashes(body, chat, engine.block_size)
                if events is not None:
                    events.observe(hashes)
                tokens = engine.generate(prompt, out, tenant=tenant, prefix_hashes=hashes)
                first = await anext(tokens)  # raises before anything is sent if too long
            except RequestTooLongError as exc:
                return error(400, str(exc), "invalid_request_error", "context_length_exceeded")
            ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
            created = int(time.time())
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": out,
                "total_tokens": prompt + out,
            }
            if body.get("stream"):
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                stream = _sse(chat, ident, created, model_name, first, tokens, usage, include_usage)
                return StreamingResponse(stream, media_type="text/event-stream")
            async for _ in tokens:
                pass
            text = _WORD * out
            choice: dict[str, Any] = (
                {"index": 0, "message": {"role": "assistant", "content": text}}
                if chat
                else {"index": 0, "text": text, "logprobs": None}
            )
            choice["finish_reason"] = "length"
            return JSONResponse(
                {
                    "id": ident,
                    "object": "chat.completion" if chat else "text_completion",
                    "created": created,
                    "model": model_name,
                    "choices": [choice],
                    "usage": usage,
                }
            )

        return handle

    @asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        if events is not None:
            publisher = events

            def publish() -> None:
                publisher.publish(engine.cached_blocks())

            engine.on_iteration = publish
        task = asyncio.create_task(engine.run())
        try:
            yield
        finally:
            task.cancel()
            if events is not None:
                events.close()

    return Starlette(
        routes=[
            Route("/v1/models", models, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/health", healthz, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/v1/chat/completions", handler(True), methods=["POST"]),
            Route("/v1/completions", handler(False), methods=["POST"]),
        ],
        lifespan=lifespan,
    )


async def _sse(
    chat: bool,
    ident: str,
    created: int,
    model: str,
    first: int,
    tokens: AsyncIterator[int],
    usage: dict[str, int],
    include_usage: bool,
) -> AsyncIterator[str]:
    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(n: int, finish: str | None) -> str:
        text = _WORD * n
        choice: dict[str, Any] = (
            {"index": 0, "delta": {"content": text} if n else {}}
            if chat
            else {"index": 0, "text": text, "logprobs": None}
        )
        choice["finish_reason"] = finish
        doc = {"id": ident, "object": kind, "created": created, "model": model, "choices": [choice]}
        return f"data: {json.dumps(doc)}\n\n"

    if chat:
        role = {"id": ident, "object": kind, "created": created, "model": model}
        role["choices"] = [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]
        yield f"data: {json.dumps(role)}\n\n"
    yield chunk(first, None)
    async for n in tokens:
        yield chunk(n, None)
    yield chunk(0, "length")
    if include_usage:
        doc = {"id": ident, "object": kind, "created": created, "model": model}
        doc["choices"] = []
        doc["usage"] = usage
        yield f"data: {json.dumps(doc)}\n\n"
    yield "data: [DONE]\n\n"
