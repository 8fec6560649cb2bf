"""Capacity planning: how much KV fits beside the weights, and how many sequences of a length.

Pure functions over :class:`ModelSpec` and :class:`GPUSpec`. With ``tp``-way tensor
parallelism and ``pp``-way pipeline parallelism every figure is per GPU: each GPU holds
``1 / (tp · pp)`` of the weights, ``max(1, H_kv / tp)`` KV heads (KV heads are replicated when
``tp > H_kv``, as serving engines do) of ``ceil(L / pp)`` layers, and a token's KV is spread
over all of them, so the token capacity of the group is the per-GPU budget over the per-GPU
bytes per token.
"""

from __future__ import annotations

import math

from attrs import field, frozen
from attrs.validators import ge, instance_of, le

from kvpolicy.kvmodel._errors import KVModelError
from kvpolicy.kvmodel._presets import GPU_PRESETS
from kvpolicy.kvmodel._specs import GPUSpec, ModelSpec

__all__ = [
    "CapacityError",
    "CapacityPlan",
    "kv_budget_bytes",
    "max_sequences",
    "num_blocks",
    "plan_capacity",
]


class CapacityError(KVModelError, ValueError):
    """Not one sequence fits on the GPUs asked for; the message says what would."""


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
    *,
    tp: int = 1,
    pp: int = 1,
) -> int:
    """Bytes left for the KV cache on each GPU: ``hbm · utilisation − weights / (tp · pp) −
    workspace`` (at least 0).

    Args:
        model: the model served.
        gpu: the accelerator (every GPU of the group is one of these).
        gpu_memory_utilization: fraction of HBM the server may use, in [0, 1].
        workspace_bytes: activations and other non-KV memory reserved per GPU, in bytes (>= 0).
        tp: tensor-parallel GPUs (see :meth:`ModelSpec.check_parallel`).
        pp: pipeline-parallel stages.
    """
    _check_fraction("gpu_memory_utilization", gpu_memory_utilization)
    _check_int("workspace_bytes", workspace_bytes, 0)
    usable = int(gpu.hbm_bytes * gpu_memory_utilization)
    return max(0, usable - model.weight_bytes_per_gpu(tp, pp) - workspace_bytes)


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
    tp: int = field(default=1, validator=[instance_of(int), ge(1)])
    """Tensor-parallel GPUs; byte figures are per GPU."""
    pp: int = field(default=1, validator=[instance_of(int), ge(1)])
    """Pipeline-parallel stages; byte figures are per GPU."""

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
            "tp": self.tp,
            "pp": self.pp,
        }


def plan_capacity(
    model: ModelSpec,
    gpu: GPUSpec,
    context_len: int | None = None,
    *,
    gpu_memory_utilization: float = 0.9,
    workspace_bytes: int = 0,
    block_size: int = 16,
    tp: int = 1,
    pp: int = 1,
) -> CapacityPlan:
    """Plan the KV capacity of ``model`` on ``tp · pp`` GPUs for sequences of ``context_len``.

    Byte figures of the plan (``bytes_per_token``, ``weight_bytes``, ``kv_budget_bytes``) are
    per GPU; token, sequence and block counts are those of the whole group.

    Args:
        model: the model served.
        gpu: the accelerator.
        context_len: sequence length ``S``; defaults to the model's maximum context.
        gpu_memory_utilization: fraction of HBM the server may use.
        workspace_bytes: non-KV memory reserved per GPU besides weights.
        block_size: tokens per paged block.
        tp: tensor-parallel GPUs: divides the query heads, divides or is a multiple of the
            KV heads (KV heads replicated beyond ``H_kv``).
        pp: pipeline-parallel stages (at most the layer count).

    Raises:
        CapacityError: not one sequence of ``context_len`` fits; the message names the
            smallest ``tp`` that fits on this GPU and the GPUs that fit at this ``tp``.
        ValueError: ``context_len`` is not in ``[1, model.max_context]``, ``tp`` or ``pp``
            cannot split the model, or another argument is out of range.
    """
    s = model.max_context if context_len is None else context_len
    _check_int("context_len", s, 1)
    if s > model.max_context:
        raise ValueError(
            f"'context_len' must be <= the max context of {model.name} ({model.max_context}): {s}"
        )
    budget = kv_budget_bytes(model, gpu, gpu_memory_utilization, workspace_bytes, tp=tp, pp=pp)
    c = model.kv_bytes_per_token_per_gpu(tp, pp)
    plan = CapacityPlan(
        model=model.name,
        gpu=gpu.name,
        context_len=s,
        bytes_per_token=c,
        weight_bytes=model.weight_bytes_per_gpu(tp, pp),
        kv_budget_bytes=budget,
        max_sequences=max_sequences(budget, s, c),
        kv_capacity_tokens=budget // c,
        block_size=block_size,
        num_blocks=num_blocks(budget, block_size, c),
        gpu_memory_utilization=float(gpu_memory_utilization),
        tp=tp,
        pp=pp,
    )
    if plan.max_sequences == 0:
        fits = _fits(model, s, gpu_memory_utilization, workspace_bytes, pp)
        raise CapacityError(
            f"{model.name} does not fit one sequence of {s:,} tokens on {gpu.name} with "
            f"tp={tp}, pp={pp}: {plan.weight_bytes / 2**30:,.1f} GiB of weights per GPU leave "
            f"{budget / 2**30:,.2f} GiB for KV, one sequence needs {s * c / 2**30:,.2f} GiB; "
            f"{_suggestion(fits, gpu.name, tp)}"
        )
    return plan


def _fits(
    model: ModelSpec, context_len: int, utilisation: float, workspace: int, pp: int
) -> dict[str, int]:
    """The smallest valid ``tp`` at which one sequence fits, for each GPU preset."""
    valid = model.tensor_parallel_sizes()
    smallest: dict[str, int] = {}
    for name, spec in GPU_PRESETS.items():
        for n in valid:
            budget = kv_budget_bytes(model, spec, utilisation, workspace, tp=n, pp=pp)
            if budget >= context_len * model.kv_bytes_per_token_per_gpu(n, pp):
                smallest[name] = n
                break
    return smallest


def _suggestion(fits: dict[str, int], gpu: str, tp: int) -> str:
    here = f"needs tp >= {fits[gpu]} on {gpu}" if gpu in fits else f"no tp fits on {gpu}"
    others = [name for name, n in fits.items() if n <= tp and name != gpu]
    if others:
        return f"{here}; at tp={tp} it fits on {', '.join(others)}"
    return f"{here}; elsewhere: " + ", ".join(
        f"tp >= {n} on {name}" for name, n in fits.items() if name != gpu
    )
