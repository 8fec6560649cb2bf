"""``kvpolicy tiers plan|reuse`` on a small synthetic hash trace."""

from __future__ import annotations

import json
import pathlib
import random

import networkx as nx
import pytest
from click.testing import CliRunner

from kvpolicy.commands._main import main


@pytest.fixture
def trace(tmp_path: pathlib.Path) -> str:
    """120 requests of 4 conversations with growing chained prefixes, Mooncake-shaped."""
    rng = random.Random(0)
    chains: dict[int, list[int]] = {c: [c * 10_000] for c in range(4)}
    lines = []
    t = 0.0
    for _ in range(120):
        t += rng.expovariate(0.5)
        c = rng.randrange(4)
        chains[c] = [*chains[c], chains[c][-1] + 1]
        lines.append(json.dumps({"timestamp": int(t * 1000), "hash_ids": chains[c]}))
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["tiers", *args])
    return result.exit_code, result.output


def test_reuse_json_and_graphml(trace: str, tmp_path: pathlib.Path) -> None:
    out_file = tmp_path / "tree.graphml"
    code, out = _invoke(
        "reuse",
        "--trace",
        trace,
        "--top-k",
        "3",
        "--depth",
        "1",
        "--json",
        "--budget",
        "500",
        "--export",
        str(out_file),
    )
    assert code == 0, out
    doc = json.loads(out)
    assert doc["requests"] == 120
    assert len(doc["groups"]) == 4  # 3 subtrees + the residual
    assert doc["cost_block_s"] <= 500 + 1e-9
    assert sum(g["unique_blocks"] for g in doc["groups"]) == doc["unique_blocks"]
    assert nx.read_graphml(out_file).number_of_nodes() == doc["tree_nodes"]


def test_reuse_table(trace: str) -> None:
    code, out = _invoke("reuse", "--trace", trace, "--top-k", "2")
    assert code == 0, out
    assert "residual" in out
    assert "reuse ratio" in out


def test_plan_with_grid(trace: str) -> None:
    code, out = _invoke("plan", "--trace", trace, "--grid", "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert 0 < doc["evaluations"] < doc["grid_evaluations"]
    assert 0.9 <= doc["hypervolume_ratio"] <= 1.0 + 1e-9
    assert doc["front"]


def test_bad_trace_names_the_option(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"hash_ids": [1]}\n')
    code, out = _invoke("reuse", "--trace", str(bad))
    assert code == 2
    assert "--trace" in out
