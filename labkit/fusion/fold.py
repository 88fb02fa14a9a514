"""Conv + BatchNorm folding (claim C8).

In eval mode BatchNorm is an affine map per output channel,
``y = (x - mean) / sqrt(var + eps) * gamma + beta``, applied to the conv's output. A
per-channel affine after a linear op folds into the op's weights:

    W' = W * s            (s = gamma / sqrt(var + eps), broadcast over each out-channel)
    b' = (b - mean) * s + beta     (b = 0 when the conv has no bias)

so conv -> bn becomes one conv: one kernel, one read and one write of the activation
instead of two of each. A ReLU after it stays a separate op unless a compiler fuses it
into the conv's epilogue.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def fold_conv_bn(conv: nn.Module, bn: nn.Module) -> nn.Module:
    """One conv equal to ``bn(conv(x))`` with `bn` in eval mode (its running statistics).

    Returns a new module of `conv`'s type (always with a bias); `conv` and `bn` are
    left untouched. Raises ValueError for a non-conv/non-BatchNorm argument, mismatched
    channels, or a BatchNorm without running statistics.
    """
    if not isinstance(conv, _CONVS):
        raise ValueError(f"conv must be one of {[c.__name__ for c in _CONVS]}, got {type(conv).__name__}")
    if not isinstance(bn, nn.modules.batchnorm._BatchNorm):
        raise ValueError(f"bn must be a BatchNorm1d/2d/3d, got {type(bn).__name__}")
    if bn.num_features != conv.out_channels:
        raise ValueError(f"bn.num_features={bn.num_features} must equal conv.out_channels={conv.out_channels}")
    if bn.running_mean is None or bn.running_var is None:
        raise ValueError("bn has no running statistics (track_running_stats=False): nothing to fold")
    fused = copy.deepcopy(conv)
    with torch.no_grad():
        # fold in float64 so the folded weights carry no more rounding than one fp32 op
        w = conv.weight.double()
        mean, var = bn.running_mean.double(), bn.running_var.double()
        gamma = bn.weight.double() if bn.weight is not None else torch.ones_like(mean)
        beta = bn.bias.double() if bn.bias is not None else torch.zeros_like(mean)
        scale = gamma / torch.sqrt(var + bn.eps)
        bias = conv.bias.double() if conv.bias is not None else torch.zeros_like(mean)
        fused.weight = nn.Parameter((w * scale.reshape(-1, *([1] * (w.dim() - 1)))).to(conv.weight.dtype))
        fused.bias = nn.Parameter(((bias - mean) * scale + beta).to(conv.weight.dtype))
    return fused


class ConvBNReLU(nn.Sequential):
    """A small CNN block: conv -> BatchNorm -> ReLU (the pattern C8 is about)."""

    def __init__(self, in_ch: int, out_ch: int, kernel_size: int = 3, *, stride: int = 1,
                 groups: int = 1, bias: bool = False):
        super().__init__(nn.Conv2d(in_ch, out_ch, kernel_size, stride=stride, padding=kernel_size // 2,
                                   groups=groups, bias=bias),
                         nn.BatchNorm2d(out_ch), nn.ReLU(inplace=True))


def fold_block(block: nn.Sequential) -> nn.Sequential:
    """`block` with every conv directly followed by a BatchNorm replaced by one folded conv."""
    mods = list(block)
    out: list[nn.Module] = []
    i = 0
    while i < len(mods):
        if i + 1 < len(mods) and isinstance(mods[i], _CONVS) and isinstance(mods[i + 1], nn.modules.batchnorm._BatchNorm):
            out.append(fold_conv_bn(mods[i], mods[i + 1]))
            i += 2
        else:
            out.append(mods[i])
            i += 1
    return nn.Sequential(*out)


def conv_act_fusable(device: torch.device | str = "cpu") -> tuple[bool, str]:
    """(usable, reason): a conv with the activation in its epilogue, one op, exists on CPUs
    with oneDNN (``mkldnn::_convolution_pointwise``, what inductor's freezing pass emits)."""
    kind = torch.device(device).type
    if kind != "cpu":
        return False, f"no fused conv+activation op wired up for {kind} here"
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_convolution_pointwise"):
        return False, "this torch build has no oneDNN fused conv (mkldnn::_convolution_pointwise)"
    return True, "oneDNN conv with a ReLU epilogue (mkldnn::_convolution_pointwise)"


class FusedConvReLU(nn.Module):
    """``relu(conv2d(x))`` as one oneDNN op: the conv writes its output with the ReLU applied,
    so the activation makes one trip to memory instead of two."""

    def __init__(self, conv: nn.Conv2d):
        super().__init__()
        if not isinstance(conv, nn.Conv2d) or conv.bias is None:
            raise ValueError(f"need an nn.Conv2d with a bias (a folded one), got {type(conv).__name__}")
        self.conv = conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.conv
        return torch.ops.mkldnn._convolution_pointwise(x.contiguous(), c.weight, c.bias, list(c.padding),
                                                       list(c.stride), list(c.dilation), c.groups, "relu", [], "")


def fold_and_fuse(block: nn.Sequential) -> tuple[nn.Module, bool]:
    """A ConvBNReLU-style `block` (conv, BatchNorm, ReLU) in eval mode as one op where the
    device allows: BN folded into the conv (`fold_block`), then the ReLU moved into the conv's
    epilogue (`FusedConvReLU`). Returns (module, activation fused?); without a fused op the
    module is the folded conv followed by the ReLU (two ops)."""
    folded = fold_block(block).eval()
    mods = list(folded)
    dev = mods[0].weight.device
    ok, _ = conv_act_fusable(dev)
    if ok and len(mods) == 2 and isinstance(mods[0], nn.Conv2d) and isinstance(mods[1], nn.ReLU):
        return FusedConvReLU(mods[0]).eval(), True
    return folded, False


def randomize_bn(bn: nn.Module, generator: torch.Generator | None = None) -> nn.Module:
    """Give `bn` non-trivial running statistics and affine weights (a fresh BatchNorm is
    the identity in eval mode, which would make any folding test pass vacuously)."""
    with torch.no_grad():
        n = bn.num_features
        bn.running_mean.copy_(torch.randn(n, generator=generator))
        bn.running_var.copy_(torch.rand(n, generator=generator) * 2 + 0.1)
        if bn.weight is not None:
            bn.weight.copy_(torch.randn(n, generator=generator))
            bn.bias.copy_(torch.randn(n, generator=generator))
    return bn


def time_conv_block(*, batch: int = 8, channels: int = 32, hw: int = 56, repeat: int = 10,
                    seed: int = 0) -> dict[str, float]:
    """Median seconds of a ConvBNReLU block in eval mode, unfolded vs folded, their
    kernel counts, and the max |difference| of their outputs. Input (batch, channels, hw, hw)."""
    from labkit.fusion.count import count_ops
    from labkit.timing import measure

    torch.manual_seed(seed)
    block = ConvBNReLU(channels, channels).eval()
    randomize_bn(block[1])
    folded = fold_block(block).eval()
    x = torch.randn(batch, channels, hw, hw)
    with torch.inference_mode():
        err = float((block(x) - folded(x)).abs().max())
        out = {"max_error": err}
        for name, mod in (("unfolded", block), ("folded", folded)):
            out[f"{name}_s"] = measure(lambda: mod(x), warmup=2, repeat=repeat).median
            out[f"{name}_kernels"] = count_ops(lambda: mod(x), warmup=0).kernels
    return out
