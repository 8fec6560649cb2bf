"""The vLLM internals kvpolicy-vllm relies on, checked by name.

vLLM's scheduler, KV cache manager and offloading classes are not a stable API. Each
entry below is one fact this package depends on; :func:`vllm_drift` checks them all
against the installed vLLM and names every one that changed, so that an upgrade fails
loudly at startup (and in ``tests/test_drift.py``) instead of misbehaving in the engine
loop.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

__all__ = ["REQUIRED_VLLM_SYMBOLS", "vllm_drift"]


def _attr(module: str, path: str) -> object:
    obj: object = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _has(module: str, path: str) -> Callable[[], str | None]:
    def check() -> str | None:
        try:
            _attr(module, path)
        except (ImportError, AttributeError) as exc:
            return f"missing ({exc})"
        return None

    return check


def _params(module: str, path: str, names: tuple[str, ...]) -> Callable[[], str | None]:
    def check() -> str | None:
        try:
            sig = inspect.signature(_attr(module, path))  # type: ignore[arg-type]
        except (ImportError, AttributeError, TypeError, ValueError) as exc:
            return f"missing ({exc})"
        lost = [n for n in names if n not in sig.parameters]
        return f"lost parameters {lost} (now {sig})" if lost else None

    return check


def _source(module: str, path: str, needles: tuple[str, ...]) -> Callable[[], str | None]:
    def check() -> str | None:
        try:
            src = inspect.getsource(_attr(module, path))  # type: ignore[arg-type]
        except (ImportError, AttributeError, OSError, TypeError) as exc:
            return f"missing ({exc})"
        lost = [n for n in needles if n not in src]
        return f"no longer contains {lost}" if lost else None

    return check


def _init_sets(module: str, path: str, names: tuple[str, ...]) -> Callable[[], str | None]:
    """Attributes ``__init__`` of a class assigns (``self.name``)."""
    return _source(module, f"{path}.__init__", tuple(f"self.{n}" for n in names))


def _abstract(module: str, path: str, names: frozenset[str]) -> Callable[[], str | None]:
    def check() -> str | None:
        try:
            cls = _attr(module, path)
        except (ImportError, AttributeError) as exc:
            return f"missing ({exc})"
        now = frozenset(getattr(cls, "__abstractmethods__", ()))
        return None if now == names else f"abstract methods are now {sorted(now)}"

    return check


def _fields(module: str, path: str, names: tuple[str, ...]) -> Callable[[], str | None]:
    def check() -> str | None:
        try:
            cls = _attr(module, path)
        except (ImportError, AttributeError) as exc:
            return f"missing ({exc})"
        have = set(getattr(cls, "__struct_fields__", ())) | set(
            getattr(cls, "__dataclass_fields__", {})
        )
        lost = [n for n in names if n not in have]
        return f"lost fields {lost}" if lost else None

    return check


_S = "vllm.v1.core.sched.scheduler"
_REQ = ("num_prompt_tokens", "num_computed_tokens", "max_tokens", "arrival_time", "priority")

REQUIRED_VLLM_SYMBOLS: dict[str, Callable[[], str | None]] = {
    # The scheduler subclass.
    "vllm.v1.core.sched.async_scheduler.AsyncScheduler": _has(
        "vllm.v1.core.sched.async_scheduler", "AsyncScheduler"
    ),
    f"{_S}.Scheduler.__init__ (running, waiting, requests, policy, max_num_active_reqs)": (
        _init_sets(
            _S,
            "Scheduler",
            ("running", "waiting", "requests", "policy", "max_num_active_reqs", "block_size"),
        )
    ),
    f"{_S}.Scheduler.schedule (FCFS victim is running[-1]; admission bound)": _source(
        _S,
        "Scheduler.schedule",
        ("self.running[-1]", "self.running.pop()", "num_running >= self.max_num_active_reqs"),
    ),
    f"{_S}.Scheduler.update_from_output(scheduler_output, model_runner_output)": _params(
        _S, "Scheduler.update_from_output", ("scheduler_output", "model_runner_output")
    ),
    f"{_S}.Scheduler.add_request(request)": _params(_S, "Scheduler.add_request", ("request",)),
    f"{_S}.Scheduler.finish_requests(request_ids, finished_status)": _params(
        _S, "Scheduler.finish_requests", ("request_ids", "finished_status")
    ),
    "vllm.v1.core.sched.request_queue.FCFSRequestQueue (a deque)": _source(
        "vllm.v1.core.sched.request_queue", "FCFSRequestQueue", ("deque[Request]",)
    ),
    "vllm.v1.core.sched.request_queue.RequestQueue.remove_requests": _has(
        "vllm.v1.core.sched.request_queue", "RequestQueue.remove_requests"
    ),
    "vllm.v1.core.sched.output.SchedulerOutput.preempted_req_ids": _fields(
        "vllm.v1.core.sched.output",
        "SchedulerOutput",
        ("preempted_req_ids", "num_scheduled_tokens"),
    ),
    "vllm.v1.request.Request.__init__ (request fields read by kvpolicy)": _init_sets(
        "vllm.v1.request", "Request", _REQ
    ),
    "vllm.v1.request.Request.num_output_tokens / is_finished / is_prefill_chunk": _source(
        "vllm.v1.request",
        "Request",
        ("def num_output_tokens", "def is_finished", "is_prefill_chunk"),
    ),
    "vllm.v1.request.RequestStatus.FINISHED_ERROR / PREEMPTED": _has(
        "vllm.v1.request", "RequestStatus.FINISHED_ERROR"
    ),
    "vllm.v1.engine.FinishReason.ERROR": _has("vllm.v1.engine", "FinishReason.ERROR"),
    "vllm.v1.engine.EngineCoreOutput(request_id, new_token_ids, finish_reason)": _fields(
        "vllm.v1.engine", "EngineCoreOutput", ("request_id", "new_token_ids", "finish_reason")
    ),
    "vllm.v1.core.block_pool.BlockPool.get_num_free_blocks / num_gpu_blocks": _source(
        "vllm.v1.core.block_pool", "BlockPool", ("def get_num_free_blocks", "self.num_gpu_blocks")
    ),
    # The offloading cache policy and the plugin.
    "vllm.v1.kv_offload.cpu.policies.base.CachePolicy (abstract methods)": _abstract(
        "vllm.v1.kv_offload.cpu.policies.base",
        "CachePolicy",
        frozenset({"get", "insert", "remove", "touch", "evict", "clear"}),
    ),
    "vllm.v1.kv_offload.cpu.policies.base.CachePolicy.__init__(cache_capacity)": _params(
        "vllm.v1.kv_offload.cpu.policies.base", "CachePolicy.__init__", ("cache_capacity",)
    ),
    "vllm.v1.kv_offload.cpu.policies.factory.CachePolicyFactory.register_cache_policy": _has(
        "vllm.v1.kv_offload.cpu.policies.factory", "CachePolicyFactory.register_cache_policy"
    ),
    "vllm.v1.kv_offload.base.get_offload_block_hash": _has(
        "vllm.v1.kv_offload.base", "get_offload_block_hash"
    ),
    # KV events.
    "vllm.distributed.kv_events.BlockStored(block_hashes, parent_block_hash)": _fields(
        "vllm.distributed.kv_events", "BlockStored", ("block_hashes", "parent_block_hash")
    ),
    "vllm.distributed.kv_events.BlockRemoved(block_hashes)": _fields(
        "vllm.distributed.kv_events", "BlockRemoved", ("block_hashes",)
    ),
    "vllm.distributed.kv_events.KVEventBatch(ts, events)": _fields(
        "vllm.distributed.kv_events", "KVEventBatch", ("ts", "events")
    ),
    # The logits processor.
    "vllm.v1.sample.logits_processor.LogitsProcessor (abstract methods)": _abstract(
        "vllm.v1.sample.logits_processor",
        "LogitsProcessor",
        frozenset({"__init__", "apply", "is_argmax_invariant", "update_state"}),
    ),
    # The block-level prototype.
    "vllm.v1.core.single_type_kv_cache_manager.SingleTypeKVCacheManager.req_to_blocks": (
        _init_sets(
            "vllm.v1.core.single_type_kv_cache_manager",
            "SingleTypeKVCacheManager",
            ("req_to_blocks", "block_pool"),
        )
    ),
    "vllm.v1.core.block_pool.BlockPool.free_blocks / null_block": _source(
        "vllm.v1.core.block_pool", "BlockPool", ("def free_blocks", "self.null_block")
    ),
}
"""Each vLLM fact this package relies on, by the symbol it concerns, with its check."""


def vllm_drift() -> dict[str, str]:
    """The symbols of :data:`REQUIRED_VLLM_SYMBOLS` that changed, with what changed."""
    out: dict[str, str] = {}
    for name, check in REQUIRED_VLLM_SYMBOLS.items():
        problem = check()
        if problem is not None:
            out[name] = problem
    return out
