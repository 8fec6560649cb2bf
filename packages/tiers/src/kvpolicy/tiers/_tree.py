"""The prefix tree of a hash trace as a ``networkx`` DiGraph (the project's graph library).

Nodes are block hashes (plus the root ``"root"``); an edge ``parent -> child`` means
``child`` followed ``parent`` in some request's chain. Each block node carries ``refs``
(references), ``reuses`` and ``gaps`` (the inter-arrival times of its reuses, seconds).
Reuse and the ROI-aware TTL of every depth-``d`` subtree come from the graph
(:func:`tree_groups`, then :func:`~kvpolicy.tiers.allocate_group_ttls`), and
:func:`export_graphml` hands the tree to other tools.

Only the analysis uses the graph: the store and the replay stay on plain dictionaries, since
a DiGraph costs a few hundred bytes and about a microsecond per node more than a dict entry
(see the README for the measured figures).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import networkx as nx  # type: ignore[import-untyped]

from kvpolicy.tiers._reuse import HashTrace, PrefixGroup, _validate

__all__ = ["ROOT", "export_graphml", "prefix_tree", "subtree_reuse", "tree_groups"]

ROOT = "root"
"""The root node of every prefix tree."""


def prefix_tree(trace: HashTrace) -> nx.DiGraph:
    """Build the prefix tree of ``trace`` (see the module docstring). A block keeps the
    parent of its first reference, so the graph is a tree rooted at :data:`ROOT`.

    Raises:
        TypeError / ValueError: a malformed row, a negative time or time going backwards.
    """
    _validate(trace)
    graph: nx.DiGraph = nx.DiGraph()
    graph.add_node(ROOT, refs=0, reuses=0, gaps=[])
    nodes = graph.nodes
    last: dict[int, float] = {}
    for t, hashes in trace:
        tf = float(t)
        parent: Any = ROOT
        for h in hashes:
            prev = last.get(h)
            if prev is None:
                graph.add_node(h, refs=1, reuses=0, gaps=[], first_time=tf)
                graph.add_edge(parent, h)
            else:
                attrs = nodes[h]
                attrs["refs"] += 1
                attrs["reuses"] += 1
                attrs["gaps"].append(tf - prev)  # its first parent stays: a tree
            last[h] = tf
            parent = h
    return graph


def _subtree_roots(graph: nx.DiGraph, depth: int) -> Iterator[Any]:
    """Nodes at ``depth`` below the root, in order of first reference."""
    level = [ROOT]
    for _ in range(depth):
        level = [c for n in level for c in graph.successors(n)]
    return iter(sorted(level, key=lambda n: graph.nodes[n]["first_time"]))


def subtree_reuse(graph: nx.DiGraph, node: Any) -> tuple[int, int, int]:
    """``(unique blocks, references, reuses)`` of the subtree under ``node`` (included)."""
    members = nx.descendants(graph, node) | {node}
    attrs = graph.nodes
    refs = sum(int(attrs[n]["refs"]) for n in members if n != ROOT)
    reuses = sum(int(attrs[n]["reuses"]) for n in members if n != ROOT)
    return len(members - {ROOT}), refs, reuses


def tree_groups(graph: nx.DiGraph, top_k: int, depth: int = 1) -> tuple[PrefixGroup, ...]:
    """The ``top_k`` most reused subtrees rooted ``depth`` levels below the root, and the
    residual group of every other block (Algorithm 2, line 1 of seed 003), from the tree.

    A block reached from two subtrees (hash chains make this rare) counts in the first.
    Blocks above ``depth`` form their own one-block subtrees, as in
    :func:`~kvpolicy.tiers.prefix_groups`.
    """
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"'top_k' must be an int >= 0: {top_k!r}")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"'depth' must be an int >= 1: {depth!r}")
    attrs = graph.nodes
    seen: set[Any] = {ROOT}
    candidates: list[tuple[Any, list[Any]]] = []
    # Blocks above ``depth`` are their own groups (one block each).
    level = [ROOT]
    for _ in range(depth - 1):
        level = [c for n in level for c in graph.successors(n)]
        candidates += [(n, [n]) for n in level if n not in seen]
        seen.update(level)
    for node in _subtree_roots(graph, depth):
        if node in seen:
            continue
        members = [m for m in nx.dfs_preorder_nodes(graph, node) if m not in seen]
        seen.update(members)
        candidates.append((node, members))
    groups = [
        (
            key,
            len(members),
            sum(int(attrs[m]["refs"]) for m in members),
            [g for m in members for g in attrs[m]["gaps"]],
        )
        for key, members in candidates
    ]
    groups.sort(key=lambda g: -len(g[3]))  # stable: first reference breaks ties
    top, rest = groups[:top_k], groups[top_k:]
    out = [PrefixGroup(key=k, unique_blocks=u, references=r, intervals=i) for k, u, r, i in top]
    out.append(
        PrefixGroup(
            key=None,
            unique_blocks=sum(g[1] for g in rest),
            references=sum(g[2] for g in rest),
            intervals=[d for g in rest for d in g[3]],
        )
    )
    return tuple(out)


def export_graphml(graph: nx.DiGraph, path: str | os.PathLike[str]) -> None:
    """Write ``graph`` as GraphML: node ids as strings, ``refs``, ``reuses``,
    ``first_time`` and ``mean_gap_s`` (the gap lists do not fit GraphML's scalars)."""
    out: nx.DiGraph = nx.DiGraph()
    for node, a in graph.nodes(data=True):
        gaps = a.get("gaps", [])
        out.add_node(
            str(node),
            refs=int(a.get("refs", 0)),
            reuses=int(a.get("reuses", 0)),
            first_time=float(a.get("first_time", 0.0)),
            mean_gap_s=float(sum(gaps) / len(gaps)) if gaps else 0.0,
        )
    out.add_edges_from((str(u), str(v)) for u, v in graph.edges)
    nx.write_graphml(out, os.fspath(path))
