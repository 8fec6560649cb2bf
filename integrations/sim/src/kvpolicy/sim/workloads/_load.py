"""``load_trace``: read a trace file in any supported format, detected or named."""

from __future__ import annotations

import json
import os

from kvpolicy.kvmodel import WORKLOAD_FORMATS, RegistryError, build, names
from kvpolicy.sim.workloads._azure import AZURE_HEADER
from kvpolicy.sim.workloads._common import check_path
from kvpolicy.sim.workloads._errors import TraceFormatError
from kvpolicy.sim.workloads._lengths import find_length_columns
from kvpolicy.sim.workloads._servegen import _CHUNK
from kvpolicy.sim.workloads._workload import Workload

__all__ = ["TRACE_FORMATS", "detect_format", "load_trace"]

TRACE_FORMATS: tuple[str, ...] = names(WORKLOAD_FORMATS)
"""Formats :func:`load_trace` reads: the ``kvpolicy.workload_formats`` entry points."""

_DEFAULTS: dict[str, object] = {
    "skip_bad": False,
    "limit": None,
    "block_size": 16,
    "rate": None,
    "seed": 0,
    "start": 0.0,
    "duration": None,
    "scale": 1.0,
    "speedup": 1.0,
}


def detect_format(path: str | os.PathLike[str]) -> str:
    """The format of a trace, from its name and first line.

    A directory holding ``chunk-<i>-trace.csv`` files, or such a file, is ``servegen``; a
    file whose first line is a JSON object with ``input_length`` is ``mooncake``; a CSV whose
    header has the Azure columns (``TIMESTAMP,ContextTokens,GeneratedTokens``, others beside
    them) is ``azure``; another CSV whose header names a prompt and an output column is
    ``lengths`` (it has no arrival times).

    Raises:
        TraceFormatError: the trace matches no known format.
    """
    p = check_path(path)
    if p.is_dir() or _CHUNK.fullmatch(p.name):
        return "servegen"
    with p.open(encoding="utf-8-sig", errors="replace") as f:
        first = f.readline().strip()
    if first.startswith("{"):
        try:
            obj = json.loads(first)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and "input_length" in obj:
            return "mooncake"
    header = [h.strip() for h in first.split(",")]
    if set(AZURE_HEADER) <= set(header):  # with more columns too: its timestamps are kept
        return "azure"
    if find_length_columns(header) is not None:
        return "lengths"
    raise TraceFormatError(
        os.fspath(p),
        1,
        f"cannot detect the trace format from {first[:80]!r}; pass format= "
        f"(one of {', '.join(TRACE_FORMATS)})",
    )


def load_trace(
    path: str | os.PathLike[str],
    format: str | None = None,
    *,
    skip_bad: bool = False,
    limit: int | None = None,
    block_size: int = 16,
    rate: float | None = None,
    seed: int = 0,
    start: float = 0.0,
    duration: float | None = None,
    scale: float = 1.0,
    speedup: float = 1.0,
) -> Workload:
    """Read a trace as a :class:`Workload`.

    ========  ==========================================  =================================
    format    file                                        arrivals
    ========  ==========================================  =================================
    azure     CSV ``TIMESTAMP,ContextTokens,              recorded (exact 100 ns)
              GeneratedTokens``
    mooncake  JSONL ``timestamp`` (ms), ``input_length``,  recorded; prefix hashes expanded
              ``output_length``, ``hash_ids``             to ``block_size`` blocks
    lengths   CSV with prompt and output columns          Poisson at ``rate`` (required)
    servegen  directory of ``chunk-<i>-trace.csv``        Gamma per client and window
              (+ ``chunk-<i>-dataset.json``)
    ========  ==========================================  =================================

    Rows with a zero prompt or output length are kept with the length raised to 1 token and
    counted in ``clamped_rows``. Arrival times start at 0 at the earliest request.

    Args:
        path: the trace file (a directory for ``servegen``).
        format: one of :data:`TRACE_FORMATS`, or ``None`` to detect it (:func:`detect_format`).
        skip_bad: skip malformed rows, counting them in ``skipped_rows``, instead of raising.
        limit: keep the first ``limit`` requests.
        block_size: tokens per KV block of the prefix hashes (``mooncake``).
        rate: mean arrival rate in req/s: required for ``lengths``; for the other formats it
            rescales the recorded (``azure``, ``mooncake``) or published (``servegen``) rates.
        seed: seed of synthesised arrivals and lengths (``lengths``, ``servegen``).
        start: seconds into the series where the workload begins (``servegen``).
        duration: seconds of series to use (``servegen``); ``None`` runs to the end.
        scale: times the requests, every client's rate multiplied (``servegen``).
        speedup: the series played that many times faster (``servegen``).

    Bad input is refused at load time, never passed on to fail later:

    * a malformed field names the file, the line and the column (``TraceFormatError.column``:
      the CSV header name, the JSON key, or ServeGen's ``timestamp_s``, ``rate``, ...);
    * token counts must be at most :data:`~kvpolicy.sim.workloads._common.MAX_TOKENS`
      (2**32);
    * a ServeGen window may need at most ``MAX_WINDOW_ARRIVALS`` (10 million) arrivals and a
      load without ``limit`` at most ``MAX_ARRIVALS`` (20 million), checked before drawing;
    * a file without data rows, an empty ServeGen client file and a ServeGen range without
      traffic are errors;
    * a last line that may be cut short (no final newline, and its last field narrower than
      that column in every row before it) gives a :class:`TraceWarning` and a note: a file
      without a final newline is otherwise legitimate (the Azure trace has none).

    Raises:
        TraceFormatError: a malformed file or row (naming the file, the line and the column).
        ValueError: an unknown ``format`` (listing the known ones) or bad arguments.

    Warns:
        TraceWarning: the last line looks cut short.
    """
    p = check_path(path)
    if not isinstance(skip_bad, bool):
        raise TypeError(f"'skip_bad' must be bool: {skip_bad!r}")
    if format is None:
        format = detect_format(p)
    if not isinstance(format, str) or format not in TRACE_FORMATS:
        raise ValueError(f"unknown trace format {format!r}; known: {', '.join(TRACE_FORMATS)}")
    # Options left at their defaults are not passed, so that an option a format does not
    # take is refused only when it is actually given.
    given = {
        k: v
        for k, v in (
            ("skip_bad", skip_bad),
            ("limit", limit),
            ("block_size", block_size),
            ("rate", rate),
            ("seed", seed),
            ("start", start),
            ("duration", duration),
            ("scale", scale),
            ("speedup", speedup),
        )
        if v != _DEFAULTS[k] or (k == "rate" and format == "lengths")
    }
    try:
        workload = build(WORKLOAD_FORMATS, format, {"path": p, **given})
    except RegistryError as exc:
        # The loader's own error already names the file, line or argument.
        if isinstance(exc.__cause__, TraceFormatError | TypeError | ValueError | OSError):
            raise exc.__cause__ from None
        raise
    assert isinstance(workload, Workload)
    return workload
