"""The needle-in-the-middle retrieval task (``kvpolicy evict eval --task needle``) on a
character tokenizer and the tiny random Llama (no download)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from kvpolicy.evict.quality import CausalLM
from kvpolicy.evict.quality._needle import DEPTHS, build_needle
from kvpolicy.evict.quality._runs import decode_row

from .test_quality import make_tiny_lm
from .test_quality_harness import CharTokenizer


class Chars:
    """One token per character, the id its code point (decodable with ``chr``)."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> object:
        return type("Encoding", (), {"input_ids": [ord(c) for c in text]})()


FILLER = "".join(chr(97 + i % 26) for i in range(5000))
DIGITS = {ord(d) % 97 for d in "0123456789"}


class TestBuild:
    def test_records_sit_at_their_depths_and_answers_at_the_end(self) -> None:
        task = build_needle(CharTokenizer(), FILLER, 2048)
        ids = task.input_ids.tolist()
        assert len(ids) == 2048
        assert task.depths == DEPTHS
        for depth, start in zip(task.depths, task.starts, strict=True):
            assert start == round(depth * task.context)
            # "\nThe code of " begins each block.
            assert ids[start : start + 5] == [ord(c) % 97 for c in "\nThe "]
        # 3 depths x 2 records x 5 digits, all after the context, each a digit.
        assert len(task.scored) == 30
        assert (task.scored >= task.context - 1).all()
        assert all(ids[t + 1] in DIGITS for t in task.scored)
        assert sorted(set(task.scored_depth.tolist())) == list(DEPTHS)
        assert (np.bincount(np.searchsorted(DEPTHS, task.scored_depth)) == 10).all()

    def test_the_answers_are_the_planted_codes(self) -> None:
        """Each depth's block plants its records, and every scored digit is the digit of
        the code planted for the name asked, from the depth it is scored at."""
        task = build_needle(Chars(), FILLER, 1024, records_per_depth=2, digits=4, seed=7)
        ids = task.input_ids.tolist()
        text = "".join(map(chr, ids))
        planted = {}
        for depth, start in zip(task.depths, task.starts, strict=True):
            block = text[start : start + 60]
            for name, code in re.findall(r"The code of (\w+) is (\d+)\.", block)[:2]:
                planted[name] = (code, depth)
        assert len(planted) == 6
        asked = re.findall(r"The code of (\w+) is (\d+)\.", text[task.context :])
        assert [name for name, _ in asked] != list(planted)  # shuffled
        answers = "".join(chr(ids[t + 1]) for t in task.scored)
        assert answers == "".join(code for _, code in asked)
        for i, (name, code) in enumerate(asked):
            assert planted[name][0] == code
            assert (task.scored_depth[4 * i : 4 * i + 4] == planted[name][1]).all()

    def test_deterministic(self) -> None:
        a = build_needle(CharTokenizer(), FILLER, 1500, seed=3)
        b = build_needle(CharTokenizer(), FILLER, 1500, seed=3)
        assert a.input_ids.tolist() == b.input_ids.tolist()
        assert a.scored.tolist() == b.scored.tolist()

    def test_depth_accuracy(self) -> None:
        task = build_needle(CharTokenizer(), FILLER, 2048)
        correct = np.zeros(2047, dtype=bool)
        correct[task.scored[task.scored_depth == 0.5]] = True
        assert task.depth_accuracy(correct) == {"0.25": 0.0, "0.5": 1.0, "0.75": 0.0}
        with pytest.raises(ValueError, match=r"shape \(2047,\)"):
            task.depth_accuracy(np.zeros(5, dtype=bool))

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"depths": ()}, "'depths' must be fractions"),
            ({"depths": (0.0, 0.5)}, "'depths' must be fractions"),
            ({"depths": (0.5, 0.25)}, "strictly increasing"),
            ({"records_per_depth": 0}, "'records_per_depth' must be an int"),
            ({"records_per_depth": 5}, "needs 15 names, 12 exist"),
            ({"digits": 0}, "'digits' must be an int"),
        ],
    )
    def test_bad_arguments_are_named(self, kwargs: dict[str, object], match: str) -> None:
        with pytest.raises(ValueError, match=match):
            build_needle(CharTokenizer(), FILLER, 2048, **kwargs)  # type: ignore[arg-type]

    def test_too_short(self) -> None:
        with pytest.raises(ValueError, match="'tokens' = 150"):
            build_needle(CharTokenizer(), FILLER, 150)
        with pytest.raises(ValueError, match="'filler' has 100 tokens"):
            build_needle(CharTokenizer(), FILLER[:100], 2048)


@pytest.fixture(scope="module")
def tiny_lm() -> CausalLM:
    return make_tiny_lm(2)


@pytest.mark.heavy
def test_rows_carry_accuracy_per_depth(tiny_lm: CausalLM) -> None:
    task = build_needle(CharTokenizer(), FILLER, 320, records_per_depth=1, digits=3)
    row = decode_row(
        tiny_lm,
        task.input_ids,
        task="needle",
        text="letters",
        policy="sink-window",
        budget=0.25,
        predictor=None,
        predictor_name="none",
        lookup=task,
    )
    assert row["task"] == "needle"
    assert set(row["depth_accuracy"]) == {"0.25", "0.5", "0.75"}
    assert all(0.0 <= v <= 1.0 for v in row["depth_accuracy"].values())
    assert row["accuracy"] == pytest.approx(np.mean(list(row["depth_accuracy"].values())))
