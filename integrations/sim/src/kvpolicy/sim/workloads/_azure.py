"""Loader of the Azure LLM inference trace CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``).

The timestamps look like ``2023-11-16 18:15:46.6805900``: seven fractional digits, one more
than ``datetime.strptime``'s ``%f`` accepts. They are parsed exactly, as integer nanoseconds
since the first row, so that two requests 100 ns apart stay 100 ns apart.
"""

from __future__ import annotations

import csv
import datetime as dt
import os
import re

from kvpolicy.sim.workloads._common import (
    FieldError,
    LastLine,
    RowLog,
    assemble,
    check_limit,
    check_path,
    parse_length,
)
from kvpolicy.sim.workloads._errors import TraceFormatError
from kvpolicy.sim.workloads._workload import Workload

__all__ = ["AZURE_HEADER", "load_azure", "parse_timestamp_ns"]

AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
"""The header row of an Azure LLM inference trace."""

_TIMESTAMP = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(?:Z|[+-]00:?00)?"
)
_NS = 1_000_000_000


def parse_timestamp_ns(text: str) -> int:
    """Nanoseconds since 0001-01-01 of a ``YYYY-MM-DD HH:MM:SS[.f{1,9}]`` timestamp.

    Up to nine fractional digits are kept exactly; a trailing ``Z`` or ``+00:00`` is
    accepted (the Azure trace has no zone and is read as UTC).

    Raises:
        ValueError: not such a timestamp, or not a valid calendar date and time.
    """
    m = _TIMESTAMP.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"TIMESTAMP must look like 2023-11-16 18:15:46.6805900: {text!r}")
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    if hour > 23 or minute > 59 or second > 59:
        raise ValueError(f"TIMESTAMP has an invalid time of day: {text!r}")
    try:
        ordinal = dt.date(year, month, day).toordinal()
    except ValueError:
        raise ValueError(f"TIMESTAMP has an invalid date: {text!r}") from None
    fraction = m.group(7) or ""
    seconds = ordinal * 86_400 + hour * 3_600 + minute * 60 + second
    return seconds * _NS + int(fraction.ljust(9, "0") or "0")


def load_azure(
    path: str | os.PathLike[str],
    *,
    skip_bad: bool = False,
    limit: int | None = None,
    rate: float | None = None,
) -> Workload:
    """Read an Azure LLM inference trace (the 2023 ``conv`` and ``code`` files, and 2024's).

    Arrival times are seconds since the earliest row (the first row of a sorted trace).
    Rows out of time order are sorted and the count is put in ``notes``. Blank lines are not
    rows and are passed over.

    Args:
        path: the CSV file.
        skip_bad: skip malformed rows and count them in ``skipped_rows`` instead of raising.
        limit: keep only the first ``limit`` good rows of the file.
        rate: rescale time so the mean arrival rate is ``rate`` req/s (``None``: as recorded).

    Raises:
        TraceFormatError: a wrong header, or a malformed row without ``skip_bad`` (a row
            with other than three fields, a bad timestamp, a non-integer or negative count).
    """
    p = check_path(path)
    limit = check_limit(limit)
    log = RowLog(path=os.fspath(p), skip_bad=skip_bad)
    rows: list[tuple[float, int, int, int, tuple[int, ...]]] = []
    ns_rows: list[tuple[int, int, int, int]] = []
    last = LastLine(AZURE_HEADER[2])  # the last column's name, for the cut-line check
    notes: tuple[str, ...] = ()
    with p.open(newline="", encoding="utf-8-sig", errors="replace") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        names = [h.strip() for h in header or ()]
        if not set(AZURE_HEADER) <= set(names) or len(set(names)) != len(names):
            raise TraceFormatError(
                log.path,
                1,
                f"header must name {','.join(AZURE_HEADER)} (other columns are ignored), "
                f"each once: {header!r}",
            )
        # By name: a trace with more columns keeps its timestamps and lengths.
        t_col, p_col, d_col = (names.index(c) for c in AZURE_HEADER)
        width = len(names)
        for fields in reader:
            if not fields:
                continue
            line = reader.line_num
            if len(fields) != width:
                log.bad(line, f"expected {width} fields, got {len(fields)}: {fields!r}")
                continue
            last.observe(line, fields[-1])
            try:
                try:
                    ns = parse_timestamp_ns(fields[t_col])
                except ValueError as exc:
                    raise FieldError(AZURE_HEADER[0], str(exc)) from None
                prompt = parse_length(fields[p_col].strip(), "ContextTokens")
                decode = parse_length(fields[d_col].strip(), "GeneratedTokens")
            except ValueError as exc:
                log.bad(line, exc)
                continue
            prompt, decode = log.clamp(prompt, decode)
            ns_rows.append((ns, line, prompt, decode))
            if limit is not None and len(ns_rows) >= limit:
                break
        else:
            notes = last.check(p)
    # Subtract in integers first: float seconds since year 1 would lose the 100 ns digits.
    ns0 = min((r[0] for r in ns_rows), default=0)
    rows = [((ns - ns0) / _NS, line, pr, de, ()) for ns, line, pr, de in ns_rows]
    return assemble(p.stem, rows, log, source=log.path, rate=rate, notes=notes)
