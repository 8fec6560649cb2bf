"""Grouped-query attention's two products without repeated KV heads: bit for bit the
products of transformers' eager attention, which repeats them (``repeat_interleave``)."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvpolicy.evict import _gqa  # noqa: E402
from kvpolicy.evict.hf import grouped_output, grouped_scores  # noqa: E402


@pytest.fixture(params=["as shipped", "always grouped"])
def threshold(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The shipped size under which heads are repeated, and none (every size grouped)."""
    if request.param == "always grouped":
        monkeypatch.setattr(_gqa, "REPEAT_BELOW", 0)
    return str(request.param)


def _repeated(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> tuple:
    groups = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(groups, dim=1)
    v = value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, k.transpose(2, 3))
    weights = torch.softmax(scores * 0.125, dim=-1)
    return scores, weights, torch.matmul(weights, v)


@pytest.mark.parametrize(
    ("rows", "heads", "kv_heads", "q", "k"),
    [
        (r, h, kvh, q, k)
        for (r, (h, kvh), q, k) in itertools.product(
            (1, 3), ((9, 3), (8, 2), (4, 4), (6, 1)), (1, 5), (1, 17, 1100)
        )
    ],
)
def test_same_floats_as_repeated_kv_heads(
    threshold: str, rows: int, heads: int, kv_heads: int, q: int, k: int
) -> None:
    """Scores and outputs equal the repeated form's exactly, for decode (one query) and
    prompt (several) shapes, several group counts (one: plain attention) and cache lengths,
    each grouped as shipped (small ones repeated) and grouped whatever its size."""
    gen = torch.Generator().manual_seed(rows * 1000 + heads * 100 + q * 10 + k)
    query = torch.randn(rows, heads, q, 64, generator=gen)
    key = torch.randn(rows, kv_heads, k, 64, generator=gen)
    value = torch.randn(rows, kv_heads, k, 64, generator=gen)
    scores, weights, out = _repeated(query, key, value)
    assert torch.equal(grouped_scores(query, key), scores)
    assert torch.equal(grouped_output(weights, value), out)


def test_a_cut_cache_view(threshold: str) -> None:
    """Keys that are a gathered or sliced view of a larger cache (as a harness's cut
    leaves them) give the same floats too."""
    gen = torch.Generator().manual_seed(7)
    query = torch.randn(2, 9, 1, 64, generator=gen)
    big = torch.randn(2, 3, 300, 64, generator=gen)
    key, value = big[:, :, 10:250], big.flip(2)[:, :, :240]
    scores, weights, out = _repeated(query, key, value)
    assert torch.equal(grouped_scores(query, key), scores)
    assert torch.equal(grouped_output(weights, value), out)


def test_heads_not_a_multiple_of_kv_heads() -> None:
    """A query-head count that is no multiple of the KV heads is refused by name."""
    message = r"query heads \(9\) must be a multiple of the KV heads \(2\)"
    with pytest.raises(ValueError, match=message):
        grouped_scores(torch.zeros(1, 9, 1, 8), torch.zeros(1, 2, 4, 8))
    with pytest.raises(ValueError, match="multiple of the KV heads"):
        grouped_output(torch.zeros(1, 9, 1, 4), torch.zeros(1, 2, 4, 8))
