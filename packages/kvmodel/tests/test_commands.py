"""The ``kvpolicy`` command: commands registered by entry point, listed without imports."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import distributions

import click
import pytest
from click.testing import CliRunner

from kvpolicy.commands._main import CommandSpec, main, registered, spec_of


def _installed(dist: str) -> bool:
    return any(d.metadata["Name"] == dist for d in distributions())


def test_kv_is_registered_by_this_distribution() -> None:
    """kvpolicy-kvmodel registers ``kv``; its spec matches the command itself."""
    spec = spec_of(registered()["kv"])
    command = spec.load()
    assert isinstance(command, click.Group)
    assert spec.help == " ".join((command.help or "").split())
    assert set(spec.subcommands) == set(command.commands)


def test_listing_and_group_help_import_nothing() -> None:
    """``kvpolicy --help`` and ``kvpolicy kv --help`` import neither the command's module nor
    the library (numpy, attrs and rich stay unloaded)."""
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from kvpolicy.commands._main import main\n"
        "top = CliRunner().invoke(main, ['--help'])\n"
        "assert top.exit_code == 0 and '  kv ' in top.output, top.output\n"
        "group = CliRunner().invoke(main, ['kv', '--help'])\n"
        "assert group.exit_code == 0 and '  plan ' in group.output, group.output\n"
        "loaded = sorted(m for m in sys.modules if (m.startswith('kvpolicy.') and not"
        " m.startswith('kvpolicy.commands')) or m.split('.')[0] in ('numpy', 'rich', 'attrs'))\n"
        "assert loaded == [], loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_subcommand_runs_through_the_lazy_group() -> None:
    """``kvpolicy kv plan`` loads and runs the real command."""
    result = CliRunner().invoke(
        main, ["kv", "plan", "--model", "llama-3-8b", "--gpu", "h100-sxm", "--context", "4096"]
    )
    assert result.exit_code == 0, result.output
    assert "Llama-3-8B" in result.output


def test_an_unknown_subcommand_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["kv", "plann"])
    assert result.exit_code == 2
    assert "No such command 'plann'" in result.output


@pytest.mark.skipif(_installed("kvpolicy-tenancy"), reason="kvpolicy-tenancy is installed here")
def test_a_command_of_a_missing_distribution_names_it() -> None:
    """``kvpolicy tenancy`` without kvpolicy-tenancy says which distribution brings it."""
    result = CliRunner().invoke(main, ["tenancy", "--help"])
    assert result.exit_code == 2
    assert "comes with kvpolicy-tenancy[gateway]" in result.output
    assert "pip install 'kvpolicy-tenancy[gateway]'" in result.output


def test_a_truly_unknown_command() -> None:
    result = CliRunner().invoke(main, ["frobnicate"])
    assert result.exit_code == 2
    assert "No such command 'frobnicate'" in result.output


def test_a_spec_that_is_not_a_command_is_refused() -> None:
    """A registration whose target is not a click command fails naming it."""
    with pytest.raises(TypeError, match=r"kvpolicy\.kvmodel:MODEL_PRESETS is dict"):
        CommandSpec(help="x", target="kvpolicy.kvmodel:MODEL_PRESETS").load()
