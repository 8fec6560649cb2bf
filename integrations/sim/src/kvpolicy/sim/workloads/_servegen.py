"""Multi-tenant arrivals synthesised from ServeGen's per-client series (Xiang et al. 2025).

ServeGen publishes, per client (tenant) of a model service, one row per 600 s window::

    timestamp_s,rate,cv,pattern,param1,param2        (chunk-<i>-trace.csv, no header)

and per 6 h window the client's input and output length PMFs (``chunk-<i>-dataset.json``,
each PMF a string holding a ``{value: probability}`` dict). The loader turns these into
requests:

* Each client is a renewal process with Gamma inter-arrival gaps of the window's rate and
  CV (shape ``1 / cv**2``, scale ``cv**2 / rate``; ``cv = 0`` gives regular gaps). The process
  carries over window boundaries: the first arrival past a window's end is the next window's
  first arrival; after an idle window (rate 0) the client restarts one gap after the window's
  start. The fitted ``pattern`` (Gamma or Weibull) is not used: the rate and CV determine
  the Gamma law, which is what :class:`kvpolicy.sim.workloads.GammaArrivals` models.
* A request of client ``i`` at time ``t`` draws its input and output lengths independently
  from the client's PMFs of the 6 h window that holds ``t`` (ServeGen gives marginals only).
  An empty window uses the client's nearest earlier non-empty one (else its first non-empty
  one); a client with no dataset file uses all the directory's PMFs pooled; a directory with
  no dataset files (the m-small snapshot) uses the Azure conversation lengths. Each
  fallback is recorded in the workload's ``notes``. ``reason_ratio`` is not used: output
  lengths already count the reasoning tokens.

Tenants are named ``client-<i>``; ServeGen has no service classes, so every priority is 0
and ``Workload.tenant_specs`` lists each client as ``elastic`` with its share of requests.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import pathlib
import re
from collections import defaultdict

import numpy as np
from attrs import frozen

from kvpolicy.kvmodel import Request
from kvpolicy.sim.workloads._calibration import AZURE_CONV_QUANTILES
from kvpolicy.sim.workloads._common import (
    MAX_TOKENS,
    FieldError,
    LastLine,
    RowLog,
    check_limit,
    check_path,
)
from kvpolicy.sim.workloads._errors import TraceFormatError
from kvpolicy.sim.workloads._tenants import TenantSpec
from kvpolicy.sim.workloads._workload import Workload, _positive_rate

__all__ = [
    "MAX_ARRIVALS",
    "MAX_UNLIMITED_REQUESTS",
    "MAX_WINDOW_ARRIVALS",
    "ServeGenClient",
    "load_servegen",
    "parse_pmf",
    "servegen_client_stats",
]

MAX_UNLIMITED_REQUESTS = 2_000_000
"""Most requests :func:`load_servegen` makes without an explicit ``limit`` or ``duration``."""

MAX_WINDOW_ARRIVALS = 10_000_000
"""Most arrivals one client's window may generate (its rate times its length, after scaling).

Arrivals are drawn a window at a time, so this bounds the memory of one draw (about 100 MB
of float64 times); ServeGen's busiest published window has about 1.5 million.
"""

MAX_ARRIVALS = 20_000_000
"""Most arrivals :func:`load_servegen` generates in all, with or without ``duration``."""

_COLUMNS = ("timestamp_s", "rate", "cv", "pattern", "param1", "param2")
_CHUNK = re.compile(r"chunk-(\d+)-trace\.csv")
_PATTERNS = frozenset({"", "Gamma", "Weibull"})


@frozen
class _Window:
    line: int
    start: float
    end: float
    rate: float
    cv: float


@frozen
class ServeGenClient:
    """Traffic statistics of one ServeGen client over its whole series."""

    client: int
    """The ``<i>`` of ``chunk-<i>-trace.csv``."""
    requests: float
    """Expected requests: ``sum(rate * window length)``."""
    share: float
    """``requests`` over all clients' requests."""
    cv: float
    """Request-weighted mean of the windows' inter-arrival CV."""
    active_fraction: float
    """Fraction of windows with a positive rate."""


def parse_pmf(text: str) -> tuple[np.ndarray, np.ndarray]:
    """Parse a ServeGen PMF string ``"{4: 0.25, 9: 0.75}"`` without evaluating it.

    Returns:
        ``(values, probabilities)``: (k,) int64 and (k,) float64 (k may be 0 for ``"{}"``).

    Raises:
        ValueError: not a ``{int: float, ...}`` literal, a negative or non-integer value, or
            a negative or non-finite probability.
    """
    s = text.strip()
    if not (s.startswith("{") and s.endswith("}")):
        raise ValueError(f"a PMF must be a {{value: probability}} literal: {s[:40]!r}")
    inner = s[1:-1].strip()
    if not inner:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64)
    if inner.count(":") != inner.count(",") + 1:
        raise ValueError(f"a PMF must be value: probability pairs: {s[:40]!r}")
    try:
        nums = np.array(inner.replace(":", ",").split(","), dtype=np.float64)
    except ValueError:
        raise ValueError(f"a PMF must hold numbers only: {s[:40]!r}") from None
    values, probs = nums[0::2], nums[1::2]
    if not (np.isfinite(values).all() and (values >= 0).all() and (values % 1 == 0).all()):
        raise ValueError(f"PMF values must be integers >= 0: {s[:40]!r}")
    if (values > MAX_TOKENS).any():
        raise ValueError(f"PMF values must be at most {MAX_TOKENS:,} tokens: {s[:40]!r}")
    if not (np.isfinite(probs).all() and (probs >= 0).all()):
        raise ValueError(f"PMF probabilities must be finite and >= 0: {s[:40]!r}")
    return values.astype(np.int64), probs


def _client_files(p: pathlib.Path) -> dict[int, pathlib.Path]:
    if p.is_dir():
        files = {}
        for f in p.iterdir():
            m = _CHUNK.fullmatch(f.name)
            if m:
                files[int(m.group(1))] = f
        if not files:
            services = sorted(
                d.name
                for d in p.iterdir()
                if d.is_dir() and any(_CHUNK.fullmatch(f.name) for f in d.iterdir())
            )
            hint = (
                f"; it holds ServeGen services, pass one of them: {', '.join(services)}"
                if services
                else ""
            )
            raise TraceFormatError(os.fspath(p), None, f"no chunk-<i>-trace.csv files in it{hint}")
        return dict(sorted(files.items()))
    m = _CHUNK.fullmatch(p.name)
    if m is None:
        raise TraceFormatError(os.fspath(p), None, "a ServeGen file is named chunk-<i>-trace.csv")
    return {int(m.group(1)): p}


def _number(fields: list[str], i: int, default: float | None = None) -> float:
    """Field ``i`` as a finite number >= 0 (``default`` when empty and one is given)."""
    if default is not None and not fields[i]:
        return default
    try:
        value = float(fields[i])
    except ValueError:
        raise FieldError(_COLUMNS[i], f"must be a number: {fields[i]!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise FieldError(_COLUMNS[i], f"must be finite and >= 0: {fields[i]!r}")
    return value


def _read_windows(path: pathlib.Path, log: RowLog, notes: list[str] | None = None) -> list[_Window]:
    """The rate windows of one client file; ``notes`` gets a note on a damaged file.

    ServeGen writes one row per window, idle windows included, so an empty file is a
    damaged copy: an error (with ``skip_bad``, a client without traffic and a note).
    """
    raw: list[tuple[int, float, float, float]] = []
    last = LastLine(_COLUMNS[-1])
    with path.open(encoding="utf-8", errors="replace") as f:
        for line_no, text in enumerate(f, start=1):
            if not text.strip():
                continue
            fields = text.rstrip("\r\n").split(",")
            try:
                if len(fields) != len(_COLUMNS):
                    raise ValueError(f"expected 6 fields, got {len(fields)}: {text.strip()!r}")
                last.observe(line_no, fields[-1])
                t, rate, cv = _number(fields, 0), _number(fields, 1), _number(fields, 2, 0.0)
                if fields[3] not in _PATTERNS:
                    raise FieldError(_COLUMNS[3], f"must be Gamma, Weibull or empty: {fields[3]!r}")
                if raw and t <= raw[-1][1]:
                    raise FieldError(_COLUMNS[0], f"must increase: {t!r} after {raw[-1][1]!r}")
            except ValueError as exc:
                log.bad(line_no, exc, os.fspath(path))
                continue
            raw.append((line_no, t, rate, cv))
    damaged = list(last.check(path))
    if not raw and log.skipped == 0:
        reason = (
            "no rows: a ServeGen client file has one row per window, idle ones included, "
            "so an empty file is a damaged copy"
        )
        if not log.skip_bad:
            raise TraceFormatError(os.fspath(path), None, reason)
        log.skipped += 1
        damaged.append(f"{os.fspath(path)}: {reason}; read as a client without traffic")
    if notes is not None:
        notes.extend(damaged)
    windows = []
    for i, (line_no, t, rate, cv) in enumerate(raw):
        # The last window lasts as long as the one before it (600 s in ServeGen's data).
        last_length = t - raw[i - 1][1] if i > 0 else 600.0
        end = raw[i + 1][1] if i + 1 < len(raw) else t + last_length
        windows.append(_Window(line_no, t, end, rate, cv))
    return windows


def servegen_client_stats(path: str | os.PathLike[str]) -> tuple[ServeGenClient, ...]:
    """Per-client share of requests and request-weighted CV, largest client first.

    Args:
        path: a ServeGen model directory (``chunk-<i>-trace.csv`` files) or one such file.

    Raises:
        TraceFormatError: a malformed file.
    """
    p = check_path(path)
    log = RowLog(path=os.fspath(p), skip_bad=False)
    rows = []
    for client, f in _client_files(p).items():
        ws = _read_windows(f, log)
        expected = sum(w.rate * (w.end - w.start) for w in ws)
        weighted = sum(w.rate * (w.end - w.start) * w.cv for w in ws)
        active = sum(1 for w in ws if w.rate > 0) / len(ws) if ws else 0.0
        rows.append((client, expected, weighted / expected if expected else 0.0, active))
    total = sum(r[1] for r in rows)
    stats = [ServeGenClient(c, e, e / total if total else 0.0, cv, a) for c, e, cv, a in rows]
    return tuple(sorted(stats, key=lambda s: (-s.requests, s.client)))


def _check_window_sizes(
    files: dict[int, pathlib.Path],
    windows: dict[int, list[_Window]],
    scale: float,
    start: float,
    end: float,
) -> None:
    """Refuse, before drawing anything, a window that would need too many arrivals.

    Raises:
        TraceFormatError: the first window in range with more than
            :data:`MAX_WINDOW_ARRIVALS` expected arrivals, naming its file, line and rate.
    """
    for client, ws in windows.items():
        for w in ws:
            if w.end <= start or w.start >= end:
                continue
            n = w.rate * scale * (w.end - w.start)
            if n > MAX_WINDOW_ARRIVALS:
                scaled = f" (scaled to {w.rate * scale:g})" if scale != 1.0 else ""
                raise TraceFormatError(
                    os.fspath(files[client]),
                    w.line,
                    f"{w.rate:g} req/s{scaled} over a {w.end - w.start:g} s window means "
                    f"about {n:,.0f} arrivals; at most {MAX_WINDOW_ARRIVALS:,} per window "
                    f"(about {MAX_WINDOW_ARRIVALS / (w.end - w.start):,.0f} req/s)",
                    _COLUMNS[1],
                )


def _gaps(rate: float, cv: float, size: int, rng: np.random.Generator) -> np.ndarray:
    if cv == 0:
        return np.full(size, 1.0 / rate)
    shape = 1.0 / (cv * cv)
    return rng.gamma(shape, 1.0 / (rate * shape), size=size)


def _window_arrivals(
    w: _Window, rate: float, carry: float | None, rng: np.random.Generator
) -> tuple[np.ndarray, float]:
    """Arrivals of one client in ``[w.start, w.end)`` and the first arrival after it."""
    t = carry if carry is not None else w.start + float(_gaps(rate, w.cv, 1, rng)[0])
    chunks = [np.array([t])]
    last = t
    while last < w.end:
        more = last + np.cumsum(_gaps(rate, w.cv, int(rate * (w.end - w.start) * 1.2) + 16, rng))
        chunks.append(more)
        last = float(more[-1])
    times = np.concatenate(chunks)
    cut = int(np.searchsorted(times, w.end, side="left"))
    return times[:cut], float(times[cut])


def _load_pmfs(
    path: pathlib.Path, log: RowLog
) -> dict[float, tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]]:
    """Window start -> (input PMF, output PMF), non-empty windows only."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise TraceFormatError(os.fspath(path), None, f"not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise TraceFormatError(os.fspath(path), None, "must be a JSON object of windows")
    out = {}
    for key, value in doc.items():
        try:
            start = float(key)
            if not isinstance(value, dict):
                raise ValueError(f"window {key!r} must be an object: {str(value)[:40]!r}")
            pmfs = []
            for field_name in ("input_tokens", "output_tokens"):
                text = value.get(field_name)
                if not isinstance(text, str):
                    raise ValueError(f"window {key!r} lacks a {field_name!r} PMF string")
                pmfs.append(parse_pmf(text))
        except ValueError as exc:
            if not log.skip_bad:
                raise TraceFormatError(os.fspath(path), None, f"window {key!r}: {exc}") from None
            log.skipped += 1  # the window counts as empty: its neighbours' PMFs are used
            continue
        if all(v.size and p.sum() > 0 for v, p in pmfs):
            out[start] = (pmfs[0], pmfs[1])
    return dict(sorted(out.items()))


def load_servegen(
    path: str | os.PathLike[str],
    *,
    skip_bad: bool = False,
    limit: int | None = None,
    rate: float | None = None,
    seed: int = 0,
    start: float = 0.0,
    duration: float | None = None,
    scale: float = 1.0,
    speedup: float = 1.0,
) -> Workload:
    """Synthesise a multi-tenant workload from ServeGen per-client series.

    Args:
        path: a ServeGen model directory (e.g. ``servegen-bailian/reason/deepseek-r1``) or one
            ``chunk-<i>-trace.csv``.
        skip_bad: skip malformed rows and count them: a rate row is read as an idle window,
            a window of a dataset file as an empty one.
        limit: keep the first ``limit`` requests (only the windows needed are drawn).
        rate: scale every client's rate so the mean aggregate rate over the selected time
            range is ``rate`` req/s; ``None`` keeps ServeGen's rates.
        seed: seed of the draws (>= 0).
        start: seconds into the series where the workload begins (its time 0).
        duration: seconds of series to use; ``None`` runs to the end.
        scale: ``scale`` times the requests: every client's rate multiplied by it (the
            series' shape kept); not with ``rate``.
        speedup: the series played ``speedup`` times faster: a day in ``86400 / speedup``
            s, the same requests (``start`` and ``duration`` stay in series seconds).

    Raises:
        TraceFormatError: a malformed file (naming the file and, for the CSV, the line and
            column); an empty client file (a damaged copy: with ``skip_bad``, a note and a
            client without traffic); a window whose rate would need more than
            :data:`MAX_WINDOW_ARRIVALS` arrivals (checked before drawing); no requests in
            the selected range.
        ValueError: bad arguments, more than :data:`MAX_UNLIMITED_REQUESTS` expected
            requests with neither ``limit`` nor ``duration``, or more than
            :data:`MAX_ARRIVALS` without ``limit``.

    Warns:
        TraceWarning: a client file whose last line looks cut short (see ``LastLine``).
    """
    p = check_path(path)
    limit = check_limit(limit)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"'seed' must be int: {seed!r}")
    if seed < 0:
        raise ValueError(f"'seed' must be >= 0: {seed}")
    if isinstance(start, bool) or not isinstance(start, int | float):
        raise TypeError(f"'start' must be a number: {start!r}")
    if not (math.isfinite(start) and start >= 0):
        raise ValueError(f"'start' must be finite and >= 0: {start!r}")
    if duration is not None:
        if isinstance(duration, bool) or not isinstance(duration, int | float):
            raise TypeError(f"'duration' must be a number or None: {duration!r}")
        if not (math.isfinite(duration) and duration > 0):
            raise ValueError(f"'duration' must be finite and > 0: {duration!r}")
    for name, value in (("scale", scale), ("speedup", speedup)):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"'{name}' must be a number: {value!r}")
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"'{name}' must be finite and > 0: {value!r}")
    if rate is not None and scale != 1.0:
        raise ValueError(f"give 'rate' or 'scale', not both: rate={rate!r}, scale={scale!r}")
    end = math.inf if duration is None else float(start) + float(duration)
    log = RowLog(path=os.fspath(p), skip_bad=skip_bad)
    files = _client_files(p)
    damaged: list[str] = []
    windows = {client: _read_windows(f, log, damaged) for client, f in files.items()}
    span_end = min(end, max((ws[-1].end for ws in windows.values() if ws), default=start))
    if span_end <= start:
        raise ValueError(f"'start' is past the end of the series ({span_end:g} s): {start!r}")
    expected = sum(
        w.rate * max(0.0, min(w.end, end) - max(w.start, start))
        for ws in windows.values()
        for w in ws
    )
    scale = float(scale)
    expected *= scale
    if rate is not None:
        rate = _positive_rate(rate)
        if expected <= 0:
            raise ValueError(f"'rate' cannot scale a series without traffic: {rate!r}")
        scale = rate * (span_end - start) / expected
        expected *= scale
    if limit is None and duration is None and expected > MAX_UNLIMITED_REQUESTS:
        raise ValueError(
            f"the series would give about {expected:,.0f} requests; pass 'limit' or "
            f"'duration' (at most {MAX_UNLIMITED_REQUESTS:,} without them)"
        )
    if limit is None and expected > MAX_ARRIVALS:
        raise ValueError(
            f"the selected range would give about {expected:,.0f} requests; at most "
            f"{MAX_ARRIVALS:,}: pass 'limit' or a shorter 'duration'"
        )
    _check_window_sizes(files, windows, scale, start, end)
    rng = np.random.default_rng(seed)
    # Draw window by window in time order, so that a limit stops early.
    order = sorted(
        (w.start, client, w) for client, ws in windows.items() for w in ws if w.end > start
    )
    carry: dict[int, float | None] = {}
    times: dict[int, list[np.ndarray]] = defaultdict(list)
    drawn = 0
    frontier = -math.inf  # every window ending by now has been drawn
    for w_start, client, w in order:
        if w_start >= end:
            break
        if limit is not None and drawn >= limit and w_start >= frontier:
            break
        r = w.rate * scale
        if r <= 0:
            carry[client] = None
            continue
        got, carry[client] = _window_arrivals(w, r, carry.get(client), rng)
        got = got[(got >= start) & (got < end)]
        times[client].append(got)
        drawn += got.size
        frontier = max(frontier, w.end)
    clients = sorted(times)
    all_t = np.concatenate([np.concatenate(times[c]) for c in clients] or [np.empty(0)])
    owner = np.concatenate(
        [np.full(sum(a.size for a in times[c]), c, dtype=np.int64) for c in clients]
        or [np.empty(0, dtype=np.int64)]
    )
    keep = np.lexsort((owner, all_t))
    if limit is not None:
        keep = keep[:limit]
    all_t, owner = all_t[keep], owner[keep]
    if all_t.size == 0:
        raise TraceFormatError(
            os.fspath(p), None, f"no requests between {start:g} s and {min(end, span_end):g} s"
        )
    lengths, notes = _draw_lengths(p, files, all_t, owner, rng, log)
    clamped = int(((lengths[:, 0] < 1) | (lengths[:, 1] < 1)).sum())
    lengths = np.maximum(lengths, 1)
    counters: dict[int, int] = defaultdict(int)
    requests = []
    for t, c, (pl, dl) in zip(
        ((all_t - start) / speedup).tolist(), owner.tolist(), lengths.tolist(), strict=True
    ):
        requests.append(
            Request(
                request_id=f"c{c}-{counters[c]}",
                prompt_len=pl,
                decode_len=dl,
                arrival_time=t,
                tenant=f"client-{c}",
            )
        )
        counters[c] += 1
    notes.insert(
        0,
        f"synthesised from ServeGen per-client series: Gamma gaps per 600 s window (rate, "
        f"CV), seed {seed}, start {start:g} s"
        + (f", rates scaled by {scale:.6g}" if scale != 1.0 else "")
        + (f", played {speedup:g}x faster" if speedup != 1.0 else ""),
    )
    notes.extend(damaged)
    if log.skipped:
        notes.append(
            f"{log.skipped} malformed rows skipped (a rate row as an idle window, "
            f"a length window as empty)"
        )
    if clamped:
        notes.append(f"{clamped} requests drew a zero length, raised to 1 token")
    # ServeGen has no service classes: every client is elastic with priority 0, and its
    # share is its share of this workload's requests.
    specs = tuple(
        TenantSpec(
            name=f"client-{c}",
            share=counters[c] / len(requests),
            service_class="elastic",
            priority=0,
        )
        for c in sorted(counters)
    )
    return Workload(
        name=p.name if p.is_dir() else p.stem,
        tenant_specs=specs,
        requests=tuple(requests),
        source=os.fspath(p),
        skipped_rows=log.skipped,
        clamped_rows=clamped,
        notes=tuple(notes),
    )


def _draw_lengths(
    p: pathlib.Path,
    files: dict[int, pathlib.Path],
    times: np.ndarray,
    owner: np.ndarray,
    rng: np.random.Generator,
    log: RowLog,
) -> tuple[np.ndarray, list[str]]:
    """(n, 2) int64 lengths for requests at ``times`` (absolute s) of clients ``owner``."""
    n = times.size
    out = np.empty((n, 2), dtype=np.int64)
    notes: list[str] = []
    datasets = {
        c: f.with_name(f"chunk-{c}-dataset.json")
        for c, f in files.items()
        if f.with_name(f"chunk-{c}-dataset.json").exists()
    }
    pmfs = {c: _load_pmfs(datasets[c], log) for c in sorted(set(owner.tolist())) if c in datasets}
    pooled: list[tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]] = []
    fallback_clients: set[int] = set()
    groups: dict[tuple[int, float], list[int]] = defaultdict(list)
    for i, (t, c) in enumerate(zip(times.tolist(), owner.tolist(), strict=True)):
        table = pmfs.get(c)
        if not table:
            groups[(c, math.nan)].append(i)
            fallback_clients.add(c)
            continue
        keys = list(table)
        j = bisect.bisect_right(keys, t) - 1
        groups[(c, keys[max(j, 0)])].append(i)
    if fallback_clients and not datasets:
        notes.append(
            "no chunk-<i>-dataset.json here: lengths from the Azure conversation trace's quantiles"
        )
    elif fallback_clients:
        if not pooled:
            others = [
                _load_pmfs(path, log) for c, path in sorted(datasets.items()) if c not in pmfs
            ]
            pooled = [pair for table in (*pmfs.values(), *others) for pair in table.values()]
        notes.append(
            f"{len(fallback_clients)} clients without length PMFs draw from all clients' "
            f"PMFs pooled"
        )
    for (c, key), idx_list in groups.items():
        idx = np.asarray(idx_list, dtype=np.int64)
        if math.isnan(key):
            if not datasets or not pooled:
                out[idx] = AZURE_CONV_QUANTILES.sample(idx.size, rng)
                continue
            picks = rng.integers(0, len(pooled), size=idx.size)
            for col in (0, 1):
                for k in np.unique(picks):
                    values, probs = pooled[int(k)][col]
                    sel = idx[picks == k]
                    out[sel, col] = rng.choice(values, size=sel.size, p=probs / probs.sum())
            continue
        for col, (values, probs) in enumerate(pmfs[c][key]):
            out[idx, col] = rng.choice(values, size=idx.size, p=probs / probs.sum())
    return out, notes
