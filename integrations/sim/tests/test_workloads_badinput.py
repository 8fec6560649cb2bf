"""Malformed copies of real trace rows: each gives a clear error or warning, never a traceback.

The rows are copied from the public traces (Azure 2023 conversation, Mooncake FAST'25
conversation, ShareGPT lengths, ServeGen Bailian deepseek-r1 client 50) and damaged here.
"""

from __future__ import annotations

import pathlib
import pickle
import re

import pytest

from kvpolicy.sim.workloads import TraceFormatError, TraceWarning, load_trace
from kvpolicy.sim.workloads._common import MAX_TOKENS
from kvpolicy.sim.workloads._servegen import MAX_ARRIVALS, MAX_WINDOW_ARRIVALS

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
AZURE_ROWS = (
    "2023-11-16 18:15:46.6805900,374,44",
    "2023-11-16 18:15:50.9951690,396,109",
    "2023-11-16 18:15:51.2224670,879,55",
)
MOONCAKE_ROW = (
    '{"timestamp": 0, "input_length": 6758, "output_length": 500, '
    '"hash_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}'
)
LENGTHS_HEADER = "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio"
LENGTHS_ROWS = ("74,918,992,0.0806100217864923", "290,905,1195,0.3204419889502762")
SERVEGEN_ROWS = (
    "43200,0.16166666666666665,9.079997311705315,Gamma,0.012129099540353521,79.2197786876842",
    "43800,0.31,4.0318342092483075,Weibull,0.43346111116190345,0.7729235699615892",
    "44400,0.065,1.2667405501798183,Gamma,0.6231959950416491,18.647635215607156",
)


def write(
    path: pathlib.Path, lines: list[str] | tuple[str, ...], *, newline: bool = True
) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + ("\n" if newline else ""))
    return path


def azure(tmp_path: pathlib.Path, *rows: str, newline: bool = True) -> pathlib.Path:
    return write(tmp_path / "azure.csv", [AZURE_HEADER, *rows], newline=newline)


def servegen(folder: pathlib.Path, client: int, rows: list[str]) -> pathlib.Path:
    return write(folder / f"chunk-{client}-trace.csv", rows, newline=bool(rows))


class TestHugeCounts:
    """Counts of 2**63 and more are refused at load time with the limit."""

    @pytest.mark.parametrize("count", [str(2**63), str(2**64 + 5), "1e300", str(MAX_TOKENS + 1)])
    def test_azure(self, tmp_path: pathlib.Path, count: str) -> None:
        """A huge ContextTokens names file, line, column and MAX_TOKENS."""
        path = azure(tmp_path, AZURE_ROWS[0], f"2023-11-16 18:15:50.9951690,{count},109")
        with pytest.raises(TraceFormatError) as info:
            load_trace(path)
        assert (info.value.path, info.value.line, info.value.column) == (
            str(path),
            3,
            "ContextTokens",
        )
        assert f"at most {MAX_TOKENS:,} tokens" in str(info.value)

    def test_limit_itself_loads(self, tmp_path: pathlib.Path) -> None:
        """MAX_TOKENS is accepted: the bound is inclusive."""
        path = azure(tmp_path, AZURE_ROWS[0], f"2023-11-16 18:15:50.9951690,{MAX_TOKENS},109")
        assert load_trace(path).requests[1].prompt_len == MAX_TOKENS

    def test_mooncake(self, tmp_path: pathlib.Path) -> None:
        """A huge output_length in a JSONL row names the key."""
        row = MOONCAKE_ROW.replace('"output_length": 500', f'"output_length": {2**63}')
        path = write(tmp_path / "trace.jsonl", [MOONCAKE_ROW, row])
        with pytest.raises(TraceFormatError, match=r"line 2, column 'output_length': must be at"):
            load_trace(path)

    def test_servegen_pmf(self, tmp_path: pathlib.Path) -> None:
        """A huge value in a ServeGen length PMF is refused (not wrapped into int64)."""
        folder = tmp_path / "model"
        servegen(folder, 0, list(SERVEGEN_ROWS))
        pmf = f"{{{2**63}: 1.0}}"
        (folder / "chunk-0-dataset.json").write_text(
            f'{{"43200": {{"input_tokens": "{pmf}", "output_tokens": "{{5: 1.0}}"}}}}'
        )
        with pytest.raises(TraceFormatError, match="at most 4,294,967,296 tokens"):
            load_trace(folder)


class TestServeGenRates:
    """A rate row too large to draw is refused before any memory is allocated."""

    def test_huge_rate(self, tmp_path: pathlib.Path) -> None:
        """10**7 req/s in one row names file, line, column and the per-window limit."""
        folder = tmp_path / "model"
        rows = list(SERVEGEN_ROWS)
        rows[1] = rows[1].replace(",0.31,", ",10000000,")
        path = servegen(folder, 50, rows)
        with pytest.raises(TraceFormatError) as info:
            load_trace(folder, limit=10)
        assert (info.value.path, info.value.line, info.value.column) == (str(path), 2, "rate")
        assert f"at most {MAX_WINDOW_ARRIVALS:,} per window" in str(info.value)

    def test_huge_scaled_rate(self, tmp_path: pathlib.Path) -> None:
        """A 'rate' that scales a window past the limit is refused the same way."""
        folder = tmp_path / "model"
        servegen(folder, 50, list(SERVEGEN_ROWS))
        with pytest.raises(TraceFormatError, match="scaled to"):
            load_trace(folder, rate=1e6, limit=10)

    def test_total_bound_with_duration(self, tmp_path: pathlib.Path) -> None:
        """Windows each under the limit but too many in all are refused without 'limit'."""
        folder = tmp_path / "model"
        rate = MAX_WINDOW_ARRIVALS / 600 * 0.9
        servegen(folder, 0, [f"{i * 600},{rate},1.0,Gamma,1.0,1.0" for i in range(5)])
        with pytest.raises(ValueError, match=f"at most {MAX_ARRIVALS:,}"):
            load_trace(folder, duration=3000.0)

    def test_abc_rate(self, tmp_path: pathlib.Path) -> None:
        """'abc' as a rate names the column."""
        folder = tmp_path / "model"
        rows = list(SERVEGEN_ROWS)
        rows[2] = rows[2].replace(",0.065,", ",abc,")
        servegen(folder, 50, rows)
        with pytest.raises(TraceFormatError, match=r"line 3, column 'rate': must be a number"):
            load_trace(folder)


class TestEmptyFiles:
    """Empty client files and header-only traces are reported, not read as no traffic."""

    def test_empty_servegen_client(self, tmp_path: pathlib.Path) -> None:
        """An empty chunk-<i>-trace.csv beside a good one is an error naming it."""
        folder = tmp_path / "model"
        servegen(folder, 50, list(SERVEGEN_ROWS))
        empty = servegen(folder, 66, [])
        with pytest.raises(TraceFormatError, match="damaged copy") as info:
            load_trace(folder)
        assert info.value.path == str(empty)

    def test_empty_servegen_client_skipped(self, tmp_path: pathlib.Path) -> None:
        """With skip_bad the empty client is counted and noted."""
        folder = tmp_path / "model"
        servegen(folder, 50, list(SERVEGEN_ROWS))
        servegen(folder, 66, [])
        w = load_trace(folder, skip_bad=True)
        assert w.skipped_rows == 1
        assert {r.tenant for r in w.requests} == {"client-50"}
        assert any("chunk-66-trace.csv" in n and "damaged copy" in n for n in w.notes)

    @pytest.mark.parametrize(
        ("name", "lines"),
        [
            ("azure.csv", [AZURE_HEADER]),
            ("lengths.csv", [LENGTHS_HEADER]),
            ("trace.jsonl", []),
        ],
    )
    def test_header_only(self, tmp_path: pathlib.Path, name: str, lines: list[str]) -> None:
        """A trace without data rows is an error, not an empty workload."""
        path = write(tmp_path / name, lines)
        fmt = "mooncake" if name.endswith("jsonl") else None
        with pytest.raises(TraceFormatError, match="no requests: no data rows") as info:
            load_trace(path, fmt, rate=1.0 if name == "lengths.csv" else None)
        assert info.value.path == str(path)

    def test_all_rows_skipped(self, tmp_path: pathlib.Path) -> None:
        """With skip_bad, a file whose rows are all malformed is still an error."""
        path = azure(tmp_path, "2023-11-16 18:15:46.6805900,abc,44")
        with pytest.raises(TraceFormatError, match="all 1 data rows are malformed"):
            load_trace(path, skip_bad=True)

    def test_servegen_range_without_traffic(self, tmp_path: pathlib.Path) -> None:
        """A start/duration over idle windows only is an error naming the range."""
        folder = tmp_path / "model"
        servegen(folder, 50, ["0,0,0,,0,0", "600,0,0,,0,0", *SERVEGEN_ROWS])
        with pytest.raises(TraceFormatError, match="no requests between 0 s and 1200 s"):
            load_trace(folder, duration=1200.0)


class TestColumns:
    """A bad field names the file, the line and the column."""

    @pytest.mark.parametrize(
        ("row", "column"),
        [
            ("2023-11-16 18:15:50.9951690,abc,109", "ContextTokens"),
            ("2023-11-16 18:15:50.9951690,396,abc", "GeneratedTokens"),
            ("abc,396,109", "TIMESTAMP"),
            ("2023-11-16 18:15:50.9951690,3.5,109", "ContextTokens"),
        ],
    )
    def test_azure(self, tmp_path: pathlib.Path, row: str, column: str) -> None:
        """Each bad Azure field is reported with its header name."""
        path = azure(tmp_path, AZURE_ROWS[0], row)
        with pytest.raises(TraceFormatError) as info:
            load_trace(path)
        assert str(info.value).startswith(f"{path}, line 3, column {column!r}: ")

    def test_lengths(self, tmp_path: pathlib.Path) -> None:
        """'abc' in a lengths CSV names the column from its header."""
        path = write(tmp_path / "l.csv", [LENGTHS_HEADER, LENGTHS_ROWS[0], "290,abc,1195,0.3"])
        with pytest.raises(TraceFormatError, match=r"line 3, column 'num_decode_tokens': "):
            load_trace(path, rate=1.0)

    def test_pickles(self) -> None:
        """The column survives pickling (sweeps send errors across processes)."""
        err = pickle.loads(pickle.dumps(TraceFormatError("t.csv", 3, "bad", "rate")))
        assert (err.path, err.line, err.reason, err.column) == ("t.csv", 3, "bad", "rate")
        assert str(err) == "t.csv, line 3, column 'rate': bad"


class TestCutLastLine:
    """A last line cut inside its last number, without a final newline, is reported."""

    def test_azure_cut(self, tmp_path: pathlib.Path) -> None:
        """'109' cut to '1' warns naming the line and column, and notes it."""
        path = azure(tmp_path, AZURE_ROWS[0], "2023-11-16 18:15:50.9951690,396,1", newline=False)
        with pytest.warns(TraceWarning, match=re.escape("line 3, column 'GeneratedTokens'")):
            w = load_trace(path)
        assert any("cut short" in n for n in w.notes)

    def test_no_newline_but_whole(self, tmp_path: pathlib.Path) -> None:
        """A last row as wide as the others without a final newline is legitimate: no note."""
        path = azure(tmp_path, *AZURE_ROWS, newline=False)
        w = load_trace(path)
        assert not any("cut short" in n for n in w.notes)

    def test_narrow_with_newline(self, tmp_path: pathlib.Path) -> None:
        """A narrow last field followed by a newline is whole data: no note."""
        path = azure(tmp_path, AZURE_ROWS[0], "2023-11-16 18:15:50.9951690,396,1")
        assert not any("cut short" in n for n in load_trace(path).notes)

    def test_lengths_cut(self, tmp_path: pathlib.Path) -> None:
        """A lengths CSV whose last pd_ratio is cut warns."""
        path = write(
            tmp_path / "l.csv", [LENGTHS_HEADER, *LENGTHS_ROWS, "43,5,48,0"], newline=False
        )
        with pytest.warns(TraceWarning, match="column 'pd_ratio'"):
            load_trace(path, rate=1.0)

    def test_servegen_cut(self, tmp_path: pathlib.Path) -> None:
        """A ServeGen client file whose last param2 is cut warns and notes it."""
        folder = tmp_path / "model"
        rows = list(SERVEGEN_ROWS)
        rows[2] = rows[2].rsplit(",", 1)[0] + ",1"
        write(folder / "chunk-50-trace.csv", rows, newline=False)
        with pytest.warns(TraceWarning, match="line 3, column 'param2'"):
            w = load_trace(folder)
        assert any("cut short" in n for n in w.notes)

    def test_mooncake_cut_is_an_error(self, tmp_path: pathlib.Path) -> None:
        """A JSONL row cut inside its last number is not JSON: an error naming the line."""
        path = write(tmp_path / "trace.jsonl", [MOONCAKE_ROW, MOONCAKE_ROW[:-5]], newline=False)
        with pytest.raises(TraceFormatError, match="line 2"):
            load_trace(path, "mooncake")


class TestTraceHints:
    def test_csv_read_as_mooncake_says_what_mooncake_is(self, tmp_path: pathlib.Path) -> None:
        """A CSV passed as Mooncake: line 1 is not JSON, and the message says what a Mooncake
        trace is, not only the JSON parser's complaint."""
        path = tmp_path / "azure.csv"
        path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,1\n")
        with pytest.raises(TraceFormatError, match=r"line 1: not JSON .*Mooncake trace is JSONL"):
            load_trace(path, "mooncake")

    def test_folder_above_servegen_services_names_them(self, tmp_path: pathlib.Path) -> None:
        """The folder above ServeGen's services lists the services to pass instead."""
        for name in ("m-large", "m-small"):
            (tmp_path / name).mkdir()
            (tmp_path / name / "chunk-0-trace.csv").write_text("0,1,1,Gamma,1,1\n")
        with pytest.raises(TraceFormatError, match="pass one of them: m-large, m-small"):
            load_trace(tmp_path)
