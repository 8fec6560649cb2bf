"""A backend's load as the router sees it: scraped vLLM metrics, their age, and the
gateway's own counts that stand in when the scrape is stale or missing.

The gateway scrapes each backend's Prometheus ``/metrics`` and reads vLLM's gauges
``vllm:num_requests_running``, ``vllm:num_requests_waiting`` and the KV-cache usage
(``vllm:kv_cache_usage_perc``; ``vllm:gpu_cache_usage_perc`` before vLLM 0.10), summed
over the engines a server runs (usage: their mean), and ``vllm:cache_config_info``'s
``num_gpu_blocks`` and ``block_size`` labels when present. :func:`parse_vllm_metrics` is
pure; an exposition without those gauges, or with a value that is not a finite
non-negative number (a usage above 1), raises :class:`MetricsError` and the scrape is
ignored (the caller logs it).

The gateway's own in-flight requests and tokens per backend are exact and always current,
but count only what this gateway replica sent; the scrape sees every replica's requests
but is as old as its age. :func:`load_view` combines them: outstanding requests are the
larger of the two (so a burst sent since the scrape is never missed), the scraped KV usage
is kept while fresh, and a stale scrape is dropped for the gateway's counts alone.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

from attrs import frozen

__all__ = [
    "KV_USAGE",
    "RUNNING",
    "WAITING",
    "LoadSignals",
    "MetricsError",
    "ScrapedMetrics",
    "load_view",
    "parse_vllm_metrics",
]

RUNNING = "vllm:num_requests_running"
"""Requests in the running batch (a gauge per engine)."""
WAITING = "vllm:num_requests_waiting"
"""Requests queued for the batch."""
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
"""KV-cache usage in [0, 1] (current name first, then the name before vLLM 0.10)."""
CACHE_INFO = "vllm:cache_config_info"
"""An info gauge whose labels carry ``num_gpu_blocks`` and ``block_size``."""

_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
_WANTED = frozenset({RUNNING, WAITING, CACHE_INFO, *KV_USAGE})


class MetricsError(ValueError):
    """An exposition the gateway cannot take a backend's load from (why in the message)."""


@frozen
class ScrapedMetrics:
    """What one scrape of a backend said."""

    running: int
    """Requests running (summed over its engines)."""
    waiting: int
    """Requests waiting."""
    kv_usage: float | None
    """KV-cache usage in [0, 1] (None: not exported)."""
    num_gpu_blocks: int | None = None
    """KV blocks of the server (None: not exported)."""
    block_size: int | None = None
    """Tokens per KV block (None: not exported)."""


def _count(name: str, value: float) -> int:
    if not (math.isfinite(value) and value >= 0):
        raise MetricsError(f"{name} must be a finite count >= 0: {value!r}")
    return round(value)


def parse_vllm_metrics(text: str) -> ScrapedMetrics:
    """The load in a Prometheus text exposition of a vLLM server (see the module docstring).

    Raises:
        MetricsError: no running or waiting gauge, or a value that is not a finite number
            >= 0 (a KV usage above 1), named with the metric.
    """
    found: dict[str, list[float]] = {}
    info: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] == "#" or not line.startswith("vllm:"):
            continue
        m = _LINE.match(line)
        if m is None:
            raise MetricsError(f"unreadable line: {line[:120]!r}")
        name, labels, value = m.groups()
        if name not in _WANTED:
            continue
        try:
            number = float(value)
        except ValueError:
            raise MetricsError(f"{name} is not a number: {value[:40]!r}") from None
        if name == CACHE_INFO and labels:
            info.update(_LABEL.findall(labels))
            continue
        found.setdefault(name, []).append(number)
    if RUNNING not in found or WAITING not in found:
        raise MetricsError(f"no {RUNNING} or {WAITING} in the exposition")
    running = sum(_count(RUNNING, v) for v in found[RUNNING])
    waiting = sum(_count(WAITING, v) for v in found[WAITING])
    usage = None
    for name in KV_USAGE:
        if name in found:
            values = found[name]
            for v in values:
                if not (math.isfinite(v) and 0.0 <= v <= 1.0):
                    raise MetricsError(f"{name} must be in [0, 1]: {v!r}")
            usage = math.fsum(values) / len(values)
            break
    blocks = _label_int(info, "num_gpu_blocks")
    size = _label_int(info, "block_size")
    return ScrapedMetrics(running, waiting, usage, blocks, size)


def _label_int(info: dict[str, str], key: str) -> int | None:
    try:
        value = int(info[key])
    except (KeyError, ValueError):
        return None
    return value if value > 0 else None


class LoadSignals(NamedTuple):
    """A backend's load as given to its router view."""

    running: int
    """Requests running."""
    waiting: int
    """Requests waiting (on the backend, or sent and not yet seen by a scrape)."""
    kv_usage: float
    """KV-cache usage in [0, 1]."""
    age_s: float
    """Age of the oldest signal used (0: the gateway's own counts only, always current)."""
    scraped: bool
    """Whether a fresh scrape was used."""


def load_view(
    in_flight: int,
    in_flight_tokens: int,
    scraped: ScrapedMetrics | None,
    scrape_age_s: float,
    max_age_s: float,
    kv_capacity_tokens: int | None,
) -> LoadSignals:
    """The load the router sees: a fresh scrape joined with the gateway's own counts, or
    those counts alone when the scrape is stale (older than ``max_age_s``) or missing.

    Requests the gateway sent that no fresh scrape has seen running count as waiting, so
    without one every request in flight is waiting: the queue is then the gateway's own
    count, and a router scoring queues (llm-d's default weights: prefix, queue, KV) still
    spreads new prompts by it, where counting them as running would leave every backend
    tied and send each new prompt to the first one.

    Args:
        in_flight: requests this gateway has on the backend now.
        in_flight_tokens: their prompt and output tokens (charged bounds).
        scraped: the last scrape (None: none yet, or the last one failed).
        scrape_age_s: its age in seconds.
        max_age_s: the age beyond which it is stale.
        kv_capacity_tokens: the backend's KV capacity in tokens, to estimate its usage from
            the gateway's tokens when no fresh usage is scraped (None: unknown, usage 0).
    """
    own_usage = 0.0
    if kv_capacity_tokens:
        own_usage = min(1.0, in_flight_tokens / kv_capacity_tokens)
    if scraped is None or not scrape_age_s <= max_age_s:
        return LoadSignals(0, in_flight, own_usage, 0.0, False)
    outstanding = max(scraped.running + scraped.waiting, in_flight)
    running = min(scraped.running, outstanding)
    usage = own_usage if scraped.kv_usage is None else scraped.kv_usage
    return LoadSignals(running, outstanding - running, usage, max(0.0, scrape_age_s), True)
