"""Eager attention's two products under grouped-query attention, without repeating the
KV heads.

A model with grouped-query attention (SmolLM2: 9 query heads over 3 KV heads) reads KV
head ``j`` from query heads ``j * groups .. (j + 1) * groups - 1``. transformers' eager
attention repeats each KV head ``groups`` times (``repeat_interleave``) before its two
matrix products: a copy of every cached key and value in every layer at every step, which
at a few thousand cached tokens costs more than the products themselves (SmolLM2's shapes on
a 2-core CPU, one thread: at 6 rows of 2,000 cached tokens, 34-70 ms a layer with the
copies against 9-14 without; a whole decode step of one row at 4,000 tokens, the quality
harness's attention, 290-336 ms of CPU against 173-226).

:func:`grouped_scores` and :func:`grouped_output` make the same products one query group
at a time, each a batched product of the same shape as before on the KV heads as they
are: every output element is the same dot product over the same operands, computed by the
same kernel, so the floats are those of the repeated form bit for bit
(``tests/test_gqa.py`` checks it against ``repeat_interleave`` over batch sizes, cache
lengths, query lengths and group counts). One row over one KV head (multi-query
attention, a batch of one) is the exception the functions make: there they repeat.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["grouped_output", "grouped_scores"]


def _groups(heads: int, kv_heads: int) -> int:
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"query heads ({heads}) must be a multiple of the KV heads ({kv_heads})")
    return heads // kv_heads


REPEAT_BELOW = 1 << 21
"""Bytes of repeated keys (or values) under which the functions repeat them: a copy that
small costs less than the products' extra calls (SmolLM2's shapes on a CPU: at 1 row and
256 cached tokens, 590 KB, 255 us a layer repeated against 313 grouped; at 6 rows and 256
tokens, 3.5 MB, 13.9 ms against 1.0)."""


def _repeats(rows: int, kv_heads: int, groups: int, per_head: int) -> bool:
    """Whether to repeat the KV heads of ``groups`` > 1 (``per_head``: bytes of one head's
    keys): below :data:`REPEAT_BELOW` the copy is cheaper; and one row
    over one KV head (multi-query attention, a batch of one) is repeated whatever its size,
    since a product over a batch of one matrix may take another kernel than the repeated
    form's over ``heads`` (CPU torch 2.13 gives other floats for prompts of several
    tokens)."""
    return rows * kv_heads == 1 or rows * kv_heads * groups * per_head < REPEAT_BELOW


def grouped_scores(query: Any, key: Any) -> Any:
    """``query @ key.T`` per query head, each reading its KV head.

    Args:
        query: (rows, heads, q, head_dim).
        key: (rows, kv_heads, k, head_dim), ``heads`` a multiple of ``kv_heads``.

    Returns:
        (rows, heads, q, k): what ``query @ key.repeat_interleave(heads // kv_heads,
        dim=1).transpose(2, 3)`` gives, bit for bit.
    """
    groups = _groups(int(query.shape[1]), int(key.shape[1]))
    rows, kv_heads = int(query.shape[0]), int(key.shape[1])
    if groups == 1:
        return torch.matmul(query, key.transpose(2, 3))
    per_head = int(key.shape[2]) * int(key.shape[3]) * key.element_size()
    if _repeats(rows, kv_heads, groups, per_head):
        return torch.matmul(query, key.repeat_interleave(groups, dim=1).transpose(2, 3))
    return _per_group(query, key.transpose(2, 3), groups)


def grouped_output(weights: Any, value: Any) -> Any:
    """``weights @ value`` per query head, each reading its KV head.

    Args:
        weights: (rows, heads, q, k) attention weights.
        value: (rows, kv_heads, k, head_dim), ``heads`` a multiple of ``kv_heads``.

    Returns:
        (rows, heads, q, head_dim): what ``weights @ value.repeat_interleave(heads //
        kv_heads, dim=1)`` gives, bit for bit.
    """
    kv_heads = int(value.shape[1])
    groups = _groups(int(weights.shape[1]), kv_heads)
    if groups == 1:
        return torch.matmul(weights, value)
    per_head = int(value.shape[2]) * int(value.shape[3]) * value.element_size()
    if _repeats(int(weights.shape[0]), kv_heads, groups, per_head):
        return torch.matmul(weights, value.repeat_interleave(groups, dim=1))
    return _per_group(weights, value, groups)


def _per_group(a: Any, b: Any, groups: int) -> Any:
    """``a @ b`` with query head ``j * groups + g`` of ``a`` (rows, heads, q, x) reading head
    ``j`` of ``b`` (rows, kv_heads, x, y): one batched product per group ``g``, as the
    repeated form's is (``matmul`` of 4-d tensors is ``bmm`` over rows * heads)."""
    rows, heads, q, x = (int(s) for s in a.shape)
    kv_heads, y = int(b.shape[1]), int(b.shape[3])
    by_group = a.reshape(rows, kv_heads, groups, q, x)
    flat = b.reshape(rows * kv_heads, x, y)
    parts = [
        torch.bmm(by_group[:, :, g].reshape(rows * kv_heads, q, x), flat).reshape(
            rows, kv_heads, q, y
        )
        for g in range(groups)
    ]
    # (rows, kv_heads, groups, q, y): query head j * groups + g at [j, g].
    return torch.stack(parts, dim=2).reshape(rows, heads, q, y)
