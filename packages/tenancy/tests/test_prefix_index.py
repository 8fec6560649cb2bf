"""The approximate prefix index: text chunks chained, least recently used forgotten."""

from __future__ import annotations

import pytest

from kvpolicy.tenancy._prefix_index import PrefixIndex, prompt_text, text_block_hashes


def test_prompt_text_of_chat_and_completions() -> None:
    """Roles and texts in order; text parts of a content list joined."""
    doc = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image"}]},
        ]
    }
    assert prompt_text(doc, True) == "<system>be brief\n<user>hi\n"
    assert prompt_text({"prompt": ["a", "b"]}, False) == "ab"
    assert prompt_text({"prompt": 3}, False) == ""


def test_chained_hashes_name_prefixes() -> None:
    """Equal prefixes give equal hashes; a different first chunk changes every later one."""
    a = text_block_hashes("x" * 64 + "y" * 64 + "z" * 10, 64)
    b = text_block_hashes("x" * 64 + "y" * 64 + "w" * 64, 64)
    c = text_block_hashes("q" * 64 + "y" * 64, 64)
    assert len(a) == 2
    assert len(b) == 3
    assert a == b[:2]
    assert not set(c) & set(b)
    assert text_block_hashes("short", 64) == ()
    with pytest.raises(ValueError, match="'block_chars' must be >= 1: 0"):
        text_block_hashes("x", 0)


class TestPrefixIndex:
    def test_lru_within_capacity(self) -> None:
        """Beyond capacity the least recently used blocks go first."""
        idx = PrefixIndex(4)
        idx.add([1, 2, 3])
        idx.add([1, 4])  # 1 is used again
        idx.add([5])
        assert sorted(h for h in range(1, 6) if h in idx) == [1, 2, 4, 5]  # 3: a tail
        assert idx.matching([1, 2, 3, 9]) == frozenset({1, 2})
        idx.remove([2, 99])
        assert len(idx) == 3
        idx.resize(1)
        assert idx.matching([1, 4, 5]) == frozenset({5})
        idx.clear()
        assert len(idx) == 0

    def test_bad_capacity(self) -> None:
        """A capacity below 1 is refused, naming it."""
        with pytest.raises(ValueError, match="'capacity' must be an int >= 1: 0"):
            PrefixIndex(0)
