"""The simulator's engine run against the wall clock, for requests that arrive live.

:class:`LiveEngine` drives the same phases as :class:`~kvpolicy.sim.Engine` (the batch, KV
residency, the step) but takes requests as they come and paces the iterations so that
simulated time runs with the wall clock (``speed`` times faster when asked). Each request's
output tokens are released when the simulated iteration that produced them ends, so a
client sees the time to first token and the time per output token that the roofline model
gives under the load the engine actually receives: queueing, continuous batching, the KV
pool and preemption included. It is a simulation, not a model: the tokens carry no text.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable

import attrs
import numpy as np

from kvpolicy.kvmodel import BlockPool, Request
from kvpolicy.sim._attention import AttentionModel
from kvpolicy.sim._batch import Batch
from kvpolicy.sim._config import EngineConfig, EvictionConfig, PreemptionConfig
from kvpolicy.sim._engine import pool_capacity_tokens
from kvpolicy.sim._errors import ConfigError
from kvpolicy.sim._recorder import Recorder
from kvpolicy.sim._residency import Evicting, KeepAll, Residency
from kvpolicy.sim._seq import Seq
from kvpolicy.sim._stack import Stack
from kvpolicy.sim._step import Step
from kvpolicy.sim._timing import TimingModel

__all__ = ["LiveEngine", "RequestTooLongError"]


class RequestTooLongError(ConfigError):
    """A request longer than the model's context or the KV pool (it can never run)."""


class _LiveRecorder(Recorder):
    """A recorder whose per-request arrays grow as requests arrive; no memory series (a
    server runs for as long as it is up)."""

    def __init__(self) -> None:
        super().__init__((), np.zeros(0, dtype=np.bool_))
        self.first_token: list[float] = []  # type: ignore[assignment]
        self.finish: list[float] = []  # type: ignore[assignment]
        self.first_admitted: list[float] = []  # type: ignore[assignment]
        self.preemptions: list[int] = []  # type: ignore[assignment]

    def register(self) -> int:
        """A slot for one more request; returns its index."""
        self.first_token.append(math.nan)
        self.finish.append(math.nan)
        self.first_admitted.append(math.nan)
        self.preemptions.append(0)
        return len(self.finish) - 1

    def sample(self, now: float, kv: int, resident: int, running: int, waiting: int) -> None:
        """Not kept: a live server's series would grow without bound."""


class _Client:
    __slots__ = ("emitted", "queue", "seq")

    def __init__(self, seq: Seq) -> None:
        self.seq = seq
        self.emitted = 0
        self.queue: asyncio.Queue[int | None] = asyncio.Queue()


class LiveEngine:
    """One simulated GPU server that serves requests as they arrive, in real time.

    Args:
        timing: the roofline time model (model and GPU).
        engine: engine limits (``max_macro_steps`` is forced to 1: tokens stream per
            iteration).
        stack: the server's policies (admission, eviction, preemption, tiers; a gateway is
            not used here: put the tenancy gateway in front of the server instead).
        eviction_config: budget and cadence of token eviction.
        preemption_config: recomputation or swap.
        attention: synthetic attention model for token eviction.
        speed: simulated seconds per wall-clock second (1.0: real time).

    Raises:
        ConfigError: a pool of less than one block, or a bad ``speed``.
    """

    def __init__(
        self,
        timing: TimingModel,
        engine: EngineConfig | None = None,
        stack: Stack | None = None,
        *,
        eviction_config: EvictionConfig | None = None,
        preemption_config: PreemptionConfig | None = None,
        attention: AttentionModel | None = None,
        speed: float = 1.0,
    ) -> None:
        if isinstance(speed, bool) or not isinstance(speed, int | float) or not speed > 0:
            raise ConfigError(f"'speed' must be a number > 0: {speed!r}")
        cfg = attrs.evolve(engine or EngineConfig(), max_macro_steps=1)
        stack = stack or Stack()
        self._tm = timing
        self._speed = float(speed)
        self._capacity = pool_capacity_tokens(timing, cfg)
        self._context = min(timing.model.max_context, self._capacity)
        pool = BlockPool(
            self._capacity // cfg.block_size,
            cfg.block_size,
            enable_prefix_caching=cfg.prefix_caching,
            record_dropped=stack.prefix_store is not None,
        )
        self._pool = pool
        self._rec = _LiveRecorder()
        ev_cfg = eviction_config or EvictionConfig()
        residency: Residency = KeepAll()
        if stack.eviction is not None:
            budget = int(ev_cfg.budget_fraction * self._capacity)
            residency = Evicting(
                stack.eviction, budget, ev_cfg, attention or AttentionModel(), 0, pool
            )
            self._context = timing.model.max_context
        self._batch = Batch(
            cfg,
            pool,
            residency,
            self._rec,
            timing,
            stack.admission,
            stack.preemption,
            preemption_config or PreemptionConfig(),
            stack.prefix_store,
        )
        self._step = Step(cfg, timing, self._batch, residency, self._finished)
        self._clients: dict[int, _Client] = {}
        self._incoming: list[Seq] = []
        self._wake = asyncio.Event()
        self._t0: float | None = None
        self._count = 0
        self.on_iteration: Callable[[], None] | None = None
        """Called after each iteration (a KV event publisher reads the cache then)."""

    @property
    def max_request_tokens(self) -> int:
        """Longest request (prompt plus output) the server can ever hold."""
        return self._context

    @property
    def in_flight(self) -> int:
        """Requests submitted and not finished (waiting, running or swapped)."""
        return len(self._clients)

    @property
    def block_size(self) -> int:
        """Tokens per KV block (prefix hashes passed to :meth:`generate` cover as many)."""
        return self._pool.block_size

    def load(self) -> tuple[int, int, float, int]:
        """``(running, waiting, kv_usage, num_blocks)`` now, as vLLM's gauges report them:
        requests in the batch, requests queued (swapped ones too), the fraction of KV blocks
        not free (cached prefix blocks on the free list count as free) and the pool's
        blocks."""
        batch, pool = self._batch, self._pool
        waiting = len(batch.waiting) + len(batch.swapped) + len(self._incoming)
        usage = 1.0 - pool.num_free_blocks / pool.num_blocks
        return len(batch.running), waiting, usage, pool.num_blocks

    def cached_blocks(self) -> frozenset[int]:
        """Hashes of the blocks the prefix cache holds now (reusable by a later prompt)."""
        return self._pool.cached_hashes()

    @property
    def prefix_hit_tokens(self) -> int:
        """Prompt tokens served from the prefix cache since the start."""
        return int(self._rec.prefix_hit)

    def _finished(self, s: Seq, now: float, iteration: int) -> None:
        self._rec.finished(s.idx, now)
        observer = self._batch.observer
        if observer is not None:
            observer.observe_completion(s.req, now)

    # ----------------------------------------------------------------- requests
    async def generate(
        self,
        prompt_len: int,
        max_tokens: int,
        *,
        tenant: str = "default",
        prefix_hashes: tuple[int, ...] = (),
    ) -> AsyncIterator[int]:
        """Serve one request; yields the number of new output tokens each time some are
        produced, ``max_tokens`` in all. Cancelling the iteration aborts the request.

        Raises:
            RequestTooLongError: the request can never fit (its length and the limit in the
                message).
            ValueError: a count below 1.

        ``prefix_hashes`` are the chained hashes of the prompt's full blocks of
        :attr:`block_size` tokens, for the prefix cache (those beyond the prompt's length
        are dropped).
        """
        for name, value in (("prompt_len", prompt_len), ("max_tokens", max_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"'{name}' must be an int >= 1: {value!r}")
        if prompt_len + max_tokens > self._context or prompt_len + 1 > self._capacity:
            raise RequestTooLongError(
                f"this request needs {prompt_len + max_tokens} tokens ({prompt_len} of prompt, "
                f"{max_tokens} of output); {self._tm.model.name} on {self._tm.gpu.name} holds "
                f"at most {self._context}"
            )
        idx = self._rec.register()
        self._count += 1
        req = Request(
            f"live-{self._count}",
            prompt_len,
            max_tokens,
            arrival_time=self._now(),
            tenant=tenant,
            prefix_hashes=prefix_hashes[: prompt_len // self._pool.block_size],
            hash_block_size=self._pool.block_size,
        )
        client = _Client(Seq(idx, req, req.prefix_hashes))
        self._clients[idx] = client
        self._incoming.append(client.seq)
        self._wake.set()
        done = False
        try:
            while True:
                n = await client.queue.get()
                if n is None:
                    done = True
                    return
                yield n
        finally:
            if not done:
                self._batch.abort(client.seq)
                self._incoming = [s for s in self._incoming if s is not client.seq]
            self._clients.pop(idx, None)

    def _now(self) -> float:
        loop = asyncio.get_running_loop()
        if self._t0 is None:
            self._t0 = loop.time()
        return (loop.time() - self._t0) * self._speed

    # --------------------------------------------------------------------- loop
    async def run(self) -> None:
        """Serve until cancelled: admit what arrived, run one iteration, wait until the wall
        clock reaches its end, release the tokens it produced."""
        loop = asyncio.get_running_loop()
        batch, step = self._batch, self._step
        self._now()
        while True:
            if batch.idle and not self._incoming:
                self._wake.clear()
                await self._wake.wait()
            step.now = max(step.now, self._now())
            for s in self._incoming:
                batch.waiting.append(s)
            self._incoming.clear()
            preempted, budget, reserve, _ = step.prepare()
            batch.admit(step.now, step.step, 0 if preempted else budget, reserve)
            if not batch.running:
                await asyncio.sleep(0.001)
                continue
            step.run(math.inf, self._rec.first_output)
            batch.offload(step.now)
            if self.on_iteration is not None:
                self.on_iteration()
            assert self._t0 is not None
            delay = self._t0 + step.now / self._speed - loop.time()
            await asyncio.sleep(max(delay, 0.0))
            self._release()

    def _release(self) -> None:
        done = self._rec.finish
        for idx, client in list(self._clients.items()):
            new = client.seq.generated - client.emitted
            if new > 0:
                client.emitted += new
                client.queue.put_nowait(new)
            if not math.isnan(done[idx]):
                client.queue.put_nowait(None)
