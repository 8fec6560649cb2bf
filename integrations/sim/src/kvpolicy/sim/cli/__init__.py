"""The ``kvpolicy`` command.

One click group per concern, each in its own module of this package, each exposing
``group``: ``kv`` (capacity planning), ``admit`` (stability analysis), ``evict`` (quality
evaluation), ``sim`` (the simulator), ``vllm`` (the simulator against vLLM's scheduler),
plus the top-level ``demo`` command.
"""

from __future__ import annotations

import importlib

import click

__all__ = ["main"]

_GROUPS = ("kv", "admit", "evict", "sim", "vllm")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(package_name="kvpolicy-sim", prog_name="kvpolicy")
def main() -> None:
    """kvpolicy: KV-cache memory policies for LLM serving."""


for _name in _GROUPS:
    _module = importlib.import_module(f"kvpolicy.sim.cli._{_name}")
    main.add_command(_module.group, name=_name)

_sim = importlib.import_module("kvpolicy.sim.cli._sim")
_fit = importlib.import_module("kvpolicy.sim.cli._fit")
_sim.group.add_command(_fit.fit_attention_cmd, name="fit-attention")
_backend = importlib.import_module("kvpolicy.sim.cli._backend")
_sim.group.add_command(_backend.backend_cmd, name="backend")

_demo = importlib.import_module("kvpolicy.sim.cli._demo")
main.add_command(_demo.demo, name="demo")
main.add_command(importlib.import_module("kvpolicy.sim.cli._tenancy").group, name="tenancy")
main.add_command(importlib.import_module("kvpolicy.sim.cli._tiers").group, name="tiers")
