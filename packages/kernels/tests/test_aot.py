"""Ahead-of-time compilation for A100 (sm_80) and H100 (sm_90), no GPU needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kvpolicy.kernels._aot import AOT_LIMITS, AOT_TARGETS

# The interpreter (set by conftest) replaces triton.jit functions; compile in a clean process.
_SCRIPT = """
import json
from kvpolicy.kernels._aot import AOT_TARGETS, compile_all
print(json.dumps({name: compile_all(cc) for name, cc in AOT_TARGETS.items()}))
"""


@pytest.mark.heavy  # Triton's compiler for two targets: ~15 s of CPU
class TestAheadOfTime:
    def test_every_kernel_compiles_to_ptx_and_cubin(self) -> None:
        """Each kernel variant yields PTX and a cubin for sm_80 and sm_90."""
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["TRITON_DEFAULT_FP_FUSION"] = "1"
        proc = subprocess.run(
            [sys.executable, "-c", _SCRIPT],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        assert sorted(result) == sorted(AOT_TARGETS)
        for gpu, kernels in result.items():
            print(f"compiled for {gpu} (sm_{AOT_TARGETS[gpu]}): {', '.join(kernels)}")
            families = {name.split("[")[0] for name in kernels}
            assert families == {
                "score_partial",
                "score_finish",
                "radix_hist",
                "radix_pick",
                "select_count",
                "select_offsets",
                "select_write",
            }
            # Both predictors in every dtype; each at the launches score_launch picks.
            for dtype in ("float32", "float16", "bfloat16"):
                for predictor in ("mlp", "compact"):
                    assert any(f"[{dtype},{predictor}," in name for name in kernels)
            smem = AOT_LIMITS[AOT_TARGETS[gpu]][1]
            for name, sizes in kernels.items():
                assert sizes["ptx_bytes"] > 0, (gpu, name)
                assert sizes["cubin_bytes"] > 0, (gpu, name)
                # What fits the target's opt-in shared memory (A100 163 KiB, H100 227 KiB).
                assert sizes["shared_bytes"] <= smem, (gpu, name, sizes)
