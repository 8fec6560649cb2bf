"""Ahead-of-time compilation of every kernel for a CUDA target, with no GPU present.

``triton.compile`` lowers a kernel through TTIR/TTGIR/LLVM to PTX and runs the ``ptxas``
that ships with triton to produce a cubin, so a kernel that stops compiling for sm_80
(A100) or sm_90 (H100) fails here, on a CPU-only CI machine. Must run without
``TRITON_INTERPRET``: the interpreter replaces the JIT functions ``triton.compile`` needs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AOT_TARGETS", "compile_all"]

AOT_TARGETS = {"A100": 80, "H100": 90}
"""GPU name -> CUDA compute capability compiled ahead of time."""

_DT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def _variants() -> list[tuple[str, Any, dict[str, str], dict[str, Any]]]:
    from kvpolicy.kernels import _triton as k

    out: list[tuple[str, Any, dict[str, str], dict[str, Any]]] = []
    for dtype, t in _DT.items():
        for mlp in (True, False):
            sig = {
                "z_ptr": f"*{t}",
                "w_ptr": f"*{t}",
                "stats_ptr": "*fp32",
                "acc_ptr": "*fp32",
                "B": "i32",
                "V": "i32",
                "stride_z": "i32",
                "cols_per_split": "i32",
            }
            const = {
                "H": 256 if mlp else 16,
                "BLOCK_B": 64,
                "BLOCK_V": 32 if mlp and dtype == "float32" else 64,
                "HAS_MLP": mlp,
                "IEEE": dtype == "float32",
                "UPCAST": False,
            }
            sig.update(dict.fromkeys(const, "constexpr"))
            name = f"score_partial[{dtype},{'mlp' if mlp else 'compact'}]"
            out.append((name, k._score_partial, sig, const))
    for mlp in (True, False):
        ptrs = ("stats_ptr", "acc_ptr", "rowsum_ptr", "b1_ptr", "w2_ptr", "cw_ptr")
        sig = dict.fromkeys(ptrs, "*fp32")
        sig.update(pos_ptr="*i64", att_ptr="*fp32", r_ptr="*fp32", v_ptr="*fp32", g_ptr="*fp32")
        sig.update(B="i32", num_s="i32")
        sig.update(
            dict.fromkeys(("b2", "const_risk", "half_s2", "expm1_s2", "lam", "offset"), "fp32")
        )
        const = {"H": 256 if mlp else 16, "BLOCK_B": 64, "HAS_MLP": mlp}
        sig.update(dict.fromkeys(const, "constexpr"))
        out.append((f"score_finish[{'mlp' if mlp else 'compact'}]", k._score_finish, sig, const))
    block = {"BLOCK": 4096}
    hist = {"g_ptr": "*fp32", "n": "i32", "prefix_ptr": "*i64", "hist_ptr": "*i32"}
    for shift in (24, 0):
        const = {"SHIFT": shift, **block}
        sig = {**hist, **dict.fromkeys(const, "constexpr")}
        out.append((f"radix_hist[shift={shift}]", k._radix_hist, sig, const))
    sig = {"g_ptr": "*fp32", "n": "i32", "kth_ptr": "*i64", "counts_ptr": "*i32"}
    out.append(("select_count", k._select_count, {**sig, "BLOCK": "constexpr"}, block))
    sig = {
        "g_ptr": "*fp32",
        "n": "i32",
        "kth_ptr": "*i64",
        "need_ptr": "*i64",
        "offsets_ptr": "*i32",
        "out_ptr": "*i64",
    }
    out.append(("select_write", k._select_write, {**sig, "BLOCK": "constexpr"}, block))
    return out


def compile_all(capability: int) -> dict[str, dict[str, int]]:
    """Compile every kernel variant for ``sm_<capability>``.

    Args:
        capability: CUDA compute capability, e.g. 80 (A100) or 90 (H100).

    Returns:
        kernel variant -> ``{"ptx_bytes", "cubin_bytes", "shared_bytes"}``.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    result: dict[str, dict[str, int]] = {}
    for name, fn, sig, const in _variants():
        src = ASTSource(fn=fn, signature=sig, constexprs=const)
        num_warps = 8 if const.get("HAS_MLP") and "partial" in name else 4
        compiled = triton.compile(
            src, target=GPUTarget("cuda", capability, 32), options={"num_warps": num_warps}
        )
        result[name] = {
            "ptx_bytes": len(compiled.asm["ptx"]),
            "cubin_bytes": len(compiled.asm["cubin"]),
            "shared_bytes": int(compiled.metadata.shared),
        }
    return result
