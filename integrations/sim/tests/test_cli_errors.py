"""Bad values on the command line: exit status 2 and the flag's name, never a traceback."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from kvpolicy.sim.cli import main


def _run(*args: str) -> tuple[int, str, BaseException | None]:
    result = CliRunner().invoke(main, list(args))
    error = result.exception if not isinstance(result.exception, SystemExit) else None
    return result.exit_code, result.output, error


@pytest.fixture
def trace(tmp_path: pathlib.Path) -> pathlib.Path:
    """A small Mooncake-shaped hash trace: 30 requests in time order."""
    rows = [{"timestamp": 1000 * i, "hash_ids": [1, 2, 3 + i % 4]} for i in range(30)]
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _write(tmp_path: pathlib.Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


class TestTiers:
    @pytest.mark.parametrize(
        ("args", "flag"),
        [
            (["--depth", "0"], "--depth"),
            (["--depth", "-1"], "--depth"),
            (["--budget", "-5"], "--budget"),
            (["--budget", "0"], "--budget"),
            (["--budget", "nan"], "--budget"),
            (["--budget", "inf"], "--budget"),
            (["--export", "/nonexistent/dir/tree.graphml"], "--export"),
        ],
    )
    def test_reuse_options(self, trace: pathlib.Path, args: list[str], flag: str) -> None:
        """Each bad option of `tiers reuse` is a usage error that names it."""
        code, out, error = _run("tiers", "reuse", "--trace", str(trace), *args)
        assert error is None
        assert code == 2
        assert flag in out

    def test_unknown_model_lists_the_known(self, trace: pathlib.Path) -> None:
        """`tiers plan --model Llama-4-8B` names the flag and the presets."""
        code, out, error = _run("tiers", "plan", "--trace", str(trace), "--model", "Llama-4-8B")
        assert (error, code) == (None, 2)
        assert "--model" in out
        assert "Llama-3-8B" in out

    def test_model_names_in_any_case(self, trace: pathlib.Path) -> None:
        """`--model llama-3-8b` is the Llama-3-8B preset."""
        code, out, error = _run(
            "tiers", "plan", "--trace", str(trace), "--model", "llama-3-8b", "--max-requests", "5"
        )
        assert (error, code) == (None, 0), out

    @pytest.mark.parametrize(
        ("data", "why"),
        [
            (bytes(range(256)) * 4, "not text"),
            (b"timestamp,input_length,output_length,hash_ids\n1,2,3,4\n", "line 1: not JSON"),
            (b'{"timestamp": 0}\n', "line 1: no 'hash_ids'"),
            (b'{"hash_ids": [1]}\n', "line 1: no 'timestamp' or 'time'"),
            (b'{"timestamp": "x", "hash_ids": [1]}\n', "line 1: a value is not a number"),
            (b'{"timestamp": -5000, "hash_ids": [1]}\n', "line 1: time -5.0 s"),
            (b'{"time": 2, "hash_ids": [1]}\n{"time": 1, "hash_ids": [2]}\n', "line 2: time 1.0"),
            (b'{"time": NaN, "hash_ids": [1]}\n', "line 1: time nan"),
        ],
    )
    @pytest.mark.parametrize("command", ["reuse", "plan"])
    def test_bad_traces(self, tmp_path: pathlib.Path, data: bytes, why: str, command: str) -> None:
        """A binary file, a CSV, missing fields, negative or shuffled times: the file, the
        line and what is wrong, with the format expected."""
        path = _write(tmp_path, "t.jsonl", data)
        code, out, error = _run("tiers", command, "--trace", path)
        assert (error, code) == (None, 2)
        flat = " ".join(out.split())
        assert "--trace" in flat
        assert why in flat
        assert "JSONL hash trace" in flat


class TestKvPlan:
    @pytest.mark.parametrize(
        ("args", "flag"),
        [
            (["--context", "0"], "--context"),
            (["--block-size", "0"], "--block-size"),
            (["--block-size", str(10**30)], "--block-size"),
            (["--tp", "0"], "--tp"),
            (["--pp", "-1"], "--pp"),
            (["--gpu-memory-utilization", "0"], "--gpu-memory-utilization"),
            (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
            (["--gpu-memory-utilization", "nan"], "--gpu-memory-utilization"),
            (["--kv-dtype", "fp3"], "--kv-dtype"),
        ],
    )
    def test_flags_not_internal_names(self, args: list[str], flag: str) -> None:
        """Errors name the flag, not the library's parameter (`context_len`)."""
        code, out, error = _run("kv", "plan", "--model", "Llama-3-8B", "--gpu", "H100-SXM", *args)
        assert (error, code) == (None, 2)
        assert flag in out
        assert "context_len" not in out

    def test_presets_in_any_case(self) -> None:
        """`kv plan --model llama-3-8b --gpu h100-sxm` plans the presets."""
        code, out, error = _run(
            "kv", "plan", "--model", "llama-3-8b", "--gpu", "h100-sxm", "--json"
        )
        assert (error, code) == (None, 0), out
        assert json.loads(out)["model"] == "Llama-3-8B"


class TestOutputFiles:
    def test_admit_plot_into_a_missing_folder(self) -> None:
        """`admit simulate --plot /nonexistent/dir/x.png` fails before it simulates."""
        code, out, error = _run(
            "admit", "simulate", "--input-len", "20", "--decode-len", "20", "--memory", "1000",
            "--steps", "50", "--plot", "/nonexistent/dir/x.png",
        )  # fmt: skip
        assert (error, code) == (None, 2)
        assert "--plot" in out
        assert "does not exist" in " ".join(out.split())


class TestStartup:
    @pytest.mark.parametrize("group", [None, "admit", "kv", "sim", "tenancy", "tiers"])
    def test_help_imports_no_command_module(self, group: str | None) -> None:
        """`kvpolicy --help` lists every command, and `kvpolicy GROUP --help` every
        subcommand, importing no command module and no library (only click and the light
        ``kvpolicy.commands`` registrations)."""
        argv = ["--help"] if group is None else [group, "--help"]
        code = (
            "import sys\n"
            "from click.testing import CliRunner\n"
            "from kvpolicy.commands._main import main\n"
            f"out = CliRunner().invoke(main, {argv!r}).output\n"
            "assert 'Commands:' in out, out\n"
            "loaded = sorted(m for m in sys.modules if (m.startswith('kvpolicy.')"
            " and not m.startswith('kvpolicy.commands')) or m.split('.')[0] in"
            " ('scipy', 'numpy', 'torch', 'rich', 'attrs'))\n"
            "assert loaded == [], loaded\n"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr

    def test_every_subcommand_help_imports_no_library(self) -> None:
        """`kvpolicy GROUP COMMAND --help`, for every installed subcommand, imports neither a
        kvpolicy library nor numpy, scipy, torch, attrs or rich: option types come from light
        tables (preset names, installed entry points), and each command imports its library
        when it runs. Only ``kvpolicy.commands``, the commands' own modules and a package's
        ``__init__``/errors/version (lazy) may load."""
        code = (
            "import sys\n"
            "from click.testing import CliRunner\n"
            "from kvpolicy.commands._main import main, registered, spec_of\n"
            "seen = 0\n"
            "for name, ep in sorted(registered().items()):\n"
            "    for sub in sorted(spec_of(ep).subcommands):\n"
            "        result = CliRunner().invoke(main, [name, sub, '--help'])\n"
            "        assert result.exit_code == 0, (name, sub, result.output)\n"
            "        assert 'Usage:' in result.output, result.output\n"
            "        seen += 1\n"
            "assert seen >= 15, seen\n"
            "light = ('.cli', '._cli', '.__about__', '._errors', '._tables', '._entrypoints',"
            " '._names')\n"
            "loaded = sorted(m for m in sys.modules if (m.startswith('kvpolicy.') and not"
            " m.startswith('kvpolicy.commands') and m.count('.') > 1 and not"
            " m.endswith(light) and '.cli.' not in m) or m.split('.')[0] in"
            " ('scipy', 'numpy', 'torch', 'rich', 'attrs', 'attr', 'transformers'))\n"
            "assert loaded == [], loaded\n"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr

    def test_top_level_lists_every_installed_command(self) -> None:
        """With every distribution installed, the listing has each one's commands."""
        code, out, error = _run("--help")
        assert (error, code) == (None, 0)
        for name in ("admit", "demo", "kv", "sim", "tenancy", "tiers"):
            assert f"  {name} " in out, name

    def test_sim_keeps_its_subcommands(self) -> None:
        """`kvpolicy sim --help` lists the commands kept in modules of their own."""
        code, out, error = _run("sim", "--help")
        assert (error, code) == (None, 0)
        assert "fit-attention" in out
        assert "backend" in out


class TestPipedTables:
    def test_wide_tables_are_not_cut(self, capsys: pytest.CaptureFixture[str]) -> None:
        """Piped (not a terminal), a table as wide as evict eval's keeps every cell whole,
        where rich's default 80 columns cut them to "…"."""
        from rich.console import Console
        from rich.table import Table

        from kvpolicy.kvmodel.cli import table_console

        def table() -> Table:
            t = Table()
            for k in range(10):
                t.add_column(f"column number {k}")
            t.add_row(*(f"value {k} of the row" for k in range(10)))
            return t

        Console(width=80).print(table())
        assert "…" in capsys.readouterr().out
        table_console().print(table())
        out = capsys.readouterr().out
        assert "…" not in out
        assert "value 9 of the row" in out


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every leaf command of ``group``, as its path of names."""
    out = []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        if isinstance(command, click.Group):
            out += _commands(command, (*path, name))
        else:
            out.append((*path, name))
    return out


def _typed_options() -> list[tuple[tuple[str, ...], str]]:
    """(command path, option) for every option whose type parses its value: numbers,
    ranges, choices, existing paths (free text is parsed later: see the table below)."""
    out = []
    for path in _commands(main):
        command: click.Command = main
        for name in path:
            assert isinstance(command, click.Group)
            sub = command.get_command(click.Context(command), name)
            assert sub is not None
            command = sub
        for param in command.params:
            if not isinstance(param, click.Option) or param.is_flag or param.count:
                continue
            t = param.type
            typed = isinstance(t, click.types._NumberParamTypeBase | click.Choice) or (
                isinstance(t, click.Path) and t.exists
            )
            if typed:
                out.append((path, param.opts[0]))
    return out


_TYPED = _typed_options()


class TestEveryCommand:
    def test_the_walk_reaches_every_group(self) -> None:
        """The walk covers every command group (a command added later is walked too)."""
        groups = {path[0] for path, _ in _TYPED}
        assert {"admit", "demo", "kv", "sim", "tenancy", "tiers"} <= groups
        assert len(_TYPED) >= 40

    @pytest.mark.parametrize(
        ("path", "option"), _TYPED, ids=lambda v: "-".join(v) if isinstance(v, tuple) else v
    )
    def test_a_bad_value_is_a_usage_error_naming_the_option(
        self, path: tuple[str, ...], option: str
    ) -> None:
        """A value the option's type refuses: exit status 2, the option named, no traceback."""
        code, out, error = _run(*path, option, "/nonexistent/not-a-value")
        assert error is None
        assert code == 2
        assert f"'{option}'" in out or f"{option}:" in out, out

    @pytest.mark.parametrize(
        ("args", "option"),
        [
            (["admit", "analyze", "--input-len", "abc", "--decode-len", "2", "--memory", "9"],
             "--input-len"),
            (["admit", "analyze", "--input-len", "5", "--decode-len", "x", "--memory", "9"],
             "--decode-len"),
            (["admit", "analyze", "--input-len", "5,5", "--decode-len", "2,3", "--mix", "a,b",
              "--memory", "518"], "--mix"),
            (["admit", "simulate", "--input-len", "5", "--decode-len", "3", "--memory", "99",
              "--arrivals", "xyz"], "--arrivals"),
            (["sim", "run", "--stack", "nosuch", "--model", "Llama-3-8B", "--gpu", "H100-SXM",
              "--workload", "multi-tenant"], "--stack"),
            (["sim", "sweep", "--param", "bad", "--model", "Llama-3-8B", "--gpu", "H100-SXM",
              "--workload", "multi-tenant"], "--param"),
        ],
    )  # fmt: skip
    def test_free_text_options(self, args: list[str], option: str) -> None:
        """Options parsed from free text: a bad value is a usage error naming the option."""
        code, out, error = _run(*args)
        assert (error, code) == (None, 2)
        assert option in out


def test_the_listed_help_is_each_commands_own() -> None:
    """Each registered command's one-line help, and its subcommands' names and helps, are
    those of the command itself (kept in two places so that listing imports nothing: this
    keeps them equal)."""
    import click

    from kvpolicy.commands._main import registered, spec_of

    def own(command: click.Command) -> str:
        return " ".join((command.help or "").split("\n\n")[0].split())

    found = registered()
    assert {"admit", "demo", "kv", "sim", "tenancy", "tiers"} <= set(found)
    for name, ep in found.items():
        spec = spec_of(ep)
        command = spec.load()
        assert spec.help == own(command), name
        if isinstance(command, click.Group):
            assert [p.name for p in command.params] == [], name  # the lazy group has none
            listed = {sub: own(cmd) for sub, cmd in command.commands.items()}
            assert dict(spec.subcommands) == listed, name
        else:
            assert not spec.subcommands, name
