"""``kvpolicy tenancy``: replay, check, crds and serve."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from kvpolicy.commands._main import main

TENANCY = pathlib.Path(__file__).resolve().parents[3] / "packages" / "tenancy"


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["tenancy", *args])
    return result.exit_code, result.output


class TestReplay:
    def test_cross_class_json(self) -> None:
        """Guaranteed tenants are never denied; spot is denied on priority."""
        code, out = _invoke("replay", "--scenario", "cross-class", "--json")
        assert code == 0, out
        rows = {r["name"]: r for r in json.loads(out)}
        assert set(rows) == {"guaranteed-a", "guaranteed-c", "spot-b"}
        keys = {"name", "admitted", "denied", "low_priority_denied", "peak_debt", "p99_ttft_s"}
        assert all(set(r) == keys for r in rows.values())
        assert rows["guaranteed-a"]["denied"] == rows["guaranteed-c"]["denied"] == 0
        assert rows["spot-b"]["low_priority_denied"] > 0

    def test_fair_share_table_and_plot(self, tmp_path: pathlib.Path) -> None:
        code, out = _invoke("replay", "--scenario", "fair-share", "--plot", str(tmp_path))
        assert code == 0, out
        assert "elastic-synth" in out
        assert (tmp_path / "fair-share.png").stat().st_size > 0


class TestCheck:
    def test_example_is_ok(self) -> None:
        code, out = _invoke("check", str(TENANCY / "examples" / "pool.yaml"))
        assert code == 0, out
        assert "ok: pool 'qwen3-8b' with 2 entitlements" in out

    def test_unfundable_manifest_names_the_field(self, tmp_path: pathlib.Path) -> None:
        text = (TENANCY / "examples" / "pool.yaml").read_text()
        bad = tmp_path / "bad.yaml"
        bad.write_text(text.replace("max_output_tokens: 64", "max_output_tokens: 100000", 1))
        code, out = _invoke("check", str(bad))
        assert code == 1
        assert "entitlements[0].max_output_tokens" in out


def test_crds_match_the_committed_files(tmp_path: pathlib.Path) -> None:
    code, out = _invoke("crds", "--out", str(tmp_path))
    assert code == 0, out
    for path in (TENANCY / "crds").glob("*.yaml"):
        assert (tmp_path / path.name).read_text() == path.read_text()


def test_serve_answers_over_loopback() -> None:
    """The gateway process starts, reports health, refuses an unknown key (401) and answers
    502 when the backend cannot be reached, releasing the request."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    pytest.importorskip("starlette")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port, dead = sock.getsockname()[1], 1
    cmd = [sys.executable, "-c", "from kvpolicy.commands._main import main; main()"]
    cmd += ["tenancy", "serve"]
    cmd += ["--config", str(TENANCY / "examples" / "pool.yaml")]
    cmd += ["--api-keys", str(TENANCY / "examples" / "api-keys.yaml")]
    cmd += ["--backend", f"http://127.0.0.1:{dead}", "--port", str(port)]
    env = {**os.environ, "KVPOLICY_ADMIN_KEY": "admin"}
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                health = httpx.get(url + "/healthz")
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "gateway did not start"
                assert proc.poll() is None, "gateway exited"
                time.sleep(0.1)
        assert health.json()["status"] == "ok"
        body = {"model": "m", "prompt": "hi", "max_tokens": 4}
        r = httpx.post(url + "/v1/completions", json=body)
        assert r.status_code == 401
        auth = {"authorization": "Bearer sk-spot-b"}
        r = httpx.post(url + "/v1/completions", json=body, headers=auth)
        assert r.status_code == 502
        assert r.json()["error"]["code"] == "backend-error"
        assert httpx.get(url + "/metrics").status_code == 403  # the admin key only
        admin = {"authorization": "Bearer admin"}
        metrics = httpx.get(url + "/metrics", headers=admin).text
        assert 'kvpolicy_in_flight{entitlement="spot-b"} 0.0' in metrics
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    # Signs of life: where it listens, what it serves, where its state and admin pages are.
    assert f"kvpolicy tenancy serve: http://127.0.0.1:{port} -> http://127.0.0.1:{dead}" in err
    assert "API keys for" in err
    assert "state in this process" in err
    assert "/metrics and /healthz with KVPOLICY_ADMIN_KEY" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "no backend: give '--backend URL' or a 'backends:' list"),
        (["--backend", "ftp://a:1"], "'--backend' must be an http:// or https:// URL"),
        (["--backend", "http://a:1", "--backend", "http://a:1/"], "is given twice"),
        (
            ["--backend", "http://a:1", "--backend", "http://b:1", "--router", "nearest"],
            "unknown router 'nearest'; known: ",  # the installed ones (kvpolicy-admit's)
        ),
        (["--backend", "http://a:1", "--autoscaler", "grow"], "unknown autoscaler 'grow'"),
    ],
)
def test_serve_refuses_a_bad_fleet(args: list[str], message: str) -> None:
    """A bad backend, router or autoscaler stops `serve` before it listens, naming it."""
    config = ["--config", str(TENANCY / "examples" / "pool.yaml")]
    keys = ["--api-keys", str(TENANCY / "examples" / "api-keys.yaml")]
    code, out = _invoke("serve", *config, *keys, *args)
    assert code != 0
    assert message in " ".join(out.split())
