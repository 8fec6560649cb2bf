"""The one-pass quantization probe (``kvpolicy.evict.quality.onepass``) on the real model."""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any

import numpy as np
import pytest
import torch

from kvpolicy.evict.quality.onepass import Layout, main, onepass_nll, onepass_scores


def test_bad_layouts_are_named() -> None:
    """Unsupported bits or axis, a window below 1 or a bad group size are refused."""
    with pytest.raises(ValueError, match="'bits'"):
        Layout(3)
    with pytest.raises(ValueError, match="'key_axis'"):
        Layout(4, "head")
    for bad in (0, -2):
        with pytest.raises(ValueError, match="'window' must be an int >= 1"):
            Layout(4, window=bad)
    with pytest.raises(ValueError, match="'group_size' must be an int >= 1"):
        Layout(4, group_size=0)
    assert Layout(16).label == "full"
    assert Layout(4, "channel", 8).label == "int4 keys per channel, window 8"


@pytest.fixture(scope="module")
def tiny() -> Any:
    """The harness's tiny two-layer test model."""
    from .test_quality import make_peaked_lm

    return make_peaked_lm(2)


class TestOnePass:
    """One teacher-forced pass through a layout, on the tiny test model."""

    @pytest.fixture
    def ids(self) -> torch.Tensor:
        return torch.randint(0, 97, (40,), generator=torch.Generator().manual_seed(5))

    def test_sixteen_bits_is_the_models_own_loss(self, tiny: Any, ids: torch.Tensor) -> None:
        """At 16 bits the probe's losses average to the model's own teacher-forced loss."""
        nll = onepass_nll(tiny, ids, Layout(16))
        assert nll.shape == (39,)
        with torch.no_grad():
            ref = tiny.model(input_ids=ids.unsqueeze(0), labels=ids.unsqueeze(0)).loss
        assert float(nll.mean()) == pytest.approx(float(ref), rel=1e-5)

    def test_a_window_covering_the_text_changes_nothing(self, tiny: Any, ids: torch.Tensor) -> None:
        """Every token inside every query's window: the quantized copies are never read,
        so the losses are the full cache's; with window 1 they move."""
        full = onepass_nll(tiny, ids, Layout(16))
        covered = onepass_nll(tiny, ids, Layout(4, "token", 40))
        np.testing.assert_allclose(covered, full, rtol=0, atol=1e-5)
        for axis in ("token", "channel"):
            narrow = onepass_nll(tiny, ids, Layout(4, axis, 1))
            assert float(np.abs(narrow - full).max()) > 1e-4

    def test_scores_say_which_next_tokens_the_model_got(self, tiny: Any, ids: torch.Tensor) -> None:
        """``onepass_scores`` gives the losses of ``onepass_nll`` and, per position, whether
        the model's most likely next token is the text's (at 16 bits: its own argmax)."""
        for layout in (Layout(16), Layout(4, "token", 1)):
            nll, correct = onepass_scores(tiny, ids, layout)
            np.testing.assert_array_equal(nll, onepass_nll(tiny, ids, layout))
            assert correct.shape == (39,)
            assert correct.dtype == np.bool_
        _, correct = onepass_scores(tiny, ids, Layout(16))
        with torch.no_grad():
            logits = tiny.model(input_ids=ids.unsqueeze(0)).logits[0, :-1]
        np.testing.assert_array_equal(correct, (logits.argmax(-1) == ids[1:]).numpy())

    def test_one_text_of_two_tokens_at_least(self, tiny: Any) -> None:
        """A single token, or two texts, is a ValueError naming the shape."""
        with pytest.raises(ValueError, match="one text of >= 2 tokens"):
            onepass_nll(tiny, torch.tensor([[1]]), Layout(4))
        with pytest.raises(ValueError, match="one text of >= 2 tokens"):
            onepass_nll(tiny, torch.ones((2, 8), dtype=torch.long), Layout(4))

    def test_a_perturbation_moves_only_what_is_quantized(
        self, tiny: Any, ids: torch.Tensor
    ) -> None:
        """``perturb`` 0 is the plain pass; a perturbation is reproducible by its seed,
        another seed gives other losses, and at 16 bits (nothing quantized) or with every
        token inside the window (the quantized copies never read) nothing moves."""
        plain = onepass_nll(tiny, ids, Layout(4, "token", 1))
        np.testing.assert_array_equal(
            onepass_nll(tiny, ids, Layout(4, "token", 1), perturb=0.0, seed=3), plain
        )
        a = onepass_nll(tiny, ids, Layout(4, "token", 1), perturb=1e-3, seed=1)
        np.testing.assert_array_equal(
            onepass_nll(tiny, ids, Layout(4, "token", 1), perturb=1e-3, seed=1), a
        )
        b = onepass_nll(tiny, ids, Layout(4, "token", 1), perturb=1e-3, seed=2)
        assert float(np.abs(a - plain).max()) > 0
        assert float(np.abs(a - b).max()) > 0
        full = onepass_nll(tiny, ids, Layout(16))
        np.testing.assert_array_equal(onepass_nll(tiny, ids, Layout(16), perturb=1e-3), full)
        covered = onepass_nll(tiny, ids, Layout(4, "token", 40), perturb=1e-3, seed=1)
        np.testing.assert_allclose(covered, full, rtol=0, atol=1e-5)

    def test_a_bad_perturbation_is_named(self, tiny: Any, ids: torch.Tensor) -> None:
        """A negative, huge or non-finite scale, or a seed that is no int, is refused."""
        for bad in (-1e-7, 0.01, float("nan"), float("inf")):
            with pytest.raises(ValueError, match="'perturb' must be finite"):
                onepass_nll(tiny, ids, Layout(4), perturb=bad)
        with pytest.raises(TypeError, match="'perturb' must be a number"):
            onepass_nll(tiny, ids, Layout(4), perturb=True)
        with pytest.raises(TypeError, match="'seed' must be an int"):
            onepass_nll(tiny, ids, Layout(4), perturb=1e-7, seed=1.5)  # type: ignore[arg-type]

    def test_command_line_refuses_bad_flags(self) -> None:
        """A bad window, bits, text or perturbation is an argparse error before the model
        loads."""
        for argv in (
            ["--window", "0"],
            ["--bits", "3"],
            ["--window", "x"],
            ["--text", "nope"],
            ["--perturb-runs", "-1"],
            ["--perturb-scale", "0"],
            ["--perturb-scale", "nan"],
        ):
            with pytest.raises(SystemExit):
                main(argv)


@pytest.mark.quality
class TestOnePassCommandLine:
    """The command line on the real model (the ``quality`` session)."""

    def test_command_line_writes_a_row_per_layout(self, lm: Any, tmp_path: pathlib.Path) -> None:
        """``main`` prints and writes one JSON row per (text, layout) with the paired ratio."""
        out = tmp_path / "rows.jsonl"
        assert (
            main(
                [
                    "--text",
                    "docs",
                    "--tokens",
                    "48",
                    "--window",
                    "1,4",
                    "--key-axis",
                    "token",
                    "--perturb-runs",
                    "2",
                    "--perturb-scale",
                    "1e-3",
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert [(r["bits"], r["key_axis"], r["window"]) for r in rows] == [
            (4, "token", 1),
            (4, "token", 4),
        ]
        for r in rows:
            assert r["tokens"] == 48
            low, high = r["vs_full"][1], r["vs_full"][2]
            assert low <= r["vs_full"][0] <= high
            assert r["perplexity"] == pytest.approx(r["full_perplexity"] * r["vs_full"][0])
            assert math.isfinite(r["perplexity"])
            assert r["perturb_scale"] == 1e-3
            assert len(r["perturbed_perplexity"]) == 2
            assert all(math.isfinite(p) for p in r["perturbed_perplexity"])

    def test_needle_rows_carry_the_recall(
        self, lm: Any, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``--task needle`` reads the needle prompt and writes the recall per depth of the
        layout and of the full cache beside the perplexities."""
        out = tmp_path / "needle.jsonl"
        argv = ["--task", "needle", "--text", "license", "--tokens", "512", "--bits", "4"]
        assert main([*argv, "--key-axis", "token", "--window", "1", "--out", str(out)]) == 0
        (row,) = [json.loads(line) for line in out.read_text().splitlines()]
        assert row["prompt"] == "needle"
        assert row["tokens"] == 512
        for key in ("depth_accuracy", "full_depth_accuracy"):
            assert set(row[key]) == {"0.25", "0.5", "0.75"}
        assert row["accuracy"] == pytest.approx(sum(row["depth_accuracy"].values()) / 3)
        assert 0.0 <= row["accuracy"] <= 1.0
        assert row["full_accuracy"] > 0.5
        assert "recall" in capsys.readouterr().out
