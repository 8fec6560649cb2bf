"""The synthetic presets' constants are what the public traces give (provenance check)."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from kvpolicy.sim.workloads import (
    GammaArrivals,
    LogNormalLengths,
    QuantileLengths,
    Workload,
    describe,
    get_workload,
    load_trace,
    servegen_client_stats,
)
from kvpolicy.sim.workloads._calibration import (
    ARXIV_LENGTHS,
    ARXIV_MEAN_PROMPT,
    ARXIV_QUANTILES,
    AZURE_CONV_ARRIVALS,
    AZURE_CONV_LENGTHS,
    AZURE_CONV_PROMPT_TOKENS_PER_S,
    AZURE_CONV_QUANTILES,
    MOONCAKE_CONV_ARRIVALS,
    MOONCAKE_CONV_LENGTHS,
    MOONCAKE_CONV_PREFIX,
    MOONCAKE_CONV_QUANTILES,
    SERVEGEN_M_SMALL_TENANTS,
    SHAREGPT_LENGTHS,
    SHAREGPT_MEAN_PROMPT,
    SHAREGPT_QUANTILES,
)

TRACES = pathlib.Path(__file__).resolve().parents[3] / ".." / "shared" / "traces"
FILES = {
    "azure": TRACES / "azure-llm-2023-conv" / "AzureLLMInferenceTrace_conv.csv",
    "mooncake": TRACES / "mooncake-fast25-conversation" / "conversation_trace.jsonl",
    "sharegpt": TRACES / "sharegpt-8k-lengths" / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
    "arxiv": TRACES / "arxiv-summarization-lengths"
    / "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
    "m-small": TRACES / "servegen-bailian" / "language" / "m-small",
}  # fmt: skip

pytestmark = pytest.mark.traces


def trace(key: str, **kwargs: object) -> Workload:
    path = FILES[key]
    if not path.exists():
        pytest.skip(f"public trace not found at {path} (see DESIGN.md: ../shared/traces)")
    return load_trace(path, **kwargs)  # type: ignore[arg-type]


def fit_lengths(w: Workload) -> LogNormalLengths:
    return LogNormalLengths.fit(
        [r.prompt_len for r in w.requests], [r.decode_len for r in w.requests]
    )


def assert_quantiles_match(constant: QuantileLengths, w: Workload) -> None:
    fitted = QuantileLengths.from_workload(w)
    assert constant.probabilities == fitted.probabilities
    assert constant.prompt_quantiles == pytest.approx(fitted.prompt_quantiles, abs=0.051)
    assert constant.decode_quantiles == pytest.approx(fitted.decode_quantiles, abs=0.051)
    assert constant.correlation == pytest.approx(fitted.correlation, abs=6e-5)


def assert_lengths_match(constant: LogNormalLengths, fitted: LogNormalLengths) -> None:
    for name in ("prompt_mu", "prompt_sigma", "decode_mu", "decode_sigma", "correlation"):
        assert getattr(constant, name) == pytest.approx(getattr(fitted, name), abs=6e-5), name
    assert constant.max_prompt_len == fitted.max_prompt_len
    assert constant.max_decode_len == fitted.max_decode_len


class TestCalibration:
    def test_azure_conv(self) -> None:
        """Azure conversation arrivals and lengths are the trace's fit."""
        w = trace("azure")
        fitted = GammaArrivals.fit(w.arrival_times())
        assert AZURE_CONV_ARRIVALS.rate == pytest.approx(fitted.rate, abs=6e-5)
        assert AZURE_CONV_ARRIVALS.cv == pytest.approx(fitted.cv, abs=6e-5)
        assert_lengths_match(AZURE_CONV_LENGTHS, fit_lengths(w))
        assert_quantiles_match(AZURE_CONV_QUANTILES, w)
        mean_prompt = np.mean([r.prompt_len for r in w.requests])
        assert pytest.approx(fitted.rate * mean_prompt, 0.01) == AZURE_CONV_PROMPT_TOKENS_PER_S

    def test_mooncake_conv(self) -> None:
        """Mooncake conversation arrivals and lengths are the trace's fit."""
        w = trace("mooncake", block_size=512)
        fitted = GammaArrivals.fit(w.arrival_times())
        assert MOONCAKE_CONV_ARRIVALS.rate == pytest.approx(fitted.rate, abs=6e-5)
        assert MOONCAKE_CONV_ARRIVALS.cv == pytest.approx(fitted.cv, abs=6e-5)
        assert_lengths_match(MOONCAKE_CONV_LENGTHS, fit_lengths(w))
        assert_quantiles_match(MOONCAKE_CONV_QUANTILES, w)

    @pytest.mark.parametrize(
        ("key", "constant", "quantiles", "mean_prompt"),
        [("sharegpt", SHAREGPT_LENGTHS, SHAREGPT_QUANTILES, SHAREGPT_MEAN_PROMPT),
         ("arxiv", ARXIV_LENGTHS, ARXIV_QUANTILES, ARXIV_MEAN_PROMPT)],
    )  # fmt: skip
    def test_length_files(
        self, key: str, constant: LogNormalLengths, quantiles: QuantileLengths, mean_prompt: float
    ) -> None:
        """ShareGPT and arXiv lognormals, quantile tables and mean prompts are the files'."""
        w = trace(key, rate=1.0)
        assert_lengths_match(constant, fit_lengths(w))
        assert_quantiles_match(quantiles, w)
        assert np.mean([r.prompt_len for r in w.requests]) == pytest.approx(mean_prompt, abs=6e-3)

    def test_servegen_m_small_tenants(self) -> None:
        """The multi-tenant shares and CVs are ServeGen m-small's top four and the rest."""
        path = FILES["m-small"]
        if not path.exists():
            pytest.skip(f"public trace not found at {path} (see DESIGN.md: ../shared/traces)")
        stats = servegen_client_stats(path)
        top = [(s.share, s.cv) for s in stats[:4]]
        rest = stats[4:]
        rest_requests = sum(s.requests for s in rest)
        rest_cv = sum(s.requests * s.cv for s in rest) / rest_requests
        expected = [*top, (sum(s.share for s in rest), rest_cv)]
        for (share, cv), (want_share, want_cv) in zip(
            SERVEGEN_M_SMALL_TENANTS, expected, strict=True
        ):
            assert share == pytest.approx(want_share, abs=6e-5)
            assert cv == pytest.approx(want_cv, abs=6e-4)

    def test_mooncake_prefix_reuse(self) -> None:
        """Every Mooncake request shares block 0, 38.72% reuse more; the model matches."""
        if not FILES["mooncake"].exists():
            pytest.skip(f"public trace not found at {FILES['mooncake']} (see DESIGN.md)")
        lines = FILES["mooncake"].read_text().splitlines()
        rows = [json.loads(line)["hash_ids"] for line in lines]
        seen: set[int] = set()
        follow_ups = 0
        for ids in rows:
            # Ids are prefix hashes, so a request's reused blocks form a leading run.
            lead = next((k for k, h in enumerate(ids) if h not in seen), len(ids))
            follow_ups += lead > 1
            seen.update(ids)
        assert {ids[0] for ids in rows} == {0}
        assert MOONCAKE_CONV_PREFIX.system_prompt_len == 512
        assert MOONCAKE_CONV_PREFIX.follow_up_probability == pytest.approx(
            follow_ups / len(rows), abs=6e-5
        )

    @pytest.mark.slow
    def test_mooncake_like_hit_ratio(self) -> None:
        """The mooncake-like preset's hit ratio on 16-token blocks is the trace's, +-0.01."""
        real = describe(trace("mooncake", block_size=16))["prefix"]["hit_ratio"]
        num_requests = 12031
        model = describe(get_workload("mooncake-like", num_requests=num_requests))
        assert model["prefix"]["hit_ratio"] == pytest.approx(real, abs=0.01)
