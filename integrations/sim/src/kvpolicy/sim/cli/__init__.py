"""The simulator's commands: ``kvpolicy sim`` (run, compare, sweep, fit-timing,
fit-attention, backend) and ``kvpolicy demo``, one module each.

The ``kvpolicy`` command itself is kvpolicy-kvmodel's (``kvpolicy.commands._main``): every
distribution registers its own commands there by entry point (``kvpolicy.commands``), this
one through ``kvpolicy.commands.sim``. ``main`` is re-exported here for the scripts that
import it from this module.
"""

from __future__ import annotations

from kvpolicy.commands._main import main

__all__ = ["main"]
