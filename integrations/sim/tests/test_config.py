"""Stack configuration: YAML files, unknown keys, presets, building policies."""

from __future__ import annotations

import pathlib

import pytest

from kvpolicy.sim import (
    STACK_PRESETS,
    ConfigError,
    EngineConfig,
    StackConfig,
    build_stack,
    get_stack,
    load_stack,
    stack_from_dict,
)


class TestStackFromDict:
    def test_sections_are_built(self) -> None:
        """Each section becomes its component's config."""
        cfg = stack_from_dict(
            {
                "name": "s",
                "engine": {"block_size": 32, "max_batch": 64},
                "eviction": {"name": "none", "budget_fraction": 0.25},
                "preemption": {"mode": "swap"},
            }
        )
        assert cfg.name == "s"
        assert cfg.engine.block_size == 32
        assert cfg.engine.max_batch == 64
        assert cfg.eviction.budget_fraction == 0.25
        assert cfg.preemption.mode == "swap"

    def test_a_bare_name_is_accepted(self) -> None:
        """``admission: greedy`` is short for ``admission: {name: greedy}``."""
        assert stack_from_dict({"admission": "greedy"}).admission.name == "greedy"

    def test_unknown_top_level_key(self) -> None:
        """An unknown section is named in the error."""
        with pytest.raises(ConfigError, match="unknown key cache"):
            stack_from_dict({"cache": {}})

    def test_unknown_nested_key(self) -> None:
        """An unknown key of a section is named with its section."""
        with pytest.raises(ConfigError, match=r"unknown key engine\.blocksize"):
            stack_from_dict({"engine": {"blocksize": 16}})

    def test_bad_value(self) -> None:
        """A value a validator rejects names the section and the field."""
        with pytest.raises(ConfigError, match="'budget_fraction' must be <= 1"):
            stack_from_dict({"eviction": {"budget_fraction": 1.5}})


class TestEngineConfig:
    def test_capacity_below_a_block(self) -> None:
        """A pool smaller than one block is a ValueError naming the field."""
        with pytest.raises(ValueError, match="'kv_capacity_tokens'"):
            EngineConfig(block_size=16, kv_capacity_tokens=8)

    def test_wrong_type(self) -> None:
        """A float block size is a TypeError."""
        with pytest.raises(TypeError, match="'block_size'"):
            EngineConfig(block_size=16.0)  # type: ignore[arg-type]


class TestLoadStack:
    def test_yaml_file(self, tmp_path: pathlib.Path) -> None:
        """A YAML file is read and named after its stem."""
        p = tmp_path / "mine.yaml"
        p.write_text("engine:\n  token_budget: 512\nslo:\n  ttft_s: 1.5\n")
        cfg = load_stack(p)
        assert cfg.name == "mine"
        assert cfg.engine.token_budget == 512
        assert cfg.slo.ttft_s == 1.5

    def test_unknown_key_names_the_file(self, tmp_path: pathlib.Path) -> None:
        """The error names the file and the key."""
        p = tmp_path / "bad.yaml"
        p.write_text("admission:\n  nmae: greedy\n")
        with pytest.raises(ConfigError, match=r"bad\.yaml: unknown key admission\.nmae"):
            load_stack(p)

    def test_an_alias_bomb_is_refused_at_once(self, tmp_path: pathlib.Path) -> None:
        """A billion-laughs stack file is one short error (no expansion, no rendering);
        a duplicate key is named with its line."""
        lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
        lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
        p = tmp_path / "bomb.yaml"
        p.write_text("\n".join(lines) + "\nengine: *a8\n")
        with pytest.raises(ConfigError, match="YAML aliases are not allowed") as info:
            load_stack(p)
        assert len(str(info.value)) < 400
        p.write_text("engine:\n  token_budget: 512\n  token_budget: 1024\n")
        with pytest.raises(ConfigError, match=r"duplicate key 'token_budget'.*line 3"):
            load_stack(p)

    def test_presets_and_files(self, tmp_path: pathlib.Path) -> None:
        """get_stack takes a preset name or a path, and lists presets otherwise."""
        assert get_stack("vllm") is STACK_PRESETS["vllm"]
        with pytest.raises(ConfigError, match="not a preset \\(vllm, kvpolicy\\)"):
            get_stack(str(tmp_path / "missing.yaml"))


class TestBuildStack:
    def test_none_builds_nothing(self) -> None:
        """The default stack uses the engine's own mechanics only."""
        stack = build_stack(StackConfig())
        assert (stack.admission, stack.eviction, stack.preemption) == (None, None, None)

    def test_unknown_names_list_known(self) -> None:
        """An unknown admission name lists the known ones."""
        with pytest.raises(ConfigError, match="unknown admission policy 'magic'; known: none"):
            build_stack(stack_from_dict({"admission": "magic"}))

    def test_unknown_preemption(self) -> None:
        """An unknown preemption name lists the known ones."""
        with pytest.raises(ConfigError, match="least-progressed-first"):
            build_stack(stack_from_dict({"preemption": {"name": "random"}}))

    def test_unknown_eviction(self) -> None:
        """An unknown eviction name is refused."""
        with pytest.raises(ConfigError, match="unknown eviction policy 'magic'"):
            build_stack(stack_from_dict({"eviction": {"name": "magic"}}))

    def test_every_wraps_the_policy_in_periodic(self) -> None:
        """``every: N`` is the policy's cadence: kvpolicy-evict's Periodic(policy, N); without
        it the policy is bare (rounds only when the budget needs one)."""
        from kvpolicy.evict import H2OPolicy, Periodic

        periodic = build_stack(stack_from_dict({"eviction": {"name": "h2o", "every": 64}}))
        assert isinstance(periodic.eviction, Periodic)
        assert periodic.eviction.interval == 64
        assert isinstance(periodic.eviction.policy, H2OPolicy)
        bare = build_stack(stack_from_dict({"eviction": {"name": "h2o"}}))
        assert isinstance(bare.eviction, H2OPolicy)
        with pytest.raises(ConfigError, match="'every' must be >= 1: 0"):
            stack_from_dict({"eviction": {"name": "h2o", "every": 0}})

    def test_interval_of_earlier_stack_files_says_what_to_write(self) -> None:
        """The key ``eviction.interval`` of earlier stack files is refused with the key to
        write instead."""
        with pytest.raises(ConfigError, match=r"eviction\.interval .* Write 'every: 512'"):
            stack_from_dict({"eviction": {"name": "token-pd", "interval": 512}})


class TestAttentionSection:
    def test_default_is_the_fitted_model(self) -> None:
        """No attention section: the engine's default model."""
        assert stack_from_dict({}).attention.build() is None

    def test_file_then_params(self, tmp_path: pathlib.Path) -> None:
        """A fit file is read and inline params override it."""
        from kvpolicy.sim import AttentionModel

        f = tmp_path / "fit.json"
        f.write_text(AttentionModel(sink_weight=10.0, recency_weight=2.0).to_json())
        cfg = stack_from_dict({"attention": {"file": str(f), "params": {"recency_weight": 3.0}}})
        model = cfg.attention.build()
        assert isinstance(model, AttentionModel)
        assert (model.sink_weight, model.recency_weight) == (10.0, 3.0)

    def test_unknown_parameter_is_named(self) -> None:
        """A parameter the model does not have is a ConfigError naming it."""
        cfg = stack_from_dict({"attention": {"params": {"recency_tau": 11.2}}})
        with pytest.raises(ConfigError, match="recency_tau"):
            cfg.attention.build()

    def test_missing_file(self, tmp_path: pathlib.Path) -> None:
        """A missing fit file names the file."""
        cfg = stack_from_dict({"attention": {"file": str(tmp_path / "nope.json")}})
        with pytest.raises(ConfigError, match=r"nope\.json"):
            cfg.attention.build()

    @pytest.mark.heavy
    def test_the_stack_model_reaches_the_engine(self) -> None:
        """Eviction sees the stack's attention model: no sinks and no recency change what
        the policy keeps."""
        from kvpolicy.kvmodel import Request, get_gpu, get_model
        from kvpolicy.sim import simulate

        reqs = [Request(f"r{i}", 3000, 400, 0.01 * i) for i in range(40)]
        base = {
            "eviction": {
                "name": "h2o",
                "params": {"recent_window": 64},
                "budget_fraction": 0.1,
                "every": 16,
            },
            "engine": {"kv_capacity_tokens": 60000},
        }
        flat = {**base, "attention": {"params": {"sink_weight": 0.0, "recency_weight": 0.0}}}
        m, g = get_model("Llama-3-8B"), get_gpu("H100-SXM")
        a = simulate(reqs, m, g, stack_from_dict(base)).summary.attention_recall
        b = simulate(reqs, m, g, stack_from_dict(flat)).summary.attention_recall
        assert a != b
