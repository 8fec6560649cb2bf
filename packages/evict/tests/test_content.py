"""The latest occurrence of each content (``LatestOccurrences``) and Token-PD's
``copy_bonus``, which keeps those occurrences as the sources of later copies."""

from __future__ import annotations

import numpy as np
import pytest

from kvpolicy.evict import ContentAware, LatestOccurrences, TokenPDConfig, TokenPDPolicy
from kvpolicy.kvmodel import EVICTION, build


def _pos(*p: int) -> np.ndarray:
    return np.array(p, dtype=np.int64)


class TestLatestOccurrences:
    def test_a_repeat_replaces_the_earlier_occurrence(self) -> None:
        """Each token is the latest of its id; a repeat hands that over and is reported."""
        occ = LatestOccurrences()
        assert occ.add("s", _pos(0, 1, 2), [7, 8, 9])[0].tolist() == []
        assert occ.add("s", _pos(3), [8])[0].tolist() == [1]
        assert occ.add("s", _pos(4, 5), [7, 7])[0].tolist() == [0, 4]
        assert occ.is_latest("s", _pos(0, 1, 2, 3, 4, 5)).tolist() == [
            False,
            False,
            True,
            True,
            False,
            True,
        ]

    def test_counts_the_occurrences_of_each_content(self) -> None:
        """Each new token comes with how often its content has occurred, itself included."""
        occ = LatestOccurrences()
        assert occ.add("s", _pos(0, 1, 2), [4, 4, 5])[1].tolist() == [1, 2, 1]
        assert occ.add("s", _pos(3), [4])[1].tolist() == [3]

    def test_pairs_match_the_token_before(self) -> None:
        """With context 2 the content is (previous id, id): the same id after another
        token is new content."""
        occ = LatestOccurrences(context=2)
        assert occ.add("s", _pos(0, 1, 2, 3), [1, 5, 2, 5])[0].tolist() == []
        assert occ.add("s", _pos(4, 5), [1, 5])[0].tolist() == [1]
        assert occ.is_latest("s", _pos(0, 1, 2, 3, 4, 5)).tolist() == [
            True,
            False,
            True,
            True,
            True,
            True,
        ]

    def test_streams_are_separate_and_remove_forgets(self) -> None:
        """A stream's contents do not replace another's; a removed stream starts over."""
        occ = LatestOccurrences()
        occ.add("a", _pos(0), [3])
        assert occ.add("b", _pos(0), [3])[0].tolist() == []
        occ.remove("a")
        occ.remove("unknown")
        assert occ.add("a", _pos(0), [3])[0].tolist() == []

    @pytest.mark.parametrize(
        ("positions", "ids", "error", "match"),
        [
            (_pos(0, 1), [1], ValueError, "'token_ids' must hold 2"),
            (_pos(0), [-1], ValueError, "'token_ids' must be >= 0"),
            (_pos(0), [1.5], TypeError, "'token_ids' must be integers"),
            (_pos(1, 0), [1, 2], ValueError, "must ascend"),
            (_pos(2), [1], ValueError, "must ascend after 2"),
        ],
    )
    def test_bad_input_is_named_and_changes_nothing(
        self, positions: np.ndarray, ids: list[float], error: type[Exception], match: str
    ) -> None:
        """Wrong ids or out-of-order positions raise with the field and value; the state
        is as before."""
        occ = LatestOccurrences()
        occ.add("s", _pos(0, 1, 2), [1, 2, 3])
        with pytest.raises(error, match=match):
            occ.add("s", positions, ids)
        assert occ.is_latest("s", _pos(0, 1, 2)).tolist() == [True, True, True]
        assert occ.add("s", _pos(3), [1])[0].tolist() == [0]

    @pytest.mark.parametrize(
        ("context", "error"), [(0, ValueError), (5, ValueError), (True, TypeError)]
    )
    def test_context_is_checked(self, context: object, error: type[Exception]) -> None:
        """The context is an int in 1..4."""
        with pytest.raises(error, match="'context'"):
            LatestOccurrences(context)  # type: ignore[arg-type]


def _run(policy: TokenPDPolicy, ids: list[int], budget: int, heavy: set[int]) -> None:
    """Decode ``ids`` one token at a time: tokens in ``heavy`` positions take most of the
    attention, the rest share what is left evenly."""
    for t, tok in enumerate(ids):
        pos = _pos(t)
        policy.insert("s", pos)
        policy.tokens("s", pos, [tok])
        held = policy.resident_positions("s")
        att = np.array([10.0 if p in heavy else 1.0 for p in held.tolist()])
        policy.observe("s", held, att / att.sum())
        policy.evict(budget)


class TestCopyBonus:
    def test_token_pd_is_content_aware(self) -> None:
        """Token-PD implements ContentAware and takes copy_bonus from a label's params."""
        policy = build(EVICTION, "token-pd", {"copy_bonus": 1.0, "copy_context": 2})
        assert isinstance(policy, ContentAware)
        assert isinstance(policy, TokenPDPolicy)
        assert policy.config.copy_bonus == 1.0
        assert policy.config.copy_context == 2

    def test_keeps_the_latest_occurrence_of_each_id(self) -> None:
        """Under pressure the duplicates go first: every id keeps its latest occurrence,
        even one that received no more attention than its duplicates."""
        ids = [1, 2, 3, 1, 2, 1, 4, 2, 1, 5, 1, 2]
        plain = TokenPDPolicy(TokenPDConfig(keep_rule=False, memory=4, prior_weight=0.0))
        copy = TokenPDPolicy(
            TokenPDConfig(keep_rule=False, memory=4, prior_weight=0.0, copy_bonus=2.0)
        )
        for policy in (plain, copy):
            _run(policy, ids, 6, heavy=set())
        kept = copy.resident_positions("s").tolist()
        latest = {tok: p for p, tok in enumerate(ids)}
        assert set(latest.values()) <= set(kept)
        # Without the bonus the tokens observed longest win and the latest of ids 1, 2, 4
        # and 5 are lost.
        assert plain.resident_positions("s").tolist() == [0, 1, 2, 3, 4, 5]

    def test_attention_still_counts_beside_the_bonus(self) -> None:
        """A heavily attended duplicate outranks an unattended latest occurrence when the
        bonus is small against its attention; both outrank unattended duplicates."""
        ids = [9, 1, 2, 1, 2, 9]
        policy = TokenPDPolicy(
            TokenPDConfig(keep_rule=False, memory=4, prior_weight=0.0, copy_bonus=0.5)
        )
        _run(policy, ids, 10, heavy={0})
        heavy_dup, dup, latest_a, latest_b = policy.excess_values("s", _pos(0, 1, 3, 5))
        assert heavy_dup > max(latest_a, latest_b)
        assert min(latest_a, latest_b) > dup

    def test_excess_values_include_the_bonus(self) -> None:
        """The bonus is ``copy_bonus`` times the even share 1/n of the stream's n tokens,
        on the latest occurrences only."""
        cfg = TokenPDConfig(keep_rule=False, copy_bonus=3.0, prior_weight=0.0)
        policy = TokenPDPolicy(cfg)
        policy.insert("s", _pos(0, 1, 2))
        policy.tokens("s", _pos(0, 1, 2), [5, 5, 6])
        got = policy.excess_values("s", _pos(0, 1, 2))
        assert got.tolist() == pytest.approx([0.0, 1.0, 1.0])

    def test_without_ids_or_bonus_nothing_changes(self) -> None:
        """A bonus of 0, or no token ids, decides exactly as plain Token-PD."""
        ids = [1, 2, 3, 1, 2, 1, 4, 2, 1, 5, 1, 2]
        runs = []
        for cfg, tag in (
            (TokenPDConfig(keep_rule=False, memory=4), True),
            (TokenPDConfig(keep_rule=False, memory=4, copy_bonus=0.0), True),
            (TokenPDConfig(keep_rule=False, memory=4, copy_bonus=2.0), False),
        ):
            policy = TokenPDPolicy(cfg)
            for t, tok in enumerate(ids):
                policy.insert("s", _pos(t))
                if tag:
                    policy.tokens("s", _pos(t), [tok])
                held = policy.resident_positions("s")
                policy.observe("s", held, np.full(len(held), 1.0 / len(held)))
                policy.evict(6)
            runs.append(policy.resident_positions("s").tolist())
        assert runs[0] == runs[1] == runs[2]

    def test_min_count_gives_the_bonus_to_repeated_contents_only(self) -> None:
        """With copy_min_count=2 a first occurrence takes no bonus, a repeat does (and the
        occurrence it replaced has none)."""
        cfg = TokenPDConfig(keep_rule=False, copy_bonus=4.0, copy_min_count=2, prior_weight=0.0)
        policy = TokenPDPolicy(cfg)
        policy.insert("s", _pos(0, 1, 2, 3))
        policy.tokens("s", _pos(0, 1, 2, 3), [5, 6, 7, 5])
        got = policy.excess_values("s", _pos(0, 1, 2, 3))
        assert got.tolist() == pytest.approx([0.0, 0.0, 0.0, 1.0])

    def test_tokens_of_a_position_not_resident_change_nothing(self) -> None:
        """Ids for a position that is not resident raise; the contents seen so far stay."""
        policy = TokenPDPolicy(TokenPDConfig(copy_bonus=1.0))
        policy.insert("s", _pos(0))
        with pytest.raises(ValueError, match="resident"):
            policy.tokens("s", _pos(0, 1), [4, 4])
        policy.tokens("s", _pos(0), [4])
        policy.insert("s", _pos(1))
        policy.tokens("s", _pos(1), [4])
        assert policy.excess_values("s", _pos(0, 1))[0] == pytest.approx(0.0)

    def test_remove_forgets_the_contents(self) -> None:
        """A removed stream's ids are forgotten: its positions may be given again."""
        policy = TokenPDPolicy(TokenPDConfig(copy_bonus=1.0))
        policy.insert("s", _pos(0))
        policy.tokens("s", _pos(0), [4])
        policy.remove("s")
        policy.insert("s", _pos(0))
        policy.tokens("s", _pos(0), [4])
        assert policy.excess_values("s", _pos(0))[0] > 0.0
