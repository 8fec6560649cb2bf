"""kvpolicy-tenancy manifests: loading a pool of many entitlements from YAML and JSON.

* ``yaml_load_s`` / ``json_load_s``: ``load_manifest`` of one file of ``entitlements``
  elastic entitlements (100,000; 10,000 with ``--quick``), best of ``rounds`` (3), the
  same pool written as YAML (block style, as people write manifests) and as JSON. Goal:
  YAML under 2 s at 100,000.
* ``yaml_parse_s``: ``load_yaml`` alone (the objects, before validation; the block-style
  path, line by line); ``yaml_events_parse_s``: the same document through ``load_yaml``'s
  second path, built from libyaml's events (what a document outside plain block style
  costs, and what every YAML document cost before the block path);
  ``pyyaml_safe_load_s``: PyYAML's ``yaml.load`` with libyaml's ``CSafeLoader`` on the same
  text (what a safe loader costs without kvpolicy's fast path, and without its rules);
  ``libyaml_events_s``: only iterating libyaml's events through PyYAML, the floor of any
  loader built on PyYAML's events; ``json_parse_s``: ``json.loads``, the same for JSON.
* ``yaml_over_json``: ``yaml_load_s / json_load_s`` in this run.
"""

from __future__ import annotations

import json
import pathlib
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import yaml
from _harness import parse_args, write_result

from kvpolicy.tenancy import load_manifest, load_yaml
from kvpolicy.tenancy._yaml import _from_events, _typer


def _manifest(n: int) -> dict[str, Any]:
    capacity = {"tokens_per_s": 1e9, "kv_bytes": 2**50, "concurrency": 10**7}
    ents = [
        {
            "tenant": f"tenant-{i:06d}",
            "service_class": "elastic",
            "slo_target_s": 2.0,
            "max_output_tokens": 256,
            "baseline": {"tokens_per_s": 10, "kv_bytes": 1_000_000, "concurrency": 2},
            "burst": {"tokens_per_s": 20, "kv_bytes": 2_000_000, "concurrency": 4},
        }
        for i in range(n)
    ]
    return {"pool": {"name": "big", "capacity": capacity}, "entitlements": ents}


def _best(rounds: int, run: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    args = parse_args(__doc__ or "")
    n = 10_000 if args.quick else 100_000
    rounds = 3
    doc = _manifest(n)
    with tempfile.TemporaryDirectory() as tmp:
        ypath = pathlib.Path(tmp) / "pool.yaml"
        jpath = pathlib.Path(tmp) / "pool.json"
        ypath.write_text(yaml.dump(doc, Dumper=yaml.CSafeDumper, sort_keys=False))
        jpath.write_text(json.dumps(doc))
        ytext, jtext = ypath.read_text(), jpath.read_text()
        assert load_yaml(ytext) == doc  # the fast path builds what was written
        assert _from_events(yaml, ytext, "pool.yaml", _typer(yaml)) == doc
        assert len(load_manifest(ypath).entitlements) == n

        def events() -> None:
            for _ in yaml.parse(ytext, Loader=yaml.CSafeLoader):
                pass

        figures = {
            "entitlements": n,
            "yaml_bytes": len(ytext),
            "json_bytes": len(jtext),
            "yaml_load_s": _best(rounds, lambda: load_manifest(ypath)),
            "json_load_s": _best(rounds, lambda: load_manifest(jpath)),
            "yaml_parse_s": _best(rounds, lambda: load_yaml(ytext)),
            "yaml_events_parse_s": _best(
                1, lambda: _from_events(yaml, ytext, "pool.yaml", _typer(yaml))
            ),
            "json_parse_s": _best(rounds, lambda: json.loads(jtext)),
            "libyaml_events_s": _best(rounds, events),
            "pyyaml_safe_load_s": _best(1, lambda: yaml.load(ytext, Loader=yaml.CSafeLoader)),
        }
    figures["yaml_over_json"] = figures["yaml_load_s"] / figures["json_load_s"]
    write_result("manifest", figures, args.out)
    for key, value in figures.items():
        print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")


if __name__ == "__main__":
    main()
