"""The CRD files and the manifest schema are generated from the manifest's definitions, and
the example manifests validate against them."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from kvpolicy.tenancy import crd_documents, custom_resources, load_manifest, manifest_schema

yaml = pytest.importorskip("yaml")
jsonschema = pytest.importorskip("jsonschema")

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _spec_schema(kind: str) -> dict[str, Any]:
    doc = next(d for d in crd_documents() if d["spec"]["names"]["kind"] == kind)
    schema: dict[str, Any] = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_crd_files_are_generated() -> None:
    """``crds/*.yaml`` equal :func:`crd_documents` (regenerate with ``kvpolicy tenancy crds``)."""
    on_disk = {p.name: yaml.safe_load(p.read_text()) for p in (ROOT / "crds").glob("*.yaml")}
    generated = {f"{d['spec']['names']['singular']}.yaml": d for d in crd_documents()}
    assert on_disk == generated


def test_example_manifest_validates_and_loads() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "pool.yaml").read_text())
    jsonschema.Draft202012Validator(manifest_schema()).validate(doc)
    assert load_manifest(ROOT / "examples" / "pool.yaml").name == "qwen3-8b"


def test_example_resources_validate_against_the_crds() -> None:
    docs = list(yaml.safe_load_all((ROOT / "examples" / "pool-resources.yaml").read_text()))
    assert docs == custom_resources(load_manifest(ROOT / "examples" / "pool.yaml"))
    for doc in docs:
        jsonschema.Draft202012Validator(_spec_schema(doc["kind"])).validate(doc)


def test_schema_rejects_what_the_loader_rejects() -> None:
    """An unknown key, a missing baseline, an unknown class: both refuse."""
    validator = jsonschema.Draft202012Validator(manifest_schema())
    base = yaml.safe_load((ROOT / "examples" / "pool.yaml").read_text())
    for path, value in (
        (("entitlements", 0, "colour"), "red"),
        (("entitlements", 0, "service_class"), "gold"),
        (("pool", "capacity", "concurrency"), 0),
    ):
        doc = yaml.safe_load(yaml.safe_dump(base))
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        assert not validator.is_valid(doc)
        with pytest.raises(ValueError, match=str(path[-1])):
            load_manifest(doc)
    doc = yaml.safe_load(yaml.safe_dump(base))
    del doc["entitlements"][1]["baseline"]
    assert not validator.is_valid(doc)
    spec = dict(custom_resources(load_manifest(base))[1])
    spec["spec"] = {**spec["spec"], "burst": {"tokens_per_s": 1}}
    assert not jsonschema.Draft202012Validator(_spec_schema("TokenEntitlement")).is_valid(spec)


def test_the_fleet_example_validates_against_the_manifest_schema() -> None:
    """The fleet manifest's backends, routing and autoscaling sections are in the schema;
    a bad one is refused by it as by the loader."""
    from kvpolicy.tenancy import ManifestError, load_backends

    validator = jsonschema.Draft202012Validator(manifest_schema())
    doc = yaml.safe_load((ROOT / "examples" / "pool-fleet.yaml").read_text())
    validator.validate(doc)
    assert len(load_backends((), doc)) == 3
    doc["backends"][0]["url"] = "ftp://x"
    assert not validator.is_valid(doc)
    with pytest.raises(ManifestError, match=r"backends\[0\]\.url"):
        load_backends((), doc)
