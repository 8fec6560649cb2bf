"""The YAML loader's block-style path: the safe loader's objects, or a hand-over."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.tenancy import ManifestError, load_manifest, load_yaml
from kvpolicy.tenancy._yaml import _block, _typer, _UnusualError

yaml = pytest.importorskip("yaml", reason="PyYAML (the 'yaml' extra) is not installed")


def block(text: str) -> Any:
    return _block(text, _typer(yaml))


def same_or_handed_over(text: str) -> bool:
    """The block path's object equals ``yaml.safe_load``'s (types included), or the block
    path hands the document over; ``True`` when it built it itself."""
    try:
        got = block(text)
    except _UnusualError:
        return False
    assert repr(got) == repr(yaml.safe_load(text)), text
    return True


# Lines of what manifests hold and of what the block path must hand over.
_KEYS = ["a", "b", "key_1", "x-y", "yes", "null", "on", "No", "a b", "'q'", "1", "?", "<<"]
_VALUES = [
    "",
    "1",
    "0",
    "-1",
    "012",
    "0x1f",
    "1_000",
    "+5",
    "1.5",
    "-.5",
    ".5",
    ".inf",
    "-.inf",
    ".nan",
    "1e3",
    "~",
    "null",
    "Null",
    "yes",
    "On",
    "true",
    "2026-01-01",
    "a",
    "a b",
    "a  b",
    "it's",
    "'q'",
    "'it''s'",
    "''",
    '"d"',
    '""',
    '"a\\tb"',
    "[]",
    "{}",
    "[1]",
    "{a: 1}",
    "-",
    "- x",
    "...",
    "---",
    "a #c",
    "a#c",
    "#c",
    "x: y",
    "x:y",
    "|",
    ">",
    "&x 1",
    "*x",
    "!!str 1",
    "!x",
    "%",
    "@a",
    "`a",
    "a,b",
    "(a)",
    "a=b",
    "=",
    "\t1",
    "1\r",
    "é",
    "a ",
    "'a",
    '"a',
]
_LINE = st.builds(
    lambda indent, dash, key, value, comment: (
        " " * indent
        + ("- " if dash else "")
        + (f"{key}:" + (f" {value}" if value else "") if key is not None else value)
        + comment
    ),
    st.integers(0, 6),
    st.booleans(),
    st.none() | st.sampled_from(_KEYS),
    st.sampled_from(_VALUES),
    st.sampled_from(["", " # note", "  #", "#x"]),
)


class TestBlock:
    @settings(max_examples=600, deadline=None)
    @given(st.lists(_LINE | st.sampled_from(["", "  ", "# c", "---", "..."]), max_size=12))
    def test_any_lines(self, lines: list[str]) -> None:
        """Any text of plausible and odd lines: the safe loader's objects, or handed over."""
        same_or_handed_over("\n".join(lines))

    @settings(max_examples=200, deadline=None)
    @given(
        st.recursive(
            st.none()
            | st.booleans()
            | st.integers(-(10**20), 10**20)
            | st.floats(allow_nan=False)
            | st.text(st.characters(codec="ascii"), max_size=12),
            lambda inner: (
                st.lists(inner, max_size=4)
                | st.dictionaries(st.text("abcxyz_-", min_size=1, max_size=6), inner, max_size=4)
            ),
            max_leaves=20,
        ),
        st.sampled_from([0, 2, 4]),
    )
    def test_dumped_documents(self, doc: Any, indent: int) -> None:
        """What ``yaml.dump`` writes in block style reads back as ``yaml.safe_load`` reads it."""
        text = yaml.safe_dump(doc, default_flow_style=False, sort_keys=False, indent=indent or 2)
        same_or_handed_over(text)

    def test_manifest_shapes_are_built_here(self) -> None:
        """Block style as people and yaml.dump write it is read by the block path itself."""
        texts = [
            "pool:\n  name: p\n  capacity: {}\nentitlements:\n- tenant: a\n  burst:\n"
            "    concurrency: 2\n  slo_target_s: 0.5 # comment\n- tenant: 'b c'\n",
            "# pool\na:\n  - 1\n  - x: 'it''s'\n    y:\n    z: \"q\"\n  -   k: ~\n      l: []\n",
            "- 1\n- a\n-  yes\n",
            "key: value\n\n\nother:\n  nested:\n    deeper: 1.5e+3\n",
            "",
            "just a scalar",
        ]
        for text in texts:
            assert same_or_handed_over(text), text

    @pytest.mark.parametrize(
        "text",
        [
            "a: 1\na: 2\n",  # a duplicate: the events path names it
            "a: &x 1\nb: *x\n",  # an anchor and an alias
            "a: b\n  c\n",  # a scalar continued on the next line
            "a:\n  b: 1\n c: 2\n",  # indentation that closes nothing
            "a: [1, 2]\n",  # a flow collection
            "a: |\n  text\n",  # a block scalar
            "a:\tb\n",  # a tab
            "a: b\r\n",  # a CR
            "a: \x00\n",  # a control character
            "name: caf\u00e9\n",  # outside ASCII
            "--- 1\n--- 2\n",  # several documents
            "a: 1\n...\n",  # the document's end
            "x\ny\n",  # a scalar of two lines
            "-\n  a: 1\n",  # an item on the next line
        ],
    )
    def test_unusual_documents_are_handed_over(self, text: str) -> None:
        """What the block path does not build itself it hands over, never guessing."""
        with pytest.raises(_UnusualError):
            block(text)

    def test_refusals_survive_the_hand_over(self) -> None:
        """A duplicate key and an alias in an otherwise plain manifest are still refused,
        with their line."""
        with pytest.raises(ManifestError, match=r"duplicate key 'tenant'.*line 3"):
            load_yaml("- tenant: a\n  service_class: spot\n  tenant: b\n")
        with pytest.raises(ManifestError, match=r"aliases are not allowed.*line 3"):
            load_yaml("a: &x 1\nb: 2\nc: *x\n")

    def test_deep_nesting_is_handed_over(self) -> None:
        """Nesting beyond the block path's depth goes to libyaml, which bounds it."""
        text = "".join(" " * (2 * i) + f"k{i}:\n" for i in range(600)) + " " * 1200 + "v: 1\n"
        with pytest.raises(_UnusualError):
            block(text)


class TestLargeManifest:
    def test_entitlements_built_once_are_shared_safely(self) -> None:
        """Entitlements equal but for their tenant share their limits; each is validated:
        a bad name, a float count or a boolean count among them is named."""
        ent = {
            "tenant": "t0",
            "service_class": "elastic",
            "baseline": {"tokens_per_s": 10, "kv_bytes": 1000, "concurrency": 2},
        }
        doc: dict[str, Any] = {
            "pool": {
                "name": "p",
                "capacity": {"tokens_per_s": 1e6, "kv_bytes": 10**9, "concurrency": 100},
            },
            "entitlements": [{**ent, "tenant": f"t{i}"} for i in range(50)],
        }
        pool = load_manifest(doc)
        assert [e.tenant for e in pool.entitlements] == [f"t{i}" for i in range(50)]
        assert pool.entitlements[7].baseline is pool.entitlements[8].baseline
        assert (
            pool.entitlements[7]
            == load_manifest({**doc, "entitlements": [doc["entitlements"][7]]}).entitlements[0]
        )
        for i, change, message in [
            (9, {"tenant": "t\x00"}, "entitlements[9]: 'tenant' must not contain control"),
            (9, {"tenant": 9}, "entitlements[9]: 'tenant' must be str"),
            (9, {"tenant": "t1"}, "'entitlements' has tenant 't1' twice"),
            (
                5,
                {"baseline": {**ent["baseline"], "kv_bytes": 1000.0}},
                "entitlements[5].baseline: 'kv_bytes' must be int",
            ),
            (
                5,
                {"baseline": {**ent["baseline"], "concurrency": True}},
                "entitlements[5].baseline: 'concurrency' must be int",
            ),
            (5, {"max_output_tokens": True}, "entitlements[5]: 'max_output_tokens' must be int"),
        ]:
            bad = json.loads(json.dumps(doc))
            bad["entitlements"][i].update(change)
            with pytest.raises(
                ManifestError, match=message.replace("[", r"\[").replace("]", r"\]")
            ):
                load_manifest(bad)

    def test_unhashable_values_are_named(self) -> None:
        """A list where a class or a count belongs is named, not a crash."""
        ent = {
            "tenant": "a",
            "service_class": ["spot"],
            "baseline": {"tokens_per_s": 1, "kv_bytes": 9, "concurrency": 1},
        }
        doc = {
            "pool": {
                "name": "p",
                "capacity": {"tokens_per_s": 9, "kv_bytes": 99, "concurrency": 9},
            },
            "entitlements": [ent],
        }
        with pytest.raises(ManifestError, match=r"entitlements\[0\]: 'service_class' must be str"):
            load_manifest(doc)
        doc["entitlements"] = [
            {**ent, "service_class": "spot", "baseline": {**ent["baseline"], "concurrency": [1]}}
        ]
        with pytest.raises(
            ManifestError, match=r"entitlements\[0\].baseline: 'concurrency' must be int"
        ):
            load_manifest(doc)
