"""kvpolicy-tenancy: TokenPoolGate decisions per second against a plain token bucket.

100,000 requests (20,000 with ``--quick``) from 50 tenants (5 dedicated, 5 guaranteed,
20 elastic, 15 spot, 5 preemptible) arrive as a Poisson stream at a pool that is over-asked,
so every check of §4.3 denies some of them. Each admitted request is released when it
finishes. The same event stream runs through

* ``TokenPoolGate`` (the ordered checks, priorities, debt and burst updates, state store),
* a baseline written here: one token bucket per tenant, the rate limit the paper compares
  against (tokens per minute, no concurrency, KV or priority).

Figures: decisions (checks plus releases) per second of each, and
``gate_over_bucket_time``, the gate's seconds per decision over the bucket's, measured in
the same run.
"""

from __future__ import annotations

import heapq
import pathlib
import random
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _harness import parse_args, write_result

from kvpolicy.kvmodel import Request
from kvpolicy.tenancy import Resources, TokenEntitlement, TokenPool, TokenPoolGate

BPT = 131_072  # Llama-3-8B KV bytes per token
CLASSES = ["dedicated"] * 5 + ["guaranteed"] * 5 + ["elastic"] * 20 + ["spot"] * 15
CLASSES += ["preemptible"] * 5


def _pool() -> TokenPool:
    rng = random.Random(1)
    ents = []
    for i, cls in enumerate(CLASSES):
        conc = rng.randint(2, 6)
        base = Resources(100.0 * conc, 1024 * BPT * conc, conc)
        burst = (
            None if cls == "guaranteed" else Resources(200.0 * conc, 2048 * BPT * conc, 2 * conc)
        )
        ents.append(
            TokenEntitlement(
                f"t{i:02d}",
                cls,
                base,
                burst,
                slo_target_s=rng.choice([0.5, 2.0, 5.0, 30.0]),
                max_output_tokens=256,
            )
        )
    return TokenPool("bench", Resources(12_000.0, 160 * 1024 * BPT, 160), ents)


def _requests(n: int) -> list[tuple[Request, float]]:
    """``n`` arrivals at 60 per second and each request's service time in seconds."""
    rng = random.Random(0)
    now = 0.0
    out = []
    for i in range(n):
        now += rng.expovariate(60.0)
        prompt = rng.randint(16, 1024)
        decode = rng.randint(8, 256)
        tenant = f"t{rng.randrange(len(CLASSES)):02d}"
        out.append((Request(f"r{i}", prompt, decode, now, tenant), 0.5 + decode / 40.0))
    return out


class TokenBucket:
    """One token bucket per tenant: rate ``tokens_per_s``, depth 60 s of it."""

    def __init__(self, pool: TokenPool) -> None:
        self.rate = {e.tenant: e.limits.tokens_per_s for e in pool.entitlements}
        self.level = {t: 60.0 * r for t, r in self.rate.items()}
        self.stamp = dict.fromkeys(self.rate, 0.0)

    def check(self, request: Request, now: float) -> bool:
        t = request.tenant
        rate = self.rate[t]
        level = min(60.0 * rate, self.level[t] + (now - self.stamp[t]) * rate)
        self.stamp[t] = now
        cost = request.prompt_len + 256
        if cost > level:
            self.level[t] = level
            return False
        self.level[t] = level - cost
        return True

    def release(self, request: Request, now: float) -> None:
        return None


def _drive(
    gate: TokenPoolGate | TokenBucket, stream: list[tuple[Request, float]]
) -> tuple[float, int, int]:
    """Seconds, decisions and admissions of ``stream`` through ``gate``."""
    pending: list[tuple[float, int, Request]] = []
    decisions = admitted = 0
    is_gate = isinstance(gate, TokenPoolGate)
    start = time.perf_counter()
    for i, (req, service) in enumerate(stream):
        now = req.arrival_time
        while pending and pending[0][0] <= now:
            done, _, old = heapq.heappop(pending)
            gate.release(old, done)
            decisions += 1
        ok = gate.check(req, now).admitted if is_gate else gate.check(req, now)  # type: ignore[union-attr]
        decisions += 1
        if ok:
            admitted += 1
            heapq.heappush(pending, (now + service, i, req))
    while pending:
        done, _, old = heapq.heappop(pending)
        gate.release(old, done)
        decisions += 1
    return time.perf_counter() - start, decisions, admitted


def main() -> None:
    args = parse_args(__doc__ or "")
    n = 20_000 if args.quick else 100_000
    pool = _pool()
    stream = _requests(n)
    best: dict[str, tuple[float, int, int]] = {}
    for _ in range(3):  # best of three: these machines are shared
        for name, gate in (("gate", TokenPoolGate(pool, BPT)), ("bucket", TokenBucket(pool))):
            run = _drive(gate, stream)
            if name not in best or run[0] < best[name][0]:
                best[name] = run
    g_sec, g_dec, g_adm = best["gate"]
    b_sec, b_dec, b_adm = best["bucket"]
    figures: dict[str, float | int] = {
        "requests": n,
        "tenants": len(CLASSES),
        "gate_decisions_per_s": g_dec / g_sec,
        "bucket_decisions_per_s": b_dec / b_sec,
        "gate_over_bucket_time": (g_sec / g_dec) / (b_sec / b_dec),
        "gate_admitted_fraction": g_adm / n,
        "bucket_admitted_fraction": b_adm / n,
        "gate_microseconds_per_decision": 1e6 * g_sec / g_dec,
    }
    reasons: dict[str, int] = {}
    gate = TokenPoolGate(pool, BPT)
    pending: list[tuple[float, int, Request]] = []
    for i, (req, service) in enumerate(stream):
        while pending and pending[0][0] <= req.arrival_time:
            done, _, old = heapq.heappop(pending)
            gate.release(old, done)
        decision = gate.check(req, req.arrival_time)
        reasons[decision.reason or "admitted"] = reasons.get(decision.reason or "admitted", 0) + 1
        if decision.admitted:
            heapq.heappush(pending, (req.arrival_time + service, i, req))
    for reason, count in sorted(reasons.items()):
        figures[f"gate_fraction_{reason.replace('-', '_')}"] = count / n
    write_result("tenancy", figures, args.out)
    for key, value in figures.items():
        print(f"  {key}: {value:.4g}" if isinstance(value, float) else f"  {key}: {value}")


if __name__ == "__main__":
    main()
