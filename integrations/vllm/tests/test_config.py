"""The kvpolicy config for vLLM: built from a mapping, JSON or a file; bad input named."""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any

import pytest

from kvpolicy.admit import RateLimitedAdmission
from kvpolicy.evict import CostAware
from kvpolicy.vllm import (
    ENV_VAR,
    TESTED_VLLM_VERSIONS,
    ConfigError,
    KVPolicyConfig,
    UnsupportedVLLMError,
    check_vllm_version,
    config_from_vllm,
    load_config,
)


class TestLoadConfig:
    def test_empty_config_turns_everything_off(self) -> None:
        """An empty mapping is a config with no feature on."""
        cfg = load_config({})
        assert cfg == KVPolicyConfig()
        assert cfg.admission_policy() is None
        assert cfg.preemption_policy() is None

    def test_policies_resolve_by_name(self) -> None:
        """Admission and preemption are built by name through kvmodel's resolver."""
        cfg = load_config(
            {
                "admission": {"name": "rate-limited", "params": {"window": 64}},
                "preemption": {"name": "cost-aware", "params": {"attention_weight": 0.5}},
            }
        )
        admission = cfg.admission_policy()
        assert isinstance(admission, RateLimitedAdmission)
        assert admission.window == 64
        assert isinstance(cfg.preemption_policy(), CostAware)
        assert cfg.admission_policy() is not admission  # a fresh instance per scheduler

    def test_json_text_and_file(self, tmp_path: pathlib.Path) -> None:
        """JSON text and a JSON file give the same config."""
        raw = {"max_admissions_per_step": 4, "preemption": {"name": "last-in-first-out"}}
        path = tmp_path / "kvpolicy.json"
        path.write_text(json.dumps(raw))
        assert load_config(json.dumps(raw)) == load_config(path) == load_config(raw)

    def test_tenancy_manifest(self, manifest: dict[str, Any]) -> None:
        """The tenancy section loads tenancy's token-pool manifest."""
        cfg = load_config({"tenancy": {"manifest": manifest, "default_tenant": "free"}})
        assert cfg.tenancy is not None
        assert [e.tenant for e in cfg.tenancy.pool.entitlements] == ["gold", "free"]

    def test_offload_group_ttls(self) -> None:
        """Group keys may be JSON strings; TTLs are seconds."""
        cfg = load_config({"offload": {"group_ttls": {"17": 60}, "residual_ttl_s": 5}})
        assert cfg.offload is not None
        assert dict(cfg.offload.group_ttls) == {17: 60.0}
        assert cfg.offload.residual_ttl_s == 5.0
        assert load_config({"offload": {}}).offload.residual_ttl_s == math.inf  # type: ignore[union-attr]


class TestBadInput:
    def test_unknown_policy_name(self) -> None:
        """An unknown admission policy fails at load time, naming the field and the known names."""
        with pytest.raises(ConfigError, match=r"'admission'.*'no-such'.*rate-limited"):
            load_config({"admission": {"name": "no-such"}})

    def test_unknown_param(self) -> None:
        """A param the policy does not take is named."""
        with pytest.raises(ConfigError, match=r"'preemption'.*unknown param 'speed'"):
            load_config({"preemption": {"name": "cost-aware", "params": {"speed": 1}}})

    def test_impossible_cap(self) -> None:
        """A cap of 0 admissions per step would never admit anything."""
        with pytest.raises(ValueError, match=r"'max_admissions_per_step' must be >= 1"):
            load_config({"max_admissions_per_step": 0})

    def test_bad_param_value(self) -> None:
        """A value the policy rejects is reported with the field."""
        with pytest.raises(ConfigError, match=r"'admission'.*window"):
            load_config({"admission": {"name": "rate-limited", "params": {"window": -1}}})

    def test_default_tenant_without_entitlement(self, manifest: dict[str, Any]) -> None:
        """A default tenant the pool does not entitle is rejected at startup."""
        with pytest.raises(ConfigError, match=r"'tenancy.default_tenant'.*'nobody'"):
            load_config({"tenancy": {"manifest": manifest, "default_tenant": "nobody"}})

    def test_bad_manifest(self) -> None:
        """A broken manifest is named as the tenancy.manifest field."""
        with pytest.raises(ConfigError, match=r"'tenancy.manifest'"):
            load_config({"tenancy": {"manifest": {"pool": {}}}})

    def test_negative_ttl(self) -> None:
        """A negative offload TTL is refused, naming the group."""
        with pytest.raises(ConfigError, match=r"offload.group_ttls\['5'\].*>= 0"):
            load_config({"offload": {"group_ttls": {"5": -1.0}}})
        with pytest.raises(ConfigError, match=r"offload.residual_ttl_s"):
            load_config({"offload": {"residual_ttl_s": -3}})

    def test_unknown_key(self) -> None:
        """A misspelt section is named with the known ones."""
        with pytest.raises(ConfigError, match=r"unknown key 'admision'"):
            load_config({"admision": {"name": "greedy"}})

    def test_missing_file_and_bad_json(self, tmp_path: pathlib.Path) -> None:
        """A missing file and broken JSON are errors, not an all-off config."""
        with pytest.raises(ConfigError, match="not found"):
            load_config(str(tmp_path / "missing.json"))
        with pytest.raises(ConfigError, match="not valid JSON"):
            load_config("{not json")


class TestSources:
    def test_additional_config_wins_over_env(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """vLLM's additional_config['kvpolicy'] is read first, then the environment."""
        monkeypatch.setenv(ENV_VAR, json.dumps({"max_admissions_per_step": 3}))
        assert (
            config_from_vllm({"kvpolicy": {"max_admissions_per_step": 5}}).max_admissions_per_step
            == 5
        )
        assert config_from_vllm({}).max_admissions_per_step == 3
        monkeypatch.delenv(ENV_VAR)
        assert config_from_vllm({}) == KVPolicyConfig()


class TestVersion:
    def test_tested_version_passes(self) -> None:
        """A tested release is accepted."""
        assert check_vllm_version(TESTED_VLLM_VERSIONS[0]) == TESTED_VLLM_VERSIONS[0]

    def test_untested_version_is_named(self) -> None:
        """An untested release fails at startup unless explicitly allowed."""
        with pytest.raises(UnsupportedVLLMError, match=r"vLLM 0\.33\.0 is untested"):
            check_vllm_version("0.33.0")
        assert check_vllm_version("0.33.0", allow_untested=True) == "0.33.0"
