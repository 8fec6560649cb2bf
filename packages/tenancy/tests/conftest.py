"""Fixtures of the kvpolicy-tenancy tests: seeded randomness and small real objects."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from kvpolicy.kvmodel import Request
from kvpolicy.tenancy import Resources, TokenEntitlement, TokenPool


@pytest.fixture(autouse=True)
def _seed() -> None:
    random.seed(0)


@pytest.fixture
def make_request() -> Callable[..., Request]:
    """Factory of requests with sequential ids."""
    counter = iter(range(1_000_000))

    def make(
        tenant: str = "a", prompt_len: int = 64, decode_len: int = 64, arrival_time: float = 0.0
    ) -> Request:
        return Request(
            request_id=f"r{next(counter)}",
            prompt_len=prompt_len,
            decode_len=decode_len,
            arrival_time=arrival_time,
            tenant=tenant,
        )

    return make


@pytest.fixture
def small_pool() -> TokenPool:
    """16 slots, 240 tokens/s, 1 MB of KV: guaranteed ``g`` (4 slots), elastic ``e`` (4, burst
    8) and spot ``s`` (8); requests are charged ``prompt_len + 64`` tokens."""
    return TokenPool(
        "small",
        Resources(240, 1_000_000, 16),
        [
            TokenEntitlement(
                "g", "guaranteed", Resources(60, 250_000, 4), slo_target_s=1.0, max_output_tokens=64
            ),
            TokenEntitlement(
                "e",
                "elastic",
                Resources(60, 250_000, 4),
                Resources(120, 500_000, 8),
                slo_target_s=2.0,
                max_output_tokens=64,
            ),
            TokenEntitlement(
                "s", "spot", Resources(120, 500_000, 8), slo_target_s=3.0, max_output_tokens=64
            ),
        ],
    )
