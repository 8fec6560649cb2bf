"""The compiled modules (the engine core, the block pool, the routing decision): compiled
all together or not at all, and compiled where the session asks for it (``nox -s
compiled`` sets ``KVPOLICY_EXPECT_COMPILED=1``).

The modules are the ones each distribution's pyproject hands to its mypyc build hook
(``tools/mypyc_hook.py``); the same tests then check the compiled core's results.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import pathlib
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
HOOK = "../../tools/mypyc_hook.py"


def _hook(dist: pathlib.Path) -> dict[str, object] | None:
    meta = tomllib.loads((dist / "pyproject.toml").read_text())
    wheel = meta.get("tool", {}).get("hatch", {}).get("build", {}).get("targets", {})
    hook: dict[str, object] | None = wheel.get("wheel", {}).get("hooks", {}).get("custom")
    return hook


DISTS = sorted(
    d for d in [*ROOT.glob("packages/*"), *ROOT.glob("integrations/*")] if d.is_dir() and _hook(d)
)
"""The distributions that compile some modules: kvmodel, admit, tenancy and the simulator,
all installed beside the simulator's tests."""


def _hooked(dist: pathlib.Path) -> list[str]:
    """The module names a distribution compiles (from its pyproject)."""
    hook = _hook(dist)
    assert hook is not None
    assert hook["path"] == HOOK
    assert hook["enable-by-default"] is False  # a plain build never loads the hook
    modules = hook["modules"]
    assert isinstance(modules, list)
    return [m.removesuffix(".py").replace("/", ".") for m in modules]


def test_the_compiled_distributions() -> None:
    """The distributions with a compiled core are the ones the docs name."""
    assert sorted(d.name for d in DISTS) == ["admit", "kvmodel", "sim", "tenancy"]


def _compiled(name: str) -> bool:
    path = importlib.import_module(name).__file__ or ""
    return path.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


@pytest.mark.parametrize("dist", DISTS, ids=lambda d: d.name)
def test_a_distribution_is_compiled_whole_or_not_at_all(dist: pathlib.Path) -> None:
    """A half-compiled install (stale extension modules beside new sources) is a packaging
    fault: every listed module is compiled, or none is."""
    modules = _hooked(dist)
    assert modules, dist
    compiled = {name: _compiled(name) for name in modules}
    assert len(set(compiled.values())) == 1, compiled
    if os.environ.get("KVPOLICY_EXPECT_COMPILED") == "1":
        assert all(compiled.values()), f"expected the compiled core: {compiled}"


def test_the_listed_modules_exist() -> None:
    """Every module named to the hook is a source file of its distribution."""
    for dist in DISTS:
        for name in _hooked(dist):
            source = dist / "src" / (name.replace(".", "/") + ".py")
            assert source.is_file(), source
