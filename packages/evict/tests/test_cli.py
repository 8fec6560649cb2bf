"""``kvpolicy evict`` comes with kvpolicy-evict-quality: with kvpolicy-evict alone, the
command says which distribution to install."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, distribution

import pytest
from click.testing import CliRunner

from kvpolicy.commands._main import main


def _harness_installed() -> bool:
    try:
        distribution("kvpolicy-evict-quality")
    except PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(_harness_installed(), reason="kvpolicy-evict-quality is installed here")
@pytest.mark.parametrize("argv", [["evict"], ["evict", "eval", "--help"], ["evict", "stats"]])
def test_without_the_harness_the_command_names_it(argv: list[str]) -> None:
    """``kvpolicy evict ...`` is a usage error that names kvpolicy-evict-quality."""
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2
    assert (
        "'kvpolicy evict' comes with kvpolicy-evict-quality, which is not installed: "
        "pip install kvpolicy-evict-quality"
    ) in " ".join(result.output.split())
