"""Plumbing shared by the trace loaders: argument checks, row bookkeeping, assembly."""

from __future__ import annotations

import math
import os
import pathlib

import attrs

from kvpolicy.kvmodel import Request
from kvpolicy.sim.workloads._errors import TraceFormatError
from kvpolicy.sim.workloads._workload import Workload

__all__ = ["Row", "RowLog", "assemble", "check_limit", "check_path", "parse_length"]


def check_path(path: str | os.PathLike[str]) -> pathlib.Path:
    """``path`` as a :class:`pathlib.Path` that exists."""
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"'path' must be a str or os.PathLike: {path!r}")
    p = pathlib.Path(path)
    if not p.exists():
        raise FileNotFoundError(f"'path' does not exist: {os.fspath(p)!r}")
    return p


def check_limit(limit: int | None) -> int | None:
    """``limit`` when it is ``None`` or an int >= 1."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"'limit' must be int or None: {limit!r}")
    if limit < 1:
        raise ValueError(f"'limit' must be >= 1: {limit}")
    return limit


def parse_length(text: str, column: str) -> int:
    """A token count: a non-negative integer, written ``"12"`` or ``"12.0"``.

    Raises:
        ValueError: anything else (the caller turns it into a :class:`TraceFormatError`).
    """
    try:
        value = int(text)
    except ValueError:
        number = float(text)  # raises ValueError on junk
        if not (math.isfinite(number) and number.is_integer()):
            raise ValueError(f"{column} must be an integer: {text!r}") from None
        value = int(number)
    if value < 0:
        raise ValueError(f"{column} must be >= 0: {text!r}")
    return value


Row = tuple[float, int, int, int, tuple[int, ...]]
"""``(time_s, line, prompt_len, decode_len, prefix_hashes)`` of one parsed row."""


@attrs.define
class RowLog:
    """Counts what a loader did with the rows of one file."""

    path: str
    skip_bad: bool
    skipped: int = 0
    clamped: int = 0

    def bad(self, line: int, reason: str, path: str | None = None) -> None:
        """A malformed row of ``path`` (default: the log's file): raise, or count it."""
        if not self.skip_bad:
            raise TraceFormatError(self.path if path is None else path, line, reason)
        self.skipped += 1

    def clamp(self, prompt_len: int, decode_len: int) -> tuple[int, int]:
        """Raise zero lengths to 1 token and count the row if it needed that.

        A zero-length output still costs a prefill, and the prefill emits the first token, so
        the request is kept as one that generates one token; a zero-length prompt becomes a
        one-token prompt (the BOS token every tokenizer adds).
        """
        if prompt_len >= 1 and decode_len >= 1:
            return prompt_len, decode_len
        self.clamped += 1
        return max(1, prompt_len), max(1, decode_len)


def assemble(
    name: str,
    rows: list[Row],
    log: RowLog,
    *,
    source: str,
    id_prefix: str = "L",
    notes: tuple[str, ...] = (),
    rate: float | None = None,
    hash_block_size: int = 16,
) -> Workload:
    """Sort rows by time (stably), make times relative to the earliest, build the workload.

    ``rate``, when given, rescales the arrival times so that the mean rate is ``rate``;
    ``hash_block_size`` is the tokens each row's prefix hashes cover.
    """
    notes = tuple(notes)
    if any(rows[i][0] < rows[i - 1][0] for i in range(1, len(rows))):
        moved = sum(1 for i in range(1, len(rows)) if rows[i][0] < rows[i - 1][0])
        notes += (f"{moved} rows arrive before the row above them; rows sorted by time",)
        rows = sorted(rows, key=lambda r: r[0])
    t0 = rows[0][0] if rows else 0.0
    requests = tuple(
        Request(
            request_id=f"{id_prefix}{line}",
            prompt_len=prompt,
            decode_len=decode,
            arrival_time=t - t0,
            prefix_hashes=hashes,
            hash_block_size=hash_block_size,
        )
        for t, line, prompt, decode, hashes in rows
    )
    if log.skipped:
        notes += (f"{log.skipped} malformed rows skipped",)
    if log.clamped:
        notes += (f"{log.clamped} rows with a zero prompt or output length raised to 1 token",)
    workload = Workload(
        name=name,
        requests=requests,
        source=source,
        skipped_rows=log.skipped,
        clamped_rows=log.clamped,
        notes=notes,
    )
    return workload if rate is None else workload.with_rate(rate)
