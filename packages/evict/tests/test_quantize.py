"""Group-wise K/V quantization against the dequantized fp32 reference."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvpolicy.evict import AXES, QUANT_BITS, dequantize, fake_quantize, quantize, quantize_kv  # noqa: E402


def _reference(x: torch.Tensor, bits: int, group: int, axis: str) -> torch.Tensor:
    """Round-to-nearest written out one group at a time in float64 (the scale and zero
    taken from the quantizer, which rounds them to fp16)."""
    q = quantize(x, bits, group, axis)
    t = x.double()
    if axis == "channel":
        t = t.transpose(-1, -2)
    n = t.shape[-1]
    out = torch.empty_like(t)
    for gi, start in enumerate(range(0, n, group)):
        seg = t[..., start : start + group]
        z = q.zero[..., gi, :].double()
        s = q.scale[..., gi, :].double()
        code = torch.where(s > 0, torch.round((seg - z) / torch.where(s > 0, s, 1.0)), 0.0)
        out[..., start : start + group] = z + s * code.clamp(0, 2**bits - 1)
    return out.transpose(-1, -2) if axis == "channel" else out


def _group_scales(q: object, x: torch.Tensor, group: int, axis: str) -> torch.Tensor:
    """Each element's scale, broadcast back to the shape of ``x``."""
    s = q.scale.float().expand(*q.codes.shape)  # type: ignore[attr-defined]
    flat = s.reshape(*s.shape[:-2], -1)
    if axis == "channel":
        return flat[..., : x.shape[-2]].transpose(-1, -2)
    return flat[..., : x.shape[-1]]


SHAPES = [(2, 3, 40, 64), (5, 123), (1, 7, 33)]


class TestQuantize:
    """Round-to-nearest per group with fp16 scales and zero points."""

    @pytest.mark.parametrize("shape", SHAPES)
    @pytest.mark.parametrize("bits", QUANT_BITS)
    @pytest.mark.parametrize("axis", AXES)
    @pytest.mark.parametrize("group", [16, 32])
    def test_error_within_half_a_scale(
        self, shape: tuple[int, ...], bits: int, axis: str, group: int
    ) -> None:
        """Every element is within scale / 2 of the fp32 original (plus float rounding)."""
        x = torch.randn(shape) * 4.0 + 0.5
        q = quantize(x, bits, group, axis)
        err = (dequantize(q) - x).abs()
        bound = _group_scales(q, x, group, axis) / 2
        assert bool((err <= bound + 1e-5 * (1 + x.abs())).all())

    @pytest.mark.parametrize("bits", QUANT_BITS)
    @pytest.mark.parametrize("axis", AXES)
    def test_equals_the_float64_reference(self, bits: int, axis: str) -> None:
        """dequantize matches round-to-nearest done group by group in float64."""
        x = torch.randn(3, 37, 50) * 2.0
        got = dequantize(quantize(x, bits, 16, axis)).double()
        ref = _reference(x, bits, 16, axis)
        assert torch.allclose(got, ref, atol=1e-5, rtol=1e-5)

    def test_scales_are_stored_in_fp16(self) -> None:
        """Scales and zero points are fp16 by default, as the byte count assumes."""
        q = quantize(torch.randn(4, 64), 4, 32)
        assert q.scale.dtype == torch.float16
        assert q.zero.dtype == torch.float16
        assert q.codes.dtype == torch.uint8
        assert int(q.codes.max()) <= 15

    def test_groups_run_along_the_named_axis(self) -> None:
        """Per token: one scale per token and group of channels; per channel: per channel
        and group of tokens."""
        x = torch.randn(10, 64)
        assert quantize(x, 8, 32, "token").scale.shape == (10, 2, 1)
        assert quantize(x, 8, 32, "channel").scale.shape == (64, 1, 1)

    def test_outlier_channel_hurts_only_its_own_groups_per_channel(self) -> None:
        """A channel 100x larger than the rest: per-channel groups keep the others exact to
        their own scale, per-token groups spread its range over the token's group."""
        x = torch.randn(64, 32)
        x[:, 3] *= 100.0
        per_channel = (fake_quantize(x, 4, 32, "channel") - x)[:, 4:].abs().max()
        per_token = (fake_quantize(x, 4, 32, "token") - x)[:, 4:].abs().max()
        assert float(per_channel) * 10 < float(per_token)

    def test_constant_group_is_exact(self) -> None:
        """A group of equal elements (representable in fp16) has scale 0 and is exact."""
        x = torch.full((4, 32), 1.25)
        assert torch.equal(dequantize(quantize(x, 2, 32)), x)

    def test_error_falls_with_the_bits(self) -> None:
        """More bits, smaller error: RMS error roughly halves per extra bit."""
        x = torch.randn(8, 256, 64)
        rms = [float((fake_quantize(x, b, 32) - x).pow(2).mean().sqrt()) for b in (2, 4, 8)]
        assert rms[0] > 3 * rms[1] > 9 * rms[2]

    def test_sixteen_bits_is_unchanged(self) -> None:
        """fake_quantize and quantize_kv at 16 bits return their input."""
        k, v = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
        assert fake_quantize(k, 16) is k
        assert quantize_kv(k, v, 16) == (k, v)

    def test_quantize_kv_uses_the_key_axis(self) -> None:
        """Keys per channel with key_axis="channel", values always per token."""
        k, v = torch.randn(3, 32, 64), torch.randn(3, 32, 64)
        kq, vq = quantize_kv(k, v, 4, 32, key_axis="channel")
        assert torch.equal(kq, fake_quantize(k, 4, 32, "channel"))
        assert torch.equal(vq, fake_quantize(v, 4, 32, "token"))

    @pytest.mark.parametrize(
        ("kwargs", "exc", "match"),
        [
            ({"bits": 3}, ValueError, "'bits' must be one of"),
            ({"bits": 16}, ValueError, "'bits' must be one of"),
            ({"group_size": 0}, ValueError, "'group_size' must be an int >= 1: 0"),
            ({"axis": "head"}, ValueError, "'axis' must be one of token, channel: 'head'"),
        ],
    )
    def test_bad_arguments_are_named(
        self, kwargs: dict[str, object], exc: type, match: str
    ) -> None:
        """Unsupported bits, group or axis: a ValueError naming it."""
        args = {"bits": 4, "group_size": 32, "axis": "token", **kwargs}
        with pytest.raises(exc, match=match):
            quantize(torch.randn(4, 8), **args)  # type: ignore[arg-type]

    def test_bad_tensors(self) -> None:
        """Integer or 1-D tensors and non-tensors are refused."""
        with pytest.raises(TypeError, match="floating point"):
            quantize(torch.ones(4, 8, dtype=torch.int64), 4)
        with pytest.raises(ValueError, match="tokens, channels"):
            quantize(torch.ones(8), 4)
        with pytest.raises(TypeError, match=r"torch\.Tensor"):
            quantize([[1.0]], 4)
