"""The networkx prefix tree: structure, subtree reuse, groups equal to ``prefix_groups``."""

from __future__ import annotations

import pathlib
import random

import networkx as nx
import pytest

from kvpolicy.tiers import (
    ROOT,
    allocate_group_ttls,
    export_graphml,
    prefix_groups,
    prefix_tree,
    subtree_reuse,
    tree_groups,
)

# Two conversations (first blocks 1 and 7) and a request sharing 1-2.
TRACE = [(0.0, [1, 2, 3]), (1.0, [7, 8]), (2.5, [1, 2, 4]), (4.0, [1, 2, 3, 5]), (6.0, [7])]


def _random_trace(seed: int) -> list[tuple[float, list[int]]]:
    rng = random.Random(seed)
    rows: list[tuple[float, list[int]]] = []
    t = 0.0
    for _ in range(200):
        t += rng.expovariate(1.0)
        root = rng.randrange(6)
        chain = [root * 1000]
        for _ in range(rng.randrange(6)):
            chain.append(chain[-1] * 7 + rng.randrange(3) + 1)
        rows.append((t, chain))
    return rows


def test_tree_structure_and_reuse() -> None:
    g = prefix_tree(TRACE)
    assert nx.is_tree(g)
    assert set(g.successors(ROOT)) == {1, 7}
    assert set(g.successors(2)) == {3, 4}
    assert g.nodes[2]["refs"] == 3
    assert g.nodes[2]["gaps"] == [2.5, 1.5]
    assert subtree_reuse(g, 1) == (5, 10, 5)  # blocks 1 2 3 4 5; 10 refs; 5 reuses
    assert subtree_reuse(g, 7) == (2, 3, 1)


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("seed", [0, 1])
def test_groups_match_prefix_groups(seed: int, depth: int) -> None:
    trace = _random_trace(seed)
    a = tree_groups(prefix_tree(trace), 3, depth)
    b = prefix_groups(trace, 3, depth)
    assert [(g.unique_blocks, g.references, g.reuses) for g in a] == [
        (g.unique_blocks, g.references, g.reuses) for g in b
    ]
    assert sorted(a[-1].intervals.tolist()) == sorted(b[-1].intervals.tolist())
    alloc = allocate_group_ttls(a, budget=50.0)
    assert alloc.cost <= 50.0 + 1e-9


def test_graphml_round_trip(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "tree.graphml"
    export_graphml(prefix_tree(TRACE), path)
    back = nx.read_graphml(path)
    assert back.number_of_nodes() == 8
    assert back.nodes["2"]["refs"] == 3
    assert back.nodes["2"]["mean_gap_s"] == pytest.approx(2.0)


def test_bad_arguments_name_the_field() -> None:
    with pytest.raises(ValueError, match="top_k"):
        tree_groups(prefix_tree(TRACE), -1)
    with pytest.raises(ValueError, match="depth"):
        tree_groups(prefix_tree(TRACE), 1, 0)
