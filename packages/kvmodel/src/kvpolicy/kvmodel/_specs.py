"""Model and GPU specifications, and KV bytes per token (seed 004 §3.1, seed 001)."""

from __future__ import annotations

import math

import attrs
from attrs import field, frozen
from attrs.validators import ge, gt, instance_of, le

from kvpolicy.kvmodel._tables import KV_DTYPE_BYTES

__all__ = [
    "KV_DTYPE_BYTES",
    "KV_PRECISIONS",
    "GPUSpec",
    "ModelSpec",
    "kv_dtype_bytes",
    "quantized_token_bytes",
]


def kv_dtype_bytes(dtype: str) -> float:
    """Bytes of one KV element of ``dtype``.

    Raises:
        ValueError: ``dtype`` is not one of :data:`KV_DTYPE_BYTES` (the message lists them).
    """
    try:
        return KV_DTYPE_BYTES[dtype]
    except KeyError:
        known = ", ".join(KV_DTYPE_BYTES)
        raise ValueError(f"'kv_dtype' must be one of {known}: {dtype!r}") from None


def _check_dtype_bytes(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if value not in set(KV_DTYPE_BYTES.values()):
        raise ValueError(
            f"'{attribute.name}' must be one of {sorted(set(KV_DTYPE_BYTES.values()))}: {value!r}"
        )


@frozen
class ModelSpec:
    """Architecture facts that set the KV footprint of a decoder-only transformer."""

    name: str = field(validator=instance_of(str))
    """Display name, e.g. ``"Llama-3-8B"``."""
    num_layers: int = field(validator=[instance_of(int), gt(0)])
    """Transformer layers ``L``."""
    num_kv_heads: int = field(validator=[instance_of(int), gt(0)])
    """KV heads ``H_kv`` (fewer than query heads under GQA)."""
    head_dim: int = field(validator=[instance_of(int), gt(0)])
    """Dimension ``d_h`` of one head."""
    kv_dtype_bytes: float = field(default=2.0, converter=float, validator=_check_dtype_bytes)
    """Bytes of one KV element ``b``: 4 (fp32), 2 (bf16/fp16), 1 (fp8/int8), 0.5 (int4)."""
    max_context: int = field(default=8192, validator=[instance_of(int), gt(0)])
    """Longest context (prompt + output) in tokens."""
    num_params: int = field(default=0, validator=[instance_of(int), ge(0)])
    """Parameter count (for weight bytes and FLOPs); 0 when unknown."""
    weight_dtype_bytes: float = field(default=2.0, converter=float, validator=[gt(0.0), le(8.0)])
    """Bytes per weight (2 for bf16)."""
    num_attention_heads: int = field(default=0, validator=[instance_of(int), ge(0)])
    """Query heads; 0 when equal to ``num_kv_heads``."""

    def __attrs_post_init__(self) -> None:
        per_token = 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes
        if per_token != int(per_token):
            raise ValueError(
                "'kv_dtype_bytes' gives a fractional byte count per token "
                f"({per_token}) for {self.name!r}"
            )

    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token: ``2 · L · H_kv · d_h · b`` (the 2 is K and V)."""
        return int(2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes)

    @property
    def query_heads(self) -> int:
        """Query heads: ``num_attention_heads``, or ``num_kv_heads`` when that is 0."""
        return self.num_attention_heads or self.num_kv_heads

    def tensor_parallel_sizes(self) -> list[int]:
        """Every valid ``tp``: divisors of the query heads that divide or are multiples of
        the KV heads, ascending."""
        heads, kv = self.query_heads, self.num_kv_heads
        return [n for n in range(1, heads + 1) if heads % n == 0 and not (kv % n and n % kv)]

    def check_parallel(self, tp: int = 1, pp: int = 1) -> None:
        """Raise unless ``tp``-way tensor and ``pp``-way pipeline parallelism can split this model.

        ``tp`` must be a positive int dividing the query heads, and either divide the KV heads
        or be a multiple of them (then each KV head is replicated on ``tp / H_kv`` GPUs, as
        vLLM and SGLang do); ``pp`` a positive int no larger than the layer count.

        Raises:
            TypeError: ``tp`` or ``pp`` is not an int.
            ValueError: naming ``tp`` or ``pp`` and the values that would work.
        """
        for name, value in (("tp", tp), ("pp", pp)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"'{name}' must be an int: {value!r}")
            if value < 1:
                raise ValueError(f"'{name}' must be a positive int: {value!r}")
        if tp > 1 and tp not in (valid := self.tensor_parallel_sizes()):
            raise ValueError(
                f"'tp' must divide the {self.query_heads} query heads of {self.name} and divide "
                f"or be a multiple of its {self.num_kv_heads} KV heads (one of {valid}): {tp!r}"
            )
        if pp > self.num_layers:
            raise ValueError(f"'pp' must be <= the {self.num_layers} layers of {self.name}: {pp!r}")

    def kv_heads_per_gpu(self, tp: int = 1) -> int:
        """KV heads each GPU stores under ``tp``-way tensor parallelism: ``max(1, H_kv / tp)``.

        When ``tp > H_kv`` the KV heads are replicated (each GPU keeps one), so the total KV
        memory grows with ``tp`` while the per-GPU share stops shrinking.
        """
        self.check_parallel(tp)
        return max(1, self.num_kv_heads // tp)

    def kv_bytes_per_token_per_gpu(self, tp: int = 1, pp: int = 1) -> int:
        """KV bytes of one token on one GPU: ``2 · ceil(L / pp) · H_kv,gpu · d_h · b``.

        With ``pp`` pipeline stages the first stages hold ``ceil(L / pp)`` layers; that
        stage bounds the capacity. ``tp = pp = 1`` gives :meth:`kv_bytes_per_token`.
        """
        self.check_parallel(tp, pp)
        layers = -(-self.num_layers // pp)
        return int(2 * layers * self.kv_heads_per_gpu(tp) * self.head_dim * self.kv_dtype_bytes)

    def weight_bytes_per_gpu(self, tp: int = 1, pp: int = 1) -> int:
        """Weight bytes on one GPU: the weights split evenly over ``tp · pp`` GPUs (rounded up).

        Replicated pieces (embeddings under tp, norms) are ignored: a few percent at most.
        """
        self.check_parallel(tp, pp)
        return -(-self.weight_bytes() // (tp * pp))

    def kv_bytes_per_block(self, block_size: int) -> int:
        """KV bytes of one paged block of ``block_size`` tokens."""
        if not isinstance(block_size, int) or isinstance(block_size, bool):
            raise TypeError(f"'block_size' must be int: {block_size!r}")
        if block_size <= 0:
            raise ValueError(f"'block_size' must be > 0: {block_size}")
        return block_size * self.kv_bytes_per_token()

    def weight_bytes(self) -> int:
        """Bytes of the model's weights: ``num_params · weight_dtype_bytes``."""
        return int(self.num_params * self.weight_dtype_bytes)

    def with_kv_dtype(self, dtype: str) -> ModelSpec:
        """The same model with its KV cache stored as ``dtype`` (e.g. ``"fp8"``)."""
        return attrs.evolve(self, kv_dtype_bytes=kv_dtype_bytes(dtype))


@frozen
class GPUSpec:
    """An accelerator's memory and speed, for capacity planning and roofline timing."""

    name: str = field(validator=instance_of(str))
    """Display name, e.g. ``"H100-SXM"``."""
    hbm_bytes: int = field(validator=[instance_of(int), gt(0)])
    """High-bandwidth memory in bytes."""
    hbm_bandwidth: float = field(converter=float, validator=gt(0.0))
    """HBM bandwidth in bytes per second."""
    peak_flops: float = field(default=1e14, converter=float, validator=gt(0.0))
    """Dense bf16 peak in FLOP/s."""
    price_per_hour: float = field(default=0.0, converter=float, validator=ge(0.0))
    """Rental price in dollars per hour (for cost reports); 0 when unknown."""


KV_PRECISIONS: tuple[int, ...] = (16, 8, 4, 2)
"""Bits of one KV element a token may be held at: 16 (fp16/bf16, stored as is), and 8, 4,
2 (integer codes with a scale and a zero point per group of elements). 0 stands for an
evicted token (no bytes)."""


def quantized_token_bytes(
    spec: ModelSpec, bits: int, group_size: int = 32, scale_bytes: int = 2
) -> int:
    """KV bytes of one token of ``spec`` held at ``bits`` bits, scales and zero points included.

    At 16 bits a token costs :meth:`ModelSpec.kv_bytes_per_token` computed at 2 bytes per
    element. At ``bits`` < 16 each of its keys and values in each layer and KV head is
    ``d_h`` integer codes packed ``8 / bits`` to a byte, plus one scale and one zero point
    (``scale_bytes`` each, fp16 by default) per group of ``group_size`` elements: per token
    and head ``ceil(d_h * bits / 8) + ceil(d_h / group_size) * 2 * scale_bytes`` bytes for K
    and as much for V. That is exact for groups along the channels of one token (values per
    token, KIVI's layout) and the amortised cost for groups along ``group_size`` tokens of one
    channel (keys per channel), which hold the same number of scales per token. 0 bits (an
    evicted token) costs 0.

    Args:
        spec: the model.
        bits: one of :data:`KV_PRECISIONS`, or 0.
        group_size: elements that share a scale and a zero point (>= 1).
        scale_bytes: bytes of one scale and of one zero point (1, 2 or 4).

    Returns:
        Bytes per token, over every layer and KV head, K and V.

    Raises:
        TypeError: ``spec`` is not a ModelSpec, or a count is not an int.
        ValueError: ``bits``, ``group_size`` or ``scale_bytes`` out of range (named).

    Example: SmolLM2-135M (30 layers, 3 KV heads, ``d_h = 64``) costs 23,040 bytes per token
    at 16 bits, 12,960 at 8 and 7,200 at 4 with groups of 32 (fp16 scales and zeros).
    """
    if not isinstance(spec, ModelSpec):
        raise TypeError(f"'spec' must be a ModelSpec: {spec!r}")
    for name, value in (("bits", bits), ("group_size", group_size), ("scale_bytes", scale_bytes)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"'{name}' must be an int: {value!r}")
    if bits != 0 and bits not in KV_PRECISIONS:
        raise ValueError(f"'bits' must be 0 or one of {list(KV_PRECISIONS)}: {bits!r}")
    if group_size < 1:
        raise ValueError(f"'group_size' must be >= 1: {group_size!r}")
    if scale_bytes not in (1, 2, 4):
        raise ValueError(f"'scale_bytes' must be 1, 2 or 4: {scale_bytes!r}")
    if bits == 0:
        return 0
    d = spec.head_dim
    if bits == 16:
        per_head = 2 * d
    else:
        per_head = math.ceil(d * bits / 8) + math.ceil(d / group_size) * 2 * scale_bytes
    return 2 * spec.num_layers * spec.num_kv_heads * per_head
