"""Plumbing shared by the trace loaders: argument checks, row bookkeeping, assembly."""

from __future__ import annotations

import math
import os
import pathlib
import warnings

import attrs

from kvpolicy.kvmodel import Request
from kvpolicy.sim.workloads._errors import TraceFormatError, TraceWarning
from kvpolicy.sim.workloads._workload import Workload

__all__ = [
    "MAX_TOKENS",
    "FieldError",
    "LastLine",
    "Row",
    "RowLog",
    "assemble",
    "check_limit",
    "check_path",
    "check_tokens",
    "parse_length",
]

MAX_TOKENS = 1 << 32
"""Largest token count a trace may hold in one field (4,294,967,296).

Far above any real context or output (millions of tokens), and small enough that a count
times the KV bytes of a token (below 2**20 for every model in the catalogue) stays within
int64, which the engine's block and byte arithmetic use.
"""


class FieldError(ValueError):
    """A bad value in one named field of a row (the loaders add the file and line).

    Attributes:
        column: the CSV header name or JSON key of the field.
    """

    def __init__(self, column: str, reason: str) -> None:
        self.column = column
        super().__init__(reason)


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


def check_tokens(value: int, column: str) -> int:
    """``value`` when it is a token count in ``[0, MAX_TOKENS]``.

    Raises:
        FieldError: a negative count or one above :data:`MAX_TOKENS`.
    """
    if value < 0:
        raise FieldError(column, f"must be >= 0: {value}")
    if value > MAX_TOKENS:
        raise FieldError(column, f"must be at most {MAX_TOKENS:,} tokens: {value}")
    return value


def parse_length(text: str, column: str) -> int:
    """A token count: an integer in ``[0, MAX_TOKENS]``, written ``"12"`` or ``"12.0"``.

    Raises:
        FieldError: anything else, naming ``column`` (the caller adds the file and line).
    """
    try:
        value = int(text)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            raise FieldError(column, f"must be an integer token count: {text!r}") from None
        if not (math.isfinite(number) and number.is_integer()):
            raise FieldError(column, f"must be an integer: {text!r}") from None
        value = int(number)
    return check_tokens(value, column)


Row = tuple[float, int, int, int, tuple[int, ...]]
"""``(time_s, line, prompt_len, decode_len, prefix_hashes)`` of one parsed row."""


@attrs.define
class RowLog:
    """Counts what a loader did with the rows of one file."""

    path: str
    skip_bad: bool
    skipped: int = 0
    clamped: int = 0

    def bad(self, line: int, reason: str | ValueError, path: str | None = None) -> None:
        """A malformed row of ``path`` (default: the log's file): raise, or count it.

        ``reason`` may be the error a field's parser raised; a :class:`FieldError` names
        the column in the :class:`TraceFormatError`.
        """
        if not self.skip_bad:
            column = reason.column if isinstance(reason, FieldError) else None
            where = self.path if path is None else path
            raise TraceFormatError(where, line, str(reason), column)
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
    if not rows:
        what = f"all {log.skipped} data rows are malformed" if log.skipped else "no data rows"
        raise TraceFormatError(log.path, None, f"no requests: {what}")
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


@attrs.define
class LastLine:
    """Watches one column for a last row cut short (a file copied or written partially).

    A file that does not end with a newline is legitimate (many editors write one), so the
    last row is suspected only when, in addition, its last field is narrower than that
    column's narrowest value in every row before it: a number cut inside its digits. The
    check is a warning (:class:`TraceWarning`) plus a note, not an error, since a legitimate
    small last value looks the same. ``observe`` every row, then ``check`` once at the end.
    """

    column: str
    narrowest: int | None = None
    last_width: int | None = None
    last_line: int | None = None

    def observe(self, line: int, field: str) -> None:
        """Record the width of the column's field in row ``line``."""
        if self.last_width is not None:
            prev = self.last_width
            self.narrowest = prev if self.narrowest is None else min(self.narrowest, prev)
        self.last_width = len(field.strip())
        self.last_line = line

    def check(self, path: pathlib.Path) -> tuple[str, ...]:
        """Warn, and return a note, when the last row looks cut short; else ``()``."""
        if self.last_width is None or self.narrowest is None:
            return ()
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() == 0:
                return ()
            f.seek(-1, os.SEEK_END)
            if f.read(1) in (b"\n", b"\r"):
                return ()
        if self.last_width >= self.narrowest:
            return ()
        note = (
            f"{os.fspath(path)}, line {self.last_line}, column {self.column!r}: the file ends "
            f"without a newline and this field has {self.last_width} character(s), fewer than "
            f"in every row before it (at least {self.narrowest}): the last line may be cut "
            f"short"
        )
        warnings.warn(note, TraceWarning, stacklevel=3)
        return (note,)
