"""Group-wise integer quantization of K/V tensors in torch (KIVI's layouts), and its bounds.

A tensor of shape ``(..., tokens, channels)`` is cut into groups of ``group_size``
elements, either along the channels of one token (``axis="token"``: one scale per token and
group of channels, what KIVI uses for values) or along the tokens of one channel
(``axis="channel"``: one scale per channel and group of tokens, what KIVI uses for keys,
whose outliers sit in fixed channels). Each group is quantized asymmetrically with
round-to-nearest::

    zero  = min(group)        (rounded *down* to the scale dtype, fp16 by default)
    scale = (max(group) - zero) / (2**bits - 1)   (rounded *up* to the scale dtype)
    code  = clamp(round((x - zero) / scale), 0, 2**bits - 1)
    x'    = zero + scale * code

Rounding the zero down and the scale up keeps every element inside the representable
range, so the error bound holds with the stored (fp16) scale: ``|x - x'| <= scale / 2`` for
every element (plus the float32 rounding of the arithmetic, a few ulps of ``|x|``). A
group of equal elements that fp16 represents has scale 0 and is exact. Every element costs
``bits`` bits and every group one scale and one zero point (kvmodel's
``quantized_token_bytes`` counts them);
the codes are held one per uint8 here, packing is a storage detail the byte count assumes.
"""

from __future__ import annotations

import math
from typing import Any

from attrs import field, frozen
from attrs.validators import in_, instance_of

__all__ = [
    "AXES",
    "QUANT_BITS",
    "Quantized",
    "dequantize",
    "fake_quantize",
    "quantize",
    "quantize_kv",
]

QUANT_BITS = (8, 4, 2)
"""Bits of an integer code :func:`quantize` supports (16 is the unquantized state)."""

AXES = ("token", "channel")
"""``"token"``: groups along the channels of one token (per-token scales); ``"channel"``:
groups along the tokens of one channel (per-channel scales)."""


@frozen
class Quantized:
    """A quantized tensor: codes, and a scale and a zero point per group."""

    codes: Any = field()
    """uint8 codes, grouped: ``(..., groups, group_size)`` with the grouped axis last."""
    scale: Any = field()
    """``(..., groups, 1)`` scales in the scale dtype (fp16 by default)."""
    zero: Any = field()
    """``(..., groups, 1)`` zero points (the group minimum rounded down) in the scale dtype."""
    bits: int = field(validator=in_(QUANT_BITS))
    """Bits per code."""
    group_size: int = field(validator=instance_of(int))
    """Elements per group."""
    axis: str = field(validator=in_(AXES))
    """Which axis the groups run along (:data:`AXES`)."""
    shape: tuple[int, ...] = field(converter=tuple)
    """Shape of the original tensor ``(..., tokens, channels)``."""


def _check(x: Any, bits: object, group_size: object, axis: object) -> None:
    import torch

    if not isinstance(x, torch.Tensor):
        raise TypeError(f"'x' must be a torch.Tensor: {type(x).__name__}")
    if x.dim() < 2:
        raise ValueError(f"'x' must be (..., tokens, channels): shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"'x' must be floating point: {x.dtype}")
    if isinstance(bits, bool) or bits not in QUANT_BITS:
        raise ValueError(f"'bits' must be one of {list(QUANT_BITS)}: {bits!r}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"'group_size' must be an int >= 1: {group_size!r}")
    if axis not in AXES:
        raise ValueError(f"'axis' must be one of {', '.join(AXES)}: {axis!r}")


def _grouped(x: Any, group_size: int, axis: str) -> Any:
    """``x`` (..., tokens, channels) as (..., [channels,] groups, group_size) float32, the
    grouped axis last, padded by repeating its last element (which changes no min or max)."""
    import torch

    t = x.float()
    if axis == "channel":
        t = t.transpose(-1, -2)  # (..., channels, tokens)
    n = t.shape[-1]
    pad = (-n) % group_size
    if pad:
        t = torch.cat([t, t[..., -1:].expand(*t.shape[:-1], pad)], dim=-1)
    return t.reshape(*t.shape[:-1], -1, group_size)


def _ungrouped(g: Any, shape: tuple[int, ...], axis: str) -> Any:
    flat = g.reshape(*g.shape[:-2], -1)
    flat = flat[..., : shape[-2]].transpose(-1, -2) if axis == "channel" else flat[..., : shape[-1]]
    return flat.reshape(shape)


def quantize(
    x: Any, bits: int, group_size: int = 32, axis: str = "token", scale_dtype: Any = None
) -> Quantized:
    """Quantize ``x`` group-wise (module docstring) with round-to-nearest.

    Args:
        x: (..., tokens, channels) floating tensor (keys or values of some heads).
        bits: 8, 4 or 2.
        group_size: elements per group (a last group shorter than that is padded).
        axis: ``"token"`` (per-token scales, groups of channels) or ``"channel"``
            (per-channel scales, groups of tokens).
        scale_dtype: dtype the scales and zero points are stored in (torch.float16 when
            None); the bound ``|x - dequantize(q)| <= scale / 2`` holds with it.

    Returns:
        The codes, scales and zero points.

    Raises:
        TypeError: ``x`` is not a floating torch tensor.
        ValueError: ``x`` has fewer than 2 dims, or ``bits``, ``group_size`` or ``axis``
            is not supported (named in the message).
    """
    import torch

    _check(x, bits, group_size, axis)
    sdt = torch.float16 if scale_dtype is None else scale_dtype
    g = _grouped(x, group_size, axis)
    levels = float(2**bits - 1)
    lo = g.amin(dim=-1, keepdim=True)
    hi = g.amax(dim=-1, keepdim=True)
    zero = lo.to(sdt)
    zero = torch.where(
        zero.float() > lo, torch.nextafter(zero, torch.full_like(zero, -math.inf)), zero
    )
    raw = (hi - zero.float()) / levels
    scale = raw.to(sdt)
    scale = torch.where(
        scale.float() < raw, torch.nextafter(scale, torch.full_like(scale, math.inf)), scale
    )
    s = scale.float()
    safe = torch.where(s > 0, s, torch.ones_like(s))
    codes = torch.clamp(torch.round((g - zero.float()) / safe), 0.0, levels)
    codes = torch.where(s > 0, codes, torch.zeros_like(codes)).to(torch.uint8)
    return Quantized(
        codes=codes,
        scale=scale,
        zero=zero,
        bits=bits,
        group_size=group_size,
        axis=axis,
        shape=tuple(x.shape),
    )


def dequantize(q: Quantized) -> Any:
    """The float32 tensor of the original shape that the codes of ``q`` stand for."""
    if not isinstance(q, Quantized):
        raise TypeError(f"'q' must be Quantized: {type(q).__name__}")
    g = q.zero.float() + q.scale.float() * q.codes.float()
    return _ungrouped(g, q.shape, q.axis)


def fake_quantize(
    x: Any, bits: int, group_size: int = 32, axis: str = "token", scale_dtype: Any = None
) -> Any:
    """``dequantize(quantize(x, ...))`` in ``x``'s dtype: what a reader of the quantized cache
    sees in place of ``x`` (16 bits returns ``x`` unchanged)."""
    if bits == 16:
        return x
    return dequantize(quantize(x, bits, group_size, axis, scale_dtype)).to(x.dtype)


def quantize_kv(
    keys: Any, values: Any, bits: int, group_size: int = 32, key_axis: str = "token"
) -> tuple[Any, Any]:
    """Fake-quantized ``(keys, values)`` of some tokens at ``bits`` (16: unchanged).

    Values are quantized per token (groups of ``group_size`` channels); keys per token too
    by default, or per channel (groups of ``group_size`` tokens, KIVI's layout for keys)
    with ``key_axis="channel"``, which needs the group's tokens quantized together at one
    precision (a block of tokens, not one token at a time).

    Args:
        keys, values: (..., tokens, head_dim) floating tensors.
        bits: 16, 8, 4 or 2.
        group_size: elements per group.
        key_axis: ``"token"`` or ``"channel"``.
    """
    if bits == 16:
        return keys, values
    return (
        fake_quantize(keys, bits, group_size, key_axis),
        fake_quantize(values, bits, group_size, "token"),
    )
