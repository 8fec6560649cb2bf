"""Tests of the Mooncake JSONL loader and its prefix-hash expansion."""

from __future__ import annotations

import json
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.kvmodel import BlockPool
from kvpolicy.sim.workloads import (
    TraceFormatError,
    describe,
    detect_format,
    expand_block_hashes,
    load_trace,
)

TRACES = pathlib.Path(__file__).resolve().parents[3] / ".." / "shared" / "traces"
MOONCAKE = TRACES / "mooncake-fast25-conversation" / "conversation_trace.jsonl"


def row(ts: int, n_in: int, n_out: int, ids: list[int]) -> str:
    return json.dumps(
        {"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": ids}
    )


def write_jsonl(tmp_path: pathlib.Path, *lines: str) -> pathlib.Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


class TestLoadMooncake:
    def test_times_lengths_and_ids(self, tmp_path: pathlib.Path) -> None:
        """Milliseconds become seconds; lengths and line-numbered ids are kept."""
        path = write_jsonl(tmp_path, row(0, 600, 5, [1, 2]), row(1500, 100, 7, [3]))
        w = load_trace(path)
        assert [(r.request_id, r.arrival_time) for r in w.requests] == [
            ("L1", 0.0), ("L2", 1.5),
        ]  # fmt: skip
        assert [(r.prompt_len, r.decode_len) for r in w.requests] == [(600, 5), (100, 7)]
        assert [len(r.prefix_hashes) for r in w.requests] == [600 // 16, 100 // 16]

    def test_shared_trace_block_gives_shared_pool_blocks(self, tmp_path: pathlib.Path) -> None:
        """Requests sharing their first 512-token id share its 32 pool blocks, no more."""
        path = write_jsonl(tmp_path, row(0, 1024, 1, [7, 8]), row(10, 600, 1, [7, 9]))
        a, b = load_trace(path, block_size=16).requests
        assert a.prefix_hashes[:32] == b.prefix_hashes[:32]
        assert not set(a.prefix_hashes[32:]) & set(b.prefix_hashes[32:])
        assert len(b.prefix_hashes) == 37

    def test_block_pool_reuses_the_shared_prefix(self, tmp_path: pathlib.Path) -> None:
        """kvmodel's BlockPool finds exactly the 512 shared tokens in its prefix cache."""
        path = write_jsonl(tmp_path, row(0, 1024, 1, [7, 8]), row(10, 600, 1, [7, 9]))
        a, b = load_trace(path, block_size=16).requests
        pool = BlockPool(num_blocks=200, block_size=16)
        assert pool.allocate(a.request_id, a.prompt_len, a.prefix_hashes) is not None
        alloc = pool.allocate(b.request_id, b.prompt_len, b.prefix_hashes)
        assert alloc is not None
        assert alloc.cached_tokens == 512

    def test_block_size_not_dividing_512(self) -> None:
        """A 48-token block straddling a 512 boundary depends on the later trace block."""
        a, b = expand_block_hashes([(1024, [7, 8]), (1024, [7, 9])], block_size=48)
        # Blocks 0..9 end by token 480 < 512; block 10 covers tokens 480..527.
        assert a[:10] == b[:10]
        assert a[10] != b[10]
        assert len(a) == 1024 // 48

    def test_ids_are_chained(self) -> None:
        """Equal ids after different ones still give different hashes (chaining)."""
        a, b = expand_block_hashes([(1024, [5, 5]), (1024, [6, 5])], block_size=512)
        assert a[1] != b[1]
        assert a[0] != a[1]

    @settings(max_examples=40, deadline=None)
    @given(
        prompt=st.integers(0, 5000),
        block_size=st.sampled_from([1, 7, 16, 64, 512, 1000]),
        cut=st.integers(0, 10),
    )
    def test_prefix_property(self, prompt: int, block_size: int, cut: int) -> None:
        """One hash per full block; equal id prefixes give equal hashes on whole blocks."""
        n_ids = -(-prompt // 512)
        ids_a = list(range(n_ids))
        ids_b = ids_a[:cut] + [10_000 + i for i in range(n_ids - min(cut, n_ids))]
        a, b = expand_block_hashes([(prompt, ids_a), (prompt, ids_b)], block_size)
        assert len(a) == len(b) == prompt // block_size
        shared_tokens = min(cut, n_ids) * 512
        shared_blocks = min(len(a), shared_tokens // block_size)
        assert a[:shared_blocks] == b[:shared_blocks]
        assert all(x != y for x, y in zip(a[shared_blocks:], b[shared_blocks:], strict=True))

    @pytest.mark.parametrize(
        ("line", "match"),
        [
            ("{not json", "line 2"),
            ('{"timestamp": 1, "input_length": 10, "output_length": 1}', "'hash_ids'"),
            (row(1, 1024, 1, [1]), r"ceil\(input_length / 512\) = 2 entries: 1"),
            (row(1, -5, 1, []), "column 'input_length': must be >= 0"),
            (row(-1, 5, 1, [1]), "column 'timestamp': must be finite and >= 0"),
            ('{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": [1.5]}',
             "list of integers"),
            ("[1, 2]", "JSON object"),
        ],
    )  # fmt: skip
    def test_malformed_rows(self, tmp_path: pathlib.Path, line: str, match: str) -> None:
        """Each malformation raises TraceFormatError naming the file and line 2."""
        path = write_jsonl(tmp_path, row(0, 5, 1, [1]), line)
        with pytest.raises(TraceFormatError, match=match) as info:
            load_trace(path, "mooncake")
        assert (info.value.path, info.value.line) == (str(path), 2)

    def test_skip_bad_and_clamp(self, tmp_path: pathlib.Path) -> None:
        """Bad rows are skipped and counted; a zero output is raised to 1 and counted."""
        path = write_jsonl(tmp_path, row(0, 5, 0, [1]), "oops", row(2, 5, 3, [2]))
        w = load_trace(path, "mooncake", skip_bad=True)
        assert (w.num_requests, w.skipped_rows, w.clamped_rows) == (2, 1, 1)
        assert w.requests[0].decode_len == 1

    def test_detected_from_first_line(self, tmp_path: pathlib.Path) -> None:
        """A JSONL file with input_length is detected as mooncake."""
        assert detect_format(write_jsonl(tmp_path, row(0, 5, 1, [1]))) == "mooncake"

    def test_limit_and_rate(self, tmp_path: pathlib.Path) -> None:
        """limit keeps the first rows and rate rescales time."""
        path = write_jsonl(tmp_path, row(0, 5, 1, [1]), row(1000, 5, 1, [2]), row(4000, 5, 1, [3]))
        w = load_trace(path, limit=2, rate=4.0)
        assert [r.arrival_time for r in w.requests] == [0.0, 0.25]


@pytest.mark.traces
class TestMooncakeTrace:
    def test_matches_provenance(self) -> None:
        """The real trace loads whole; rate, CV and prefix reuse match its PROVENANCE."""
        if not MOONCAKE.exists():
            pytest.skip(f"public trace not found at {MOONCAKE} (see DESIGN.md: ../shared/traces)")
        w = load_trace(MOONCAKE, block_size=512)
        d = describe(w)
        assert (d["num_requests"], d["skipped_rows"]) == (12031, 0)
        assert d["interarrival_cv"] == pytest.approx(3.03, abs=0.005)
        assert d["prompt_tokens"]["max"] == 126195
        # PROVENANCE counts partial blocks too (288,500 refs, hit ratio 0.366); full blocks:
        assert d["prefix"]["block_references"] == 276491
        assert d["prefix"]["hit_ratio"] == pytest.approx(0.3819, abs=1e-4)
