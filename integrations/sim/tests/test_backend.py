"""The simulated OpenAI-compatible backend, driven by the real ``openai`` client on loopback."""

from __future__ import annotations

import concurrent.futures
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kvpolicy.kvmodel import get_gpu, get_model
from kvpolicy.sim import EngineConfig, TimingModel

openai = pytest.importorskip("openai", reason="the backend tests need the openai client")
uvicorn = pytest.importorskip("uvicorn", reason="the backend needs uvicorn (extra 'backend')")
httpx = pytest.importorskip("httpx", reason="the backend tests need httpx")

from kvpolicy.sim.backend import LiveEngine, count_prompt_tokens, create_app  # noqa: E402

MODEL = "Llama-3-8B"
SPEED = 4.0  # simulated seconds per wall second: quick tests, same engine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, LiveEngine]]:
    """A backend on a free loopback port: Llama-3-8B on an L40S, 4x faster than real time."""
    tm = TimingModel(get_model(MODEL), get_gpu("L40S"))
    engine = LiveEngine(tm, EngineConfig(max_batch=64), speed=SPEED)
    port = _free_port()
    config = uvicorn.Config(
        create_app(engine, MODEL), host="127.0.0.1", port=port, log_level="error"
    )
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    yield url, engine
    srv.should_exit = True
    thread.join(timeout=5)


def _client(url: str) -> Any:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


class TestOpenAIClient:
    def test_models(self, server: tuple[str, LiveEngine]) -> None:
        """GET /v1/models lists the simulated model."""
        assert [m.id for m in _client(server[0]).models.list()] == [MODEL]

    def test_chat_completion(self, server: tuple[str, LiveEngine]) -> None:
        """A chat completion returns max_tokens tokens and the usage counts them."""
        got = _client(server[0]).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x" * 400}], max_tokens=12
        )
        assert got.choices[0].finish_reason == "length"
        assert got.usage is not None
        assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (104, 12)
        assert got.choices[0].message.content == " tok" * 12

    def test_stream_paced_by_the_time_model(self, server: tuple[str, LiveEngine]) -> None:
        """Tokens stream one iteration at a time: the wall time per token is the roofline's
        decode time of a small batch divided by the speed-up, and the chunks add up."""
        tm = TimingModel(get_model(MODEL), get_gpu("L40S"))
        t0 = time.perf_counter()
        stream = _client(server[0]).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=40,
            stream=True,
            stream_options={"include_usage": True},
        )
        arrivals, text, usage = [], "", None
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
                arrivals.append(time.perf_counter() - t0)
        assert text == " tok" * 40
        assert usage is not None
        assert usage.completion_tokens == 40
        per_token = (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1)
        step = tm.iteration_time(1, 50, 50) / SPEED
        assert step * 0.5 < per_token < step * 4

    def test_completions_endpoint(self, server: tuple[str, LiveEngine]) -> None:
        """/v1/completions answers with text and defaults to 16 tokens, as the API does."""
        got = _client(server[0]).completions.create(model=MODEL, prompt="a" * 80)
        assert got.choices[0].text == " tok" * 16
        assert got.usage is not None
        assert got.usage.prompt_tokens == 20

    def test_concurrent_requests_share_the_batch(self, server: tuple[str, LiveEngine]) -> None:
        """Sixteen concurrent requests all finish, batched together: far faster than
        sixteen in a row."""

        def one(_: int) -> float:
            t = time.perf_counter()
            _client(server[0]).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "y" * 200}], max_tokens=30
            )
            return time.perf_counter() - t

        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            times = list(pool.map(one, range(16)))
        total = time.perf_counter() - t0
        assert total < 4 * max(times)
        assert server[1].in_flight == 0


class TestErrors:
    def test_too_long_is_a_400(self, server: tuple[str, LiveEngine]) -> None:
        """A request beyond the context is refused with the API's context-length error."""
        with pytest.raises(openai.BadRequestError) as info:
            _client(server[0]).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "z" * 40_000}], max_tokens=10
            )
        assert info.value.code == "context_length_exceeded"
        assert "holds at most 8192" in str(info.value)

    def test_unknown_model_is_a_404(self, server: tuple[str, LiveEngine]) -> None:
        """Another model name is a 404 naming both."""
        with pytest.raises(openai.NotFoundError, match="Qwen3-8B"):
            _client(server[0]).chat.completions.create(
                model="Qwen3-8B", messages=[{"role": "user", "content": "hi"}]
            )

    def test_bad_json_is_a_400(self, server: tuple[str, LiveEngine]) -> None:
        """A body that is not JSON is a 400 in the API's error shape."""
        r = httpx.post(f"{server[0]}/v1/chat/completions", content=b"{not json")
        assert r.status_code == 400
        assert r.json()["error"]["type"] == "invalid_request_error"

    def test_disconnect_frees_the_request(self, server: tuple[str, LiveEngine]) -> None:
        """A client that goes away mid-stream leaves nothing in flight."""
        with httpx.stream(
            "POST",
            f"{server[0]}/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "q"}],
                "max_tokens": 5000,
                "stream": True,
            },
        ) as r:
            for line in r.iter_lines():
                if '"content"' in line:
                    break
        for _ in range(100):
            if server[1].in_flight == 0:
                break
            time.sleep(0.05)
        assert server[1].in_flight == 0


class TestPromptTokens:
    def test_chat_counts_four_chars_a_token_plus_markup(self) -> None:
        """Chat prompts: 4 tokens of markup per message plus one per 4 characters."""
        body = {
            "messages": [
                {"role": "system", "content": "a" * 40},
                {"role": "user", "content": "b" * 8},
            ]
        }
        assert count_prompt_tokens(body, chat=True) == 4 + 10 + 4 + 2

    def test_bad_messages(self) -> None:
        """A chat body without messages is named."""
        with pytest.raises(ValueError, match="'messages' must be a non-empty list"):
            count_prompt_tokens({"messages": []}, chat=True)
