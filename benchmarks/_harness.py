"""Shared plumbing of the benchmark scripts: arguments, machine description, JSON output.

Every ``benchmarks/bench_*.py`` calls :func:`parse_args` and :func:`write_result`, so that
``nox -s bench`` leaves one JSON file per benchmark under ``results/bench/`` holding the
figures and the machine that measured them. Figures are ratios against a baseline measured
in the same run wherever possible: these machines are noisy.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import pathlib
import platform
import sys
from collections.abc import Callable
from typing import Any

COMPILED = {
    "kvmodel": "kvpolicy.kvmodel._pool",
    "admit": "kvpolicy.admit._fused",
    "tenancy": "kvpolicy.tenancy._fleet",
    "sim": "kvpolicy.sim._engine",
}
"""A module of each distribution whose wheel may carry compiled modules (mypyc:
``tools/mypyc_hook.py``)."""


def compiled_core(dists: tuple[str, ...] = tuple(COMPILED)) -> dict[str, str]:
    """For each of ``dists`` installed, whether its hot modules run ``mypyc``-compiled or
    ``interpreted`` (a wheel built by ``nox -s bench`` where a C compiler is found, or with
    ``HATCH_BUILD_HOOK_ENABLE_CUSTOM=1`` from the checkout, carries them compiled)."""
    import importlib
    import importlib.machinery

    out = {}
    for dist in dists:
        try:
            path = importlib.import_module(COMPILED[dist]).__file__ or ""
        except ImportError:
            continue
        compiled = path.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
        out[dist] = "mypyc" if compiled else "interpreted"
    return out


def run_interpreted(script: str, args: list[str], dists: tuple[str, ...]) -> dict[str, Any]:
    """Run ``script`` with ``args`` in a child process whose path puts this tree's sources
    of ``dists`` before the installed (compiled) modules, and return the JSON object of its
    last line, which must say (``"compiled"``: :func:`compiled_core` of ``dists``) that it
    ran them interpreted: the interpreted baseline of a compiled run, measured in the same
    run."""
    import subprocess

    root = pathlib.Path(__file__).resolve().parents[1]
    srcs = [str(next(root.glob(f"*/{dist}/src"))) for dist in dists]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*srcs, os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, script, *args]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    child: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    if set(child["compiled"].values()) != {"interpreted"}:
        raise RuntimeError(f"the interpreted child of {script} ran {child['compiled']}")
    return child


def machine() -> dict[str, Any]:
    """Describe the machine: CPU model, cores, memory, Python and key library versions."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
    }
    try:
        import cpuinfo  # type: ignore[import-untyped]

        info["cpu"] = cpuinfo.get_cpu_info().get("brand_raw", "")
    except ImportError:
        info["cpu"] = platform.processor()
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        info["memory_bytes"] = int(pages)
    except (ValueError, OSError, AttributeError):
        pass
    for mod in ("numpy", "scipy", "torch", "triton"):
        try:
            info[f"{mod}_version"] = __import__(mod).__version__
        except ImportError:
            continue
    if "torch_version" in info:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info["gpu"] = props.name
            info["gpu_memory_bytes"] = int(props.total_memory)
            info["gpu_sms"] = int(props.multi_processor_count)
            info["cuda_version"] = torch.version.cuda
    return info


def parse_args(
    description: str, more: Callable[[argparse.ArgumentParser], None] | None = None
) -> argparse.Namespace:
    """Common arguments: ``--out DIR`` for the JSON and ``--quick`` for a short run;
    ``more`` adds a script's own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("results/bench"))
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    if more is not None:
        more(parser)
    return parser.parse_args()


def write_result(name: str, figures: dict[str, Any], out: pathlib.Path) -> pathlib.Path:
    """Write ``{"benchmark", "time", "machine", "compiled", "figures"}`` to
    ``out/<name>.json`` (``compiled``: :func:`compiled_core`)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    doc = {
        "benchmark": name,
        "time": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "compiled": compiled_core(),
        "figures": figures,
    }
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    print(f"{name}: wrote {path}")
    return path
