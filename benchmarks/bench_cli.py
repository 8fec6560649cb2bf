"""Start-up time of the ``kvpolicy`` command: ``--help`` at the top, of each group and of
each subcommand.

Each command runs as a fresh process (what a user waits for), ``--help`` so that only the
start-up is timed; the median of ``--runs`` (default 7) after one warm-up run that fills
the page cache. A bare ``python -c pass`` is the baseline measured in the same run. Goal:
under 0.5 s for every ``--help`` on the 2-core development machine.

Run: ``python benchmarks/bench_cli.py [--quick] [--out results/bench]``.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time

from _harness import parse_args, write_result


def _commands() -> list[list[str]]:
    """Every installed command: the top, each group, and each group's every subcommand (from
    the registered specs, which import no command module)."""
    from kvpolicy.commands._main import registered, spec_of

    out: list[list[str]] = [[]]
    for name, ep in sorted(registered().items()):
        out.append([name])
        out += [[name, sub] for sub in sorted(spec_of(ep).subcommands)]
    return out


def _seconds(argv: list[str], runs: int) -> float:
    subprocess.run(argv, capture_output=True, check=True)  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    args = parse_args(__doc__.splitlines()[0])
    runs = 3 if args.quick else 7
    exe = shutil.which("kvpolicy")
    if exe is None:
        print("bench_cli: no `kvpolicy` on PATH (install kvpolicy-sim); nothing measured")
        return 0
    baseline = _seconds([sys.executable, "-c", "pass"], runs)
    rows = []
    for command in _commands():
        s = _seconds([exe, *command, "--help"], runs)
        row = {
            "command": " ".join(["kvpolicy", *command, "--help"]),
            "seconds": s,
            "over_bare_python": s / baseline,
            "under_0_5_s": s < 0.5,
        }
        print(row, flush=True)
        rows.append(row)
    slowest = max(rows, key=lambda r: r["seconds"])
    summary = {
        "runs": runs,
        "bare_python_seconds": baseline,
        "commands": len(rows),
        "all_under_0_5_s": all(r["under_0_5_s"] for r in rows),
        "slowest": slowest["command"],
        "slowest_seconds": slowest["seconds"],
        "rows": rows,
    }
    write_result("cli", summary, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
