"""kvpolicy's admission, tenancy and preemption order inside vLLM's own scheduler.

``vllm serve --scheduler-cls kvpolicy.vllm.KVPolicyScheduler`` with the config in
``--additional-config '{"kvpolicy": {...}}'`` (or ``KVPOLICY_VLLM_CONFIG``). The class
subclasses vLLM's ``AsyncScheduler`` (a ``Scheduler`` subclass would turn async scheduling
off) and leaves vLLM's scheduling loop untouched; around each ``schedule()`` it

- caps the requests that join the running batch this step, through vLLM's own
  ``max_num_active_reqs`` bound (set to ``len(running) + cap`` for the call): the cap is
  kvpolicy-admit's count (``RateLimitedAdmission`` fed with the scheduler's completions)
  and/or a fixed ``max_admissions_per_step``;
- hides from the waiting queue the requests of tenants at their concurrency quota, and
  puts them back in their place afterwards;
- orders ``self.running`` so that the request evict's preemption order picks first is
  the last of the list, which is the one vLLM's FCFS policy preempts (``running.pop()``),
  then the second, and so on.

Every feature is off unless configured; with an empty config the class schedules exactly
as ``AsyncScheduler`` does.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any, overload

from kvpolicy.kvmodel import (
    AdmissionPolicy,
    CompletionObserver,
    PreemptionPolicy,
    SchedulerState,
    SequenceView,
)
from kvpolicy.kvmodel import Request as KVRequest
from kvpolicy.vllm._config import KVPolicyConfig, config_from_vllm
from kvpolicy.vllm._drift import vllm_drift
from kvpolicy.vllm._errors import ConfigError, UnknownTenantError, UnsupportedVLLMError
from kvpolicy.vllm._tenants import TenantBook
from kvpolicy.vllm._version import check_vllm_version
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import FCFSRequestQueue, SchedulingPolicy
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
from vllm.v1.request import Request, RequestStatus

__all__ = ["KVPolicyScheduler"]

_log = logging.getLogger("kvpolicy.vllm")
_HEAD = 1024  # most waiting requests shown to the admission policy per step


class _QueueView(Sequence[KVRequest]):
    """The head of vLLM's waiting queue as kvmodel requests, each built when a policy reads
    it (greedy admission reads only the few that fit; the queue may hold thousands)."""

    __slots__ = ("_reqs",)

    def __init__(self, reqs: list[Request]) -> None:
        self._reqs = reqs

    @staticmethod
    def _one(r: Request) -> KVRequest:
        return KVRequest(
            request_id=r.request_id,
            prompt_len=max(1, r.num_tokens - r.num_computed_tokens),
            decode_len=max(1, r.max_tokens),
        )

    def __len__(self) -> int:
        return len(self._reqs)

    @overload
    def __getitem__(self, i: int) -> KVRequest: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[KVRequest]: ...
    def __getitem__(self, i: int | slice) -> KVRequest | Sequence[KVRequest]:
        if isinstance(i, slice):
            return [self._one(r) for r in self._reqs[i]]
        return self._one(self._reqs[i])

    def __iter__(self) -> Iterator[KVRequest]:
        return (self._one(r) for r in self._reqs)


class KVPolicyScheduler(AsyncScheduler):  # type: ignore[misc,unused-ignore]
    """vLLM's ``AsyncScheduler`` with kvpolicy's admission cap, tenancy and preemption order.

    Built by vLLM with its usual arguments; the kvpolicy config comes from
    ``vllm_config.additional_config["kvpolicy"]`` or the ``KVPOLICY_VLLM_CONFIG``
    environment variable (:func:`kvpolicy.vllm.load_config` documents it).

    Raises:
        ConfigError: the config is invalid (named field), or asks for a preemption order
            under vLLM's ``priority`` scheduling policy (which picks its victim by priority).
        UnsupportedVLLMError: vLLM is a release this package was not tested against.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = config_from_vllm(self.vllm_config.additional_config)
        check_vllm_version(allow_untested=config.allow_untested_vllm)
        drift = vllm_drift()
        if drift:
            listed = "; ".join(f"{k}: {v}" for k, v in drift.items())
            raise UnsupportedVLLMError(f"vLLM internals kvpolicy relies on changed: {listed}")
        if config.preemption is not None and self.policy != SchedulingPolicy.FCFS:
            raise ConfigError(
                "'preemption': a kvpolicy preemption order needs vLLM's fcfs scheduling "
                f"policy (vLLM's {self.policy.value!r} policy picks its own victim)"
            )
        self.kvpolicy_config: KVPolicyConfig = config
        """The validated kvpolicy config this scheduler runs."""
        self._admission: AdmissionPolicy | None = config.admission_policy()
        self._preemption: PreemptionPolicy | None = config.preemption_policy()
        self._book = None if config.tenancy is None else TenantBook(config.tenancy)
        self._tenant: dict[str, str] = {}
        self._admitted_step: dict[str, int] = {}
        self._rejected: list[Request] = []
        self.capped_admissions = 0
        """Steps on which the admission cap held back a waiting request."""

    # ----------------------------------------------------------------- submit
    def add_request(self, request: Request) -> None:
        """Tag the request with its tenant and priority; reject an unentitled tenant.

        A request of a tenant with no entitlement is finished at once with
        ``FinishReason.ERROR`` (the engine loop never sees an exception); the error is
        logged with the tenant named. Put tenancy's gateway in front of the server to
        answer such requests with an HTTP error before they reach the engine.
        """
        if self._book is None or request.request_id in self.requests:
            super().add_request(request)
            return
        params = request.sampling_params
        extra = None if params is None else params.extra_args
        try:
            tenant = self._book.tenant_of(extra, request.trace_headers)
        except UnknownTenantError as exc:
            _log.error("kvpolicy rejected request %s: %s", request.request_id, exc)
            request.status = RequestStatus.FINISHED_ERROR
            self._rejected.append(request)
            return
        self._tenant[request.request_id] = tenant
        if self._book.config.priorities:
            request.priority = self._book.vllm_priority(tenant)
        super().add_request(request)

    def tenant(self, request_id: str) -> str | None:
        """The tenant a request was tagged with (None without tenancy or once finished)."""
        return self._tenant.get(request_id)

    # --------------------------------------------------------------- schedule
    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        """vLLM's ``schedule()`` under the admission cap, tenant quotas and preemption order."""
        step = self.current_step
        if self._preemption is not None and len(self.running) > 1:
            self._order_running(step)
        held = self._hold_over_quota()
        bound = int(getattr(self, "max_num_active_reqs"))  # noqa: B009 (typed by vLLM)
        cap = self._admission_cap(step)
        if cap is not None:
            self.max_num_active_reqs = min(bound, len(self.running) + cap)
        before = {r.request_id for r in self.running}
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            self.max_num_active_reqs = bound
            self._put_back(held)
        for r in self.running:
            if r.request_id not in before:
                self._admitted_step[r.request_id] = step
        return output

    def _view(self, r: Request) -> SequenceView:
        tenant = self._tenant.get(r.request_id, "default")
        return SequenceView(
            request_id=r.request_id,
            prompt_len=max(1, r.num_prompt_tokens),
            generated=r.num_output_tokens,
            kv_tokens=r.num_computed_tokens,
            tenant=tenant,
            priority=0
            if self._book is None or tenant == "default"
            else self._book.priority(tenant),
            arrival_time=r.arrival_time,
            admitted_time=float(self._admitted_step.get(r.request_id, 0)),
            computed_tokens=r.num_computed_tokens,
        )

    def _order_running(self, step: int) -> None:
        assert self._preemption is not None
        by_id = {r.request_id: r for r in self.running}
        order = self._preemption.order([self._view(r) for r in self.running])
        # vLLM's FCFS policy preempts running[-1] first: the first victim goes last.
        self.running[:] = [by_id[rid] for rid in reversed(order)]

    def _admission_cap(self, step: int) -> int | None:
        # The head of the queue is all an admission count can reach in one step.
        waiting = list(islice(self.waiting, _HEAD))
        cap = self.kvpolicy_config.max_admissions_per_step
        if self._admission is not None and waiting:
            pool = self.kv_cache_manager.block_pool
            total = pool.num_gpu_blocks - 1  # block 0 is vLLM's null block
            used = total - pool.get_num_free_blocks()
            state = SchedulerState(
                step=max(step, 0),
                time=float(step),
                used_tokens=max(used, 0) * self.block_size,
                capacity_tokens=max(total, 1) * self.block_size,
                running=tuple(self._view(r) for r in self.running),
            )
            count = self._admission.admit(state, _QueueView(waiting))
            cap = count if cap is None else min(cap, count)
        if cap is not None and cap < len(self.waiting):
            self.capped_admissions += 1
        return cap

    def _hold_over_quota(self) -> list[Request]:
        if self._book is None or not self._book.config.quotas or not self.waiting:
            return []
        room: dict[str, int] = {}
        for r in self.running:
            t = self._tenant.get(r.request_id)
            if t is not None:
                room[t] = room.get(t, 0) + 1
        room = {t: self._book.limit(t) - n for t, n in room.items()}
        held: list[Request] = []
        for r in self.waiting:
            t = self._tenant.get(r.request_id)
            if t is None:
                continue
            left = room.get(t, self._book.limit(t))
            if left <= 0:
                held.append(r)
            room[t] = left - 1
        if held:
            self.waiting.remove_requests(held)
        return held

    def _put_back(self, held: list[Request]) -> None:
        if not held:
            return
        if isinstance(self.waiting, FCFSRequestQueue):
            # Held requests go back to their place in arrival order; requests preempted
            # during this step stay at the head where vLLM put them.
            rest = list(self.waiting)
            preempted = [r for r in rest if r.status == RequestStatus.PREEMPTED]
            others = sorted(
                [r for r in rest if r.status != RequestStatus.PREEMPTED] + held,
                key=lambda r: (r.arrival_time, r.request_id),
            )
            merged: deque[Request] = deque(preempted + others)
            self.waiting.clear()
            self.waiting.extend(merged)
        else:
            for r in held:
                self.waiting.add_request(r)

    # ----------------------------------------------------------------- update
    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        """vLLM's update; finished requests feed the admission policy's length estimate."""
        scheduled = [
            self.requests[rid]
            for rid in scheduler_output.num_scheduled_tokens
            if rid in self.requests
        ]
        outputs: dict[int, EngineCoreOutputs] = super().update_from_output(
            scheduler_output, model_runner_output
        )
        for r in scheduled:
            if r.is_finished():
                self._finished(r)
        for r in self._rejected:
            out = outputs.setdefault(r.client_index, EngineCoreOutputs())
            out.outputs.append(
                EngineCoreOutput(
                    request_id=r.request_id, new_token_ids=[], finish_reason=FinishReason.ERROR
                )
            )
        self._rejected.clear()
        return outputs

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        """vLLM's abort path; the kvpolicy bookkeeping of the requests is dropped too."""
        finished = super().finish_requests(request_ids, finished_status)
        for r in finished:
            self._tenant.pop(r.request_id, None)
            self._admitted_step.pop(r.request_id, None)
        return finished

    def _finished(self, r: Request) -> None:
        self._tenant.pop(r.request_id, None)
        self._admitted_step.pop(r.request_id, None)
        observer: object = self._admission
        if isinstance(observer, CompletionObserver) and r.num_output_tokens > 0:
            observer.observe_completion(
                KVRequest(
                    request_id=r.request_id,
                    prompt_len=max(1, r.num_prompt_tokens),
                    decode_len=r.num_output_tokens,
                ),
                float(self.current_step),
            )
