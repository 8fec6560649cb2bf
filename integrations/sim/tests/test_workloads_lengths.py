"""Tests of the length-only CSV loader (ShareGPT, arXiv) with Poisson arrivals."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from kvpolicy.sim.workloads import TraceFormatError, describe, detect_format, load_trace

TRACES = pathlib.Path(__file__).resolve().parents[3] / ".." / "shared" / "traces"
SHAREGPT = TRACES / "sharegpt-8k-lengths" / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
ARXIV = (
    TRACES / "arxiv-summarization-lengths"
    / "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"
)  # fmt: skip
HEADER = "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"


def write_csv(tmp_path: pathlib.Path, *rows: str, header: str = HEADER) -> pathlib.Path:
    path = tmp_path / "lengths.csv"
    path.write_text(header + "".join(r + "\n" for r in rows))
    return path


class TestLoadLengths:
    def test_lengths_in_file_order(self, tmp_path: pathlib.Path) -> None:
        """Rows keep their order and lengths; extra columns are ignored."""
        path = write_csv(tmp_path, "74,918,992,0.08", "290,905,1195,0.32", "3,4,7,0.75")
        w = load_trace(path, rate=2.0)
        assert [(r.prompt_len, r.decode_len) for r in w.requests] == [
            (74, 918), (290, 905), (3, 4),
        ]  # fmt: skip
        assert [r.request_id for r in w.requests] == ["L2", "L3", "L4"]
        assert w.requests[0].arrival_time == 0.0

    def test_poisson_arrivals_are_seeded(self, tmp_path: pathlib.Path) -> None:
        """Arrivals are Poisson at the rate given, the same for the same seed."""
        path = write_csv(tmp_path, *(f"{i + 1},{i + 1},0,0" for i in range(6_000)))
        w = load_trace(path, rate=8.0, seed=3)
        assert w == load_trace(path, rate=8.0, seed=3)
        assert w != load_trace(path, rate=8.0, seed=4)
        gaps = np.diff(w.arrival_times())
        assert 1.0 / gaps.mean() == pytest.approx(8.0, rel=0.05)
        assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)

    def test_rate_is_required(self, tmp_path: pathlib.Path) -> None:
        """Without a rate the lengths format refuses to guess one."""
        path = write_csv(tmp_path, "1,1,2,1")
        with pytest.raises(ValueError, match="'rate' is required for the 'lengths' format"):
            load_trace(path)

    def test_alternative_header(self, tmp_path: pathlib.Path) -> None:
        """Headers such as prompt_tokens,output_tokens are recognised and detected."""
        path = write_csv(tmp_path, "5,6", header="prompt_tokens,output_tokens\n")
        assert detect_format(path) == "lengths"
        assert load_trace(path, rate=1.0).requests[0].total_len == 11

    def test_unrecognised_header(self, tmp_path: pathlib.Path) -> None:
        """A header without known columns is an error on line 1."""
        path = write_csv(tmp_path, "5,6", header="a,b\n")
        with pytest.raises(TraceFormatError, match="line 1: header must name a prompt column"):
            load_trace(path, "lengths", rate=1.0)
        with pytest.raises(TraceFormatError, match="cannot detect the trace format"):
            detect_format(path)

    def test_bad_rows_and_skip(self, tmp_path: pathlib.Path) -> None:
        """Bad rows name file and line; skip_bad counts them; zeros are clamped."""
        path = write_csv(tmp_path, "5,6,11,1", "x,6,0,0", "5,0,5,0", "1,2")
        with pytest.raises(
            TraceFormatError, match=f"{path}, line 3, column 'num_prefill_tokens': .*'x'"
        ):
            load_trace(path, rate=1.0)
        w = load_trace(path, rate=1.0, skip_bad=True)
        assert (w.num_requests, w.skipped_rows, w.clamped_rows) == (2, 2, 1)

    @pytest.mark.parametrize(("rate", "error"), [(0.0, ValueError), ("2", TypeError)])
    def test_bad_rate(self, tmp_path: pathlib.Path, rate: object, error: type) -> None:
        """A non-positive or non-numeric rate names 'rate'."""
        with pytest.raises(error, match="'rate'"):
            load_trace(write_csv(tmp_path, "1,1,2,1"), rate=rate)  # type: ignore[arg-type]


@pytest.mark.traces
class TestLengthTraces:
    @pytest.mark.parametrize(
        ("path", "rows", "mean_prompt", "max_prompt"),
        [(SHAREGPT, 30731, 2340.0, 8141), (ARXIV, 28257, 2588.1, 4054)],
    )
    def test_matches_provenance(
        self, path: pathlib.Path, rows: int, mean_prompt: float, max_prompt: int
    ) -> None:
        """The real length files load whole and match their PROVENANCE figures."""
        if not path.exists():
            pytest.skip(f"public trace not found at {path} (see DESIGN.md: ../shared/traces)")
        d = describe(load_trace(path, rate=2.0))
        assert (d["num_requests"], d["skipped_rows"], d["clamped_rows"]) == (rows, 0, 0)
        assert d["prompt_tokens"]["mean"] == pytest.approx(mean_prompt, abs=0.1)
        assert d["prompt_tokens"]["max"] == max_prompt
