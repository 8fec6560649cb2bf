"""Exceptions of :mod:`kvpolicy.sim.workloads`."""

from __future__ import annotations

import os

__all__ = ["TraceFormatError", "TraceWarning", "WorkloadError"]


class WorkloadError(ValueError):
    """Base class of the errors raised while building or loading a workload."""


class TraceFormatError(WorkloadError):
    """A trace file that cannot be read as the format it claims to be.

    The message names the file and, where the fault is on one line, the line (1-based, the
    header counting as line 1) and the column, so that ``TraceFormatError`` points at the
    exact field to fix: ``trace.csv, line 7, column 'ContextTokens': must be an integer``.

    Attributes:
        path: the file.
        line: 1-based line number of the bad row, or ``None`` for a fault of the whole file.
        reason: what is wrong, without the location.
        column: the column (CSV header name or JSON key) of the bad field, or ``None``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        line: int | None,
        reason: str,
        column: str | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.line = line
        self.reason = reason
        self.column = column
        where = self.path if line is None else f"{self.path}, line {line}"
        if column is not None:
            where += f", column {column!r}"
        super().__init__(f"{where}: {reason}")

    def __reduce__(
        self,
    ) -> tuple[type[TraceFormatError], tuple[str, int | None, str, str | None]]:
        # Keep the attributes through pickling (sweeps send errors across processes).
        return (type(self), (self.path, self.line, self.reason, self.column))


class TraceWarning(UserWarning):
    """A trace that loads but looks damaged (e.g. a last line that may be cut short)."""
