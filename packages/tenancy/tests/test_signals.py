"""vLLM's metrics parsed, garbage refused, stale scrapes replaced by the gateway's counts."""

from __future__ import annotations

import pytest

from kvpolicy.tenancy._signals import (
    LoadSignals,
    MetricsError,
    ScrapedMetrics,
    load_view,
    parse_vllm_metrics,
)

VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="2048"} 1.0
vllm:prefix_cache_hits_total{model_name="m"} 1.2e+06
process_cpu_seconds_total 12.5
"""


class TestParse:
    def test_summed_over_engines(self) -> None:
        """Running and waiting are summed over engines, usage averaged, cache info read."""
        assert parse_vllm_metrics(VLLM) == ScrapedMetrics(5, 4, 0.375, 2048, 16)

    def test_the_older_usage_name(self) -> None:
        """Before vLLM 0.10 the usage was vllm:gpu_cache_usage_perc."""
        text = (
            "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"
            "vllm:gpu_cache_usage_perc 0.9\n"
        )
        assert parse_vllm_metrics(text) == ScrapedMetrics(1, 0, 0.9)

    @pytest.mark.parametrize(
        ("text", "match"),
        [
            ("<html>502 Bad Gateway</html>", "no vllm:num_requests_running"),
            ("", "no vllm:num_requests_running"),
            ("vllm:num_requests_running 1\n", "or vllm:num_requests_waiting"),
            ("vllm:num_requests_running one\nvllm:num_requests_waiting 0", "is not a number"),
            ("vllm:num_requests_running -1\nvllm:num_requests_waiting 0", "finite count >= 0"),
            ("vllm:num_requests_running NaN\nvllm:num_requests_waiting 0", "finite count"),
            (
                "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"
                "vllm:kv_cache_usage_perc 7",
                r"vllm:kv_cache_usage_perc must be in \[0, 1\]: 7.0",
            ),
            ("vllm:num_requests_running\nvllm:num_requests_waiting 0", "unreadable line"),
        ],
    )
    def test_garbage_is_refused(self, text: str, match: str) -> None:
        """An exposition without the load, or with a bad value, raises MetricsError."""
        with pytest.raises(MetricsError, match=match):
            parse_vllm_metrics(text)


class TestLoadView:
    def test_fresh_scrape_joined_with_own_counts(self) -> None:
        """Outstanding is the larger of the scrape and the gateway's own in-flight."""
        s = ScrapedMetrics(3, 1, 0.5)
        assert load_view(2, 100, s, 0.4, 3.0, None) == LoadSignals(3, 1, 0.5, 0.4, True)
        assert load_view(7, 100, s, 0.4, 3.0, None) == LoadSignals(3, 4, 0.5, 0.4, True)

    def test_stale_or_missing_falls_back(self) -> None:
        """A stale or missing scrape gives the gateway's counts (every request in flight
        waiting: no scrape saw it run), usage from its tokens."""
        s = ScrapedMetrics(30, 10, 0.9)
        assert load_view(2, 500, s, 3.5, 3.0, 1000) == LoadSignals(0, 2, 0.5, 0.0, False)
        assert load_view(2, 5000, None, 0.0, 3.0, 1000) == LoadSignals(0, 2, 1.0, 0.0, False)
        assert load_view(0, 0, None, 0.0, 3.0, None) == LoadSignals(0, 0, 0.0, 0.0, False)
