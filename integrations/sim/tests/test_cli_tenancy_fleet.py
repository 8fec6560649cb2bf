"""``kvpolicy tenancy check`` on a fleet manifest: its router and autoscaler resolve through
the entry points, so this runs where kvpolicy-admit is installed (here, not in tenancy's
own session)."""

from __future__ import annotations

import pathlib

from click.testing import CliRunner

from kvpolicy.commands._main import main

TENANCY = pathlib.Path(__file__).resolve().parents[3] / "packages" / "tenancy"


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["tenancy", *args])
    return result.exit_code, result.output


def test_the_fleet_sections_are_checked(tmp_path: pathlib.Path) -> None:
    """The fleet example passes with its backends counted; a bad router fails, named."""
    fleet = TENANCY / "examples" / "pool-fleet.yaml"
    code, out = _invoke("check", str(fleet))
    assert code == 0, out
    assert "ok: pool 'qwen3-8b' with 2 entitlements; 3 backends" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text(fleet.read_text().replace("router: prefix-aware", "router: nearest"))
    code, out = _invoke("check", str(bad))
    assert code == 1
    assert "unknown router 'nearest'" in out
