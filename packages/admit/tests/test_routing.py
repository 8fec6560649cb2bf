"""Routers and scorers, each on small fleets with exact expectations."""

from __future__ import annotations

import pytest

from kvpolicy.admit import (
    DEFAULT_TIER_WEIGHTS,
    ChoiceScorer,
    KVScorer,
    LeastKVRouter,
    LeastRequestsRouter,
    MixingRouter,
    PowerOfTwoRouter,
    PrefixAwareRouter,
    PrefixScorer,
    QueueScorer,
    RandomRouter,
    RequestClass,
    RequestsScorer,
    RoundRobinRouter,
    WeightedRouter,
    eligible_replicas,
    prefix_match,
)
from kvpolicy.kvmodel import ReplicaView, RoutingRequest


def _replica(
    replica_id: str,
    running: int = 0,
    waiting: int = 0,
    kv_usage: float = 0.0,
    prefix: dict[str, list[int]] | None = None,
    draining: bool = False,
) -> ReplicaView:
    return ReplicaView(
        replica_id,
        running=running,
        waiting=waiting,
        kv_usage=kv_usage,
        free_blocks=100,
        block_size=16,
        prefix_blocks=prefix or {},
        draining=draining,
    )


def _fleet() -> list[ReplicaView]:
    """a: 4 outstanding, half full, blocks 1-2 on GPU; b: 1 outstanding, blocks 1-3 on the
    host; c: draining; d: 2 outstanding, 90% full, nothing cached."""
    return [
        _replica("a", running=3, waiting=1, kv_usage=0.5, prefix={"gpu": [1, 2]}),
        _replica("b", running=1, waiting=0, kv_usage=0.2, prefix={"host": [1, 2, 3]}),
        _replica("c", draining=True),
        _replica("d", running=0, waiting=2, kv_usage=0.9),
    ]


def _request(blocks: tuple[int, ...] = (1, 2, 3, 4), label: str = "default") -> RoutingRequest:
    return RoutingRequest("q", prompt_len=16 * len(blocks) + 1, block_hashes=blocks, label=label)


class TestEligible:
    def test_draining_replicas_are_left_out(self) -> None:
        """Only replicas that are not draining are eligible, in the list's order."""
        assert [r.replica_id for r in eligible_replicas(_request(), _fleet())] == ["a", "b", "d"]

    def test_duplicate_ids_are_misuse(self) -> None:
        """Two replicas with one id are refused, naming the id."""
        with pytest.raises(ValueError, match="'replicas' has replica id 'a' twice"):
            eligible_replicas(_request(), [_replica("a"), _replica("a")])

    def test_wrong_types_are_named(self) -> None:
        """A request or a replica of the wrong type is a TypeError naming the argument."""
        with pytest.raises(TypeError, match="'request' must be a RoutingRequest"):
            eligible_replicas("q", _fleet())  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"'replicas\[1\]' must be a ReplicaView: 'b'"):
            eligible_replicas(_request(), [_replica("a"), "b"])  # type: ignore[list-item]


class TestPrefixMatch:
    def test_tiers_weigh_hits(self) -> None:
        """Two GPU hits of four blocks give 0.5; three host hits give 3 * 0.75 / 4."""
        a, b = _fleet()[:2]
        assert prefix_match(_request(), a, DEFAULT_TIER_WEIGHTS) == 0.5
        assert prefix_match(_request(), b, DEFAULT_TIER_WEIGHTS) == 0.5625

    def test_best_tier_per_block_and_run_stops_at_a_miss(self) -> None:
        """Each block counts its best tier; the run ends at the first block no tier holds."""
        view = _replica("x", prefix={"gpu": [1], "host": [1, 2], "disk": [3, 5]})
        assert prefix_match(_request((1, 2, 3, 4, 5)), view, DEFAULT_TIER_WEIGHTS) == 0.4

    def test_no_blocks_matches_nothing(self) -> None:
        """A prompt without full blocks matches 0."""
        assert prefix_match(_request(()), _fleet()[0], DEFAULT_TIER_WEIGHTS) == 0.0


class TestRoundRobin:
    def test_cycles_over_eligible(self) -> None:
        """Each eligible replica in turn, the draining one skipped."""
        router = RoundRobinRouter()
        assert [router.route(_request(), _fleet()) for _ in range(5)] == ["a", "b", "d", "a", "b"]

    def test_none_when_all_drain(self) -> None:
        """No eligible replica: None."""
        assert RoundRobinRouter().route(_request(), [_replica("c", draining=True)]) is None


class TestRandom:
    def test_seeded_sequence(self) -> None:
        """Seed 7 gives the same choices every time, never the draining replica."""
        router = RandomRouter(seed=7)
        assert [router.route(_request(), _fleet()) for _ in range(8)] == [
            "b", "a", "b", "d", "a", "a", "d", "a",
        ]  # fmt: skip

    def test_seed_must_be_int(self) -> None:
        """A seed that is not an int is a TypeError naming 'seed'."""
        with pytest.raises(TypeError, match=r"'seed' must be an int: 1\.5"):
            RandomRouter(seed=1.5)  # type: ignore[arg-type]


class TestLeastRequests:
    def test_fewest_outstanding(self) -> None:
        """b has 1 outstanding request, a 4, d 2."""
        assert LeastRequestsRouter().route(_request(), _fleet()) == "b"

    def test_tie_goes_to_the_first(self) -> None:
        """Equal loads: the first in the list."""
        fleet = [_replica("x", running=1), _replica("y", waiting=1)]
        assert LeastRequestsRouter().route(_request(), fleet) == "x"


class TestLeastKV:
    def test_lowest_usage(self) -> None:
        """b uses 20% of its KV."""
        assert LeastKVRouter().route(_request(), _fleet()) == "b"

    def test_outstanding_breaks_ties(self) -> None:
        """Equal usage: fewer outstanding requests."""
        fleet = [_replica("x", running=2, kv_usage=0.3), _replica("y", running=1, kv_usage=0.3)]
        assert LeastKVRouter().route(_request(), fleet) == "y"


class TestPowerOfTwo:
    def test_seeded_sequence(self) -> None:
        """Seed 7: of each drawn pair the less loaded, so a (4 outstanding) never wins."""
        router = PowerOfTwoRouter(seed=7)
        assert [router.route(_request(), _fleet()) for _ in range(8)] == [
            "b", "b", "d", "b", "d", "d", "b", "d",
        ]  # fmt: skip

    def test_one_eligible(self) -> None:
        """One eligible replica takes it without a draw."""
        fleet = [_replica("x", draining=True), _replica("y", running=9)]
        assert PowerOfTwoRouter().route(_request(), fleet) == "y"


class TestPrefixAware:
    def test_highest_weighted_match(self) -> None:
        """Blocks 1-4: b's three host hits (0.5625) beat a's two GPU hits (0.5)."""
        assert PrefixAwareRouter().route(_request(), _fleet()) == "b"

    def test_gpu_hits_win_when_they_cover_more(self) -> None:
        """Blocks 1, 2, 9: a matches 2/3 on the GPU, b 1.5/3 on the host."""
        assert PrefixAwareRouter().route(_request((1, 2, 9)), _fleet()) == "a"

    def test_least_requests_on_no_hit(self) -> None:
        """No replica holds block 9: the least-requests replica (b)."""
        assert PrefixAwareRouter().route(_request((9,)), _fleet()) == "b"

    def test_tier_weights_param(self) -> None:
        """Host hits worth 0.5 make a's GPU hits win on blocks 1-4 (0.5 vs 0.375)."""
        router = PrefixAwareRouter({"gpu": 1.0, "host": 0.5})
        assert router.route(_request(), _fleet()) == "a"

    @pytest.mark.parametrize(
        ("weights", "error", "message"),
        [
            ({"gpu": 1.5}, ValueError, r"'tier_weights\['gpu'\]' must be in \[0, 1\]: 1.5"),
            ({"gpu": "1"}, TypeError, r"'tier_weights\['gpu'\]' must be a number: '1'"),
            ({"": 1.0}, TypeError, "'tier_weights' tier names must be non-empty str"),
            ([1.0], TypeError, "'tier_weights' must map tier names to weights"),
        ],
    )
    def test_bad_tier_weights(self, weights: object, error: type[Exception], message: str) -> None:
        """Bad tier weights are named with their value."""
        with pytest.raises(error, match=message):
            PrefixAwareRouter(weights)  # type: ignore[arg-type]


class TestScorers:
    def test_each_scorer(self) -> None:
        """Prefix: weighted match; queue and requests: min-max; KV: 1 - usage."""
        fleet = eligible_replicas(_request(), _fleet())
        assert PrefixScorer().score(_request(), fleet) == (0.5, 0.5625, 0.0)
        assert QueueScorer().score(_request(), fleet) == (0.5, 1.0, 0.0)
        assert RequestsScorer().score(_request(), fleet) == (0.0, 1.0, 2 / 3)
        assert KVScorer().score(_request(), fleet) == (0.5, 0.8, pytest.approx(0.1))

    def test_equal_loads_all_score_one(self) -> None:
        """Min-max normalisation of equal values gives 1 to every replica."""
        fleet = [_replica("x", waiting=2), _replica("y", waiting=2)]
        assert QueueScorer().score(_request(), fleet) == (1.0, 1.0)


class TestWeighted:
    def test_llmd_default(self) -> None:
        """Prefix 3, queue 2, KV 2: b scores 3*0.5625 + 2*1 + 2*0.8 = 5.2875, the most."""
        router = WeightedRouter()
        assert [(type(s).__name__, w) for s, w in router.scorers] == [
            ("PrefixScorer", 3.0),
            ("QueueScorer", 2.0),
            ("KVScorer", 2.0),
        ]
        assert router.route(_request(), _fleet()) == "b"

    def test_composes_named_and_built_scorers(self) -> None:
        """Prefix alone on blocks 1, 2 picks a; a GPU-only prefix scorer picks a on 1-4 too."""
        assert WeightedRouter({"prefix": 1}).route(_request((1, 2)), _fleet()) == "a"
        gpu_only = WeightedRouter([(PrefixScorer({"gpu": 1.0}), 1.0)])
        assert gpu_only.route(_request(), _fleet()) == "a"

    def test_composes_routers(self) -> None:
        """A router's choice scores 1: least-KV's pick b at weight 4 beats a's GPU prefix
        (3 * 1.0) on blocks 1, 2; at weight 0.5 it does not (b: 0.5 + 3 * 0.75 = 2.75)."""
        router = WeightedRouter([(ChoiceScorer(LeastKVRouter()), 4.0), ("prefix", 3.0)])
        assert ChoiceScorer(RoundRobinRouter()).score(_request(), _fleet()) == (1.0, 0.0, 0.0, 0.0)
        assert router.route(_request((1, 2)), _fleet()) == "b"
        gpu_first = WeightedRouter([(ChoiceScorer(LeastKVRouter()), 0.5), ("prefix", 3.0)])
        assert gpu_first.route(_request((1, 2)), _fleet()) == "a"

    def test_choice_scorer_needs_a_router(self) -> None:
        """A ChoiceScorer of something that is not a Router is a TypeError naming 'router'."""
        with pytest.raises(TypeError, match="'router' must be a Router: 3"):
            ChoiceScorer(3)  # type: ignore[arg-type]

    def test_tie_goes_to_the_first(self) -> None:
        """Equal totals: the first eligible replica."""
        fleet = [_replica("x", draining=True), _replica("y"), _replica("z")]
        assert WeightedRouter().route(_request(), fleet) == "y"

    @pytest.mark.parametrize(
        ("scorers", "error", "message"),
        [
            ({"latency": 1}, ValueError, "unknown scorer 'latency'; known: kv, prefix, queue"),
            ({"kv": -1}, ValueError, "weight of KVScorer\\(\\) must be finite and >= 0: -1"),
            ({"kv": 0}, ValueError, "'scorers' must give some scorer a weight > 0"),
            ({"kv": "2"}, TypeError, "weight of KVScorer\\(\\) must be a number: '2'"),
            ([(1, 2)], TypeError, "'scorers' must hold ReplicaScorer values: 1"),
            ([1], TypeError, r"'scorers' must hold \(scorer, weight\) pairs: 1"),
        ],
    )
    def test_bad_scorers(self, scorers: object, error: type[Exception], message: str) -> None:
        """Bad scorers or weights are named with their value."""
        with pytest.raises(error, match=message):
            WeightedRouter(scorers)  # type: ignore[arg-type]


TABLE_2 = [(300, 5, 0.25), (300, 10, 0.25), (300, 6, 0.25), (300, 12, 0.25)]


class TestWeightedInline:
    def test_inline_scores_decide_as_the_scorers_do(self) -> None:
        """The built-in scorers, summed inline, decide as the same scorers asked one by
        one (subclasses take that path) over random fleets, weights and orders."""
        import random

        class Kv(KVScorer):
            pass

        class Queue(QueueScorer):
            pass

        class Requests(RequestsScorer):
            pass

        class Prefix(PrefixScorer):
            pass

        pairs = [(KVScorer, Kv), (QueueScorer, Queue), (RequestsScorer, Requests)]
        pairs.append((PrefixScorer, Prefix))
        rng = random.Random(0)
        for step in range(300):
            chosen = rng.sample(pairs, rng.randint(1, 4))
            weights = [rng.choice([0.0, 0.5, 1.0, 3.0, rng.random()]) for _ in chosen]
            weights[0] = weights[0] or 1.0
            inline = WeightedRouter([(a(), w) for (a, _), w in zip(chosen, weights, strict=True)])
            asked = WeightedRouter([(b(), w) for (_, b), w in zip(chosen, weights, strict=True)])
            fleet = [
                _replica(
                    f"r{i}",
                    running=rng.randrange(4),
                    waiting=rng.randrange(4),
                    kv_usage=rng.choice([0.0, 0.5, rng.random()]),
                    prefix={"gpu": rng.sample(range(6), 3)} if rng.random() < 0.4 else None,
                    draining=rng.random() < 0.1,
                )
                for i in range(rng.randint(1, 12))
            ]
            request = _request(tuple(rng.sample(range(6), rng.randrange(5))))
            assert inline.route(request, fleet) == asked.route(request, fleet), step


class TestReadsKVUsage:
    def test_declarations(self) -> None:
        """Only least-KV and a weighted router with a KV scorer (or a choice of one) read
        the views' KV memory."""
        from kvpolicy.kvmodel import reads_kv_usage

        assert not reads_kv_usage(RoundRobinRouter())
        assert not reads_kv_usage(LeastRequestsRouter())
        assert not reads_kv_usage(PrefixAwareRouter())
        assert reads_kv_usage(LeastKVRouter())
        assert reads_kv_usage(WeightedRouter())
        assert not reads_kv_usage(WeightedRouter({"prefix": 1, "queue": 1, "requests": 1}))
        assert reads_kv_usage(WeightedRouter([(ChoiceScorer(LeastKVRouter()), 1.0)]))
        assert not reads_kv_usage(WeightedRouter([(ChoiceScorer(RoundRobinRouter()), 1.0)]))


class TestReadsLoad:
    def test_declarations(self) -> None:
        """Round-robin, random and mixing read no load; every router that compares
        replicas by what they hold or run does."""
        from kvpolicy.kvmodel import reads_load

        assert not reads_load(RoundRobinRouter())
        assert not reads_load(RandomRouter(seed=1))
        assert not reads_load(MixingRouter(TABLE_2, labels=["l5", "l10", "l6", "l12"]))
        for router in (
            LeastRequestsRouter(),
            LeastKVRouter(),
            PrefixAwareRouter(),
            WeightedRouter(),
            WeightedRouter([(ChoiceScorer(RoundRobinRouter()), 1.0)]),
        ):
            assert reads_load(router), router
        assert reads_load(object())  # saying nothing: it may read anything


class TestMixing:
    def test_fractions_from_plan_routing(self) -> None:
        """Seed 002's Table 2 classes on two replicas: the plan's fractions, exactly."""
        router = MixingRouter(TABLE_2, labels=["l5", "l10", "l6", "l12"])
        assert router.plan(2).fractions[0][0] == 0.95
        assert router.plan(2).fractions[0][2:] == (1.0, 0.0)

    def test_deterministic_shares(self) -> None:
        """Class l10 (55.6% / 44.4%): the replica furthest behind its share, first on ties."""
        router = MixingRouter(TABLE_2, labels=["l5", "l10", "l6", "l12"])
        fleet = [_replica("g0"), _replica("g1")]
        picks = "".join(router.route(_request(label="l10"), fleet) or "-" for _ in range(20))
        assert picks == "g0g1g0g1g0g1g0g1g0g0g1g0g1g0g1g0g1g0g0g1"
        assert [router.route(_request(label="l6"), fleet) for _ in range(3)] == ["g0"] * 3
        assert [router.route(_request(label="l12"), fleet) for _ in range(3)] == ["g1"] * 3

    def test_counts_follow_the_eligible_set(self) -> None:
        """A draining replica added keeps the counts; another order starts them afresh."""
        router = MixingRouter(TABLE_2, labels=["l5", "l10", "l6", "l12"])
        pair = [_replica("g0"), _replica("g1")]
        with_draining = [*pair, _replica("x", draining=True)]
        picks = [
            router.route(_request(label="l10"), pair),
            router.route(_request(label="l10"), with_draining),
            router.route(_request(label="l10"), pair[::-1]),
        ]
        assert picks == ["g0", "g1", "g1"]

    def test_plan_over_eligible_replicas(self) -> None:
        """A draining replica is not a GPU of the plan: one eligible replica takes all."""
        router = MixingRouter(TABLE_2)
        fleet = [_replica("g0", draining=True), _replica("g1")]
        assert [router.route(_request(label="3"), fleet) for _ in range(3)] == ["g1"] * 3
        assert router.route(_request(label="3"), [_replica("g0", draining=True)]) is None

    def test_classes_as_request_classes_or_mappings(self) -> None:
        """Classes may be RequestClass values, mappings or triples."""
        router = MixingRouter(
            [RequestClass(30, 6, 0.5), {"input_len": 30, "decode_len": 10, "share": 0.5}]
        )
        assert router.classes == (RequestClass(30, 6, 0.5), RequestClass(30, 10, 0.5))
        assert router.labels == ("0", "1")

    @pytest.mark.parametrize(
        ("kw", "error", "message"),
        [
            ({"classes": []}, ValueError, r"'classes' must not be empty: \[\]"),
            ({"classes": ["x"]}, TypeError, "'classes' must hold RequestClass values"),
            ({"classes": [(30, 6, 0.4)]}, ValueError, "'classes' shares must sum to 1"),
            ({"labels": ["a"]}, ValueError, "'labels' must name each of the 2 classes"),
            ({"labels": ["a", "a"]}, ValueError, "'labels' must be unique"),
            ({"margin": 1.0}, ValueError, r"'margin' must be in \[0, 1\): 1.0"),
        ],
    )
    def test_bad_config(self, kw: dict[str, object], error: type[Exception], message: str) -> None:
        """Bad classes, labels or margin are named with their value."""
        args: dict[str, object] = {"classes": [(30, 6, 0.5), (30, 10, 0.5)], **kw}
        with pytest.raises(error, match=message):
            MixingRouter(**args)  # type: ignore[arg-type]

    def test_unknown_label(self) -> None:
        """A request whose label names no class is refused, naming the label."""
        router = MixingRouter([(30, 6, 0.5), (30, 10, 0.5)])
        with pytest.raises(ValueError, match="'label' of request 'q' names no mixing class"):
            router.route(_request(label="other"), [_replica("g0")])
