"""``kvpolicy vllm``: the simulator against vLLM's real scheduler (needs kvpolicy-vllm).

Outside ``kvpolicy.vllm``, whose import loads the tiers and numpy, so that ``--help`` does
not; the commands import what they run.
"""

from __future__ import annotations

import json
import os
from typing import Any

import click

__all__ = ["group"]


def _json_object(
    value: str | None, param: click.Parameter, ctx: click.Context
) -> dict[str, Any] | None:
    """A flag's JSON object, parsed before anything runs (the error names the flag)."""
    if value is None:
        return None
    try:
        obj = json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON ({exc}): {value[:80]!r}", ctx, param) from None
    if not isinstance(obj, dict):
        raise click.BadParameter(f"must be a JSON object: {value[:80]!r}", ctx, param)
    return obj


@click.group()
def group() -> None:
    """The simulator cross-checked against vLLM's real scheduler (kvpolicy-vllm and vLLM)."""


@group.command("crosscheck")
@click.option(
    "--workload",
    required=True,
    help="uniform:N[:SEED[:GAP]] (GAP: mean steps between Poisson arrivals) or a JSON file "
    "of requests (prompt_len, max_tokens, prefix, prefix_id, arrival_step).",
)
@click.option("--num-blocks", type=click.IntRange(min=2), required=True, help="KV blocks.")
@click.option(
    "--block-size",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Tokens per KV block, both sides.",
)
@click.option(
    "--max-batch",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="Most requests running at once, both sides.",
)
@click.option(
    "--token-budget",
    type=click.IntRange(min=1),
    default=2048,
    show_default=True,
    help="Tokens computed per step, both sides.",
)
@click.option("--prefix-caching", is_flag=True, help="Prefix caching on both sides.")
@click.option(
    "--kvpolicy",
    "kvpolicy_json",
    default=None,
    callback=lambda ctx, param, value: _json_object(value, param, ctx),
    help='kvpolicy-vllm config for both sides, e.g. \'{"preemption": {"name": "cost-aware"}}\'.',
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def crosscheck_cmd(
    workload: str,
    num_blocks: int,
    block_size: int,
    max_batch: int,
    token_budget: int,
    prefix_caching: bool,
    kvpolicy_json: dict[str, Any] | None,
    as_json: bool,
) -> None:
    """Step the same requests through vLLM's scheduler and the simulator's vllm stack;
    print steps, preemptions and recomputed tokens of both and their differences."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import vllm  # noqa: F401  (only to say clearly when it is missing)

        from kvpolicy.vllm._crosscheck import crosscheck, load_workload
    except ImportError as exc:
        raise click.UsageError(
            f"the cross-check needs kvpolicy-vllm and vLLM 0.32 ({exc}): "
            "pip install --extra-index-url https://download.pytorch.org/whl/cpu "
            "./integrations/vllm 'vllm==0.32.0' && pip uninstall -y torchvision torchaudio "
            "torchcodec (vLLM's CUDA-linked builds of those break its imports on a CPU "
            "machine), or run `nox -s vllm`"
        ) from exc
    try:
        config = kvpolicy_json
        out = crosscheck(
            load_workload(workload),
            num_blocks,
            block_size=block_size,
            max_batch=max_batch,
            token_budget=token_budget,
            prefix_caching=prefix_caching,
            kvpolicy=config,
        )
    except (ValueError, TypeError) as exc:
        raise click.UsageError(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(out))
        return
    click.echo(f"{'':<18} {'vLLM':>10} {'sim':>10} {'diff':>8}")
    for key in ("steps", "preemptions", "recomputed_tokens"):
        diff = out["relative_difference"][key]
        shown = "n/a" if diff is None else f"{diff:+.1%}"
        click.echo(f"{key:<18} {out['vllm'][key]:>10} {out['sim'][key]:>10} {shown:>8}")
    click.echo(f"finish-step rank correlation: {out['finish_rank_correlation']:.4f}")
