"""``quality.losses``: where one policy loses against another, by copy distance."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from kvpolicy.evict.quality.losses import (
    DISTANCE_BUCKETS,
    LossSource,
    copy_distances,
    loss_by_distance,
    loss_sources,
    main,
    source_attention,
)


def test_copy_distances() -> None:
    ids = [5, 7, 5, 9, 7, 7]
    # predicted tokens: 7 (new), 5 (2 back), 9 (new), 7 (3 back), 7 (1 back)
    assert copy_distances(ids).tolist() == [-1, 2, -1, 3, 1]
    assert copy_distances([4]).tolist() == []


def test_loss_sources_orders_by_loss_and_names_the_distance() -> None:
    ids = [1, 2, 3, 1, 2, 3]
    nll = np.array([0.5, 0.5, 0.5, 2.0, 0.1])
    other = np.array([0.5, 0.5, 0.5, 0.5, 0.2])
    got = loss_sources(nll, other, ids, 2)
    assert got == [LossSource(3, 1.5, 3), LossSource(0, 0.0, None)]


def test_loss_by_distance_adds_up() -> None:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, 3000).tolist()
    nll, other = rng.random(2999), rng.random(2999)
    rows = loss_by_distance(nll, other, ids)
    assert [r[0] for r in rows] == ["1-32", "33-256", "257-1024", ">1024 or never"]
    assert len(rows) == len(DISTANCE_BUCKETS) + 1
    assert sum(r[1] for r in rows) == 2999
    assert sum(r[2] for r in rows) == pytest.approx(float((nll - other).sum()))


def test_mismatched_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="equal-length"):
        loss_by_distance(np.zeros(3), np.zeros(4), [1, 2, 3, 4])
    with pytest.raises(ValueError, match="'ids' must hold len\\(nll\\) \\+ 1 = 4 tokens: 3"):
        loss_sources(np.zeros(3), np.zeros(3), [1, 2, 3], 1)


def test_cli_names_a_missing_row(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = tmp_path / "rows.jsonl"
    full = {"task": "ppl", "text": "code", "tokens": 8, "policy": "full", "budget": 1.0}
    rows.write_text(json.dumps({**full, "predictor": "-", "nll": [0.0] * 7}) + "\n")
    with pytest.raises(SystemExit) as exc:
        main(["--rows", str(rows), "--text", "code", "--tokens", "8", "--budget", "0.5",
              "--policy", "h2o", "--against", "full"])  # fmt: skip
    assert exc.value.code == 2
    assert "no ppl row with" in capsys.readouterr().err


def test_source_attention() -> None:
    ids = [1, 2, 3, 4, 2, 5, 9, 9]
    n = len(ids)
    mass = np.tril(np.ones((n, n)))
    mass /= mass.sum(axis=1, keepdims=True)
    mass[5, 1] = 0.0  # query 5 ignores the source
    # position 3 predicts ids[4] = 2, last seen at 1
    got = source_attention(mass, ids, 3)
    assert got is not None
    assert got.source == 1
    assert got.mean == pytest.approx(np.mean([1 / 3]))
    assert got.uniform == pytest.approx(1 / 3)
    assert got.at_copy == pytest.approx(1 / 4)
    assert source_attention(mass, ids, 0) is None  # 2 never appeared before
    assert source_attention(mass, ids, 6) is None  # 9 right before: no queries between
