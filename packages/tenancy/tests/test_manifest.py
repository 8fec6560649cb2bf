"""Token-pool manifests."""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import pytest

from kvpolicy.tenancy import (
    ManifestError,
    Resources,
    dump_manifest,
    load_gate,
    load_manifest,
    load_yaml,
)

MANIFEST: dict[str, Any] = {
    "pool": {
        "name": "qwen3-8b",
        "capacity": {"tokens_per_s": 240, "kv_cache_gib": 16, "concurrency": 16},
    },
    "entitlements": [
        {
            "tenant": "sample",
            "service_class": "guaranteed",
            "slo_target_s": 0.2,
            "baseline": {"tokens_per_s": 100, "kv_cache_gib": 2, "concurrency": 4},
        },
        {
            "tenant": "batch",
            "service_class": "spot",
            "max_output_tokens": 512,
            "baseline": {"tokens_per_s": 50, "kv_bytes": 1000, "concurrency": 2},
            "burst": {"tokens_per_s": 100, "kv_bytes": 2000, "concurrency": 4},
        },
    ],
}


class TestLoadManifest:
    def test_mapping(self) -> None:
        """The §4.2 example loads, with KV given in GiB."""
        pool = load_manifest(MANIFEST)
        assert pool.capacity == Resources(240, 16 * 2**30, 16)
        sample = pool.entitlement("sample")
        assert sample is not None
        assert (sample.service_class.name, sample.slo_target_s, sample.baseline.kv_bytes) == (
            "guaranteed",
            0.2,
            2 * 2**30,
        )
        batch = pool.entitlement("batch")
        assert batch is not None
        assert (batch.max_output_tokens, batch.limits.concurrency) == (512, 4)

    def test_round_trip(self) -> None:
        """dump_manifest then load_manifest gives the same pool."""
        pool = load_manifest(MANIFEST)
        assert load_manifest(dump_manifest(pool)) == pool

    def test_json_and_yaml_files(self, tmp_path: pathlib.Path) -> None:
        """JSON and YAML files load to the same pool."""
        yaml = pytest.importorskip("yaml", reason="PyYAML (the 'yaml' extra) is not installed")
        (tmp_path / "m.json").write_text(json.dumps(MANIFEST))
        (tmp_path / "m.yaml").write_text(yaml.safe_dump(MANIFEST))
        assert load_manifest(tmp_path / "m.json") == load_manifest(str(tmp_path / "m.yaml"))

    def test_unknown_key_is_named(self) -> None:
        """An unknown key names itself and where it is."""
        bad = json.loads(json.dumps(MANIFEST))
        bad["entitlements"][1]["burst"]["gpus"] = 2
        with pytest.raises(
            ManifestError, match=re.escape("entitlements[1].burst: unknown key 'gpus'")
        ):
            load_manifest(bad)
        with pytest.raises(ManifestError, match="manifest: unknown key 'pools'"):
            load_manifest({"pools": {}})

    def test_missing_key_is_named(self) -> None:
        """A missing key names itself."""
        bad = json.loads(json.dumps(MANIFEST))
        del bad["entitlements"][0]["service_class"]
        with pytest.raises(
            ManifestError, match=re.escape("entitlements[0]: missing key 'service_class'")
        ):
            load_manifest(bad)

    def test_bad_value_is_named(self) -> None:
        """A bad value names the entitlement and the field; reserved overbooking is refused."""
        bad = json.loads(json.dumps(MANIFEST))
        bad["entitlements"][0]["service_class"] = "gold"
        with pytest.raises(
            ManifestError, match=re.escape("entitlements[0]: 'service_class' must be")
        ):
            load_manifest(bad)
        bad = json.loads(json.dumps(MANIFEST))
        bad["entitlements"].append(
            {**json.loads(json.dumps(bad["entitlements"][0])), "tenant": "t"}
        )
        bad["entitlements"][2]["baseline"]["concurrency"] = 13
        with pytest.raises(ManifestError, match="pool: reserved baselines need concurrency=17"):
            load_manifest(bad)
        assert issubclass(ManifestError, ValueError)

    @pytest.mark.parametrize(
        ("path", "value", "message"),
        [
            (
                ("entitlements", 0, "baseline", "concurrency"),
                100,
                "'entitlements[0].baseline.concurrency' (100) exceeds the pool's capacity (16)",
            ),
            (
                ("entitlements", 1, "burst", "concurrency"),
                100,
                "'entitlements[1].burst.concurrency' (100) exceeds the pool's capacity (16)",
            ),
            (
                ("pool", "capacity", "concurrency"),
                10**30,
                "pool.capacity: 'concurrency' must be > 0 and <= 10000000: <huge int>",
            ),
            (
                ("pool", "capacity", "tokens_per_s"),
                float("inf"),
                "pool.capacity: 'tokens_per_s' must be finite, > 0 and <= 1e+12: inf",
            ),
            (("pool", "capacity", "kv_cache_gib"), float("nan"), "pool.capacity.kv_cache_gib"),
            (
                ("entitlements", 0, "tenant"),
                "a\x00b",
                "entitlements[0]: 'tenant' must not contain control characters: 'a\\x00b'",
            ),
            (
                ("entitlements", 0, "tenant"),
                "x" * 10**6,
                "entitlements[0]: 'tenant' must have 1 to 253 characters: 'xxxx",
            ),
            (("pool", "name"), "p\nq", "pool: 'name' must not contain control characters"),
        ],
    )
    def test_absurd_values_name_their_field(
        self, path: tuple[Any, ...], value: Any, message: str
    ) -> None:
        """A baseline or burst beyond the pool, a non-finite or absurd count and control
        characters in a name are errors naming the field, never rendering a huge value."""
        bad = json.loads(json.dumps(MANIFEST))
        node = bad
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        with pytest.raises(ManifestError) as info:
            load_manifest(bad)
        assert message in str(info.value)
        assert len(str(info.value)) < 400

    def test_yaml_aliases_and_duplicate_keys_are_refused(self, tmp_path: pathlib.Path) -> None:
        """A billion-laughs alias bomb is refused before it is expanded, a duplicate key
        is named with its line, and neither error renders the document."""
        pytest.importorskip("yaml")
        lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
        lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
        bomb = tmp_path / "bomb.yaml"
        bomb.write_text("\n".join(lines) + "\npool: *a8\n")
        with pytest.raises(ManifestError, match="YAML aliases are not allowed") as info:
            load_manifest(bomb)
        assert len(str(info.value)) < 400
        twice = tmp_path / "twice.yaml"
        twice.write_text("pool:\n  name: p\n  name: q\n")
        with pytest.raises(ManifestError, match=r"duplicate key 'name'.*line 3"):
            load_manifest(twice)

    def test_bad_file(self, tmp_path: pathlib.Path) -> None:
        """A missing file, bad JSON or an unknown suffix is a ManifestError."""
        with pytest.raises(ManifestError, match="cannot read manifest"):
            load_manifest(tmp_path / "absent.json")
        (tmp_path / "m.json").write_text("{")
        with pytest.raises(ManifestError, match="is not JSON"):
            load_manifest(tmp_path / "m.json")
        (tmp_path / "m.toml").write_text("")
        with pytest.raises(ManifestError, match=re.escape("must end in .json, .yaml or .yml")):
            load_manifest(tmp_path / "m.toml")


_YAML_DOCS = [
    "",
    "a: 1",
    "a: 012\nb: 0x1f\nc: 1_000\nd: +5\ne: -0\nf: 1.5e3\ng: .inf\nh: ~\ni: null\nj: yes\n"
    "k: 'yes'\nl: \"1\"\nm: 2026-01-01\nn: 2001-12-14t21:59:43.10-05:00\no:\n"
    "p: [1, {x: y}, [], {}]\nq: |\n  block\n  text\nr: >\n  folded\ns: 0o17\nt: 1:20\n"
    "u: True\nv: Off\nw: 1.0\nx: 1.0\n",
    "- 1\n- - 2\n  - 3\n- {a: [b, c]}\n",
    "key with spaces: value\n? complex\n: v\n1: int key\n",
    "!!str 1",
    "a: !!int '5'",
    "a: &anchored 1\nb: 2",
    "# comment only\n",
]


class TestLoadYaml:
    @pytest.mark.parametrize("text", _YAML_DOCS)
    def test_same_objects_as_the_safe_loader(self, text: str) -> None:
        """Scalars typed as PyYAML's safe loader types them (ints, octal, floats, booleans,
        nulls, dates, strings quoted or not), in the same order, tags included."""
        yaml = pytest.importorskip("yaml")
        want = yaml.safe_load(text)
        got = load_yaml(text)
        assert repr(got) == repr(want)

    def test_several_documents_and_bad_syntax(self) -> None:
        """Two documents or a broken flow sequence are ManifestErrors naming the source."""
        pytest.importorskip("yaml")
        with pytest.raises(
            ManifestError, match=re.escape("'m.yaml' is not YAML: 'expected a single")
        ):
            load_yaml("--- 1\n--- 2", "m.yaml")
        with pytest.raises(ManifestError, match=re.escape("'m.yaml' is not YAML")):
            load_yaml("[1, 2", "m.yaml")

    def test_refusals_name_the_line(self) -> None:
        """An alias, a duplicate key and a collection as a key are refused with their line."""
        pytest.importorskip("yaml")
        with pytest.raises(ManifestError, match=r"aliases are not allowed.*line 2"):
            load_yaml("a: &x [1]\nb: *x\n")
        with pytest.raises(ManifestError, match=r"duplicate key 1.*line 3"):
            load_yaml("- x: 1\n- 1: a\n  1: b\n")
        with pytest.raises(ManifestError, match=r"a key must be a scalar.*line 1"):
            load_yaml("? [a]\n: 1\n")


class TestLoadGate:
    def test_default_and_gate_sections(self) -> None:
        """The default entitlement serves unknown tenants; gate settings reach GateConfig."""
        doc = json.loads(json.dumps(MANIFEST))
        doc["default"] = {
            "service_class": "spot",
            "baseline": {"tokens_per_s": 50, "kv_bytes": 10**6, "concurrency": 1},
        }
        doc["gate"] = {"update_interval_s": 2, "alpha_debt": 3.0, "max_retry_s": 30}
        gate = load_gate(doc, 100)
        assert (gate.config.update_interval_s, gate.config.max_retry_s) == (2.0, 30.0)
        assert gate.config.coefficients.alpha_debt == 3.0
        stranger = gate.entitlement("stranger")
        assert stranger is not None
        assert (stranger.tenant, stranger.service_class.name) == ("stranger", "spot")
        assert load_gate(MANIFEST, 100).entitlement("stranger") is None
        assert not load_gate(MANIFEST, 100).config.overcommit  # a hard pool by default
        doc["gate"] = {"overcommit": True, "contention_level": 0.9}
        config = load_gate(doc, 100).config
        assert (config.overcommit, config.contention_level) == (True, 0.9)

    def test_bad_sections(self) -> None:
        """Unknown gate keys, a tenant in the default, or a reserving default are refused."""
        doc = json.loads(json.dumps(MANIFEST))
        doc["gate"] = {"gamma": 0.5}
        with pytest.raises(ManifestError, match="gate: unknown key 'gamma'"):
            load_gate(doc, 100)
        doc = json.loads(json.dumps(MANIFEST))
        doc["gate"] = {"gamma_d": 1.5}
        with pytest.raises(ManifestError, match=re.escape("gate: 'gamma_d' must be < 1.0: 1.5")):
            load_manifest(doc)
        doc["gate"] = {"contention_level": 1.2}
        with pytest.raises(ManifestError, match=re.escape("gate: 'contention_level' must be in")):
            load_manifest(doc)
        doc = json.loads(json.dumps(MANIFEST))
        doc["default"] = {"tenant": "x"}
        with pytest.raises(ManifestError, match="default: unknown key 'tenant'"):
            load_gate(doc, 100)
        doc["default"] = {
            "service_class": "guaranteed",
            "baseline": {"tokens_per_s": 10, "kv_bytes": 1, "concurrency": 1},
        }
        with pytest.raises(ManifestError, match="default: 'default_entitlement' must not reserve"):
            load_gate(doc, 100)

    def test_unfundable_and_nan_are_rejected_at_load(self) -> None:
        """A ``max_output_tokens`` no token bucket can hold, or a NaN ``kv_cache_gib``, is a
        ManifestError naming the field."""
        doc = json.loads(json.dumps(MANIFEST))
        doc["entitlements"][0]["max_output_tokens"] = 10**7
        with pytest.raises(ManifestError, match=r"entitlements\[0\]\.max_output_tokens"):
            load_manifest(doc)
        doc = json.loads(json.dumps(MANIFEST))
        doc["entitlements"][0]["baseline"] = {
            "tokens_per_s": 10,
            "kv_cache_gib": float("nan"),
            "concurrency": 1,
        }
        with pytest.raises(ManifestError, match=r"baseline\.kv_cache_gib must be finite"):
            load_manifest(doc)
