"""``kvpolicy vllm``: registered by this distribution, its flags checked before vLLM is."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from kvpolicy.commands._main import main, registered, spec_of


def test_vllm_is_registered_with_its_own_help() -> None:
    """The listing's one-line helps are the command's own (kept equal by this test)."""
    spec = spec_of(registered()["vllm"])
    command = spec.load()
    assert isinstance(command, click.Group)

    def own(cmd: click.Command) -> str:
        return " ".join((cmd.help or "").split("\n\n")[0].split())

    assert spec.help == own(command)
    assert dict(spec.subcommands) == {n: own(c) for n, c in command.commands.items()}


@pytest.mark.parametrize(("value", "why"), [("{bad", "not JSON"), ("[1]", "a JSON object")])
def test_kvpolicy_flag_is_named(value: str, why: str) -> None:
    """A bad --kvpolicy is refused by name before vLLM is even looked for."""
    result = CliRunner().invoke(main, ["vllm", "crosscheck", "--kvpolicy", value])
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.exit_code == 2
    assert "--kvpolicy" in result.output
    assert why in result.output


def test_without_vllm_says_what_to_install() -> None:
    """Without vLLM the cross-check is a usage error naming what to install."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vLLM is installed: the cross-check runs (see nox -s vllm)")
    args = ["vllm", "crosscheck", "--workload", "uniform:5", "--num-blocks", "64"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "needs kvpolicy-vllm and vLLM 0.32" in result.output
