"""`QuantLinear` and `quantize_model`: swap a decoder's linears for quantized ones.

Each `QuantLinear` says which matmul path it runs in `.kernel_path`, because the same
int8 bytes can be multiplied in very different ways:

* ``"dequant"``       dequantize the weight to fp32, then ``F.linear`` (always works,
                      exact reference; reads int8 but writes an fp32 copy per call);
* ``"int8pack_bf16"`` ``torch._weight_int8pack_mm``: a real int8 weight-only kernel;
                      on CPU it is only fast with bf16 activations, so x is cast to bf16;
* ``"ao_dynamic"``    torch.ao's dynamic-quantized linear (fbgemm/x86): int8 weights *and*
                      int8 activations quantized per tensor on the fly (W8A8-dynamic);
* ``"int4pack_bf16"`` ``torch._weight_int4pack_mm_for_cpu``: a real group-wise int4
                      weight-only kernel (tinygemm's format) on CPU, bf16 activations; the
                      layer then holds only the kernel's packed codes and bf16 scale/zero
                      pairs. (Its fp32-activation variant measured ~10x slower here.)

Activations can be fake-quantized to int8 (simulated W8A8: the error is real, the
matmul is fp32) with a static per-tensor scale from calibration, static per-channel
scales, or dynamic per-token scales.
"""

from __future__ import annotations

import copy
import fnmatch
import warnings
from typing import Iterable, Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F

from labkit.quant.core import QuantizedTensor, Scheme, parse_scheme, unpack_int4

KERNEL_CHOICES = ("auto", "dequant", "int8pack_bf16", "ao_dynamic", "int4pack_bf16")
ACT_MODES = ("tensor", "channel", "token")

KERNEL_LABELS = {
    "dequant": "dequantize->fp32 F.linear (no low-precision kernel)",
    "int8pack_bf16": "torch._weight_int8pack_mm, int8 weights x bf16 activations",
    "ao_dynamic": "torch.ao dynamic int8 linear (W8A8-dynamic, per-tensor activation scale)",
    "int4pack_bf16": "torch._weight_int4pack_mm_for_cpu, packed int4 weights x bf16 activations",
}


def int4pack_supported(weight: torch.Tensor, scheme: Scheme) -> str | None:
    """None if the CPU int4 kernel can take `weight` (N×K) with `scheme`, else why not."""
    if scheme.bits != 4 or scheme.granularity != "group":
        return f"needs a group-wise int4 scheme, got {scheme}"
    if weight.device.type != "cpu":
        return "the int4 kernel wired here is the CPU one (CUDA's tinygemm layout is not wired)"
    if not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
        return f"torch {torch.__version__} has no _weight_int4pack_mm_for_cpu"
    if weight.shape[0] % 16:
        return f"the kernel needs out_features divisible by 16, got {weight.shape[0]}"
    return None


def fake_quant_act(x: torch.Tensor, mode: str, scale: torch.Tensor | None = None) -> torch.Tensor:
    """Round `x` to a symmetric int8 grid and back. `mode`: "tensor" / "channel" use the
    static `scale` (a scalar / one per input channel, from calibration; values beyond
    127·scale clip); "token" computes one scale per row on the fly."""
    if mode == "token":
        scale = (x.detach().abs().amax(-1, keepdim=True) / 127).clamp_min(1e-12)
    elif mode not in ACT_MODES:
        raise ValueError(f"activation mode {mode!r} not allowed; choose one of {ACT_MODES}")
    elif scale is None:
        raise ValueError(f"activation mode {mode!r} needs a calibrated scale")
    return torch.clamp(torch.round(x / scale), -127, 127) * scale


class QuantLinear(nn.Module):
    """A bias-free linear layer whose weight is held quantized (see the module docstring)."""

    def __init__(self, weight: torch.Tensor, scheme: str | Scheme = "int8", kernel: str = "auto",
                 act_mode: str | None = None, act_scale: torch.Tensor | None = None):
        super().__init__()
        if kernel not in KERNEL_CHOICES:
            raise ValueError(f"kernel={kernel!r} not allowed; choose one of {KERNEL_CHOICES}")
        self.scheme = parse_scheme(scheme)
        self.out_features, self.in_features = weight.shape
        self.qweight = QuantizedTensor(weight.detach(), self.scheme)
        int8_channel = self.scheme.bits == 8 and self.scheme.granularity == "channel" and self.scheme.symmetric
        int4_why_not = int4pack_supported(weight, self.scheme)
        if kernel == "auto":
            kernel = ("dequant" if act_mode is not None else "int8pack_bf16" if int8_channel
                      else "int4pack_bf16" if int4_why_not is None else "dequant")
        if kernel == "int4pack_bf16" and (int4_why_not or act_mode is not None):
            raise ValueError(f"kernel='int4pack_bf16' unavailable: {int4_why_not or 'weight-only only'}")
        if kernel in ("int8pack_bf16", "ao_dynamic") and not (int8_channel and act_mode is None):
            raise ValueError(f"kernel={kernel!r} needs weight-only symmetric per-channel int8; "
                             f"use 'dequant' for scheme {self.scheme}")
        self.kernel = kernel
        self.act_mode, self.act_scale = act_mode, act_scale
        if act_mode is not None and act_mode not in ACT_MODES:
            raise ValueError(f"act_mode={act_mode!r} not allowed; choose one of {ACT_MODES} or None")
        if kernel == "int4pack_bf16":
            self._pack_int4()
            return
        # Register the stored tensors so state_dict/bytes accounting sees exactly them.
        for name, t in (("q_data", self.qweight.data), ("q_scale", self.qweight.scale),
                        ("q_zero", self.qweight.zero)):
            self.register_buffer(name, t)
        if kernel == "int8pack_bf16":
            self._scale_bf16 = self.qweight.scale.reshape(-1).to(torch.bfloat16)
        elif kernel == "ao_dynamic":
            self._ao = self._build_ao()

    def _pack_int4(self) -> None:
        """Re-express our codes in the kernel's format and drop the generic copy.

        tinygemm dequantizes w = (u − 8)·scale + zero for unsigned codes u in 0..15. Ours:
        symmetric u = q + 8, w = q·scale → zero = 0; asymmetric w = (u − z)·scale →
        zero = (8 − z)·scale. Scale/zero pairs are laid out (K/G, N, 2) in bf16."""
        qt, N, K = self.qweight, self.out_features, self.in_features
        codes = unpack_int4(qt.data).reshape(N, K).to(torch.int32)
        scale = qt.scale.reshape(N, -1)
        zero = torch.zeros_like(scale) if qt.zero is None else (8 - qt.zero.reshape(N, -1).float()) * scale
        self.register_buffer("q_packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1))
        self.register_buffer("q_scale_zero", torch.stack((scale, zero), -1).transpose(0, 1)
                             .contiguous().to(torch.bfloat16))
        self.qweight = None  # the kernel's copy is the only one held

    def _build_ao(self) -> nn.Module:
        """torch.ao's dynamic int8 linear holding exactly our int8 codes and scales."""
        from torch.ao.nn.quantized.dynamic import Linear as DynLinear

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.ao quantization is deprecated upstream
            mod = DynLinear(self.in_features, self.out_features, bias_=False, dtype=torch.qint8)
            scales = self.qweight.scale.reshape(-1).double()
            qw = torch._make_per_channel_quantized_tensor(
                self.qweight.data, scales, torch.zeros_like(scales, dtype=torch.long), 0)
            mod.set_weight_bias(qw, None)
        return mod

    @property
    def kernel_path(self) -> str:
        """Which matmul really runs, in words."""
        if self.act_mode is not None:
            return (f"simulated W8A8: fake-quant int8 activations ({self.act_mode}) x dequantized "
                    f"{self.scheme} weights, fp32 matmul")
        return f"{self.scheme}: {KERNEL_LABELS[self.kernel]}"

    @property
    def nbytes(self) -> int:
        """Bytes of the stored weight (codes + scales + zero-points)."""
        if self.kernel == "int4pack_bf16":
            return sum(t.numel() * t.element_size() for t in (self.q_packed, self.q_scale_zero))
        return self.qweight.nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel == "int8pack_bf16":
            y = torch._weight_int8pack_mm(x.reshape(-1, self.in_features).to(torch.bfloat16),
                                          self.qweight.data, self._scale_bf16)
            return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        if self.kernel == "int4pack_bf16":
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x.reshape(-1, self.in_features).to(torch.bfloat16), self.q_packed,
                self.scheme.group_size, self.q_scale_zero)
            return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        if self.kernel == "ao_dynamic":
            return self._ao(x)
        if self.act_mode is not None:
            x = fake_quant_act(x, self.act_mode, self.act_scale)
        return F.linear(x, self.qweight.dequantize(x.dtype))

    def extra_repr(self) -> str:
        return f"{self.in_features}->{self.out_features}, {self.kernel_path}, {self.nbytes} B"


def _match(name: str, keep: Mapping[str, str | None]) -> tuple[bool, str | None]:
    for pattern, scheme in keep.items():
        if fnmatch.fnmatchcase(name, pattern):
            return True, scheme
    return False, None


def quantize_model(model: nn.Module, scheme: str | Scheme = "int8",
                   keep: Mapping[str, str | None] | Iterable[str] | None = None, *,
                   kernel: str = "auto", act_mode: str | None = None,
                   act_scales: Mapping[str, torch.Tensor] | None = None,
                   inplace: bool = False) -> nn.Module:
    """Replace every ``nn.Linear`` of `model` by a `QuantLinear` with `scheme`.

    `keep` maps module-name patterns (fnmatch, e.g. ``"output"``, ``"layers.0.*"``) to a
    different scheme string, or to None to keep that layer in its original precision;
    a plain list of patterns means "keep these". `act_mode` adds simulated int8
    activations ("tensor"/"channel" need `act_scales[name]` from `calibrate`).
    Works on the decoder's "nk" and "kn" weight layouts alike (the logical N×K weight is
    quantized). Returns a copy unless `inplace`.
    """
    parse_scheme(scheme)  # fail early on a bad scheme
    keep = {} if keep is None else (dict(keep) if isinstance(keep, Mapping) else {p: None for p in keep})
    for s in keep.values():
        if s is not None:
            parse_scheme(s)
    if not inplace:
        model = copy.deepcopy(model)
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError("model has no nn.Linear layers to quantize")
    for name, lin in linears:
        kept, alt = _match(name, keep)
        if kept and alt is None:
            continue
        if act_mode in ("tensor", "channel") and (act_scales is None or name not in act_scales):
            raise ValueError(f"act_mode={act_mode!r} needs act_scales for layer {name!r} (see calibrate)")
        q = QuantLinear(lin.weight, alt if kept else scheme, kernel=kernel if not kept else "auto",
                        act_mode=act_mode, act_scale=None if act_scales is None else act_scales.get(name))
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, q)
    return model


def kernel_paths(model: nn.Module) -> dict[str, int]:
    """How many layers run each matmul path (fp layers listed by dtype)."""
    out: dict[str, int] = {}
    for m in model.modules():
        if isinstance(m, QuantLinear):
            key = m.kernel_path
        elif isinstance(m, nn.Linear):
            key = f"{str(m.weight.dtype).replace('torch.', '')} F.linear (not quantized)"
        else:
            continue
        out[key] = out.get(key, 0) + 1
    return out


def model_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer the model holds (shared storage counted once).

    Note: the "ao_dynamic" path also holds torch.ao's prepacked copy of the int8 weight,
    which is not a registered tensor and is not counted here.
    """
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total
