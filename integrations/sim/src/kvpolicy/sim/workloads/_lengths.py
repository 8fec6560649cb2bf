"""Loader of length-only CSVs (ShareGPT, arXiv summarisation, ...) with Poisson arrivals.

These files hold one request per row and no timestamps, so arrivals are synthesised: a
Poisson process at ``rate`` req/s, the rows taken in file order. The header names the two
columns used (other columns, such as ``num_total_tokens`` or ``pd_ratio``, are ignored).
"""

from __future__ import annotations

import csv
import os

import numpy as np

from kvpolicy.sim.workloads._common import (
    LastLine,
    Row,
    RowLog,
    assemble,
    check_limit,
    check_path,
    parse_length,
)
from kvpolicy.sim.workloads._errors import TraceFormatError
from kvpolicy.sim.workloads._workload import Workload, _positive_rate

__all__ = ["DECODE_COLUMNS", "PROMPT_COLUMNS", "find_length_columns", "load_lengths"]

PROMPT_COLUMNS = (
    "num_prefill_tokens",
    "prompt_len",
    "prompt_tokens",
    "input_length",
    "input_tokens",
    "ContextTokens",
)
"""Header names accepted for the prompt length, in order of preference."""
DECODE_COLUMNS = (
    "num_decode_tokens",
    "decode_len",
    "output_tokens",
    "output_length",
    "completion_tokens",
    "GeneratedTokens",
)
"""Header names accepted for the output length, in order of preference."""


def find_length_columns(header: list[str]) -> tuple[int, int] | None:
    """Indices of the prompt and output columns in ``header``, or ``None``."""
    names = [h.strip() for h in header]
    prompt = next((names.index(c) for c in PROMPT_COLUMNS if c in names), None)
    decode = next((names.index(c) for c in DECODE_COLUMNS if c in names), None)
    if prompt is None or decode is None:
        return None
    return prompt, decode


def load_lengths(
    path: str | os.PathLike[str],
    *,
    rate: float,
    skip_bad: bool = False,
    limit: int | None = None,
    seed: int = 0,
) -> Workload:
    """Read a length-only CSV and give its rows Poisson arrival times.

    Args:
        path: the CSV file; its header names a prompt column (:data:`PROMPT_COLUMNS`) and an
            output column (:data:`DECODE_COLUMNS`).
        rate: Poisson arrival rate in req/s (> 0); required, the file has no times.
        skip_bad: skip malformed rows and count them instead of raising.
        limit: keep the first ``limit`` good rows.
        seed: seed of the arrival times.

    Raises:
        TraceFormatError: no recognised header, no data rows, or a malformed row without
            ``skip_bad`` (naming the file, line and column).
        ValueError: a bad ``rate`` or ``seed``.
    """
    p = check_path(path)
    limit = check_limit(limit)
    if rate is None:
        raise ValueError("'rate' is required for the 'lengths' format (the file has no times)")
    rate = _positive_rate(rate)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"'seed' must be int: {seed!r}")
    if seed < 0:
        raise ValueError(f"'seed' must be >= 0: {seed}")
    log = RowLog(path=os.fspath(p), skip_bad=skip_bad)
    parsed: list[tuple[int, int, int]] = []
    with p.open(newline="", encoding="utf-8-sig", errors="replace") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        columns = find_length_columns(header) if header else None
        if columns is None:
            raise TraceFormatError(
                log.path,
                1,
                f"header must name a prompt column ({', '.join(PROMPT_COLUMNS)}) and an "
                f"output column ({', '.join(DECODE_COLUMNS)}): {header!r}",
            )
        pi, di = columns
        width = len(header) if header else 0
        last = LastLine(header[-1].strip() if header else "")
        notes: tuple[str, ...] = ()
        for fields in reader:
            if not fields:
                continue
            line = reader.line_num
            if len(fields) != width:
                log.bad(line, f"expected {width} fields, got {len(fields)}: {fields!r}")
                continue
            last.observe(line, fields[-1])
            try:
                prompt = parse_length(fields[pi].strip(), header[pi].strip())  # type: ignore[index]
                decode = parse_length(fields[di].strip(), header[di].strip())  # type: ignore[index]
            except ValueError as exc:
                log.bad(line, exc)
                continue
            prompt, decode = log.clamp(prompt, decode)
            parsed.append((line, prompt, decode))
            if limit is not None and len(parsed) >= limit:
                break
        else:
            notes = last.check(p)
    times = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, size=len(parsed)))
    rows: list[Row] = [
        (t, line, prompt, decode, ())
        for t, (line, prompt, decode) in zip(times.tolist(), parsed, strict=True)
    ]
    note = f"Poisson arrivals at {rate:g} req/s (seed {seed}), rows in file order"
    return assemble(p.stem, rows, log, source=log.path, notes=(note, *notes))
