"""Tests of the ServeGen per-client series loader (multi-tenant synthesis)."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from kvpolicy.sim.workloads import (
    GammaArrivals,
    TraceFormatError,
    describe,
    detect_format,
    load_trace,
    servegen_client_stats,
)
from kvpolicy.sim.workloads._servegen import parse_pmf

TRACES = pathlib.Path(__file__).resolve().parents[3] / ".." / "shared" / "traces"
DEEPSEEK = TRACES / "servegen-bailian" / "reason" / "deepseek-r1"


def write_client(
    folder: pathlib.Path,
    client: int,
    rows: list[str],
    dataset: dict[str, dict[str, str]] | None = None,
) -> pathlib.Path:
    folder.mkdir(exist_ok=True)
    path = folder / f"chunk-{client}-trace.csv"
    path.write_text("".join(r + "\n" for r in rows))
    if dataset is not None:
        (folder / f"chunk-{client}-dataset.json").write_text(json.dumps(dataset))
    return path


def windows(rate: float, cv: float, n: int, length: int = 600) -> list[str]:
    return [f"{i * length},{rate},{cv},Gamma,1.0,1.0" for i in range(n)]


PMFS = {"0": {"input_tokens": "{10: 0.5, 20: 0.5}", "output_tokens": "{3: 1.0}"}}


class TestParsePMF:
    def test_exact(self) -> None:
        """A PMF literal parses to its values and probabilities."""
        values, probs = parse_pmf("{4: 0.25, 9: 0.75}")
        assert values.tolist() == [4, 9]
        assert probs.tolist() == [0.25, 0.75]

    def test_empty(self) -> None:
        """An empty dict is an empty PMF."""
        assert parse_pmf("{}")[0].size == 0

    @pytest.mark.parametrize(
        "text", ["[1, 2]", "{4: 0.5, 5}", "{__import__('os'): 1}", "{4.5: 1.0}", "{4: -1}"]
    )
    def test_rejects(self, text: str) -> None:
        """Non-literals, code, fractional values and negative probabilities are rejected."""
        with pytest.raises(ValueError, match="PMF"):
            parse_pmf(text)


class TestLoadServeGen:
    def test_clients_become_tenants(self, tmp_path: pathlib.Path) -> None:
        """Each client is a tenant; counts follow the rates; lengths come from the PMFs."""
        write_client(tmp_path, 0, windows(2.0, 1.0, 6), PMFS)
        write_client(tmp_path, 3, windows(0.5, 1.0, 6), PMFS)
        w = load_trace(tmp_path, seed=1)
        assert detect_format(tmp_path) == "servegen"
        assert w.tenants == ("client-0", "client-3")
        counts = describe(w)["tenants"]
        assert counts["client-0"]["requests"] == pytest.approx(2.0 * 3600, rel=0.05)
        assert counts["client-3"]["requests"] == pytest.approx(0.5 * 3600, rel=0.1)
        assert {r.prompt_len for r in w.requests} == {10, 20}
        assert {r.decode_len for r in w.requests} == {3}
        assert w.requests[0].request_id.startswith("c")
        specs = {t.name: (t.service_class, t.request_priority) for t in w.tenant_specs}
        assert specs == {"client-0": ("elastic", 0), "client-3": ("elastic", 0)}
        assert sum(t.share for t in w.tenant_specs) == pytest.approx(1.0)
        assert all(0.0 <= r.arrival_time < 3600.0 for r in w.requests)

    def test_gamma_cv_per_window(self, tmp_path: pathlib.Path) -> None:
        """A client's gaps have the window's CV."""
        write_client(tmp_path, 0, windows(2.0, 3.0, 20), PMFS)
        w = load_trace(tmp_path, seed=2)
        fit = GammaArrivals.fit(w.arrival_times())
        assert fit.rate == pytest.approx(2.0, rel=0.1)
        assert fit.cv == pytest.approx(3.0, rel=0.1)

    def test_lengths_follow_the_6h_window(self, tmp_path: pathlib.Path) -> None:
        """A request draws from the PMFs of the window holding its arrival time."""
        dataset = {
            "0": {"input_tokens": "{100: 1.0}", "output_tokens": "{1: 1.0}"},
            "21600": {"input_tokens": "{}", "output_tokens": "{}"},
            "43200": {"input_tokens": "{300: 1.0}", "output_tokens": "{2: 1.0}"},
        }
        write_client(tmp_path, 0, windows(0.01, 1.0, 3, length=21600), dataset)
        w = load_trace(tmp_path, seed=0)
        for r in w.requests:
            # The empty middle window falls back on the earlier one.
            expected = 300 if r.arrival_time >= 43200 else 100
            assert r.prompt_len == expected

    def test_limit_stops_early_and_keeps_order(self, tmp_path: pathlib.Path) -> None:
        """limit gives exactly the first requests, in time order."""
        write_client(tmp_path, 0, windows(1000.0, 1.0, 1000), PMFS)
        w = load_trace(tmp_path, limit=500)
        assert w.num_requests == 500
        assert (np.diff(w.arrival_times()) >= 0).all()
        assert w.duration < 1.0

    def test_rate_start_and_duration(self, tmp_path: pathlib.Path) -> None:
        """rate rescales the aggregate; start and duration cut the series."""
        write_client(tmp_path, 0, windows(1.0, 1.0, 12), PMFS)
        write_client(tmp_path, 1, windows(3.0, 1.0, 12), PMFS)
        w = load_trace(tmp_path, rate=2.0, start=1200.0, duration=3600.0, seed=4)
        assert w.num_requests == pytest.approx(2.0 * 3600, rel=0.05)
        assert all(0.0 <= r.arrival_time < 3600.0 for r in w.requests)
        assert "rates scaled by 0.5" in w.notes[0]

    @pytest.mark.heavy
    def test_speedup_and_scale(self, tmp_path: pathlib.Path) -> None:
        """speedup K plays the same requests K times faster (the series' shape kept); scale S
        draws S times the requests over the same span; with rate, or not positive, refused
        naming the argument."""
        write_client(tmp_path, 0, windows(1.0, 1.0, 6), PMFS)
        write_client(tmp_path, 1, windows(3.0, 1.0, 6), PMFS)
        base = load_trace(tmp_path, seed=4)
        fast = load_trace(tmp_path, seed=4, speedup=24.0)
        assert [r.request_id for r in fast.requests] == [r.request_id for r in base.requests]
        assert fast.arrival_times() == pytest.approx(base.arrival_times() / 24.0)
        assert "played 24x faster" in fast.notes[0]
        more = load_trace(tmp_path, seed=4, scale=3.0)
        assert more.num_requests == pytest.approx(3 * base.num_requests, rel=0.05)
        assert all(r.arrival_time < 3600.0 for r in more.requests)
        with pytest.raises(ValueError, match="give 'rate' or 'scale', not both"):
            load_trace(tmp_path, rate=2.0, scale=2.0)
        with pytest.raises(ValueError, match="'speedup' must be finite and > 0: 0"):
            load_trace(tmp_path, speedup=0)
        with pytest.raises(TypeError, match="'scale' must be a number: 'x'"):
            load_trace(tmp_path, scale="x")  # type: ignore[arg-type]

    def test_no_dataset_uses_azure_lengths_and_says_so(self, tmp_path: pathlib.Path) -> None:
        """Without length files the lengths come from the Azure trace's quantiles, noted."""
        write_client(tmp_path, 0, windows(1.0, 1.0, 2))
        w = load_trace(tmp_path)
        assert any("Azure conversation trace's quantiles" in n for n in w.notes)
        assert max(r.decode_len for r in w.requests) <= 1000

    def test_client_without_dataset_uses_pooled_pmfs(self, tmp_path: pathlib.Path) -> None:
        """A client without a length file draws from the other clients' PMFs, noted."""
        write_client(tmp_path, 0, windows(1.0, 1.0, 2), PMFS)
        write_client(tmp_path, 1, windows(1.0, 1.0, 2))
        w = load_trace(tmp_path)
        assert {r.prompt_len for r in w.requests if r.tenant == "client-1"} == {10, 20}
        assert any("1 clients without length PMFs" in n for n in w.notes)

    def test_single_file(self, tmp_path: pathlib.Path) -> None:
        """One chunk file is a one-client workload."""
        path = write_client(tmp_path, 7, windows(1.0, 1.0, 2), PMFS)
        assert load_trace(path).tenants == ("client-7",)

    def test_bad_window_row(self, tmp_path: pathlib.Path) -> None:
        """A bad window row names the chunk file and line; skip_bad counts it."""
        rows = windows(1.0, 1.0, 3)
        rows[1] = "600,abc,1.0,Gamma,1,1"
        path = write_client(tmp_path, 0, rows, PMFS)
        with pytest.raises(TraceFormatError, match=f"{path}, line 2"):
            load_trace(tmp_path)
        w = load_trace(tmp_path, skip_bad=True)
        assert w.skipped_rows == 1

    def test_bad_pmf_names_file_and_window(self, tmp_path: pathlib.Path) -> None:
        """A malformed PMF names the dataset file and the window."""
        bad = {"0": {"input_tokens": "{1: x}", "output_tokens": "{1: 1.0}"}}
        write_client(tmp_path, 0, windows(1.0, 1.0, 1), bad)
        with pytest.raises(TraceFormatError, match=r"chunk-0-dataset.json: window '0'"):
            load_trace(tmp_path)

    def test_skip_bad_pmf_window_falls_back(self, tmp_path: pathlib.Path) -> None:
        """With skip_bad a malformed length window is counted and treated as empty."""
        dataset = {
            "0": {"input_tokens": "{100: 1.0}", "output_tokens": "{1: 1.0}"},
            "21600": {"input_tokens": "{1: x}", "output_tokens": "{1: 1.0}"},
        }
        write_client(tmp_path, 0, windows(0.01, 1.0, 2, length=21600), dataset)
        w = load_trace(tmp_path, skip_bad=True)
        assert w.skipped_rows == 1
        assert {r.prompt_len for r in w.requests} == {100}

    def test_refuses_huge_unlimited_series(self, tmp_path: pathlib.Path) -> None:
        """A series of millions of requests needs a limit or a duration."""
        write_client(tmp_path, 0, windows(1000.0, 1.0, 144))
        with pytest.raises(ValueError, match="pass 'limit' or 'duration'"):
            load_trace(tmp_path)

    def test_bad_arguments(self, tmp_path: pathlib.Path) -> None:
        """Bad start, duration or an empty folder raise naming the problem."""
        write_client(tmp_path, 0, windows(1.0, 1.0, 2), PMFS)
        with pytest.raises(ValueError, match="'duration' must be finite and > 0"):
            load_trace(tmp_path, duration=0.0)
        with pytest.raises(ValueError, match="'start' is past the end"):
            load_trace(tmp_path, start=5000.0)
        empty = tmp_path / "empty"
        empty.mkdir()
        with pytest.raises(TraceFormatError, match=r"no chunk-<i>-trace.csv"):
            load_trace(empty, "servegen")

    def test_client_stats(self, tmp_path: pathlib.Path) -> None:
        """Shares and request-weighted CVs are exact."""
        write_client(tmp_path, 0, ["0,1.0,2.0,Gamma,1,1", "600,3.0,1.0,Gamma,1,1"])
        write_client(tmp_path, 1, ["0,0,0,,0,0", "600,2.0,1.5,Gamma,1,1"])
        first, second = servegen_client_stats(tmp_path)
        assert (first.client, first.requests, first.cv, first.active_fraction) == (
            0, 2400.0, 1.25, 1.0,
        )  # fmt: skip
        assert first.share == pytest.approx(2400 / 3600)
        assert (second.client, second.cv, second.active_fraction) == (1, 1.5, 0.5)


@pytest.mark.traces
class TestDeepSeekSeries:
    def test_loads_a_slice(self) -> None:
        """The real deepseek-r1 series gives tenants with PMF lengths (long outputs)."""
        if not DEEPSEEK.exists():
            pytest.skip(f"public trace not found at {DEEPSEEK} (see DESIGN.md: ../shared/traces)")
        w = load_trace(DEEPSEEK, limit=3000, start=43200.0)
        d = describe(w)
        assert d["num_requests"] == 3000
        assert len(d["tenants"]) > 5
        assert d["decode_tokens"]["mean"] > 500
