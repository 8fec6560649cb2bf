"""Hatchling build hook: a distribution's hot modules compiled with mypyc, on request.

A distribution names the modules in its ``pyproject.toml``::

    [tool.hatch.build.targets.wheel.hooks.custom]
    path = "../../tools/mypyc_hook.py"
    enable-by-default = false
    modules = ["kvpolicy/sim/_step.py", ...]   # relative to src/

and a build from the checkout with the hook enabled (``HATCH_BUILD_HOOK_ENABLE_CUSTOM=1``
before the README's ``pip install ./packages/kvmodel ...``; ``KVPOLICY_COMPILE=1 nox -s ...``
sets it for nox's builds) compiles them (mypyc, then the C compiler) into extension modules
that the wheel carries beside the sources; Python imports an extension module before the
``.py`` of the same name, so the compiled code runs, with the same results (CI runs the
tests of every such distribution against it: ``nox -s compiled``). An editable install is
not compiled (the hook says so and leaves the sources to run). Disabled, as by default,
hatchling never loads this file (an sdist, which does not carry it, builds) and the wheel
is pure Python: a machine with only Python and pip builds and runs kvpolicy.

mypy resolves the monorepo's other distributions from their sources (``packages/*/src``,
``integrations/*/src`` beside this file) and treats what it cannot find (numpy where the
build environment lacks it) as untyped.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import tempfile
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

BUILD_REQUIRES = ["mypy>=2.3,<3", "setuptools>=61", "attrs>=23.1"]
"""What compiling needs in the build environment (an isolated build installs it)."""
_MONOREPO = pathlib.Path(__file__).resolve().parent.parent


class MypycHook(BuildHookInterface):  # type: ignore[misc]
    """Compile the configured ``modules`` into the wheel (the hook runs only when enabled)."""

    PLUGIN_NAME = "custom"

    def dependencies(self) -> list[str]:
        """The build requirements of a compiling build."""
        return list(BUILD_REQUIRES)

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        """Compile into a temporary folder and add the extension modules to the wheel."""
        if self.target_name != "wheel":
            return
        if version == "editable":
            print("mypyc hook: an editable install runs its sources, uncompiled", file=sys.stderr)
            return
        modules = self.config.get("modules")
        if not isinstance(modules, list) or not modules:
            raise ValueError(f"'modules' of the mypyc hook must be a non-empty list: {modules!r}")
        src = pathlib.Path(self.root) / "src"
        missing = [m for m in modules if not (src / m).is_file()]
        if missing:
            raise ValueError(f"'modules' of the mypyc hook names no file under {src}: {missing}")
        try:
            from mypyc.build import mypycify
            from setuptools import Distribution  # type: ignore[import-untyped]
        except ImportError as exc:
            raise RuntimeError(
                "the mypyc hook compiles: the build environment needs "
                f"{' and '.join(BUILD_REQUIRES)} ({exc})"
            ) from exc
        self._tmp = pathlib.Path(tempfile.mkdtemp(prefix="kvpolicy-mypyc-"))
        try:
            self._compile(src, modules, build_data, mypycify, Distribution)
        except BaseException:
            shutil.rmtree(self._tmp, ignore_errors=True)  # finalize is not called then
            raise

    def _compile(
        self,
        src: pathlib.Path,
        modules: list[str],
        build_data: dict[str, Any],
        mypycify: Any,
        Distribution: Any,  # noqa: N803 (setuptools' class)
    ) -> None:
        """mypyc and the C compiler over ``modules`` (paths under ``src``), the extension
        modules added to ``build_data``'s files."""
        out = self._tmp / "lib"
        others = [
            str(p)
            for p in sorted(_MONOREPO.glob("*/*/src"))
            if p.is_dir() and p.resolve() != src.resolve()
        ]
        group = self.metadata.name.replace("-", "_") + "_core"
        cwd, mypypath = os.getcwd(), os.environ.get("MYPYPATH")
        os.environ["MYPYPATH"] = os.pathsep.join(others)
        try:
            os.chdir(src)  # module names are the files' paths from src/
            extensions = mypycify(
                [
                    "--ignore-missing-imports",
                    "--follow-imports=silent",
                    # Not in src/: a cache there would change the sources' hash (nox).
                    f"--cache-dir={self._tmp / 'mypy'}",
                    *modules,
                ],
                opt_level="3",
                group_name=group,
                target_dir=str(self._tmp / "c"),
            )
            dist = Distribution({"name": group, "ext_modules": extensions})
            build = dist.get_command_obj("build_ext")
            build.build_lib = str(out)
            build.build_temp = str(self._tmp / "obj")
            build.ensure_finalized()
            build.run()
        finally:
            os.chdir(cwd)
            if mypypath is None:
                os.environ.pop("MYPYPATH", None)
            else:
                os.environ["MYPYPATH"] = mypypath
        built = sorted(p for p in out.rglob("*") if p.is_file())
        if not built:
            raise RuntimeError(f"mypyc built nothing for {modules}")
        for path in built:
            build_data["force_include"][str(path)] = path.relative_to(out).as_posix()
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        print(f"mypyc hook: compiled {len(modules)} modules of {group}", file=sys.stderr)

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        """Remove the temporary folder."""
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
