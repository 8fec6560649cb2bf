"""Tests of the Azure LLM inference trace loader (kvpolicy.sim.workloads._azure)."""

from __future__ import annotations

import pathlib
import pickle

import pytest

from kvpolicy.sim.workloads import TraceFormatError, describe, detect_format, load_trace
from kvpolicy.sim.workloads._azure import parse_timestamp_ns

TRACES = pathlib.Path(__file__).resolve().parents[3] / ".." / "shared" / "traces"
AZURE_CONV = TRACES / "azure-llm-2023-conv" / "AzureLLMInferenceTrace_conv.csv"
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def write_csv(tmp_path: pathlib.Path, *rows: str, header: str = HEADER) -> pathlib.Path:
    path = tmp_path / "trace.csv"
    path.write_text(header + "".join(r + "\n" for r in rows))
    return path


class TestTimestamps:
    def test_seven_fractional_digits_exact(self) -> None:
        """The 7th fractional digit (100 ns) is kept exactly."""
        a = parse_timestamp_ns("2023-11-16 18:15:46.6805900")
        b = parse_timestamp_ns("2023-11-16 18:15:46.6805901")
        assert b - a == 100

    def test_day_boundary(self) -> None:
        """Timestamps across midnight are one nanosecond-exact day apart."""
        a = parse_timestamp_ns("2023-12-31 23:59:59.9999999")
        b = parse_timestamp_ns("2024-01-01 00:00:00")
        assert b - a == 100

    @pytest.mark.parametrize(
        "text", ["2023-11-16", "2023-13-01 00:00:00", "2023-11-16 24:00:00", "x"]
    )
    def test_rejects_malformed(self, text: str) -> None:
        """Malformed or impossible timestamps are a ValueError quoting the text."""
        with pytest.raises(ValueError, match="TIMESTAMP"):
            parse_timestamp_ns(text)


class TestLoadAzure:
    def test_relative_arrivals_and_lengths(self, tmp_path: pathlib.Path) -> None:
        """Arrival times are exact seconds since the first row; lengths are copied."""
        path = write_csv(
            tmp_path,
            "2023-11-16 18:15:46.6805900,374,44",
            "2023-11-16 18:15:50.9951690,396,109",
            "2023-11-16 18:16:00.0000000,10,2",
        )
        w = load_trace(path)
        assert [r.arrival_time for r in w.requests] == [0.0, 4.314579, 13.31941]
        assert [(r.prompt_len, r.decode_len) for r in w.requests] == [
            (374, 44), (396, 109), (10, 2),
        ]  # fmt: skip
        assert [r.request_id for r in w.requests] == ["L2", "L3", "L4"]
        assert (w.name, w.source, w.skipped_rows) == ("trace", str(path), 0)

    def test_bad_row_names_file_and_line(self, tmp_path: pathlib.Path) -> None:
        """A malformed row raises TraceFormatError with the file and the line."""
        path = write_csv(tmp_path, "2023-11-16 18:15:46.1,374,44", "2023-11-16 18:15:47,abc,4")
        with pytest.raises(
            TraceFormatError, match=f"{path}, line 3, column 'ContextTokens': .*'abc'"
        ) as info:
            load_trace(path, "azure")
        assert (info.value.line, info.value.path) == (3, str(path))
        assert isinstance(info.value, ValueError)

    @pytest.mark.parametrize(
        "row",
        [
            "2023-11-16 18:15:47,4",
            "2023-11-16 18:15:47,4,5,6",
            "2023-11-16 18:15:47,-4,5",
            "2023-11-16 18:15:47,4,2.5",
            "yesterday,4,5",
        ],
    )
    def test_each_malformation_is_reported(self, tmp_path: pathlib.Path, row: str) -> None:
        """Wrong field counts, negative or fractional counts and bad times are errors."""
        path = write_csv(tmp_path, "2023-11-16 18:15:46,1,1", row)
        with pytest.raises(TraceFormatError, match="line 3"):
            load_trace(path, "azure")

    def test_error_survives_pickling(self, tmp_path: pathlib.Path) -> None:
        """TraceFormatError keeps path, line and reason through pickle (process pools)."""
        err = TraceFormatError(tmp_path / "t.csv", 7, "bad")
        back = pickle.loads(pickle.dumps(err))
        assert (back.path, back.line, back.reason, str(back)) == (
            str(tmp_path / "t.csv"), 7, "bad", f"{tmp_path / 't.csv'}, line 7: bad",
        )  # fmt: skip

    def test_skip_bad_counts(self, tmp_path: pathlib.Path) -> None:
        """With skip_bad the bad rows are left out and counted, never silently."""
        path = write_csv(
            tmp_path,
            "2023-11-16 18:15:46,1,1",
            "garbage",
            "2023-11-16 18:15:48,2,-1",
            "2023-11-16 18:15:49,3,3",
        )
        w = load_trace(path, skip_bad=True)
        assert [r.request_id for r in w.requests] == ["L2", "L5"]
        assert w.skipped_rows == 2
        assert "2 malformed rows skipped" in w.notes

    def test_zero_lengths_are_clamped_and_counted(self, tmp_path: pathlib.Path) -> None:
        """Zero prompt or output lengths become 1 token and are counted in clamped_rows."""
        path = write_csv(
            tmp_path,
            "2023-11-16 18:15:46,0,5",
            "2023-11-16 18:15:47,8,0",
            "2023-11-16 18:15:48,8,8",
        )
        w = load_trace(path)
        assert [(r.prompt_len, r.decode_len) for r in w.requests] == [(1, 5), (8, 1), (8, 8)]
        assert w.clamped_rows == 2
        assert describe(w)["clamped_rows"] == 2

    def test_undecodable_bytes_are_a_bad_row(self, tmp_path: pathlib.Path) -> None:
        """Bytes that are not UTF-8 make their row malformed (line named), or skipped."""
        path = tmp_path / "trace.csv"
        path.write_bytes(
            HEADER.encode() + b"2023-11-16 18:15:46,1,1\n2023-11-16 18:15:47,\xff\xfe,1\n"
        )
        with pytest.raises(TraceFormatError, match="line 3"):
            load_trace(path)
        assert load_trace(path, skip_bad=True).skipped_rows == 1

    def test_binary_file_is_not_detected(self, tmp_path: pathlib.Path) -> None:
        """A binary file is a TraceFormatError from detection, not a decoding crash."""
        path = tmp_path / "blob.bin"
        path.write_bytes(bytes(range(256)))
        with pytest.raises(TraceFormatError, match="cannot detect the trace format"):
            load_trace(path)

    def test_wrong_header(self, tmp_path: pathlib.Path) -> None:
        """A file with another header is an error on line 1."""
        path = write_csv(tmp_path, "2023-11-16 18:15:46,1,1", header="time,in,out\n")
        with pytest.raises(TraceFormatError, match="line 1: header must name"):
            load_trace(path, "azure")

    def test_extra_columns_keep_the_timestamps(self, tmp_path: pathlib.Path) -> None:
        """An Azure CSV with one more column is read as Azure, by column name: its recorded
        arrival times, not a lengths-only trace given invented ones."""
        path = tmp_path / "more.csv"
        path.write_text(
            "ContextTokens,TIMESTAMP,Model,GeneratedTokens\n"
            "100,2023-11-16 18:15:46.0000000,a,7\n"
            "200,2023-11-16 18:15:48.5000000,b,9\n"
        )
        assert detect_format(path) == "azure"
        w = load_trace(path)
        assert [r.arrival_time for r in w.requests] == [0.0, 2.5]
        assert [(r.prompt_len, r.decode_len) for r in w.requests] == [(100, 7), (200, 9)]

    def test_repeated_column_is_refused(self, tmp_path: pathlib.Path) -> None:
        """A header naming a column twice is an error on line 1."""
        path = write_csv(
            tmp_path,
            "2023-11-16 18:15:46,1,1,2",
            header="TIMESTAMP,ContextTokens,GeneratedTokens,TIMESTAMP\n",
        )
        with pytest.raises(TraceFormatError, match="each once"):
            load_trace(path, "azure")

    def test_limit_and_rate(self, tmp_path: pathlib.Path) -> None:
        """limit keeps the first rows; rate rescales time to that mean rate."""
        path = write_csv(
            tmp_path,
            "2023-11-16 18:15:46,1,1",
            "2023-11-16 18:15:48,1,1",
            "2023-11-16 18:15:52,1,1",
            "2023-11-16 18:15:59,1,1",
        )
        w = load_trace(path, limit=3, rate=1.0)
        assert w.num_requests == 3
        assert [r.arrival_time for r in w.requests] == [0.0, 0.6666666666666666, 2.0]

    def test_unsorted_rows_are_sorted_and_noted(self, tmp_path: pathlib.Path) -> None:
        """Rows out of order are sorted, times relative to the earliest, and noted."""
        path = write_csv(tmp_path, "2023-11-16 18:15:50,1,1", "2023-11-16 18:15:46,2,2")
        w = load_trace(path)
        assert [(r.request_id, r.arrival_time) for r in w.requests] == [
            ("L3", 0.0), ("L2", 4.0),
        ]  # fmt: skip
        assert w.notes == ("1 rows arrive before the row above them; rows sorted by time",)

    def test_blank_lines_are_not_rows(self, tmp_path: pathlib.Path) -> None:
        """A trailing blank line is not a row and is not counted."""
        path = write_csv(tmp_path, "2023-11-16 18:15:46,1,1", "")
        w = load_trace(path, skip_bad=True)
        assert (w.num_requests, w.skipped_rows) == (1, 0)

    def test_detect_and_unknown_format(self, tmp_path: pathlib.Path) -> None:
        """The header is detected as azure; an unknown format name lists the known ones."""
        path = write_csv(tmp_path, "2023-11-16 18:15:46,1,1")
        assert detect_format(path) == "azure"
        with pytest.raises(
            ValueError,
            match="unknown trace format 'parquet'; known: azure, lengths, mooncake, servegen",
        ):
            load_trace(path, "parquet")

    def test_bad_arguments(self, tmp_path: pathlib.Path) -> None:
        """A missing file, a bad limit, or an option the format does not take (Azure rows
        carry no prefix hashes, so no block size) raise naming the parameter."""
        path = write_csv(tmp_path, "2023-11-16 18:15:46,1,1")
        with pytest.raises(FileNotFoundError, match="'path' does not exist"):
            load_trace(tmp_path / "missing.csv")
        with pytest.raises(ValueError, match="'limit' must be >= 1: 0"):
            load_trace(path, limit=0)
        with pytest.raises(ValueError, match="unknown param 'block_size'; accepted: path"):
            load_trace(path, block_size=32)


@pytest.mark.traces
class TestAzureConvTrace:
    def test_matches_provenance_statistics(self) -> None:
        """The real conversation trace loads whole and matches its PROVENANCE figures."""
        if not AZURE_CONV.exists():
            pytest.skip(f"public trace not found at {AZURE_CONV} (see DESIGN.md: ../shared/traces)")
        w = load_trace(AZURE_CONV)
        d = describe(w)
        assert (d["num_requests"], d["skipped_rows"], d["clamped_rows"]) == (19366, 0, 0)
        assert d["duration_s"] == pytest.approx(3501.721937, abs=1e-9)
        assert d["interarrival_cv"] == pytest.approx(1.094, abs=5e-4)
        assert d["prompt_tokens"]["max"] == 14050
        assert d["prompt_tokens"]["p50"] == 1020.0
        assert d["decode_tokens"]["max"] == 1000
        assert d["decode_tokens"]["p99"] == 601.0
