"""The evaluation texts and the tuning texts of the quality harness (no model needed)."""

from __future__ import annotations

import pytest

from kvpolicy.evict.quality import EVAL_TEXTS, TUNING_TEXTS, eval_text, gpl3_path


@pytest.mark.parametrize("name", [*EVAL_TEXTS, *TUNING_TEXTS])
def test_every_named_text_loads(name: str) -> None:
    if name in ("license", "tune-license") and not gpl3_path().parent.is_dir():
        pytest.skip("no /usr/share/common-licenses on this machine")
    text, source = eval_text(name)
    assert len(text) > 10_000  # well over 2,048 tokens
    assert source


def test_tuning_texts_differ_from_the_evaluation_texts() -> None:
    assert not set(TUNING_TEXTS) & set(EVAL_TEXTS)
    docs, _ = eval_text("docs")
    tune_docs, _ = eval_text("tune-docs")
    # The same topics in the other order: the openings (what 2,048 tokens cover) differ.
    assert len(docs) == len(tune_docs)
    assert docs[:10_000] not in tune_docs[:20_000]
    assert eval_text("code")[0] != eval_text("tune-code")[0]


def test_unknown_name_lists_every_text() -> None:
    with pytest.raises(ValueError, match="'text' must be one of license, code, docs, tune-"):
        eval_text("poetry")
