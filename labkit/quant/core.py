"""Quantize and dequantize tensors, with real packed storage.

A *scheme* says how many bits, which values share a scale (the granularity), and whether
the grid is symmetric around zero:

* ``"int8"``        8 bits, one scale per output channel (row), symmetric: q in [-127, 127];
* ``"int8-tensor"`` one scale for the whole tensor;
* ``"int4-g128"``   4 bits, one scale per group of 128 consecutive input values of a row;
* a trailing ``-asym`` adds an integer zero-point per scale: q in [0, 2^bits - 1].

Every granularity is the same computation on a 3-D view ``(rows, groups, values)``:
per-tensor is ``(1, 1, numel)``, per-channel ``(N, 1, K)``, group-wise ``(N, K/G, G)``.
Round-to-nearest then bounds the error of every element by ``scale / 2``.

Storage is what a kernel would read: int8 values one per byte, int4 values packed two
per byte (low nibble first), scales in fp32, zero-points one byte each.
`QuantizedTensor.nbytes` is the sum of those tensors' sizes, nothing estimated.
"""

from __future__ import annotations

import dataclasses

import torch

BITS = (4, 8)
GRANULARITIES = ("tensor", "channel", "group")
GROUP_SIZES = (32, 64, 128)


@dataclasses.dataclass(frozen=True)
class Scheme:
    """How a tensor is quantized (see the module docstring for the string form)."""

    bits: int = 8
    granularity: str = "channel"
    group_size: int | None = None
    symmetric: bool = True

    def __post_init__(self) -> None:
        if self.bits not in BITS:
            raise ValueError(f"bits={self.bits!r} not allowed; choose one of {BITS}")
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"granularity={self.granularity!r} not allowed; choose one of {GRANULARITIES}")
        if self.granularity == "group" and self.group_size not in GROUP_SIZES:
            raise ValueError(f"group_size={self.group_size!r} not allowed; choose one of {GROUP_SIZES}")
        if self.granularity != "group" and self.group_size is not None:
            raise ValueError(f"group_size={self.group_size!r} needs granularity 'group'")

    @property
    def qmin(self) -> int:
        return -(2 ** (self.bits - 1) - 1) if self.symmetric else 0

    @property
    def qmax(self) -> int:
        return 2 ** (self.bits - 1) - 1 if self.symmetric else 2 ** self.bits - 1

    @property
    def name(self) -> str:
        g = {"tensor": "-tensor", "channel": "", "group": f"-g{self.group_size}"}[self.granularity]
        return f"int{self.bits}{g}" + ("" if self.symmetric else "-asym")

    def __str__(self) -> str:
        return self.name


SCHEME_EXAMPLES = ("int8", "int8-tensor", "int8-g64", "int4-g32", "int4-g128", "int8-asym", "int4-g128-asym")


def parse_scheme(spec: str | Scheme) -> Scheme:
    """`Scheme` from a string like ``"int4-g128-asym"`` (a `Scheme` passes through)."""
    if isinstance(spec, Scheme):
        return spec
    allowed = (f"'int8' or 'int4', then optionally '-tensor' or '-g32'/'-g64'/'-g128', then optionally "
               f"'-asym' (e.g. {', '.join(SCHEME_EXAMPLES)})")
    parts = str(spec).lower().split("-") if isinstance(spec, str) else []
    if not parts or parts[0] not in ("int8", "int4"):
        raise ValueError(f"quantization scheme {spec!r} not understood; allowed: {allowed}")
    bits, gran, group, sym = int(parts[0][3:]), "channel", None, True
    for p in parts[1:]:
        if p == "asym":
            sym = False
        elif p == "tensor":
            gran = "tensor"
        elif p.startswith("g") and p[1:].isdigit():
            gran, group = "group", int(p[1:])
        else:
            raise ValueError(f"quantization scheme {spec!r}: part {p!r} not understood; allowed: {allowed}")
    return Scheme(bits, gran, group, sym)


def _grouped(x: torch.Tensor, scheme: Scheme) -> torch.Tensor:
    """View `x` as (rows, groups, values) for `scheme`'s granularity."""
    if scheme.granularity == "tensor":
        return x.reshape(1, 1, -1)
    rows = x.reshape(x.shape[0], -1)
    if scheme.granularity == "channel":
        return rows[:, None, :]
    if rows.shape[1] % scheme.group_size:
        raise ValueError(f"row length {rows.shape[1]} is not a multiple of group_size={scheme.group_size}")
    return rows.reshape(rows.shape[0], -1, scheme.group_size)


def scale_zero(x: torch.Tensor, scheme: Scheme) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scales (fp32, shape (rows, groups, 1)) and zero-points (or None) covering `x`'s range."""
    g = _grouped(x.detach().float(), scheme)
    tiny = torch.finfo(torch.float32).tiny
    if scheme.symmetric:
        return (g.abs().amax(-1, keepdim=True) / scheme.qmax).clamp_min(tiny), None
    # Widen the range to include 0 so that 0 is exact and rounding stays within scale/2.
    lo = g.amin(-1, keepdim=True).clamp_max(0)
    hi = g.amax(-1, keepdim=True).clamp_min(0)
    scale = ((hi - lo) / scheme.qmax).clamp_min(tiny)
    zero = (-lo / scale).round().clamp(0, scheme.qmax)
    return scale, zero


def fake_quantize(x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, scheme: Scheme,
                  ) -> torch.Tensor:
    """Integer codes of `x` (float tensor of the grouped shape) for the given scale/zero."""
    g = _grouped(x.float(), scheme)
    q = torch.round(g / scale)
    if zero is not None:
        q = q + zero
    return q.clamp(scheme.qmin, scheme.qmax)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Pack unsigned 4-bit codes (values 0..15, even count) two per byte, low nibble first."""
    flat = q.reshape(-1).to(torch.uint8)
    if flat.numel() % 2:
        raise ValueError(f"int4 packing needs an even number of values, got {flat.numel()}")
    if int(flat.max()) > 15:
        raise ValueError("int4 codes must lie in 0..15")
    return flat[0::2] | (flat[1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_int4`: a flat uint8 tensor of codes 0..15, twice as long."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(-1)


class QuantizedTensor:
    """A tensor held as integer codes + fp32 scales (+ uint8 zero-points), really packed.

    `data` is int8 (symmetric 8-bit), uint8 (asymmetric 8-bit) or uint8 with two 4-bit
    codes per byte (symmetric 4-bit codes are stored offset by +8 to fit 0..15).
    """

    def __init__(self, x: torch.Tensor, scheme: str | Scheme):
        self.scheme = parse_scheme(scheme)
        self.shape = tuple(x.shape)
        self.dtype = x.dtype
        x = x.contiguous()  # codes are stored row-major whatever the source layout ("kn" views)
        scale, zero = scale_zero(x, self.scheme)
        q = fake_quantize(x, scale, zero, self.scheme).reshape(self.shape)
        if self.scheme.bits == 4:
            self.data = pack_int4(q + (8 if self.scheme.symmetric else 0))
        else:
            self.data = q.to(torch.int8 if self.scheme.symmetric else torch.uint8)
        self.scale = scale.contiguous()
        self.zero = None if zero is None else zero.to(torch.uint8)

    def int_codes(self) -> torch.Tensor:
        """The integer codes as int16 in `self.shape` (signed for symmetric schemes)."""
        if self.scheme.bits == 4:
            q = unpack_int4(self.data).to(torch.int16).reshape(self.shape)
            return q - 8 if self.scheme.symmetric else q
        return self.data.to(torch.int16)

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Back to floating point: (q - zero) * scale, in `dtype` (default: the original)."""
        g = _grouped(self.int_codes().float(), self.scheme)
        if self.zero is not None:
            g = g - self.zero.float()
        return (g * self.scale).reshape(self.shape).to(dtype or self.dtype)

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.data, self.scale, self.zero) if t is not None]

    @property
    def nbytes(self) -> int:
        """Bytes actually held: codes + scales + zero-points."""
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def __repr__(self) -> str:
        return f"QuantizedTensor({self.scheme}, shape={self.shape}, nbytes={self.nbytes})"


def quantize(x: torch.Tensor, scheme: str | Scheme = "int8") -> QuantizedTensor:
    """Quantize `x` with `scheme` (round-to-nearest; see the module docstring)."""
    return QuantizedTensor(x, scheme)


def dequantize(qt: QuantizedTensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`qt` back in floating point."""
    return qt.dequantize(dtype)
