"""``load_trace``: read a trace file in any supported format, detected or named."""

from __future__ import annotations

import os
from collections.abc import Callable

from kvpolicy.sim.workloads._azure import AZURE_HEADER, load_azure
from kvpolicy.sim.workloads._common import check_path
from kvpolicy.sim.workloads._errors import TraceFormatError
from kvpolicy.sim.workloads._workload import Workload

__all__ = ["TRACE_FORMATS", "detect_format", "load_trace"]

TRACE_FORMATS: tuple[str, ...] = ("azure",)
"""Formats :func:`load_trace` reads."""


def detect_format(path: str | os.PathLike[str]) -> str:
    """The format of a trace file, from its extension and first line.

    Raises:
        TraceFormatError: the file matches no known format.
    """
    p = check_path(path)
    with p.open(encoding="utf-8-sig") as f:
        first = f.readline().strip()
    header = tuple(h.strip() for h in first.split(","))
    if header == AZURE_HEADER:
        return "azure"
    raise TraceFormatError(
        os.fspath(p), 1, f"cannot detect the trace format from {first[:80]!r}; pass format="
    )


def load_trace(
    path: str | os.PathLike[str],
    format: str | None = None,
    *,
    skip_bad: bool = False,
    limit: int | None = None,
    block_size: int = 16,
    rate: float | None = None,
) -> Workload:
    """Read a trace as a :class:`Workload`.

    Args:
        path: the trace file.
        format: one of :data:`TRACE_FORMATS`, or ``None`` to detect it.
        skip_bad: skip malformed rows, counting them in ``skipped_rows``, instead of raising.
        limit: keep the first ``limit`` requests.
        block_size: tokens per KV block of the prefix hashes made from block-hashed traces.
        rate: mean arrival rate to rescale to, in req/s.

    Raises:
        TraceFormatError: a malformed file or row (naming the file and the line).
        ValueError: an unknown ``format`` (listing the known ones) or bad arguments.
    """
    p = check_path(path)
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"'block_size' must be int: {block_size!r}")
    if block_size < 1:
        raise ValueError(f"'block_size' must be >= 1: {block_size}")
    if format is None:
        format = detect_format(p)
    loaders: dict[str, Callable[[], Workload]] = {
        "azure": lambda: load_azure(p, skip_bad=skip_bad, limit=limit, rate=rate),
    }
    loader = loaders.get(format) if isinstance(format, str) else None
    if loader is None:
        raise ValueError(f"unknown trace format {format!r}; known: {', '.join(TRACE_FORMATS)}")
    return loader()
