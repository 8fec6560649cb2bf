"""The engine core's modules: compiled all together or not at all, and compiled where the
session asks for it (``nox -s compiled`` sets ``KVPOLICY_EXPECT_COMPILED=1``).

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
DISTS = [ROOT / "packages" / "kvmodel", ROOT / "integrations" / "sim"]


def _hooked(dist: pathlib.Path) -> list[str]:
    """The module names a distribution compiles (from its pyproject)."""
    meta = tomllib.loads((dist / "pyproject.toml").read_text())
    hook = meta["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["custom"]
    assert hook["path"] == "../../tools/mypyc_hook.py"
    return [m.removesuffix(".py").replace("/", ".") for m in hook["modules"]]


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
