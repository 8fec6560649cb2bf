"""KV residency in the simulator: every token kept, or a token eviction policy's ledger.

:class:`KeepAll` is the engine without token eviction: a request's KV is what it holds in the
block pool. :class:`Evicting` puts kvmodel's :class:`~kvpolicy.kvmodel.ResidencyLedger` over
the eviction policy, feeds it the synthetic attention model's signals and attention, and
after each round gives the pool back the blocks of evicted tokens (the cache is compacted,
as a paged eviction kernel does).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from kvpolicy.kvmodel import BlockPool, EvictionPolicy, ResidencyError, ResidencyLedger
from kvpolicy.sim._attention import AttentionModel
from kvpolicy.sim._config import EvictionConfig
from kvpolicy.sim._errors import SimError
from kvpolicy.sim._seq import Seq

__all__ = ["Evicting", "KeepAll", "Residency"]


class KeepAll:
    """No token eviction: every written token stays until its request ends."""

    budget: int | None = None

    def resident_now(self, running: Sequence[Seq]) -> int:
        """Tokens resident now."""
        return sum(s.pool_tokens for s in running)

    def join(self, s: Seq, step: int) -> None:
        """``s`` joined the batch (nothing to track)."""

    def resume(self, s: Seq, step: int) -> None:
        """``s`` came back from swap."""

    def suspend(self, s: Seq) -> None:
        """``s`` was swapped out."""

    def drop(self, s: Seq) -> None:
        """``s`` lost its KV (preempted)."""

    def close(self, s: Seq) -> None:
        """``s`` finished."""

    def wrote(self, tokens: int) -> None:
        """``tokens`` were written."""

    def maybe_round(self, step: int, running: Sequence[Seq], growth: int) -> bool:
        """Never evicts."""
        return False

    def steps_free(self, step: int, batch: int) -> int | None:
        """No limit from eviction on multi-step jumps."""
        return None

    @property
    def evicted(self) -> int:
        """Tokens evicted."""
        return 0

    @property
    def rounds(self) -> int:
        """Eviction rounds."""
        return 0

    @property
    def attention_recall(self) -> float:
        """Share of attention kept."""
        return 1.0


class _Attention:
    """The synthetic attention model as the ledger's source: one heavy-hitter score per
    position of each request, drawn when the request first joins."""

    def __init__(self, model: AttentionModel, seed: int, *, lazy: bool = False) -> None:
        self._model = model
        self._rng = np.random.default_rng(seed)
        self._lazy = lazy
        self._lengths: dict[str, int] = {}
        self._z: dict[str, NDArray[np.float64]] = {}
        # z_cum[k] = sum(z[:k]): the heavy-hitter mass of the first k positions, for the
        # model's normaliser in O(1).
        self._z_cum: dict[str, NDArray[np.float64]] = {}

    def ensure(self, stream: str, total_len: int) -> None:
        """Scores for ``stream``: drawn now, or (lazy) at its first signal or attention."""
        if stream in self._z:
            return
        if self._lazy:
            self._lengths[stream] = total_len
        else:
            self._draw(stream, total_len)

    def _draw(self, stream: str, total_len: int) -> NDArray[np.float64]:
        z = self._model.token_scores(self._rng, total_len)
        self._z[stream] = z
        self._z_cum[stream] = np.concatenate(([0.0], np.cumsum(z)))
        return z

    def _scores(self, stream: str) -> NDArray[np.float64]:
        z = self._z.get(stream)
        return z if z is not None else self._draw(stream, self._lengths.pop(stream))

    def forget(self, stream: str) -> None:
        self._z.pop(stream, None)
        self._z_cum.pop(stream, None)
        self._lengths.pop(stream, None)

    def signals(
        self, stream: str, positions: NDArray[np.int64], length: int
    ) -> NDArray[np.float64]:
        """(n, 1) predicted return of each token (the role of seed 000's predictor): the
        heavy-hitter attention the model expects it to draw from a query at ``length``,
        without the recency and sink terms that fade or do not apply."""
        am = self._model
        z = self._scores(stream)
        n = max(length, 1)
        norm = am.normaliser(n, float(self._z_cum[stream][n]))
        out: NDArray[np.float64] = (am.body_weight(n) * z[positions] / norm)[:, None]
        return out

    def attention(
        self, stream: str, positions: NDArray[np.int64], length: int
    ) -> tuple[NDArray[np.float64], float]:
        am = self._model
        w = am.weights(positions, length, self._scores(stream))
        return w, am.normaliser(length, float(self._z_cum[stream][length]))


class Evicting:
    """Token eviction to a budget through a :class:`~kvpolicy.kvmodel.ResidencyLedger`.

    Args:
        policy: the eviction policy.
        budget: resident tokens allowed after a round.
        config: whether rounds run while well under the budget, and the growth a round
            leaves room for (the cadence is the policy's own: kvpolicy-evict's Periodic).
        attention: the synthetic attention model.
        seed: seed of the heavy-hitter scores.
        pool: the block pool whose blocks evicted tokens give back.
    """

    def __init__(
        self,
        policy: EvictionPolicy,
        budget: int,
        config: EvictionConfig,
        attention: AttentionModel,
        seed: int,
        pool: BlockPool,
    ) -> None:
        self._attention = _Attention(attention, seed, lazy=not config.idle_rounds)
        self._ledger = ResidencyLedger(
            policy,
            budget,
            self._attention,
            evict_ahead=config.evict_ahead,
            idle_rounds=config.idle_rounds,
        )
        self._pool = pool
        self.budget: int | None = budget

    def resident_now(self, running: Sequence[Seq]) -> int:
        """Tokens resident now: reported and not evicted, plus written since."""
        return self._ledger.resident_now

    def join(self, s: Seq, step: int) -> None:
        """``s`` joined the batch; its prefix-cache hits are resident already."""
        self._attention.ensure(s.rid, s.req.total_len)
        self._ledger.open(s.rid, step, s.computed)

    def resume(self, s: Seq, step: int) -> None:
        """``s`` came back from swap with the tokens it had."""
        self._ledger.resume(s.rid, step)

    def suspend(self, s: Seq) -> None:
        """``s`` was swapped out: its tokens leave the budget."""
        self._ledger.suspend(s.rid, s.written)

    def drop(self, s: Seq) -> None:
        """``s`` lost its KV (preempted for recomputation)."""
        self._ledger.drop(s.rid, s.written)

    def close(self, s: Seq) -> None:
        """``s`` finished."""
        self._ledger.close(s.rid, s.written)
        self._attention.forget(s.rid)

    def wrote(self, tokens: int) -> None:
        """``tokens`` were written across the batch."""
        self._ledger.wrote(tokens)

    def maybe_round(self, step: int, running: Sequence[Seq], growth: int) -> bool:
        """Run an eviction round if one is due before an iteration adding ``growth`` tokens;
        then release the blocks of evicted tokens. Returns whether a round ran."""
        ledger = self._ledger
        if not ledger.due(step, growth):
            return False
        target = growth + ledger.headroom(len(running))
        try:
            left = ledger.round(step, [(s.rid, s.written) for s in running], target)
        except ResidencyError as exc:
            raise SimError(str(exc)) from exc
        if left:
            by_id = {s.rid: s for s in running}
            for rid, resident in left.items():
                seq = by_id.get(rid)
                if seq is not None:
                    self._shrink(seq, resident)
        return True

    def steps_free(self, step: int, batch: int) -> int | None:
        """Decode iterations that can run before a round is due."""
        return self._ledger.steps_free(step, batch)

    def _shrink(self, s: Seq, resident: int) -> None:
        """Release the blocks of evicted tokens; a token written but not yet reported, and
        prompt blocks allocated but not yet computed, stay held."""
        pool = self._pool
        want = resident + (s.target - s.computed if not s.decoding else 0)
        if want >= s.pool_tokens:
            return
        if pool.num_free_blocks == 0:
            # No block to copy a shared partial block into: stop at a block boundary.
            bs = pool.block_size
            want = -(-want // bs) * bs
            if want >= s.pool_tokens:
                return
        if want < s.pool_reserved:
            pool.truncate(s.rid, want)
            s.pool_reserved = want
        s.pool_tokens = want

    @property
    def evicted(self) -> int:
        """Tokens the policy evicted."""
        return self._ledger.evicted

    @property
    def rounds(self) -> int:
        """Eviction rounds run."""
        return self._ledger.rounds

    @property
    def attention_recall(self) -> float:
        """Mean share of the model's attention mass on resident tokens."""
        return self._ledger.attention_recall


Residency = KeepAll | Evicting
"""What the engine's phases see of KV residency."""
