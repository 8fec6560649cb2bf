"""Seed 004's two experiments (§5.2, §5.3) replayed in discrete time.

A closed-loop client population sends requests through a :class:`TokenPoolGate` to a small
model of one serving replica: every admitted request needs ``prompt_len + decode_len``
tokens of work, a slot serves at most ``tokens_per_s / concurrency`` of them a second, and
when more requests are in flight than there are slots they share the replica's throughput
(the backend queues what the gateway over-commits). A denied client waits its Retry-After;
a finished client sends its next request after a think time (exponential, ``think_s`` on
average; 0: at once). The time to first token of a request is the wait from its first
attempt to its admission plus its prompt at one slot's rate.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import attrs

from kvpolicy.kvmodel import Request
from kvpolicy.tenancy._entitlements import Resources, TokenEntitlement, TokenPool
from kvpolicy.tenancy._gate import GateConfig, TokenPoolGate

__all__ = ["EXPERIMENTS", "Replay", "replay_experiment"]

BPT = 147_456  # KV bytes per token of Qwen3-8B (36 layers, 8 KV heads, head dim 128, bf16)
DT = 0.05  # seconds per step of the replay
PER_SLOT = 30.0  # tokens/s of one slot: 16 slots serve 480 tokens/s (240 of them output)


@attrs.define
class Client:
    """One closed-loop client of a tenant, active from ``start`` to ``stop``."""

    tenant: str
    start: float
    stop: float
    lengths: tuple[int, int]
    next_time: float = 0.0
    waiting: Request | None = None
    busy: bool = False


@attrs.define
class Replay:
    """What the replay saw: decisions, per-step samples and times to first token."""

    decisions: list[tuple[float, str, str]] = attrs.field(factory=list)
    samples: list[dict[str, object]] = attrs.field(factory=list)
    ttft: dict[str, list[float]] = attrs.field(factory=dict)

    def denials(self, tenant: str, reason: str, t0: float = 0.0, t1: float = 1e9) -> int:
        return sum(
            1 for t, who, why in self.decisions if who == tenant and why == reason and t0 <= t < t1
        )

    def throttle_rate(self, tenant: str, t0: float, t1: float) -> float:
        mine = [why for t, who, why in self.decisions if who == tenant and t0 <= t < t1]
        return sum(1 for why in mine if why != "ok") / len(mine)

    def series(self, key: str, tenant: str) -> list[tuple[float, float]]:
        return [(float(s["time"]), s[key][tenant]) for s in self.samples]  # type: ignore[index,arg-type]


def replay(
    gate: TokenPoolGate,
    clients: list[Client],
    capacity_at: Callable[[float], Resources],
    duration: float,
    seed: int = 0,
    events: Callable[[TokenPoolGate, float], None] | None = None,
    think_s: float = 0.0,
) -> Replay:
    """Run ``clients`` against ``gate`` for ``duration`` seconds; return what happened.

    ``events(gate, now)`` runs at the start of every step (tenants joining and leaving);
    ``think_s`` is the mean pause of a client between a completion and its next request.
    """
    rng = random.Random(seed)
    out = Replay()
    running: dict[str, tuple[Request, Client, float]] = {}  # id -> request, client, work left
    capacity = gate.pool_state().capacity
    tenants = sorted({c.tenant for c in clients})
    counter = 0
    step = 0
    while step * DT < duration:
        now = step * DT
        step += 1
        cap = capacity_at(now)
        if cap != capacity:
            gate.set_capacity(cap, now)
            capacity = cap
        if events is not None:
            events(gate, now)
        # Serve: each request gets its slot's rate, or a fair share when over-committed.
        if running:
            rate = min(PER_SLOT, cap.tokens_per_s / len(running))
            for rid, (req, client, left) in list(running.items()):
                left -= rate * DT
                if left <= 0:
                    del running[rid]
                    gate.release(req, now)
                    client.busy = False
                    client.next_time = now + (rng.expovariate(1 / think_s) if think_s else 0.0)
                else:
                    running[rid] = (req, client, left)
        for client in clients:
            if client.busy or not client.start <= now < client.stop or now < client.next_time:
                continue
            if client.waiting is None:
                counter += 1
                lo, hi = client.lengths
                client.waiting = Request(
                    f"q{counter}", rng.randint(lo, hi), rng.randint(lo, hi), now, client.tenant
                )
            decision = gate.check(client.waiting, now)
            out.decisions.append((now, client.tenant, decision.reason or "ok"))
            if decision.admitted:
                req = client.waiting
                wait = now - req.arrival_time + req.prompt_len / PER_SLOT
                out.ttft.setdefault(client.tenant, []).append(wait)
                running[req.request_id] = (req, client, float(req.total_len))
                client.waiting = None
                client.busy = True
            else:
                client.next_time = now + decision.retry_after
        flight: Counter[str] = Counter(c.tenant for _, c, _ in running.values())
        out.samples.append(
            {
                "time": now,
                "in_flight": {t: flight[t] for t in tenants},
                "debt": {t: gate.usage(t).debt for t in tenants},
                "priority": {t: gate.priority(t) for t in tenants if gate.entitlement(t)},
                "pool": len(running),
            }
        )
    return out


def _resources(slots: int, tps: float | None = None, kv_tokens: int = 512) -> Resources:
    """``slots`` slots of ``PER_SLOT`` tokens/s and ``kv_tokens`` tokens of KV each."""
    return Resources(PER_SLOT * slots if tps is None else tps, kv_tokens * BPT * slots, slots)


# The paper's gateway over-commits a full pool for requests above the threshold (§4.3).
_PAPER = GateConfig(overcommit=True)


def _cross_class() -> Replay:
    """Experiment 1 (§5.2): two guaranteed tenants and a spot tenant on 16 slots."""
    ents = [
        TokenEntitlement("guaranteed-a", "guaranteed", _resources(6), max_output_tokens=64),
        TokenEntitlement("spot-b", "spot", _resources(10), max_output_tokens=64),
    ]
    late = TokenEntitlement("guaranteed-c", "guaranteed", _resources(6), max_output_tokens=64)
    gate = TokenPoolGate(TokenPool("qwen3-8b", _resources(16), ents), BPT, config=_PAPER)

    def join_and_leave(gate: TokenPoolGate, now: float) -> None:
        # guaranteed-c's entitlement is bound at 30 s and unbound once its last request
        # (sent before 60 s) has finished.
        bound = "guaranteed-c" in {e.tenant for e in gate.entitlements}
        if not bound and 30.0 <= now < 60.0:
            gate.bind(late, now)
        elif bound and now >= 60.0 and gate.usage("guaranteed-c").in_flight == 0:
            gate.unbind("guaranteed-c", now)

    clients = (
        [Client("guaranteed-a", 0, 90, (64, 64)) for _ in range(6)]
        + [Client("spot-b", 0, 90, (64, 64)) for _ in range(10)]
        + [Client("guaranteed-c", 30, 60, (64, 64)) for _ in range(6)]
    )
    return replay(gate, clients, lambda t: _resources(16), 90.0, events=join_and_leave)


def _fair_share() -> Replay:
    """Experiment 2 (§5.3): three elastic tenants, an outage halving capacity at 30-120 s.

    Each tenant has 7 clients that pause 1 s on average between a completion and their
    next request: the paper's copilot holds "5-7 slots" of its 7 while it is never denied,
    so its clients are not all busy all the time (zero pause holds 7 throughout).
    """

    def elastic(tenant: str, slo: float) -> TokenEntitlement:
        # Baseline of 5 slots and half the pool's normal throughput; burst to 7 slots.
        return TokenEntitlement(
            tenant,
            "elastic",
            _resources(5, tps=240),
            _resources(7, tps=480),
            slo_target_s=slo,
            max_output_tokens=176,
        )

    ents = [elastic("elastic-copilot", 0.5), elastic("elastic-synth", 30.0)]
    reports = elastic("elastic-reports", 5.0)
    gate = TokenPoolGate(TokenPool("qwen3-8b", _resources(16), ents), BPT, config=_PAPER)

    def join(gate: TokenPoolGate, now: float) -> None:
        # Reports' entitlement is bound when it joins at 210 s ("total baselines rise to 15
        # of 16 available slots"), so the pool-average SLO is copilot's and synth's 15.25 s
        # until then, which gives the paper's weights 93.8 and 20.3.
        if now >= 210.0 and gate.entitlement("elastic-reports") is None:
            gate.bind(reports, now)

    clients = (
        [Client("elastic-copilot", 0, 300, (32, 176)) for _ in range(7)]
        + [Client("elastic-synth", 0, 300, (32, 176)) for _ in range(7)]
        + [Client("elastic-reports", 210, 300, (32, 176)) for _ in range(7)]
    )
    return replay(
        gate,
        clients,
        lambda t: _resources(8 if 30 <= t < 120 else 16),
        300.0,
        seed=4,
        events=join,
        think_s=1.0,
    )


EXPERIMENTS: dict[str, Callable[[], Replay]] = {
    "cross-class": _cross_class,
    "fair-share": _fair_share,
}
"""The paper's experiments by name."""


def _p99(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def replay_experiment(scenario: str) -> tuple[Replay, list[dict[str, Any]]]:
    """Replay ``scenario`` (``"cross-class"`` or ``"fair-share"``).

    Returns:
        The replay and one summary per entitlement: ``name``, ``admitted``, ``denied``,
        ``low_priority_denied`` (denials on priority), ``peak_debt``, ``p99_ttft_s``.

    Raises:
        ValueError: unknown ``scenario``.
    """
    if scenario not in EXPERIMENTS:
        raise ValueError(f"'scenario' must be one of {sorted(EXPERIMENTS)}: {scenario!r}")
    run = EXPERIMENTS[scenario]()
    names = sorted({who for _, who, _ in run.decisions})
    rows = []
    for name in names:
        mine = [why for _, who, why in run.decisions if who == name]
        debts = [float(v) for _, v in run.series("debt", name)]
        rows.append(
            {
                "name": name,
                "admitted": sum(why == "ok" for why in mine),
                "denied": sum(why != "ok" for why in mine),
                "low_priority_denied": sum(why == "priority" for why in mine),
                "peak_debt": max(debts, default=0.0),
                "p99_ttft_s": _p99(run.ttft.get(name, [])),
            }
        )
    return run, rows
