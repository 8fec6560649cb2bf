"""The ``kvpolicy`` command: one group whose commands come from the installed distributions.

Each distribution registers its commands under the entry-point group ``kvpolicy.commands``:
the entry point's name is the command, its value a :class:`CommandSpec` in a light module of
the ``kvpolicy.commands`` namespace (which imports click alone). A spec says the command's
one-line help, where the command lives and, for a group, its subcommands' one-line helps.
``kvpolicy --help`` and ``kvpolicy GROUP --help`` import nothing else; a command's own module
is imported only when it runs or shows its own help. ``pip install kvpolicy-tenancy`` thus
gives ``kvpolicy tenancy ...`` and nothing of the other packages.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points

import click

__all__ = ["GROUP", "CommandSpec", "main"]

GROUP = "kvpolicy.commands"
"""The entry-point group the distributions register their commands in."""

_PROVIDERS = {
    "kv": "kvpolicy-kvmodel",
    "admit": "kvpolicy-admit",
    "evict": "kvpolicy-evict-quality",
    "tiers": "kvpolicy-tiers",
    "tenancy": "'kvpolicy-tenancy[gateway]'",
    "sim": "kvpolicy-sim",
    "demo": "kvpolicy-sim",
    "vllm": "kvpolicy-vllm",
}
"""The kvpolicy commands and the distribution that brings each: named when one is missing."""


def _target(path: str) -> click.Command:
    module, _, attr = path.partition(":")
    command = getattr(importlib.import_module(module), attr)
    if not isinstance(command, click.Command):
        raise TypeError(f"{path} is {type(command).__name__}, not a click command")
    return command


@dataclass(frozen=True)
class CommandSpec:
    """A command as its distribution registers it.

    ``help`` is the first paragraph of the command's docstring on one line (a test of each
    distribution keeps the two equal), ``target`` its ``module:attribute``. For a group,
    ``subcommands`` maps each subcommand to its one-line help and ``elsewhere`` the ones that
    live outside the group's module to their ``module:attribute``.
    """

    help: str
    target: str
    subcommands: Mapping[str, str] = field(default_factory=dict)
    elsewhere: Mapping[str, str] = field(default_factory=dict)

    def load(self) -> click.Command:
        """The command itself (imports its module)."""
        command = _target(self.target)
        if isinstance(command, click.Group):
            for name, path in self.elsewhere.items():
                if name not in command.commands:
                    command.add_command(_target(path), name=name)
        return command


def _short(text: str, limit: int) -> str:
    """``text`` cut at a word to at most ``limit`` characters, "..." marking the cut (as
    click shortens a command's docstring)."""
    if len(text) <= limit:
        return text
    out = ""
    for word in text.split():
        if len(out) + len(word) + 1 > limit - 3:
            break
        out = f"{out} {word}" if out else word
    return f"{out}..."


def _write_listing(formatter: click.HelpFormatter, helps: Mapping[str, str]) -> None:
    if not helps:
        return
    limit = formatter.width - 6 - max(len(n) for n in helps)
    with formatter.section("Commands"):
        formatter.write_dl([(n, _short(helps[n], limit)) for n in sorted(helps)])


class _LazyGroup(click.Group):
    """A registered group: lists its subcommands from the spec and imports its module only
    when a subcommand is asked for."""

    def __init__(self, name: str, spec: CommandSpec) -> None:
        super().__init__(name=name, help=spec.help)
        self.spec = spec
        self._loaded: click.Group | None = None

    def _real(self) -> click.Group:
        if self._loaded is None:
            command = _target(self.spec.target)
            if not isinstance(command, click.Group):
                raise TypeError(f"{self.spec.target} is not a click group")
            self._loaded = command
        return self._loaded

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self.spec.subcommands)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.spec.subcommands:
            return None
        if cmd_name in self.spec.elsewhere:  # its own module only, not the group's
            return _target(self.spec.elsewhere[cmd_name])
        return self._real().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        _write_listing(formatter, self.spec.subcommands)


def registered() -> dict[str, EntryPoint]:
    """The installed commands by name (the first distribution's where two register one)."""
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=GROUP):
        found.setdefault(ep.name, ep)
    return found


def spec_of(ep: EntryPoint) -> CommandSpec:
    """The :class:`CommandSpec` an entry point names (imports its light module only)."""
    spec = ep.load()
    if not isinstance(spec, CommandSpec):
        raise TypeError(f"entry point {ep.name} = {ep.value} is not a CommandSpec")
    return spec


class _Main(click.Group):
    """The top-level group: its commands are the installed distributions' entry points."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(registered())

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        ep = registered().get(cmd_name)
        if ep is None:
            if cmd_name in _PROVIDERS:
                raise click.UsageError(
                    f"'kvpolicy {cmd_name}' comes with {_PROVIDERS[cmd_name].strip(chr(39))}, "
                    f"which is not installed: pip install {_PROVIDERS[cmd_name]}",
                    ctx,
                )
            return None
        spec = spec_of(ep)
        return _LazyGroup(cmd_name, spec) if spec.subcommands else spec.load()

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        _write_listing(formatter, {n: spec_of(ep).help for n, ep in registered().items()})


def _installed() -> list[tuple[str, str, bool]]:
    """Every installed kvpolicy distribution as ``(name, version, compiled)``, by name;
    ``compiled``: its wheel carries extension modules (built with its mypyc hook). Read
    from the distributions' metadata, importing none of them."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    out = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if not name.startswith("kvpolicy-") or name in out:
            continue
        compiled = any(str(f).endswith(suffixes) for f in dist.files or ())
        out[name] = (name, dist.version, compiled)
    return [out[n] for n in sorted(out)]


def _version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """``--version``: kvpolicy's version (kvmodel's), then each installed distribution's
    and whether its hot modules are compiled."""
    if not value or ctx.resilient_parsing:
        return
    click.echo(f"kvpolicy, version {importlib.metadata.version('kvpolicy-kvmodel')}")
    for name, version, compiled in _installed():
        click.echo(f"  {name} {version}{' (compiled)' if compiled else ''}")
    ctx.exit()


@click.group(
    cls=_Main,
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_version,
    help="Show the version, the installed kvpolicy distributions (compiled or not), and exit.",
)
def main() -> None:
    """kvpolicy: KV-cache memory policies for LLM serving."""
