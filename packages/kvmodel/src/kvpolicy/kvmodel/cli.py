"""Parameter types the ``kvpolicy`` commands share: errors name the flag, exit status 2.

Preset names are case-insensitive everywhere (``llama-3-8b`` is ``Llama-3-8B``), as the
library's ``get_model``/``get_gpu`` are; an output file's folder must exist before any
work starts, so a long run never ends in a traceback at its last step.
"""

from __future__ import annotations

import math
import os
import pathlib
import sys
from typing import TYPE_CHECKING, Any

import click

from kvpolicy.kvmodel._entrypoints import entry_point_names
from kvpolicy.kvmodel._tables import GPU_ROWS, KV_DTYPE_BYTES, MODEL_ROWS

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "GPU",
    "KV_DTYPE",
    "MODEL",
    "FiniteFloat",
    "OutputFile",
    "PresetChoice",
    "installed_names",
    "table_console",
]


class PresetChoice(click.Choice):  # type: ignore[type-arg]
    """One of ``choices`` in any case, converted to its own spelling; an unknown value
    lists the choices as spelled (click's case-insensitive Choice lists them lower-cased)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            for choice in self.choices:
                if isinstance(choice, str) and choice.lower() == value.lower():
                    return choice
        return super().convert(value, param, ctx)


MODEL = PresetChoice(list(MODEL_ROWS))
"""A model preset, by name in any case."""
GPU = PresetChoice(list(GPU_ROWS))
"""A GPU preset, by name in any case."""
KV_DTYPE = PresetChoice(list(KV_DTYPE_BYTES))
"""A KV-cache dtype, by name in any case."""


def installed_names(entry_point_group: str) -> tuple[str, ...]:
    """The names installed in an entry-point group (``"kvpolicy.eviction"``...), sorted, as
    :func:`kvpolicy.kvmodel.names` gives them, without importing the registry: for a
    command's choices and ``--help``."""
    return entry_point_names(entry_point_group)


class FiniteFloat(click.FloatRange):
    """A finite float within the range (``nan`` and ``inf`` are refused by name)."""

    name = "finite float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        out = super().convert(value, param, ctx)
        if not math.isfinite(out):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return out


class OutputFile(click.Path):
    """A file to write: not a folder, and in a folder that exists."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False, writable=True, path_type=pathlib.Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        path = super().convert(value, param, ctx)
        folder = pathlib.Path(os.fsdecode(path)).parent
        if not folder.is_dir():
            self.fail(f"{str(value)!r}: the folder {str(folder)!r} does not exist.", param, ctx)
        return path


def table_console() -> Console:
    """A console for tables on standard output: the terminal's width on a terminal, and
    wide enough that a piped or redirected table is never cut (rich assumes 80 columns
    there, which folds and truncates wide tables)."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=240)
