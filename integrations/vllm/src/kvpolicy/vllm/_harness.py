"""vLLM's real scheduler on CPU, driven by a fake model runner (no weights, no GPU).

This is how vLLM's own scheduler tests build a scheduler (``tests/v1/core/utils.py``): a
``KVCacheConfig`` with one full-attention group and a model config read from a local
``config.json`` with ``skip_tokenizer_init=True``. :func:`run_workload` then loops
``schedule()`` -> a ``ModelRunnerOutput`` with one sampled token per request that finished
its prefill -> ``update_from_output()``, so the scheduler, the KV cache manager and the
block pool are vLLM's own and only the model is fake. Used by the tests, the stock-vs-
kvpolicy comparison and the simulator cross-check.
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from attrs import field, frozen
from attrs.validators import ge, instance_of

__all__ = ["RunStats", "WorkloadRequest", "make_scheduler", "run_workload", "tiny_model_dir"]

_TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def tiny_model_dir(directory: str | os.PathLike[str] | None = None) -> pathlib.Path:
    """A folder with a tiny Llama ``config.json`` (no weights, no tokenizer), written once."""
    path = pathlib.Path(directory or pathlib.Path(tempfile.gettempdir()) / "kvpolicy-tiny-llama")
    path.mkdir(parents=True, exist_ok=True)
    cfg = path / "config.json"
    if not cfg.exists():
        cfg.write_text(json.dumps(_TINY_LLAMA))
    return path


def make_scheduler(
    scheduler_cls: type[Any] | None = None,
    *,
    num_blocks: int,
    block_size: int = 16,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 2048,
    max_model_len: int = 16384,
    enable_prefix_caching: bool = False,
    kvpolicy: Mapping[str, Any] | None = None,
    scheduling_policy: str = "fcfs",
    model_dir: str | os.PathLike[str] | None = None,
    kv_events: Mapping[str, Any] | None = None,
) -> Any:
    """vLLM's scheduler (``AsyncScheduler`` unless ``scheduler_cls``) on ``num_blocks`` blocks.

    Args:
        scheduler_cls: the class to build (e.g. :class:`~kvpolicy.vllm.KVPolicyScheduler`).
        num_blocks: KV blocks of the pool (vLLM keeps one as its null block).
        block_size: tokens per block.
        max_num_seqs: most running requests.
        max_num_batched_tokens: per-step token budget.
        max_model_len: longest request.
        enable_prefix_caching: vLLM's automatic prefix caching.
        kvpolicy: the kvpolicy config, passed as ``additional_config["kvpolicy"]``.
        scheduling_policy: ``fcfs`` or ``priority``.
        model_dir: folder of a model ``config.json`` (default: :func:`tiny_model_dir`).
        kv_events: vLLM ``KVEventsConfig`` fields (e.g. ``enable_kv_cache_events``).
    """
    import torch

    from vllm.config import CacheConfig, KVEventsConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    cls = AsyncScheduler if scheduler_cls is None else scheduler_cls
    sched = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=True,
        async_scheduling=True,
        policy=scheduling_policy,  # type: ignore[arg-type,unused-ignore]
        is_encoder_decoder=False,
    )
    model = ModelConfig(
        model=str(model_dir or tiny_model_dir()),
        dtype="float32",
        seed=0,
        skip_tokenizer_init=True,
        max_model_len=max_model_len,
    )
    cache = CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching)
    extra: dict[str, Any] = {}
    if kv_events is not None:
        extra["kv_events_config"] = KVEventsConfig(**kv_events)
    vllm_config = VllmConfig(
        scheduler_config=sched,
        model_config=model,
        cache_config=cache,
        additional_config={} if kvpolicy is None else {"kvpolicy": dict(kvpolicy)},
        **extra,
    )
    kv = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(block_size, num_kv_heads=1, head_size=1, dtype=torch.float32),
            )
        ],
    )
    cache.num_gpu_blocks = num_blocks
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size,
        log_stats=True,
    )


def _tokens(value: Sequence[int]) -> tuple[int, ...]:
    return tuple(value)


@frozen
class WorkloadRequest:
    """One request of an explicit workload."""

    request_id: str = field(validator=instance_of(str))
    """Unique id."""
    prompt: tuple[int, ...] = field(converter=_tokens)
    """(prompt_len,) token ids (equal leading blocks share prefix-cache blocks)."""
    max_tokens: int = field(validator=[instance_of(int), ge(1)])
    """Tokens it decodes (EOS is ignored)."""
    arrival_step: int = field(default=0, validator=[instance_of(int), ge(0)])
    """Step at which it is submitted."""
    extra_args: Mapping[str, Any] | None = field(default=None)
    """``SamplingParams.extra_args`` (e.g. ``{"tenant": "a"}``)."""


@frozen
class RunStats:
    """What one run of a workload through a scheduler did."""

    steps: int
    """Scheduler steps until every request finished."""
    preemptions: int
    """Requests preempted (counted once per preemption)."""
    recomputed_tokens: int
    """Computed tokens lost to preemptions (prefilled again later)."""
    finish_step: Mapping[str, int]
    """Step at which each request finished."""
    preempted: tuple[str, ...]
    """Request ids in order of preemption."""
    errors: tuple[str, ...]
    """Request ids finished with an error (e.g. rejected tenants)."""

    @property
    def finish_order(self) -> list[str]:
        """Request ids in finishing order (ties by id)."""
        return sorted(self.finish_step, key=lambda r: (self.finish_step[r], r))


def _vllm_request(req: WorkloadRequest, block_size: int, arrival: float) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    params = SamplingParams(max_tokens=req.max_tokens, ignore_eos=True)
    params.extra_args = None if req.extra_args is None else dict(req.extra_args)
    return Request(
        req.request_id,
        list(req.prompt),
        params,
        None,
        arrival_time=arrival,
        block_hasher=get_request_block_hasher(block_size, sha256),
    )


def run_workload(
    scheduler: Any,
    workload: Sequence[WorkloadRequest],
    *,
    max_steps: int = 1_000_000,
    tied_arrivals: bool = False,
) -> RunStats:
    """Step ``workload`` through ``scheduler`` with a fake model runner until it drains.

    Each step: submit the requests arriving now, ``schedule()``, sample one token (id 7)
    for every scheduled request whose prefill is complete, ``update_from_output()``.

    Args:
        scheduler: vLLM's scheduler (:func:`make_scheduler`).
        workload: the requests, submitted at their ``arrival_step`` (list order within a
            step).
        max_steps: most steps before giving up.
        tied_arrivals: each request's ``arrival_time`` is its ``arrival_step``, so requests
            submitted in one step tie (as they do in kvpolicy-sim, whose clock counts
            steps); by default every request gets its own, later than the one before, as
            on a live server.

    Raises:
        RuntimeError: the workload did not drain in ``max_steps`` steps.
    """
    from vllm.v1.engine import FinishReason
    from vllm.v1.outputs import ModelRunnerOutput

    pending = sorted(workload, key=lambda r: r.arrival_step)  # stable: list order within a step
    block_size = scheduler.block_size
    finish: dict[str, int] = {}
    preempted: list[str] = []
    errors: list[str] = []
    recomputed = 0
    step = 0
    i = 0
    while i < len(pending) or scheduler.has_requests():
        if step >= max_steps:
            raise RuntimeError(f"workload did not drain in {max_steps} steps")
        while i < len(pending) and pending[i].arrival_step <= step:
            req = pending[i]
            arrival = float(req.arrival_step) if tied_arrivals else 1000.0 + i
            scheduler.add_request(_vllm_request(req, block_size, arrival))
            i += 1
        computed = {r.request_id: r.num_computed_tokens for r in scheduler.running}
        out = scheduler.schedule()
        for rid in sorted(out.preempted_req_ids or ()):
            preempted.append(rid)
            recomputed += computed.get(rid, 0)
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            sampled.append([] if scheduler.requests[rid].is_prefill_chunk else [7])
        runner = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={rid: k for k, rid in enumerate(ids)},
            sampled_token_ids=sampled,
        )
        results = scheduler.update_from_output(out, runner)
        step += 1
        for outs in results.values():
            for o in outs.outputs:
                if o.finish_reason is None:
                    continue
                if o.finish_reason == FinishReason.ERROR:
                    errors.append(o.request_id)
                else:
                    finish[o.request_id] = step
    return RunStats(
        steps=step,
        preemptions=len(preempted),
        recomputed_tokens=recomputed,
        finish_step=finish,
        preempted=tuple(preempted),
        errors=tuple(errors),
    )
