"""``kvpolicy admit``: commands of this group."""

from __future__ import annotations

import click

__all__ = ["group"]


@click.group()
def group() -> None:
    """Commands of kvpolicy-admit."""
