"""Perplexity of eviction policies at several budgets: what ``kvpolicy evict eval`` runs."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attrs import field, frozen
from attrs.validators import ge, gt, instance_of, le

from kvpolicy.evict import (
    GroupedPrecision,
    MixedConfig,
    PrecisionCosts,
    ReturnPredictor,
    TokenPDConfig,
    TokenPDMixed,
    UniformPrecision,
    check_precisions,
)
from kvpolicy.evict.quality._decode import decode_perplexity
from kvpolicy.evict.quality._model import CausalLM
from kvpolicy.kvmodel import EVICTION, EvictionPolicy, ModelSpec, build, describe, names

__all__ = [
    "BYTES_PARAMS",
    "FULL",
    "POLICY_CHOICES",
    "QualityResult",
    "budget_tokens",
    "demoting_factory",
    "evaluate",
    "parse_policy",
    "policy_factory",
    "validate_budgets",
]

FULL = "full"
"""Name of the no-eviction baseline (the full KV cache)."""

BYTES_PARAMS = ("precision", "precisions", "group_size", "loss_scale", "key_axis", "window")
"""Label params of a run under a budget in bytes (:func:`demoting_factory`), not of the
policy: ``precision=B`` holds every token at ``B`` bits (any policy, and ``full``: uniform
quantization); ``precisions=16+8+4`` lets Token-PD choose among those precisions per token
(:class:`~kvpolicy.evict.TokenPDMixed`), ``loss_scale`` its loss model; ``group_size``
the channels per quantization group (32 when not given); ``key_axis=channel`` with
``precision=B`` quantizes keys per channel over groups of ``group_size`` tokens (KIVI's
layout: the newest tokens wait at 16 bits until a group is whole), and with
``precisions`` Token-PD's demotions wait until ``group_size`` tokens of a layer share a
target precision (:class:`~kvpolicy.evict.GroupedPrecision`); ``token`` (the default)
per token; ``window=W`` with ``precision=B`` (keys per token) keeps the newest ``W``
tokens of each layer at 16 bits, demoted one at a time as they leave it (a sliding
full-precision residual, paid for at 16 bits)."""

POLICY_CHOICES: tuple[str, ...] = (
    FULL,
    *(n for n in names(EVICTION) if not any(p.required for p in describe(EVICTION, n))),
)
"""Names :func:`policy_factory` knows: the full cache and every installed eviction policy
(``kvpolicy.eviction`` entry points) that needs no params (``composed`` names its members,
so it is built in Python or a stack file, not here)."""


@frozen
class QualityResult:
    """Perplexity of one policy at one budget."""

    policy: str = field(validator=instance_of(str))
    """Policy name (``"full"`` for the full cache)."""
    budget: float = field(converter=float, validator=[gt(0.0), le(1.0)])
    """Budget as a fraction of the tokens fed (1.0 for the full cache)."""
    budget_tokens: int = field(validator=[instance_of(int), ge(1)])
    """Tokens each layer keeps."""
    perplexity: float = field(converter=float)
    """exp of the mean next-token NLL."""
    mean_resident: float = field(converter=float)
    """Mean tokens resident per layer after each step's eviction."""

    def to_dict(self) -> dict[str, Any]:
        """``{"policy", "budget", "budget_tokens", "perplexity", "mean_resident"}`` for JSON."""
        return {
            "policy": self.policy,
            "budget": self.budget,
            "budget_tokens": self.budget_tokens,
            "perplexity": self.perplexity,
            "mean_resident": self.mean_resident,
        }


def validate_budgets(budgets: Sequence[float]) -> tuple[float, ...]:
    """Return ``budgets`` as floats, or raise ValueError naming the first outside (0, 1]."""
    out = []
    for b in budgets:
        if isinstance(b, bool) or not isinstance(b, int | float):
            raise TypeError(f"'budget' must be a number: {b!r}")
        if not (math.isfinite(b) and 0 < b <= 1):
            raise ValueError(f"'budget' must be in (0, 1]: {b!r}")
        out.append(float(b))
    if not out:
        raise ValueError("'budget' must list at least one budget")
    return tuple(out)


def cli_texts_and_budgets(
    parser: argparse.ArgumentParser, text: str, budget: str
) -> tuple[list[str], tuple[float, ...]]:
    """The ``--text`` names and ``--budget`` fractions of the harness scripts' command lines
    (comma-separated); a bad one ends the program through ``parser.error``, naming it."""
    from kvpolicy.evict.quality._texts import EVAL_TEXTS

    texts = [t.strip() for t in text.split(",") if t.strip()]
    for t in texts:
        if t not in EVAL_TEXTS:
            parser.error(f"--text: unknown {t!r}; known: {', '.join(EVAL_TEXTS)}")
    try:
        return texts, validate_budgets([float(b) for b in budget.split(",")])
    except ValueError as exc:
        parser.error(f"--budget: {exc}")


def budget_tokens(budget: float, tokens: int) -> int:
    """Tokens kept per layer: ``round(budget * tokens)``, at least 1 (0.25 of 512 -> 128)."""
    return max(1, round(budget * tokens))


def _bind(factory: Callable[[int], EvictionPolicy], budget: int) -> Callable[[], EvictionPolicy]:
    return lambda: factory(budget)


def parse_policy(label: str) -> tuple[str, dict[str, Any]]:
    """Split a policy label ``NAME[:KEY=VALUE]...`` into the name and its parameters.

    Values are ints, floats, ``true``/``false``, or a fraction of the budget written with a
    ``b`` suffix (``recent_window=0.25b`` keeps a quarter of the budget as recent window);
    :func:`policy_factory` resolves those per budget.

    Raises:
        ValueError: unknown policy name, or a parameter that is not ``KEY=VALUE``.
    """
    if not isinstance(label, str) or not label:
        raise ValueError(f"'policy' must be a non-empty string: {label!r}")
    name, *parts = label.split(":")
    if name != FULL and name not in POLICY_CHOICES:
        raise ValueError(f"'policy' must be one of {', '.join(POLICY_CHOICES)}: {name!r}")
    params: dict[str, Any] = {}
    for part in parts:
        key, sep, raw = part.partition("=")
        if not sep or not key or not raw:
            raise ValueError(f"'policy' parameter must be KEY=VALUE: {part!r} in {label!r}")
        params[key] = _parse_value(raw, part)
    if name == FULL and set(params) - {"precision", "group_size", "key_axis", "window"}:
        raise ValueError(
            f"'policy' full takes only precision, group_size, key_axis and window: {label!r}"
        )
    return name, params


class _OfBudget(float):
    """A parameter given as a fraction of the budget (``0.5b``)."""


def _parse_value(raw: str, part: str) -> Any:
    low = raw.lower()
    if "+" in raw:  # a list of ints: precisions=16+8+4
        items = raw.split("+")
        if not all(i.isdigit() for i in items):
            raise ValueError(f"'policy' parameter list must be ints joined by +: {part!r}")
        return tuple(int(i) for i in items)
    if low in ("true", "false"):
        return low == "true"
    if low in ("token", "channel"):  # key_axis=channel
        return low
    try:
        if low.endswith("b"):
            return _OfBudget(float(low[:-1]))
        return int(raw) if raw.lstrip("-").isdigit() else float(raw)
    except ValueError:
        raise ValueError(
            f"'policy' parameter value must be a number, a bool, token or channel: {part!r}"
        ) from None


def _resolve(params: Mapping[str, Any], budget: int) -> dict[str, Any]:
    return {
        k: max(0, round(v * budget)) if isinstance(v, _OfBudget) else v for k, v in params.items()
    }


def policy_factory(name: str) -> Callable[[int], EvictionPolicy] | None:
    """The factory :func:`evaluate` uses for a policy label (None for ``"full"``).

    Policies are built by kvmodel's resolver (``build(EVICTION, name, params)``) with their
    defaults, except that per budget ``B`` tokens H2O keeps a recent window of ``B // 2``
    (the heavy-hitter/recent split of the H2O paper). A label may set parameters
    (:func:`parse_policy`): ``token-pd:num_sink=4:recent_window=0.25b``.

    Raises:
        ValueError: unknown name; the message lists :data:`POLICY_CHOICES`.
    """
    base, params = parse_policy(name)
    if set(params) & set(BYTES_PARAMS):
        raise ValueError(
            f"'policy' {name!r}: {', '.join(sorted(set(params) & set(BYTES_PARAMS)))} "
            "needs a budget in bytes (--budget-unit bytes)"
        )
    if base == FULL:
        return None
    if base == "h2o" and "recent_window" not in params:
        params = {**params, "recent_window": _OfBudget(0.5)}

    def factory(budget: int) -> EvictionPolicy:
        resolved = _resolve(params, budget)
        if base == "h2o":
            resolved["recent_window"] = max(1, resolved["recent_window"])
        return build(EVICTION, base, resolved or None)

    return factory


def evaluate(
    lm: CausalLM,
    input_ids: Any,
    policies: Mapping[str, Callable[[int], EvictionPolicy] | None],
    budgets: Sequence[float],
    predictor: ReturnPredictor | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[QualityResult]:
    """Perplexity of each policy at each budget on ``input_ids``.

    Args:
        lm: the model.
        input_ids: (n,) int64 torch tensor.
        policies: name -> factory of a fresh policy for a per-layer budget in tokens (called
            once per layer); a None factory is the full cache, run once and reported at
            budget 1.0.
        budgets: fractions of ``n`` in (0, 1].
        predictor: return predictor feeding ``signals`` to every policy.
        progress: called with 1 after every decoded token.

    Returns:
        One result per (policy, budget), in the order given (the full cache once).
    """
    fractions = validate_budgets(budgets)
    n = len(input_ids)
    results = []
    for name, factory in policies.items():
        if factory is None:
            r = decode_perplexity(lm, input_ids, None, n, progress=progress)
            results.append(QualityResult(name, 1.0, n, r.perplexity, r.mean_resident))
            continue
        for b in fractions:
            k = budget_tokens(b, n)
            r = decode_perplexity(lm, input_ids, _bind(factory, k), k, predictor, progress=progress)
            results.append(QualityResult(name, b, k, r.perplexity, r.mean_resident))
    return results


def demoting_factory(
    name: str, layer: ModelSpec
) -> tuple[Callable[[float], EvictionPolicy] | None, PrecisionCosts, int]:
    """The factory, costs and group size of a policy label under a budget in bytes.

    ``BYTES_PARAMS`` are taken from the label (:data:`BYTES_PARAMS`); the rest build the
    policy as :func:`policy_factory` does, a ``b`` fraction counting the tokens the budget
    buys at the policy's precision (16 bits for Token-PD choosing its precisions). The
    factory takes the budget in bytes of one layer.

    Args:
        name: a label, e.g. ``token-pd:precisions=16+8+4:memory=32`` or ``h2o:precision=4``
            or ``full:precision=8``.
        layer: one decoder layer of the model (costs are per layer).

    Returns:
        ``(factory or None for the full cache at 16 bits, costs, group_size)``.

    Raises:
        ValueError: unknown policy, ``precisions`` on a policy other than ``token-pd``,
            both ``precision`` and ``precisions``, or a bad value (named).
    """
    base, params = parse_policy(name)
    extra = {k: params.pop(k) for k in BYTES_PARAMS if k in params}
    group = extra.get("group_size", 32)
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ValueError(f"'group_size' must be an int >= 1: {group!r} in {name!r}")
    if "precision" in extra and "precisions" in extra:
        raise ValueError(f"'policy' {name!r}: give precision or precisions, not both")
    if "loss_scale" in extra and "precisions" not in extra:
        raise ValueError(f"'policy' {name!r}: loss_scale needs precisions")
    window = extra.get("window", 0)
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"'window' must be an int >= 0: {window!r} in {name!r}")
    if window and ("precision" not in extra or extra.get("key_axis", "token") != "token"):
        raise ValueError(
            f"'policy' {name!r}: window needs precision=B with keys per token "
            "(key_axis=channel has its own residual; precisions choose per token)"
        )
    axis = extra.get("key_axis", "token")
    if axis not in ("token", "channel"):
        raise ValueError(f"'key_axis' must be token or channel: {axis!r} in {name!r}")
    if "precisions" in extra:
        if base != "token-pd":
            raise ValueError(f"'precisions' is a param of token-pd only: {name!r}")
        raw = extra["precisions"]
        chosen = check_precisions(raw if isinstance(raw, tuple) else (raw,))
        costs = PrecisionCosts.of(layer, sorted({16, *chosen}), group)
        mixed = MixedConfig(chosen, costs, float(extra.get("loss_scale", 1.0)))

        def mixed_factory(budget_bytes: float) -> EvictionPolicy:
            k = int(budget_bytes // costs.token_bytes[16])
            try:
                config = TokenPDConfig(**_resolve(params, k))
            except TypeError as exc:
                raise ValueError(f"'policy' {name!r}: {exc}") from None
            if axis == "channel":
                return GroupedPrecision(TokenPDMixed(config, mixed), costs, residual=group)
            return TokenPDMixed(config, mixed)

        return mixed_factory, costs, group
    bits = extra.get("precision", 16)
    (bits,) = check_precisions([bits])
    if window and bits == 16:
        raise ValueError(f"'window' = {window} needs precision=B below 16: {name!r}")
    if axis == "channel" and bits == 16:
        raise ValueError(f"'key_axis' = channel needs precision=B below 16: {name!r}")
    costs = PrecisionCosts.of(layer, sorted({16, bits}), group)
    if base == FULL:
        if bits == 16:
            return None, costs, group
        base, params = "fifo", {}  # never evicts: the full cache's budget holds every token
    inner = policy_factory(":".join([base, *(f"{k}={_unparse(v)}" for k, v in params.items())]))
    assert inner is not None

    def uniform_factory(budget_bytes: float) -> EvictionPolicy:
        k = max(1, int(budget_bytes // costs.token_bytes[bits]))
        return UniformPrecision(
            inner(k), bits, costs, residual=group if axis == "channel" else 0, window=window
        )

    return uniform_factory, costs, group


def _unparse(value: Any) -> str:
    if isinstance(value, _OfBudget):
        return f"{float(value)!r}b"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "+".join(str(v) for v in value)
    return repr(value)
