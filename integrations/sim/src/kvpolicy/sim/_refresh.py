"""The gateway's idea of the server's throughput, refreshed from the service observed.

A token-pool gateway sized in shares of the server admits tokens at the rate the server was
*estimated* to sustain (:func:`kvpolicy.sim.server_capacity`, from the workload's typical
lengths). When the estimate is off — a trace whose lengths drift, prefix caching that makes
prompts cheaper, a time model calibrated on another machine — the gateway either throttles
work the server could take (429s, clients who give up) or lets a queue build at the server.
Every ``window_s`` seconds of simulated time :class:`ThroughputRefresh` compares what the
server served with the estimate and rescales the gate (kvmodel's ``ThroughputScalable``):

* **saturated** (the server was busy — requests waited, or its batch was full — in at
  least ``saturated_share`` of the window's iterations): the server ran flat out, so what
  it served *is* its throughput: the estimate moves to the observed rate (down or up).
* **throttled** (not saturated, yet the gateway denied requests for lack of tokens): the
  buckets, not the server, were the bottleneck: the estimate rises by ``probe``.
* otherwise the estimate was not what limited anyone, and stays.

A step is clamped to ``[1 / max_step, max_step]`` and ignored within ``deadband``; a window
with fewer than ``min_completions`` completions says too little and changes nothing.
"""

from __future__ import annotations

import math

from attrs import field, frozen
from attrs.validators import ge, gt, instance_of, le

from kvpolicy.kvmodel import ThroughputScalable

__all__ = ["RefreshConfig", "ThroughputRefresh", "refresh_factor"]


@frozen
class RefreshConfig:
    """How often and how far the gateway's throughput estimate follows the server."""

    window_s: float = field(default=0.0, converter=float, validator=ge(0.0))
    """Seconds of simulated time between two refreshes; 0 never refreshes."""
    saturated_share: float = field(default=0.9, converter=float, validator=[gt(0.0), le(1.0)])
    """Share of a window's busy iterations (requests waiting or the batch full) that makes
    it saturated."""
    probe: float = field(default=1.5, converter=float, validator=gt(1.0))
    """Factor by which a throttled window raises the estimate."""
    max_step: float = field(default=2.0, converter=float, validator=gt(1.0))
    """Largest factor (and smallest, as its inverse) of one refresh."""
    deadband: float = field(default=0.05, converter=float, validator=[ge(0.0), le(0.5)])
    """Relative changes smaller than this are ignored."""
    min_completions: int = field(default=20, validator=[instance_of(int), ge(1)])
    """Completions a window needs before it can say anything."""


def refresh_factor(
    config: RefreshConfig,
    estimate: float,
    served_tokens: float,
    window_s: float,
    busy_share: float,
    token_denials: int,
    completions: int,
) -> float:
    """The factor to apply to the gateway's throughput estimate after one window.

    Args:
        config: the refresh rules.
        estimate: tokens/s the gateway assumes now (> 0).
        served_tokens: prompt plus output tokens of the requests that finished in the window.
        window_s: the window's length in seconds (> 0).
        busy_share: share of the window's iterations in which the server was busy.
        token_denials: 429s of the window answered by a token bucket.
        completions: requests that finished in the window.

    Returns:
        1.0 for no change, else a factor in ``[1 / max_step, max_step]``.
    """
    if completions < config.min_completions or not (estimate > 0 and window_s > 0):
        return 1.0
    if busy_share >= config.saturated_share:
        factor = served_tokens / window_s / estimate
    elif token_denials > 0:
        factor = config.probe
    else:
        return 1.0
    factor = min(config.max_step, max(1.0 / config.max_step, factor))
    return 1.0 if abs(factor - 1.0) < config.deadband or not math.isfinite(factor) else factor


class ThroughputRefresh:
    """Feeds :func:`refresh_factor` from one run and rescales the gate.

    The front door tells it whether each iteration was busy, each completion and each 429;
    at the end of every window it rescales the gate and starts the next window.

    Args:
        gate: the gateway to rescale.
        config: the refresh rules (``window_s > 0``).
    """

    __slots__ = (
        "_busy",
        "_completions",
        "_config",
        "_denials",
        "_gate",
        "_iterations",
        "_served",
        "_start",
        "refreshes",
    )

    def __init__(self, gate: ThroughputScalable, config: RefreshConfig) -> None:
        if config.window_s <= 0:
            raise ValueError(f"'window_s' must be > 0 to refresh: {config.window_s!r}")
        self._gate = gate
        self._config = config
        self._start = 0.0
        self._busy = 0
        self._iterations = 0
        self._served = 0.0
        self._completions = 0
        self._denials = 0
        self.refreshes: list[tuple[float, float]] = []
        """(time, tokens/s assumed from then on) of every change made."""

    def completed(self, tokens: int) -> None:
        """A request of ``tokens`` prompt plus output tokens finished."""
        self._served += tokens
        self._completions += 1

    def denied(self, reason: str) -> None:
        """The gateway answered 429 for ``reason``."""
        if reason == "tokens":
            self._denials += 1

    def iteration(self, now: float, busy: bool) -> None:
        """One server iteration ended at ``now``; ``busy`` if requests waited or the batch
        was full."""
        self._iterations += 1
        self._busy += busy
        elapsed = now - self._start
        if elapsed < self._config.window_s:
            return
        gate = self._gate
        factor = refresh_factor(
            self._config,
            gate.tokens_per_s,
            self._served,
            elapsed,
            self._busy / self._iterations,
            self._denials,
            self._completions,
        )
        if factor != 1.0:
            gate.scale_throughput(factor, now)
            self.refreshes.append((now, gate.tokens_per_s))
        self._start = now
        self._busy = self._iterations = self._completions = self._denials = 0
        self._served = 0.0
