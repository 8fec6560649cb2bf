"""Token-PD (seed 000): KV tokens as assets priced by one dual variable per GPU.

Every cached token has a return ``R`` (the fraction of future query attention mass that
lands on it) and a risk ``sigma^2``; keeping it costs ``c``. With the memory price ``mu``
shared by every stream on the GPU, the excess value of a token is::

    g = R - lambda * sigma^2 + delta - mu * c

and the keep rule (eq. 4) keeps exactly the tokens with ``g >= 0``. After each step the price
follows the exponentiated dual update of eq. 5 (``mu <- mu * exp(eta * (demand - M) / M)``,
``eta ∝ 1/sqrt(T)``). Evicting means popping the smallest ``g`` first from a structure shared
by every stream (the :class:`TokenTable`'s candidate set plays the paper's shared heap); after the
keep rule, tokens are popped until the hard budget holds, which the paper does not promise.

See the package README for where seed 000 is ambiguous and what is chosen here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np
from attrs import field, frozen
from attrs.validators import ge, gt, instance_of, le, optional
from numpy.typing import ArrayLike, NDArray

from kvpolicy.evict._content import LatestOccurrences
from kvpolicy.evict._kernels import signals_from_logits
from kvpolicy.evict._scored import ScoredPolicy
from kvpolicy.evict._table import check_budget

__all__ = [
    "TokenPDConfig",
    "TokenPDPolicy",
    "age_bins",
    "bin_medians",
    "dual_update",
    "excess_value",
    "pooled_max",
]

_MAX_EXPONENT = 20.0
_COLUMNS = ("prior_r", "prior_v", "count", "mean", "m2", "latest")
_AGE_BINS = 32
"""Age bins of the age profile: ages 0, 1, 2-3, 4-7, ... (``bit_length`` of the age)."""
_AGE_RATE = 1.0 / 16.0
"""How fast the age profile forgets: each step's weight decays by this factor (the
profile is a count-weighted exponential moving average of the steps' medians)."""


def age_bins(ages: NDArray[np.int64]) -> NDArray[np.int64]:
    """Bin of each age >= 0: 0 for age 0, ``k`` for ages in ``[2**(k-1), 2**k)``."""
    a = np.maximum(np.asarray(ages, dtype=np.int64), 0)
    out = np.zeros(a.shape, dtype=np.int64)
    pos = a > 0
    out[pos] = np.floor(np.log2(a[pos])).astype(np.int64) + 1
    return np.minimum(out, _AGE_BINS - 1)


def pooled_max(
    values: NDArray[np.float64], positions: NDArray[np.int64], half_width: int
) -> NDArray[np.float64]:
    """Each value replaced by the largest of the ``2 * half_width + 1`` values around it
    when ordered by position (fewer at the ends); returned in the input order."""
    order = np.argsort(positions, kind="stable")
    v = values[order]
    out = v.copy()
    for d in range(1, half_width + 1):
        np.maximum(out[d:], v[:-d], out=out[d:])
        np.maximum(out[:-d], v[d:], out=out[:-d])
    res = np.empty_like(out)
    res[order] = out
    return res


def bin_medians(
    bins: NDArray[np.int64], values: NDArray[np.float64]
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """The bins present in ``bins`` (ascending) and the median of ``values`` in each."""
    order = np.lexsort((values, bins))
    b, v = bins[order], values[order]
    present, start, count = np.unique(b, return_index=True, return_counts=True)
    lo = start + (count - 1) // 2
    hi = start + count // 2
    return present, 0.5 * (v[lo] + v[hi])


def _finite(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"'{attribute.name}' must be finite: {value!r}")


def _float_field(default: float, *validators: object) -> float:
    return field(
        default=default,
        converter=float,
        validator=[_finite, *validators],  # type: ignore[list-item]
    )


def _int_field(default: int, most: int = 2**31 - 1) -> int:
    # Bounded: a count beyond ``most`` is a mistake that would allocate or loop for ever.
    return field(default=default, validator=[instance_of(int), ge(0), le(most)])


@frozen
class TokenPDConfig:
    """Parameters of :class:`TokenPDPolicy`, with seed 000's symbols."""

    risk_aversion: float = _float_field(0.1, ge(0.0))
    """``lambda`` of eq. 2: return given up per unit of risk (seed 000 sweeps 0 to 0.5)."""
    recompute_penalty: float = _float_field(0.0, ge(0.0))
    """``delta`` of eq. 2: utility lost when an evicted token must be recomputed."""
    token_cost: float = _float_field(1.0, gt(0.0))
    """``c`` of eq. 1: memory cost of one token, in the units of the budget (1 = a token)."""
    learning_rate: float = _float_field(1.0, gt(0.0))
    """Scale ``eta_0`` of the dual step: ``eta = eta_0 / sqrt(T)`` (eq. 5)."""
    horizon: int | None = field(default=None, validator=optional([instance_of(int), gt(0)]))
    """``T`` of ``eta ∝ 1/sqrt(T)`` when known; None uses ``eta_t = eta_0 / sqrt(t)`` (anytime)."""
    initial_price: float | None = field(
        default=None,
        converter=attrs.converters.optional(float),
        validator=optional([_finite, gt(0.0)]),
    )
    """``mu^(1)``; None sets it at the first over-budget step to the price that clears it."""
    min_price: float = _float_field(1e-12, gt(0.0))
    """Floor of ``mu``: the multiplicative update could never leave 0 (eq. 5)."""
    default_return: float = _float_field(0.0, ge(0.0))
    """``R_hat`` of a token inserted without signals (the paper's constant-return ablation)."""
    default_risk: float = _float_field(0.0, ge(0.0))
    """``sigma_hat^2`` of a token inserted without a risk column."""
    prior_weight: float = _float_field(1.0, ge(0.0))
    """How many observed steps the predicted return counts for in the running estimate."""
    memory: int = _int_field(0)
    """Observations the running estimate remembers: 0 averages every step since insertion
    (Welford); ``k > 0`` weights the last ~``k`` steps, an exponential moving average with
    weight ``1/k`` once a token has been observed ``k`` times, so a token whose attention
    has faded loses value (not in seed 000)."""
    keep_rule: bool = field(default=True, validator=instance_of(bool))
    """Apply eq. 4 (evict every ``g < 0``, even under budget); False only enforces the budget."""
    num_sink: int = _int_field(0)
    """Leading positions of each stream kept while the budget allows (not in seed 000)."""
    recent_window: int = _int_field(0)
    """Newest positions of each stream kept while the budget allows (not in seed 000)."""
    pool: int = _int_field(0, 2**16)
    """Half-width (at most 65,536) of the neighbourhood whose best value a token takes as its
    key (0: its own; not in seed 000): among the tokens observed together, in position order, each
    keeps the largest value of the ``2 * pool + 1`` around it, so the neighbours of an
    attended token stay with it (SnapKV pools its scores the same way)."""
    age_prior: float = _float_field(0.0, ge(0.0))
    """How many observations the stream's *age profile* counts for in a token's estimate
    (0: not used; not in seed 000). The profile is the median attention a token of each
    age (in powers of two) receives in that stream, learned online from every
    observation: a prior that says how attention fades with age in this layer, which the
    token's own observations then correct."""
    copy_bonus: float = _float_field(0.0, ge(0.0))
    """Value added to a token while it is the latest occurrence of its content in its
    stream, in units of the even share ``1/n`` of the stream's ``n`` resident tokens (0:
    not used; not in seed 000). A model copies a token it has seen before from that
    earlier occurrence, often hundreds of tokens later and after little attention in
    between, which no score of past attention foresees; the latest occurrence of each
    content is the one copy source that is certain to stay useful, and older duplicates are
    not needed for it. Needs the token ids (:meth:`TokenPDPolicy.tokens`); without them it
    changes nothing."""
    copy_context: int = field(default=1, validator=[instance_of(int), ge(1), le(4)])
    """Tokens that make a token's *content* for ``copy_bonus``: 1, its own id; 2, its id
    and the id before it (the pair an induction head matches: it attends to the token that
    followed an earlier occurrence of the current one); up to 4."""
    copy_min_count: int = field(default=1, validator=[instance_of(int), ge(1)])
    """Occurrences a content must have had in its stream, the latest included, before its
    latest occurrence takes ``copy_bonus``: 1, every content; 2, contents that have
    already repeated (a token that has been copied once is likely to be copied again, and
    far fewer tokens qualify, so the bonus costs less of the budget)."""


def excess_value(
    returns: NDArray[np.float64],
    risks: NDArray[np.float64],
    price: float,
    config: TokenPDConfig,
) -> NDArray[np.float64]:
    """Excess value ``g = R - lambda sigma^2 + delta - mu c`` of tokens (eq. 2 and 4).

    Seed 000 writes ``g = R - lambda sigma^2 - mu c`` and puts ``delta`` on evicted tokens in
    eq. 2; keeping a token saves that penalty, so it counts towards keeping here.

    Args:
        returns: (n,) float64 expected returns ``R_hat``.
        risks: (n,) float64 risks ``sigma_hat^2``.
        price: memory price ``mu`` >= 0.
        config: the policy's parameters.

    Returns:
        (n,) float64 excess values; eq. 4 keeps the tokens where it is >= 0.
    """
    lam, delta, c = config.risk_aversion, config.recompute_penalty, config.token_cost
    return np.asarray(returns - lam * risks + delta - price * c, dtype=np.float64)


def dual_update(price: float, demand: float, capacity: float, eta: float) -> float:
    """Eq. (5) of seed 000: ``mu * exp(eta * (demand - M) / M)``.

    Args:
        price: current price ``mu^(t)`` > 0.
        demand: memory the keep rule would hold, ``sum c x`` (same units as ``capacity``).
        capacity: the budget ``M`` > 0.
        eta: step size.

    Returns:
        ``mu^(t+1)``; the exponent is clipped to ±20 so that one step cannot overflow.
    """
    if capacity <= 0:
        raise ValueError(f"'capacity' must be > 0: {capacity!r}")
    step = max(-_MAX_EXPONENT, min(_MAX_EXPONENT, eta * (demand - capacity) / capacity))
    return price * math.exp(step)


class TokenPDPolicy(ScoredPolicy):
    """Token-PD of seed 000 over every stream on a GPU.

    ``insert(stream, positions, signals)`` is seed 000's ``CacheInsert``: ``signals`` is None
    or an (n, k) float64 array whose column 0 is the predicted return ``R_hat`` and column 1,
    when ``k >= 2``, the risk ``sigma_hat^2`` (a :class:`ReturnPredictor` gives both).
    ``observe`` folds the attention actually received into a running estimate (the
    prediction counts for ``prior_weight`` observations), so the policy learns online.
    ``evict(budget)`` is ``CacheEvict``: the keep rule at the current price, then the hard
    budget, then the dual update.
    """

    def __init__(self, config: TokenPDConfig | None = None) -> None:
        cfg = TokenPDConfig() if config is None else config
        if not isinstance(cfg, TokenPDConfig):
            raise TypeError(f"'config' must be a TokenPDConfig: {config!r}")
        super().__init__(num_sink=cfg.num_sink, recent_window=cfg.recent_window)
        self._cfg = cfg
        self._price: float | None = cfg.initial_price
        self._steps = 0
        self._last_demand = 0
        # Age profile per stream (cfg.age_prior > 0): median attention per age bin and the
        # decayed count of tokens behind it; the stream being observed, for `observed`.
        self._profiles: dict[str, tuple[NDArray[np.float64], NDArray[np.float64]]] = {}
        self._observing: str | None = None
        # The latest occurrence of each content per stream (copy_bonus; `tokens`).
        self._occurrences = LatestOccurrences(cfg.copy_context)
        # Per token: predicted return and risk, and Welford's count, mean and sum of
        # squared deviations of the realised returns.
        for name in _COLUMNS:
            self.table.add_column(name)

    @property
    def config(self) -> TokenPDConfig:
        """The parameters."""
        return self._cfg

    @property
    def price(self) -> float | None:
        """The memory price ``mu`` (None until the first over-budget step sets it)."""
        return self._price

    @property
    def steps(self) -> int:
        """Evict calls so far (``t`` of eq. 5)."""
        return self._steps

    @property
    def last_demand(self) -> int:
        """Tokens the keep rule alone would have kept at the last evict call."""
        return self._last_demand

    def age_profile(self, stream: str) -> NDArray[np.float64] | None:
        """(32,) float64 median attention per age bin (:func:`age_bins`) learned for
        ``stream`` (NaN where no token of that age was observed), or None when the policy
        keeps no profile (``age_prior == 0``) or has not observed ``stream``."""
        got = self._profiles.get(stream)
        if got is None:
            return None
        prof, weight = got
        return np.where(weight > 0, prof, np.nan)

    def observe(
        self, stream: str, positions: NDArray[np.int64], attention: NDArray[np.float64]
    ) -> None:
        """:meth:`ScoredPolicy.observe`; with ``age_prior`` it also learns the stream's age
        profile from this step's attention (after the estimates are updated)."""
        self._observing = stream
        try:
            super().observe(stream, positions, attention)
        finally:
            self._observing = None

    def remove(self, stream: str) -> None:
        """Forget a finished or preempted stream, its tokens, its age profile and the
        contents it has seen."""
        super().remove(stream)
        self._profiles.pop(stream, None)
        self._occurrences.remove(stream)

    def tokens(self, stream: str, positions: NDArray[np.int64], token_ids: ArrayLike) -> None:
        """The token ids at resident ``positions`` of ``stream`` (``copy_bonus``), given
        once per token right after :meth:`insert`, in position order (kvpolicy-evict's
        ``ContentAware``).

        Each token becomes the latest occurrence of its content (its id and the
        ``copy_context - 1`` ids before it in the stream) and takes the bonus once the
        content has occurred ``copy_min_count`` times; the occurrence it replaces, when
        still resident, loses it.

        Args:
            stream: stream id.
            positions: (n,) int64 resident positions, ascending, after every position
                given before for ``stream``.
            token_ids: (n,) int64 token ids (or any non-negative content ids) at them.

        Raises:
            TypeError: ``stream`` not a str, positions or ids not integers.
            ValueError: lengths differ, a negative id, a position not resident, or
                positions not ascending after the last ones given. Nothing changes then.
        """
        # lookup checks the stream and residency without changing anything; add checks
        # the ids and the order before it records anything.
        slots = self.table.lookup(stream, positions)
        replaced, counts = self._occurrences.add(stream, positions, token_ids)
        latest = self.table.column("latest")
        latest[slots] = (counts >= self._cfg.copy_min_count).astype(np.float64)
        if replaced.size:
            held = replaced[np.isin(replaced, self.table.resident_positions(stream))]
            faded = self.table.lookup(stream, held)
            latest[faded] = 0.0
            slots = np.union1d(slots, faded)
        if self._cfg.copy_bonus and slots.size:
            self.table.set_keys(slots, self._value(slots, stream))

    def estimates(
        self, stream: str, positions: NDArray[np.int64]
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Current ``(R_hat, sigma_hat^2)`` of resident ``positions``, each (n,) float64."""
        return self._estimate(self.table.lookup(stream, positions), stream)

    def excess_values(self, stream: str, positions: NDArray[np.int64]) -> NDArray[np.float64]:
        """(n,) float64 excess values ``g`` at the current price (0 before it is set),
        with the ``copy_bonus`` of the latest occurrences."""
        slots = self.table.lookup(stream, positions)
        return self._value(slots, stream) - (self._price or 0.0) * self._cfg.token_cost

    def insert_logits(
        self,
        stream: str,
        positions: NDArray[np.int64],
        logits: Any,
        predictor: object,
        attention: Any = None,
    ) -> None:
        """:meth:`insert` with signals predicted from the tokens' (n, V) logits.

        ``predictor`` is a ``CompactReturnPredictor`` (needs (n,) ``attention``) or a
        ``LogitsMLPPredictor``; CUDA logits are priced by kvpolicy-kernels' fused kernel
        when that extra is installed (``kvpolicy-evict[kernels]``).
        """
        signals = signals_from_logits(predictor, logits, positions, attention)
        self.insert(stream, positions, signals)

    # ------------------------------------------------------------------ hooks
    def check_signals(self, signals: object, n: int) -> NDArray[np.float64] | None:
        """Column 0 (the predicted return) and column 1 (the risk) must be finite, >= 0."""
        arr = super().check_signals(signals, n)
        if arr is None:
            return None
        if arr.shape[1] < 1:
            raise ValueError(f"'signals' needs at least one column (the return), got {arr.shape}")
        bad = ~np.isfinite(arr[:, 0]) | (arr[:, 0] < 0)
        if bad.any():
            raise ValueError(
                f"'signals' column 0 (predicted return) must be finite and >= 0: "
                f"{arr[bad, 0][:5].tolist()}"
            )
        if arr.shape[1] >= 2:
            bad = ~np.isfinite(arr[:, 1]) | (arr[:, 1] < 0)
            if bad.any():
                raise ValueError(
                    f"'signals' column 1 (predicted risk) must be finite and >= 0: "
                    f"{arr[bad, 1][:5].tolist()}"
                )
        return arr

    def new_keys(
        self, slots: NDArray[np.int64], signals: NDArray[np.float64] | None
    ) -> NDArray[np.float64]:
        """``g + mu c`` of the predicted return and risk (the defaults without signals)."""
        cfg = self._cfg
        col = self.table.column
        if signals is None:
            col("prior_r")[slots] = cfg.default_return
            col("prior_v")[slots] = cfg.default_risk
        else:
            col("prior_r")[slots] = signals[:, 0]
            col("prior_v")[slots] = signals[:, 1] if signals.shape[1] >= 2 else cfg.default_risk
        col("count")[slots] = 0.0
        col("mean")[slots] = 0.0
        col("m2")[slots] = 0.0
        col("latest")[slots] = 0.0
        return self._value(slots)

    def observed(self, slots: NDArray[np.int64], attention: NDArray[np.float64]) -> None:
        """Fold the attention received (a realised return) into the running estimate."""
        # Welford's running mean and sum of squared deviations of the realised returns.
        col = self.table.column
        count, mean_col = col("count"), col("mean")
        n = count[slots] + 1.0
        delta = attention - mean_col[slots]
        k = self._cfg.memory
        if k:
            # Exponential moving average once n reaches k: the count stops at k and the
            # sum of squared deviations decays with it (m2 / n stays the running variance).
            n = np.minimum(n, float(k))
            w = 1.0 / n
            var = col("m2")[slots] / np.maximum(count[slots], 1.0)
            col("m2")[slots] = (1.0 - w) * (var + w * delta * delta) * n
            mean_col[slots] = mean_col[slots] + w * delta
        else:
            mean = mean_col[slots] + delta / n
            col("m2")[slots] += delta * (attention - mean)
            mean_col[slots] = mean
        count[slots] = n
        stream = self._observing
        bins = self._ages(stream, slots)
        keys = self._value(slots, stream, bins)
        if self._cfg.pool:
            keys = pooled_max(keys, self.table.positions_of(slots), self._cfg.pool)
        self.table.set_keys(slots, keys)
        if stream is not None and bins is not None:
            self._learn_ages(stream, bins, attention)

    def _ages(self, stream: str | None, slots: NDArray[np.int64]) -> NDArray[np.int64] | None:
        """Age bins of ``slots`` in ``stream`` (ages from its newest position), or None
        when the policy keeps no age profile or no stream is given."""
        if self._cfg.age_prior <= 0 or stream is None or not slots.size:
            return None
        newest = int(self.table.resident_positions(stream)[-1])
        return age_bins(newest - self.table.positions_of(slots))

    def _learn_ages(
        self, stream: str, bins: NDArray[np.int64], attention: NDArray[np.float64]
    ) -> None:
        """Fold this step's median attention per age bin into the stream's profile, each
        bin weighted by how many tokens it held (a new bin is first reached by the oldest
        token alone, which is often an attention sink)."""
        present, medians = bin_medians(bins, attention)
        counts = np.bincount(bins, minlength=_AGE_BINS)[present].astype(np.float64)
        prof, weight = self._profiles.setdefault(stream, (np.zeros(_AGE_BINS), np.zeros(_AGE_BINS)))
        weight[present] = (1.0 - _AGE_RATE) * weight[present] + counts
        prof[present] += counts / weight[present] * (medians - prof[present])

    def _estimate(
        self,
        slots: NDArray[np.int64],
        stream: str | None = None,
        bins: NDArray[np.int64] | None = None,
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        # The prediction is a prior worth `prior_weight` observations; the realised returns
        # (per-step attention mass) and their spread update it.
        w0 = self._cfg.prior_weight
        col = self.table.column
        n = col("count")[slots]
        prior_r, prior_v = col("prior_r")[slots], col("prior_v")[slots]
        denom = np.maximum(w0 + n, 1e-300)
        r = np.where(n > 0, (w0 * prior_r + n * col("mean")[slots]) / denom, prior_r)
        v = np.where(n > 0, (w0 * prior_v + col("m2")[slots]) / denom, prior_v)
        profile = None if stream is None else self._profiles.get(stream)
        b = bins if bins is not None or profile is None else self._ages(stream, slots)
        if profile is not None and b is not None:
            # The age profile counts for `wa` more observations: tokens of an age whose
            # attention has typically faded lose value before their own estimate shows it.
            wa = self._cfg.age_prior
            prof, weight = profile
            mixed = (wa * prof[b] + (w0 + n) * r) / (wa + w0 + n)
            r = np.where(weight[b] > 0, mixed, r)
        return r, v

    def _value(
        self,
        slots: NDArray[np.int64],
        stream: str | None = None,
        bins: NDArray[np.int64] | None = None,
    ) -> NDArray[np.float64]:
        """``g + mu c``: the part of the excess value that differs between tokens (with
        the ``copy_bonus`` of the latest occurrences when ``stream`` is known)."""
        r, v = self._estimate(slots, stream, bins)
        g = excess_value(r, v, 0.0, self._cfg)
        if stream is None:
            return g
        return g + self._copy_bonus(slots, stream)

    def _copy_bonus(self, slots: NDArray[np.int64], stream: str) -> NDArray[np.float64] | float:
        """The ``copy_bonus`` of each token: the bonus times the even share ``1/n`` of the
        stream's ``n`` tokens on the latest occurrences (0 when not used)."""
        bonus = self._cfg.copy_bonus
        if not bonus:
            return 0.0
        share = bonus / max(self.table.stream_tokens(stream), 1)
        return share * self.table.column("latest")[slots]

    # ------------------------------------------------------------- CacheEvict
    def evict(self, budget_tokens: int) -> Mapping[str, NDArray[np.int64]]:
        """Seed 000's ``CacheEvict``: keep rule (eq. 4), hard budget, dual update (eq. 5).

        1. Every unprotected token with ``g < 0`` at the current price is evicted (when
           ``keep_rule``); the tokens left are the *demand* ``D`` of eq. 5.
        2. While more than ``budget_tokens`` remain, the smallest ``g`` goes next.
        3. ``mu <- mu exp(eta (c D - M) / M)`` with ``M = c * budget_tokens``.

        Before the price is set (``initial_price=None``) the first over-budget call sets it
        to the value of the last token evicted by step 2, the price that clears the budget.

        Args:
            budget_tokens: hard budget in tokens, >= 0.

        Returns:
            For each stream that lost tokens, its (m,) int64 evicted positions, ascending.
        """
        budget = check_budget(budget_tokens)
        cfg = self._cfg
        table = self.table
        self._steps += 1
        out: dict[str, NDArray[np.int64]] = {}
        demand = table.resident_tokens()
        if self._price is not None and cfg.keep_rule:
            below = table.below(self._price * cfg.token_cost)
            demand -= below.size
            if below.size:
                out = table.release(below)
        self._last_demand = demand
        over = table.resident_tokens() - budget
        if over > 0:
            victims = table.smallest(over)
            if self._price is None:
                top = float(table.keys(victims).max())
                self._price = max(top / cfg.token_cost, cfg.min_price)
            for name, pos in table.release(victims).items():
                prev = out.get(name)
                out[name] = pos if prev is None else np.sort(np.concatenate((prev, pos)))
        if self._price is not None:
            eta = cfg.learning_rate / math.sqrt(cfg.horizon or self._steps)
            capacity = max(budget, 1) * cfg.token_cost
            self._price = max(
                dual_update(self._price, demand * cfg.token_cost, capacity, eta), cfg.min_price
            )
        return out
