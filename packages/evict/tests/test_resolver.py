"""evict's policies through kvmodel's one resolver: names, defaults and bad params."""

from __future__ import annotations

import pytest

from kvpolicy.evict import H2OPolicy, TokenPDPolicy
from kvpolicy.kvmodel import EVICTION, PREEMPTION, RegistryError, build, describe, names

EVICTION_NAMES = ("fifo", "h2o", "lru", "sink-window", "token-pd")
PREEMPTION_NAMES = ("cost-aware", "last-in-first-out", "least-progressed-first", "priority-aware")


class TestNames:
    """Every entry point builds with its defaults."""

    def test_eviction_names(self) -> None:
        """The eviction policies evict declares are installed."""
        assert set(EVICTION_NAMES) <= set(names(EVICTION))

    @pytest.mark.parametrize("name", EVICTION_NAMES)
    def test_every_eviction_policy_builds_without_params(self, name: str) -> None:
        """No eviction policy needs a param; each param has a default."""
        build(EVICTION, name)
        assert not [p.name for p in describe(EVICTION, name) if p.required]

    @pytest.mark.parametrize("name", PREEMPTION_NAMES)
    def test_every_preemption_policy_builds_without_params(self, name: str) -> None:
        """No preemption order needs a param."""
        build(PREEMPTION, name)

    def test_h2o_default_window(self) -> None:
        """H2O's recent window defaults to 32 positions per stream."""
        policy = build(EVICTION, "h2o")
        assert isinstance(policy, H2OPolicy)
        assert policy.table.recent_window == 32


class TestParams:
    """Params reach the policy; a bad one is named."""

    def test_token_pd_fields_become_its_config(self) -> None:
        """Token-PD's params are the fields of TokenPDConfig."""
        policy = build(EVICTION, "token-pd", {"risk_aversion": 0.3, "recent_window": 4})
        assert isinstance(policy, TokenPDPolicy)
        assert (policy.config.risk_aversion, policy.config.recent_window) == (0.3, 4)

    def test_unknown_param_is_named(self) -> None:
        """A param the policy does not take names itself and the accepted ones."""
        with pytest.raises(RegistryError, match="unknown param 'window'; accepted: recent_window"):
            build(EVICTION, "h2o", {"window": 4})

    def test_bad_value_names_the_param(self) -> None:
        """A value the policy rejects names the param and the value."""
        with pytest.raises(RegistryError, match="'recent_window' must be >= 0: -1"):
            build(EVICTION, "h2o", {"recent_window": -1})
        with pytest.raises(RegistryError, match="'risk_aversion' must be >= 0"):
            build(EVICTION, "token-pd", {"risk_aversion": -1.0})
        with pytest.raises(TypeError, match="'access_threshold' must be a float"):
            build(EVICTION, "lru", {"access_threshold": "high"})

    def test_unknown_name_lists_the_known(self) -> None:
        """An unknown name lists every installed policy."""
        with pytest.raises(
            RegistryError, match="unknown eviction policy 'arc'; known: composed, fifo, h2o"
        ):
            build(EVICTION, "arc")
