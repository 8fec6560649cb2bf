"""Capacity planning: how much KV fits beside the weights, and how many sequences of a length.

Pure functions over :class:`ModelSpec` and :class:`GPUSpec`.
"""

from __future__ import annotations

import math

from attrs import field, frozen
from attrs.validators import ge, instance_of, le

from kvpolicy.kvmodel._specs import GPUSpec, ModelSpec

__all__ = ["CapacityPlan", "kv_budget_bytes", "max_sequences", "num_blocks", "plan_capacity"]


def _check_fraction(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"'{name}' must be a number: {value!r}")
    if not (0.0 <= value <= 1.0) or math.isnan(value):
        raise ValueError(f"'{name}' must be in [0, 1]: {value!r}")


def _check_int(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"'{name}' must be int: {value!r}")
    if value < minimum:
        raise ValueError(f"'{name}' must be >= {minimum}: {value!r}")


def kv_budget_bytes(
    model: ModelSpec,
    gpu: GPUSpec,
    gpu_memory_utilization: float = 0.9,
    workspace_bytes: int = 0,
) -> int:
    """Bytes left for the KV cache: ``hbm · utilisation − weights − workspace`` (at least 0).

    Args:
        model: the model served.
        gpu: the accelerator.
        gpu_memory_utilization: fraction of HBM the server may use, in [0, 1].
        workspace_bytes: activations and other non-KV memory reserved, in bytes (>= 0).
    """
    _check_fraction("gpu_memory_utilization", gpu_memory_utilization)
    _check_int("workspace_bytes", workspace_bytes, 0)
    usable = int(gpu.hbm_bytes * gpu_memory_utilization)
    return max(0, usable - model.weight_bytes() - workspace_bytes)


def max_sequences(budget_bytes: int, context_len: int, bytes_per_token: int) -> int:
    """How many sequences of ``context_len`` tokens fit: ``floor(budget / (S · c))``."""
    _check_int("budget_bytes", budget_bytes, 0)
    _check_int("context_len", context_len, 1)
    _check_int("bytes_per_token", bytes_per_token, 1)
    return budget_bytes // (context_len * bytes_per_token)


def num_blocks(budget_bytes: int, block_size: int, bytes_per_token: int) -> int:
    """Paged blocks of ``block_size`` tokens that fit in ``budget_bytes``."""
    _check_int("budget_bytes", budget_bytes, 0)
    _check_int("block_size", block_size, 1)
    _check_int("bytes_per_token", bytes_per_token, 1)
    return budget_bytes // (block_size * bytes_per_token)


@frozen
class CapacityPlan:
    """The result of :func:`plan_capacity` (all sizes in bytes or tokens)."""

    model: str = field(validator=instance_of(str))
    """Model name."""
    gpu: str = field(validator=instance_of(str))
    """GPU name."""
    context_len: int = field(validator=[instance_of(int), ge(1)])
    """Sequence length ``S`` planned for."""
    bytes_per_token: int = field(validator=[instance_of(int), ge(1)])
    """KV bytes per token."""
    weight_bytes: int = field(validator=[instance_of(int), ge(0)])
    """Model weights."""
    kv_budget_bytes: int = field(validator=[instance_of(int), ge(0)])
    """Memory left for KV."""
    max_sequences: int = field(validator=[instance_of(int), ge(0)])
    """Sequences of ``context_len`` that fit."""
    kv_capacity_tokens: int = field(validator=[instance_of(int), ge(0)])
    """Tokens of KV that fit."""
    block_size: int = field(validator=[instance_of(int), ge(1)])
    """Tokens per paged block."""
    num_blocks: int = field(validator=[instance_of(int), ge(0)])
    """Paged blocks in the pool."""
    gpu_memory_utilization: float = field(validator=[ge(0.0), le(1.0)])
    """Fraction of HBM used."""

    def as_dict(self) -> dict[str, object]:
        """JSON-ready dictionary of the plan."""
        return {
            "model": self.model,
            "gpu": self.gpu,
            "context_len": self.context_len,
            "bytes_per_token": self.bytes_per_token,
            "weight_bytes": self.weight_bytes,
            "kv_budget_bytes": self.kv_budget_bytes,
            "max_sequences": self.max_sequences,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "block_size": self.block_size,
            "num_blocks": self.num_blocks,
            "gpu_memory_utilization": self.gpu_memory_utilization,
        }


def plan_capacity(
    model: ModelSpec,
    gpu: GPUSpec,
    context_len: int | None = None,
    *,
    gpu_memory_utilization: float = 0.9,
    workspace_bytes: int = 0,
    block_size: int = 16,
) -> CapacityPlan:
    """Plan the KV capacity of ``model`` on ``gpu`` for sequences of ``context_len`` tokens.

    Args:
        model: the model served.
        gpu: the accelerator.
        context_len: sequence length ``S``; defaults to the model's maximum context.
        gpu_memory_utilization: fraction of HBM the server may use.
        workspace_bytes: non-KV memory reserved besides weights.
        block_size: tokens per paged block.

    Raises:
        ValueError: ``context_len`` is not in ``[1, model.max_context]`` or another
            argument is out of range.
    """
    s = model.max_context if context_len is None else context_len
    _check_int("context_len", s, 1)
    if s > model.max_context:
        raise ValueError(
            f"'context_len' must be <= the max context of {model.name} ({model.max_context}): {s}"
        )
    budget = kv_budget_bytes(model, gpu, gpu_memory_utilization, workspace_bytes)
    c = model.kv_bytes_per_token()
    return CapacityPlan(
        model=model.name,
        gpu=gpu.name,
        context_len=s,
        bytes_per_token=c,
        weight_bytes=model.weight_bytes(),
        kv_budget_bytes=budget,
        max_sequences=max_sequences(budget, s, c),
        kv_capacity_tokens=budget // c,
        block_size=block_size,
        num_blocks=num_blocks(budget, block_size, c),
        gpu_memory_utilization=float(gpu_memory_utilization),
    )
