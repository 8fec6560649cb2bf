"""Fixtures of the kvpolicy-tiers tests: seeded randomness and small real objects."""

from __future__ import annotations

import json
import math
import pathlib
import random
from collections.abc import Callable

import numpy as np
import pytest

from kvpolicy.tiers import (
    FixedTTL,
    ReuseAnalysis,
    TieredPrefixStore,
    TierSpec,
    TTLPolicy,
    analyze_reuse,
)

TRACES = pathlib.Path(__file__).resolve().parents[3] / ".." / "shared" / "traces"
MOONCAKE = TRACES / "mooncake-fast25-conversation" / "conversation_trace.jsonl"


@pytest.fixture(autouse=True)
def _seed() -> None:
    random.seed(0)
    np.random.seed(0)


def _tier(
    name: str,
    blocks: int,
    *,
    read: float = 100.0,
    write: float = 50.0,
    latency: float = 0.5,
    price: float = 1.0,
) -> TierSpec:
    """A tier holding ``blocks`` blocks of 10 bytes (bandwidth in bytes per second)."""
    return TierSpec(
        name=name,
        capacity_bytes=10 * blocks,
        read_bandwidth=read,
        write_bandwidth=write,
        latency=latency,
        price_per_gib_hour=price,
    )


@pytest.fixture(scope="session")
def make_tier() -> Callable[..., TierSpec]:
    """Factory of tiers holding a number of 10-byte blocks."""
    return _tier


@pytest.fixture(scope="session")
def make_store() -> Callable[..., TieredPrefixStore]:
    """Factory of DRAM+disk stores of 10-byte blocks, sized in blocks.

    DRAM reads one block in 0.5 + 10/100 = 0.6 s, disk in 2.0 + 10/10 = 3.0 s.
    """

    def make(
        dram: int = 2,
        disk: int = 3,
        *,
        dram_ttl: float = math.inf,
        disk_ttl: float = math.inf,
        ttl: TTLPolicy | None = None,
    ) -> TieredPrefixStore:
        policy = ttl if ttl is not None else FixedTTL({"dram": dram_ttl, "disk": disk_ttl})
        return TieredPrefixStore(
            (
                _tier("dram", dram, read=100.0, latency=0.5),
                _tier("disk", disk, read=10.0, latency=2.0),
            ),
            block_bytes=10,
            ttl=policy,
        )

    return make


@pytest.fixture(scope="session")
def mooncake() -> list[tuple[float, list[int]]]:
    """The Mooncake conversation trace as (seconds, hash_ids) rows; skips when absent."""
    if not MOONCAKE.is_file():
        pytest.skip(f"public trace not found at {MOONCAKE} (see ../shared/traces)")
    rows = []
    with MOONCAKE.open() as f:
        for line in f:
            r = json.loads(line)
            rows.append((r["timestamp"] / 1000.0, r["hash_ids"]))
    return rows


@pytest.fixture(scope="session")
def mooncake_reuse(mooncake: list[tuple[float, list[int]]]) -> ReuseAnalysis:
    """The reuse analysis of the Mooncake trace (computed once)."""
    return analyze_reuse(mooncake)
