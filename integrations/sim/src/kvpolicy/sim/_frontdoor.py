"""The front door: arrivals, the gateway in front of the server, and clients' retries."""

from __future__ import annotations

import heapq
import math

import numpy as np
from numpy.typing import NDArray

from kvpolicy.kvmodel import Request, RequestGate, ThroughputScalable
from kvpolicy.sim._config import GatewayConfig
from kvpolicy.sim._errors import ConfigError
from kvpolicy.sim._recorder import Recorder
from kvpolicy.tenancy import RefreshConfig, ThroughputRefresh

__all__ = ["FrontDoor"]


class FrontDoor:
    """Requests reach the server here, in arrival order.

    Without a gateway every request that can run enters the waiting queue when it arrives.
    With one, each arrival (and each retry) is checked: an admitted request enters, a denied
    one (429) comes back after its Retry-After (at least ``min_backoff_s``) until its
    client has been denied more than ``max_retries`` times and gives up. With ``refresh``
    the gateway's throughput estimate follows the service the server is observed to give
    (:class:`~kvpolicy.sim.ThroughputRefresh`).

    Args:
        requests: the workload, in arrival order.
        arrivals: (n,) float64 arrival times.
        recorder: where denials, give-ups and rejections are counted.
        gate: the gateway, or None.
        config: how the gateway's clients retry.
        refresh: how the gateway's throughput estimate follows the server (None: never).

    Raises:
        ConfigError: ``refresh`` with a gateway that cannot be rescaled.
    """

    def __init__(
        self,
        requests: tuple[Request, ...],
        arrivals: NDArray[np.float64],
        recorder: Recorder,
        gate: RequestGate | None,
        config: GatewayConfig,
        refresh: RefreshConfig | None = None,
    ) -> None:
        self._reqs = requests
        self._arrivals: list[float] = arrivals.tolist()  # read one at a time: floats
        self._rec = recorder
        self._gate = gate
        self._max_retries = config.max_retries
        self._min_backoff = config.min_backoff_s
        self._next = 0
        self._retries: list[tuple[float, int]] = []  # (time, request index)
        self._refresh: ThroughputRefresh | None = None
        if gate is not None and refresh is not None and refresh.window_s > 0:
            if not isinstance(gate, ThroughputScalable):
                raise ConfigError(
                    f"gateway.refresh_s = {refresh.window_s:g} needs a gateway that can be "
                    f"rescaled (ThroughputScalable): {type(gate).__name__} cannot; set it to 0"
                )
            self._refresh = ThroughputRefresh(gate, refresh)
            recorder.gateway_refreshes = self._refresh.refreshes

    def next_event(self) -> float:
        """Time of the next arrival or client retry (``inf`` when none is left)."""
        t = math.inf
        if self._next < len(self._reqs):
            t = self._arrivals[self._next]
        if self._retries and self._retries[0][0] < t:
            t = self._retries[0][0]
        return t

    def arrive(self, now: float, times: list[float] | None = None) -> list[int]:
        """Indices of the requests that enter the server at ``now`` (arrivals, then
        retries), in order; ``times`` gets, for each, when it knocked (its arrival or its
        retry, at or before ``now``)."""
        entered: list[int] = []
        n = len(self._reqs)
        i = self._next
        rejected = self._rec.rejected
        arrivals = self._arrivals
        while i < n and arrivals[i] <= now:
            if rejected[i]:
                self._rec.done += 1
            elif self._gate is None or self._knock(i, now):
                entered.append(i)
                if times is not None:
                    times.append(self._arrivals[i])
            i += 1
        self._next = i
        while self._retries and self._retries[0][0] <= now:
            at, j = heapq.heappop(self._retries)
            if self._knock(j, now):
                entered.append(j)
                if times is not None:
                    times.append(at)
        return entered

    def _knock(self, i: int, now: float) -> bool:
        """Request ``i`` reaches the gateway now (first arrival or a retry)."""
        assert self._gate is not None
        decision = self._gate.check(self._reqs[i], now)
        if decision.admitted:
            return True
        rec = self._rec
        rec.denials[i] += 1
        reason = decision.reason or "unspecified"
        rec.denial_reasons[reason] = rec.denial_reasons.get(reason, 0) + 1
        if self._refresh is not None:
            self._refresh.denied(reason)
        if rec.denials[i] > self._max_retries:
            rec.gave_up[i] = True
            rec.done += 1
            return False
        # A client honours Retry-After; a zero Retry-After is retried after min_backoff_s.
        wait = max(decision.retry_after, self._min_backoff)
        heapq.heappush(self._retries, (now + wait, i))
        return False

    def release(self, i: int, now: float) -> None:
        """Admitted request ``i`` finished at ``now``: the gateway gets back what it held."""
        if self._gate is not None:
            request = self._reqs[i]
            self._gate.release(request, now)
            if self._refresh is not None:
                first = float(self._rec.first_token[i])
                tpot = (now - first) / (request.decode_len - 1) if request.decode_len > 1 else 0.0
                self._refresh.completed(
                    request.prompt_len + request.decode_len, first - request.arrival_time, tpot
                )

    def server_iteration(self, started: float, now: float, busy: bool) -> None:
        """The server ran an iteration (or a run of decode iterations) from ``started`` to
        ``now``; ``busy`` if requests waited, its batch was full or it used its whole token
        budget."""
        if self._refresh is not None:
            self._refresh.iteration(started, now, busy)
