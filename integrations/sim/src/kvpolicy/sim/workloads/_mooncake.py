"""Loader of Mooncake JSONL traces, with prefix block hashes for prefix caching.

Each line is ``{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}``
where ``hash_ids[i]`` names the prompt's tokens ``[512 i, 512 (i + 1))`` *and everything
before them* (Mooncake's hashes are prefix hashes: equal ids mean a reusable prefix).

:class:`kvpolicy.kvmodel.BlockPool` caches blocks of ``block_size`` tokens (16 in vLLM), so
each 512-token id is expanded into one hash per full ``block_size`` block::

    trace blocks (512):   [ h0                 ][ h1                 ][ h2 (partial) ]
    pool blocks (16):     [b0][b1] ... [b31]    [b32] ... [b63]       [b64]..[b(n//16 - 1)]
    hash of pool block k: mix(c(j), k)  where j = (16 (k + 1) - 1) // 512 holds its last token
                          and c(j) = hash(c(j - 1), h_j) chains the trace's ids

Pool block ``k`` covers tokens ``[16 k, 16 (k + 1))``; it is equal in two requests exactly when
their prefixes up to its last token are, which the trace tells us at 512-token granularity:
when ``c(j)`` is equal. A pool block whose prefix differs only inside its 512-token block is
therefore treated as different (the trace cannot say otherwise), so hit ratios are those of
the trace's blocks, never more. Chaining ``c(j)`` makes the hashes correct even for traces
whose ids name a block's content rather than its prefix. A trailing partial pool block gets no
hash, as in :func:`kvpolicy.kvmodel.chain_block_hashes`.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np

from kvpolicy.sim.workloads._common import (
    FieldError,
    Row,
    RowLog,
    assemble,
    check_limit,
    check_path,
    check_tokens,
)
from kvpolicy.sim.workloads._workload import Workload

__all__ = ["MOONCAKE_BLOCK_SIZE", "expand_block_hashes", "load_mooncake"]

MOONCAKE_BLOCK_SIZE = 512
"""Tokens per hashed block in the Mooncake traces."""

_MASK = (1 << 64) - 1


def _mix(chains: np.ndarray, index: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser of ``chain + golden * (index + 1)``: (n,) uint64 -> (n,) int64."""
    x = chains + (index + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    out: np.ndarray = x.view(np.int64)
    return out


def expand_block_hashes(
    rows: list[tuple[int, list[int]]],
    block_size: int,
    trace_block_size: int = MOONCAKE_BLOCK_SIZE,
) -> list[tuple[int, ...]]:
    """Per-``block_size`` prefix hashes of many prompts at once (see the module docstring).

    Args:
        rows: ``(prompt_len, hash_ids)`` per request, ``len(hash_ids)`` =
            ``ceil(prompt_len / trace_block_size)``.
        block_size: tokens per pool block (>= 1).
        trace_block_size: tokens per hashed block of the trace.

    Returns:
        One tuple of ``prompt_len // block_size`` int hashes per request.
    """
    chains: list[int] = []
    starts: list[int] = []
    counts: list[int] = []
    for prompt_len, ids in rows:
        starts.append(len(chains))
        prev = 0
        for h in ids:
            prev = hash((prev, h)) & _MASK
            chains.append(prev)
        counts.append(prompt_len // block_size)
    total = sum(counts)
    if total == 0:
        return [() for _ in rows]
    count_arr = np.asarray(counts, dtype=np.int64)
    first = np.cumsum(count_arr) - count_arr  # index of each request's first pool block
    owner = np.repeat(np.arange(len(rows)), count_arr)
    k = np.arange(total, dtype=np.int64) - first[owner]
    trace_block = ((k + 1) * block_size - 1) // trace_block_size
    chain = np.asarray(chains, dtype=np.uint64)[
        np.asarray(starts, dtype=np.int64)[owner] + trace_block
    ]
    flat = _mix(chain, k.astype(np.uint64)).tolist()
    bounds = np.cumsum(count_arr).tolist()
    out: list[tuple[int, ...]] = []
    lo = 0
    for hi in bounds:
        out.append(tuple(flat[lo:hi]))
        lo = hi
    return out


def _int_field(obj: dict[str, object], key: str) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise FieldError(key, f"must be an integer: {value!r}")
    return check_tokens(value, key)


def load_mooncake(
    path: str | os.PathLike[str],
    *,
    skip_bad: bool = False,
    limit: int | None = None,
    block_size: int = 16,
    rate: float | None = None,
    trace_block_size: int = MOONCAKE_BLOCK_SIZE,
) -> Workload:
    """Read a Mooncake JSONL trace.

    Arrival times are ``timestamp / 1000`` seconds, relative to the earliest row. A row is
    malformed when it is not a JSON object, lacks a field, has a negative or non-integer
    count, a ``hash_ids`` that is not a list of integers, or ``len(hash_ids) !=
    ceil(input_length / trace_block_size)``.

    Args:
        path: the JSONL file.
        skip_bad: skip malformed rows and count them instead of raising.
        limit: keep the first ``limit`` good rows.
        block_size: tokens per pool block of the expanded prefix hashes.
        rate: rescale time to this mean arrival rate (req/s).
        trace_block_size: tokens per hashed block in the file (512 in Mooncake's traces).

    Raises:
        TraceFormatError: a malformed row without ``skip_bad`` (naming the file and line).
    """
    p = check_path(path)
    limit = check_limit(limit)
    for name, value in (("block_size", block_size), ("trace_block_size", trace_block_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"'{name}' must be int: {value!r}")
        if value < 1:
            raise ValueError(f"'{name}' must be >= 1: {value}")
    log = RowLog(path=os.fspath(p), skip_bad=skip_bad)
    parsed: list[tuple[float, int, int, int, list[int]]] = []
    with p.open(encoding="utf-8", errors="replace") as f:
        for line_no, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                try:
                    obj = json.loads(text)
                except ValueError as exc:
                    raise ValueError(
                        f"not JSON ({exc}): {text.strip()[:60]!r}; a Mooncake trace is JSONL "
                        "with timestamp (ms), input_length, output_length and hash_ids"
                    ) from None
                if not isinstance(obj, dict):
                    raise ValueError(f"a row must be a JSON object: {text.strip()[:60]!r}")
                ts = obj.get("timestamp")
                if isinstance(ts, bool) or not isinstance(ts, int | float):
                    raise FieldError("timestamp", f"must be a number of ms: {ts!r}")
                if not (math.isfinite(ts) and ts >= 0):
                    raise FieldError("timestamp", f"must be finite and >= 0: {ts!r}")
                prompt = _int_field(obj, "input_length")
                decode = _int_field(obj, "output_length")
                ids = obj.get("hash_ids")
                if not isinstance(ids, list) or not all(
                    isinstance(h, int) and not isinstance(h, bool) for h in ids
                ):
                    raise FieldError("hash_ids", f"must be a list of integers: {str(ids)[:60]}")
                expected = -(-prompt // trace_block_size)
                if len(ids) != expected:
                    raise FieldError(
                        "hash_ids",
                        f"must have ceil(input_length / {trace_block_size}) = "
                        f"{expected} entries: {len(ids)}",
                    )
            except ValueError as exc:  # json.JSONDecodeError is a ValueError
                log.bad(line_no, exc)
                continue
            prompt, decode = log.clamp(prompt, decode)
            parsed.append((ts / 1000.0, line_no, prompt, decode, ids))
            if limit is not None and len(parsed) >= limit:
                break
    hashes = expand_block_hashes([(row[2], row[4]) for row in parsed], block_size, trace_block_size)
    rows: list[Row] = [
        (t, ln, pr, de, h) for (t, ln, pr, de, _), h in zip(parsed, hashes, strict=True)
    ]
    return assemble(p.stem, rows, log, source=log.path, rate=rate, hash_block_size=block_size)
