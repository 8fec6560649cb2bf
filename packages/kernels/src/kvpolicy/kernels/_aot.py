"""Ahead-of-time compilation of every kernel for a CUDA target, with no GPU present.

``triton.compile`` lowers a kernel through TTIR/TTGIR/LLVM to PTX and runs the ``ptxas``
that ships with triton to produce a cubin, so a kernel that stops compiling for sm_80
(A100) or sm_90 (H100) fails here, on a CPU-only CI machine. Must run without
``TRITON_INTERPRET``: the interpreter replaces the JIT functions ``triton.compile`` needs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AOT_LIMITS", "AOT_TARGETS", "compile_all"]

AOT_TARGETS = {"A100": 80, "H100": 90}
"""GPU name -> CUDA compute capability compiled ahead of time."""

AOT_LIMITS = {80: (108, 163 * 1024), 90: (132, 227 * 1024)}
"""Compute capability -> (SMs, opt-in shared memory bytes per block) of its reference GPU
(A100, H100 SXM): what ``score_launch`` is given to pick the launches compiled."""

_DT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
_ELEM = {"float32": 4, "float16": 2, "bfloat16": 2}

Variant = tuple[str, Any, dict[str, str], dict[str, Any], dict[str, int]]


def _variants(capability: int) -> list[Variant]:
    """Every kernel as the dispatcher launches it on ``sm_<capability>``: the scoring
    pass at each launch ``score_launch`` picks there for 1, 64 and 256 rows of 128,256
    logits, the finishing pass at the slice counts those launches make, the selection
    kernels."""
    from kvpolicy.kernels import _triton as k

    sms, smem = AOT_LIMITS[capability]
    out: list[Variant] = []
    finishes = set()
    for dtype, t in _DT.items():
        for mlp in (True, False):
            hidden = 256 if mlp else 0
            wide = mlp and dtype == "float32"
            launches = {
                k.score_launch(b, 128_256, hidden, _ELEM[dtype], wide, sms=sms, smem=smem)
                for b in (1, 64, 256)
            }
            for launch in sorted(launches):
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
                    "H": hidden or 16,
                    "BLOCK_B": launch.block_b,
                    "BLOCK_V": launch.block_v,
                    "HAS_MLP": mlp,
                    "IEEE": dtype == "float32",
                    "UPCAST": False,
                }
                sig.update(dict.fromkeys(const, "constexpr"))
                options = {"num_warps": launch.num_warps}
                if launch.num_stages is not None:
                    options["num_stages"] = launch.num_stages
                tile = f"{launch.block_b}x{launch.block_v}"
                name = f"score_partial[{dtype},{'mlp' if mlp else 'compact'},{tile}]"
                out.append((name, k._score_partial, sig, const, options))
                _cols, splits = k.vocab_slices(128_256, launch)
                finishes.add((mlp, *k.finish_tiles(splits, hidden)))
    for mlp, s_pad, s_chunk in sorted(finishes):
        ptrs = ("stats_ptr", "acc_ptr", "rowsum_ptr", "b1_ptr", "w2_ptr", "cw_ptr")
        sig = dict.fromkeys(ptrs, "*fp32")
        sig.update(pos_ptr="*i64", att_ptr="*fp32", r_ptr="*fp32", v_ptr="*fp32", g_ptr="*fp32")
        sig.update(B="i32", num_s="i32")
        sig.update(
            dict.fromkeys(("b2", "const_risk", "half_s2", "expm1_s2", "lam", "offset"), "fp32")
        )
        const = {"H": 256 if mlp else 16, "S_PAD": s_pad, "S_CHUNK": s_chunk, "HAS_MLP": mlp}
        sig.update(dict.fromkeys(const, "constexpr"))
        name = f"score_finish[{'mlp' if mlp else 'compact'},{s_pad}x{s_chunk}]"
        out.append((name, k._score_finish, sig, const, {"num_warps": k.FINISH_WARPS}))
    block = {"BLOCK": 4096}
    warps = {"num_warps": 4}
    hist = {"g_ptr": "*fp32", "n": "i32", "prefix_ptr": "*i64", "hist_ptr": "*i32"}
    for shift in (24, 0):
        const = {"SHIFT": shift, **block}
        sig = {**hist, **dict.fromkeys(const, "constexpr")}
        out.append((f"radix_hist[shift={shift}]", k._radix_hist, sig, const, warps))
    sig = {"hist_ptr": "*i32", "state_ptr": "*i64"}
    out.append(("radix_pick", k._radix_pick, sig, {}, warps))
    sig = {"g_ptr": "*fp32", "n": "i32", "kth_ptr": "*i64", "counts_ptr": "*i32"}
    out.append(("select_count", k._select_count, {**sig, "BLOCK": "constexpr"}, block, warps))
    sig = {"counts_ptr": "*i32", "nblocks": "i32", "state_ptr": "*i64", "offsets_ptr": "*i32"}
    const = {"BLOCK": 1024}
    out.append(("select_offsets", k._select_offsets, {**sig, "BLOCK": "constexpr"}, const, warps))
    sig = {
        "g_ptr": "*fp32",
        "n": "i32",
        "kth_ptr": "*i64",
        "need_ptr": "*i64",
        "offsets_ptr": "*i32",
        "out_ptr": "*i64",
    }
    out.append(("select_write", k._select_write, {**sig, "BLOCK": "constexpr"}, block, warps))
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
    for name, fn, sig, const, options in _variants(capability):
        src = ASTSource(fn=fn, signature=sig, constexprs=const)
        compiled = triton.compile(src, target=GPUTarget("cuda", capability, 32), options=options)
        result[name] = {
            "ptx_bytes": len(compiled.asm["ptx"]),
            "cubin_bytes": len(compiled.asm["cubin"]),
            "shared_bytes": int(compiled.metadata.shared),
        }
    return result
