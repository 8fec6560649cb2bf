"""The ``kvpolicy`` command.

One click group per concern, each in its own module of this package, each exposing
``group``: ``kv`` (capacity planning), ``admit`` (stability analysis), ``evict`` (quality
evaluation), ``sim`` (the simulator), ``vllm`` (the simulator against vLLM's scheduler),
``tenancy`` (token pools), ``tiers`` (KV tiers), plus the top-level ``demo`` command.

A command's module is imported only when that command runs or shows its own help, so
``kvpolicy --help`` imports click alone (the libraries behind the commands, numpy and
scipy among them, take seconds to import on a small machine).
"""

from __future__ import annotations

import importlib

import click

__all__ = ["main"]

_COMMANDS: dict[str, tuple[str, str, str]] = {
    "admit": (
        "_admit",
        "group",
        'Stability of continuous batching under growing KV caches (after "Service-Induced '
        'Congestion in Memory-Constrained LLM Serving").',
    ),
    "demo": (
        "_demo",
        "demo",
        "A vLLM-like stack against the kvpolicy stack on the multi-tenant workload.",
    ),
    "evict": (
        "_evict",
        "group",
        "Quality of eviction policies on a real LLM (needs kvpolicy-evict[quality]).",
    ),
    "kv": ("_kv", "group", "KV cost model and capacity planning."),
    "sim": (
        "_sim",
        "group",
        "The reference serving simulator: run, compare and sweep policy stacks.",
    ),
    "tenancy": (
        "_tenancy",
        "group",
        'Token pools ("Token Management in Multi-Tenant AI '
        'Inference Platforms"): gateway, experiments, manifests.',
    ),
    "tiers": (
        "_tiers",
        "group",
        "KV tiers below HBM (after Kareto, the tiered KV-cache "
        "optimizer): Pareto sizing and reuse analysis.",
    ),
    "vllm": (
        "_vllm",
        "group",
        "The simulator cross-checked against vLLM's real scheduler (kvpolicy-vllm and vLLM).",
    ),
}
"""Command name -> (module of this package, its attribute, the one-line help)."""

_SIM_SUBCOMMANDS = {"fit-attention": ("_fit", "fit_attention_cmd"), "backend": ("_backend",
                    "backend_cmd")}  # fmt: skip
"""Commands of ``kvpolicy sim`` that live in modules of their own."""


def _load(name: str) -> click.Command:
    module, attr, _ = _COMMANDS[name]
    command: click.Command = getattr(importlib.import_module(f"kvpolicy.sim.cli.{module}"), attr)
    if name == "sim" and isinstance(command, click.Group):
        for sub, (sub_module, sub_attr) in _SIM_SUBCOMMANDS.items():
            if sub not in command.commands:
                cmd = getattr(importlib.import_module(f"kvpolicy.sim.cli.{sub_module}"), sub_attr)
                command.add_command(cmd, name=sub)
    return command


def _short(text: str, limit: int) -> str:
    """``text`` cut at a word to at most ``limit`` characters, "..." marking the cut (as
    click shortens a command's docstring)."""
    if len(text) <= limit:
        return text
    words, out = text.split(), ""
    for word in words:
        if len(out) + len(word) + 1 > limit - 3:
            break
        out = f"{out} {word}" if out else word
    return f"{out}..."


class _LazyGroup(click.Group):
    """The top-level group: lists its commands from ``_COMMANDS`` and imports a command's
    module only when that command is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in _COMMANDS:
            return None
        return _load(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        limit = formatter.width - 6 - max(len(n) for n in _COMMANDS)
        rows = [(n, _short(_COMMANDS[n][2], limit)) for n in sorted(_COMMANDS)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(
    cls=_LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
)
@click.version_option(package_name="kvpolicy-sim", prog_name="kvpolicy")
def main() -> None:
    """kvpolicy: KV-cache memory policies for LLM serving."""
