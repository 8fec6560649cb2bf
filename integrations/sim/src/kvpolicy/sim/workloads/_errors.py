"""Exceptions of :mod:`kvpolicy.sim.workloads`."""

from __future__ import annotations

import os

__all__ = ["TraceFormatError", "WorkloadError"]


class WorkloadError(ValueError):
    """Base class of the errors raised while building or loading a workload."""


class TraceFormatError(WorkloadError):
    """A trace file that cannot be read as the format it claims to be.

    The message names the file and, where the fault is on one line, the line (1-based, the
    header counting as line 1), so that ``TraceFormatError`` points at the exact row to fix.

    Attributes:
        path: the file.
        line: 1-based line number of the bad row, or ``None`` for a fault of the whole file.
        reason: what is wrong, without the location.
    """

    def __init__(self, path: str | os.PathLike[str], line: int | None, reason: str) -> None:
        self.path = os.fspath(path)
        self.line = line
        self.reason = reason
        where = self.path if line is None else f"{self.path}, line {line}"
        super().__init__(f"{where}: {reason}")

    def __reduce__(self) -> tuple[type[TraceFormatError], tuple[str, int | None, str]]:
        # Keep the three attributes through pickling (sweeps send errors across processes).
        return (type(self), (self.path, self.line, self.reason))
