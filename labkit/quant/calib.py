"""Activation calibration, planted outliers and SmoothQuant-style repair.

Calibration runs the float model over windows of the *training* text (never the
validation text the perplexity is measured on) and records, for every linear layer's
input, the per-channel maximum |x| and a random sample of values. From those a
per-tensor int8 clipping range is chosen:

* ``"minmax"``  the largest |x| seen (no clipping, coarsest grid);
* ``"p99.9"``, ``"p99.99"`` that percentile of |x| (clips rare large values);
* ``"mse"``     the clip that minimises the mean squared fake-quantization error on the sample.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
import torch.nn as nn

CALIB_METHODS = ("minmax", "p99.9", "p99.99", "mse")


@dataclasses.dataclass
class ActStats:
    """Input statistics of one linear layer: per-channel max |x| and a value sample."""

    channel_amax: torch.Tensor
    sample: torch.Tensor


def collect_act_stats(model: nn.Module, ids: torch.Tensor, n_windows: int = 8, ctx: int = 256,
                      max_samples: int = 200_000, seed: int = 0) -> dict[str, ActStats]:
    """Run `model` on `n_windows` windows of `ctx` tokens from `ids` and record the inputs
    of every ``nn.Linear`` (keyed by module name)."""
    ids = torch.as_tensor(ids, dtype=torch.long).flatten()
    if ids.numel() < n_windows * ctx:
        raise ValueError(f"calibration needs {n_windows * ctx} tokens, got {ids.numel()}")
    gen = torch.Generator().manual_seed(seed)
    amax: dict[str, torch.Tensor] = {}
    samples: dict[str, list[torch.Tensor]] = {}
    per_call = max(1, max_samples // n_windows)

    def hook(name):
        def record(_mod, args):
            x = args[0].detach().float().reshape(-1, args[0].shape[-1])
            a = x.abs().amax(0)
            amax[name] = a if name not in amax else torch.maximum(amax[name], a)
            flat = x.reshape(-1)
            pick = torch.randint(0, flat.numel(), (min(per_call, flat.numel()),), generator=gen)
            samples.setdefault(name, []).append(flat[pick])
        return record

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in model.named_modules()
               if isinstance(m, nn.Linear)]
    try:
        with torch.inference_mode():
            windows = ids[: n_windows * ctx].reshape(n_windows, ctx)
            for w in windows.split(4):
                model(w.to(model.device))
    finally:
        for h in handles:
            h.remove()
    return {n: ActStats(amax[n], torch.cat(samples[n])) for n in amax}


def clip_value(stats: ActStats, method: str) -> float:
    """The per-tensor clipping value |x|max (same units as the activations) for `method`."""
    a = stats.sample.abs()
    if method == "minmax":
        return float(stats.channel_amax.max())
    if method in ("p99.9", "p99.99"):
        return float(torch.quantile(a[:16_000_000], float(method[1:]) / 100))
    if method == "mse":
        top = float(stats.channel_amax.max())
        best, best_err = top, float("inf")
        for frac in torch.linspace(0.05, 1.0, 40).tolist():  # a grid search is plenty here
            s = top * frac / 127
            err = float(((torch.clamp(torch.round(stats.sample / s), -127, 127) * s - stats.sample) ** 2).mean())
            if err < best_err:
                best, best_err = top * frac, err
        return best
    raise ValueError(f"calibration method {method!r} not allowed; choose one of {CALIB_METHODS}")


def calibrate(stats: dict[str, ActStats], method: str = "minmax", mode: str = "tensor") -> dict[str, torch.Tensor]:
    """Static int8 activation scales per layer: `mode` "tensor" gives one scale from
    `method`; "channel" gives one scale per input channel from that channel's max |x|."""
    if method not in CALIB_METHODS:
        raise ValueError(f"calibration method {method!r} not allowed; choose one of {CALIB_METHODS}")
    if mode == "channel":
        return {n: (s.channel_amax / 127).clamp_min(1e-12) for n, s in stats.items()}
    if mode != "tensor":
        raise ValueError(f"static calibration mode {mode!r} not allowed; choose one of ('tensor', 'channel')")
    return {n: torch.tensor(max(clip_value(s, method), 1e-12) / 127) for n, s in stats.items()}


def _norm_linear_pairs(model: nn.Module):
    """(RMSNorm, linear that reads its output) pairs, where channel scaling is exact."""
    for layer in model.layers:
        yield layer.attention_norm, layer.attention.wqkv
        yield layer.ffn_norm, layer.feed_forward.w13


@torch.no_grad()
def _rescale(norm: nn.Module, lin: nn.Linear, s: torch.Tensor) -> None:
    """Multiply the norm's output channels by `s` and the linear's input columns by 1/s:
    RMSNorm(x)·s then W/s gives the same product, so the model's function is unchanged."""
    norm.weight.mul_(s)
    lin.weight.mul_(1.0 / s)  # in place: keeps the "kn" storage layout


def plant_outliers(model: nn.Module, n_channels: int = 4, factor: float = 50.0, seed: int = 0) -> nn.Module:
    """A copy of `model` whose norm->linear activations have `n_channels` outlier channels,
    `factor` times larger, with the function unchanged (the linear's columns are divided
    by `factor`). Real LLMs grow such channels in training; the tiny model has none."""
    if factor <= 0 or n_channels < 1:
        raise ValueError(f"need factor > 0 and n_channels >= 1, got {factor}, {n_channels}")
    model = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    for norm, lin in _norm_linear_pairs(model):
        s = torch.ones(lin.in_features)
        s[torch.randperm(lin.in_features, generator=gen)[:n_channels]] = factor
        _rescale(norm, lin, s.to(norm.weight))
    return model


def smooth(model: nn.Module, stats: dict[str, ActStats], alpha: float = 0.5) -> nn.Module:
    """SmoothQuant: a copy of `model` with activation scale migrated into the weights,
    s_c = max|X_c|^alpha / max|W_c|^(1-alpha) per input channel c (alpha in [0, 1])."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha={alpha} must lie in [0, 1]")
    model = copy.deepcopy(model)
    names = {m: n for n, m in model.named_modules()}
    for norm, lin in _norm_linear_pairs(model):
        xa = stats[names[lin]].channel_amax.clamp_min(1e-5)
        wa = lin.weight.detach().abs().amax(0).float().clamp_min(1e-5)
        s = (xa ** alpha / wa ** (1 - alpha)).clamp_min(1e-5)
        _rescale(norm, lin, (1.0 / s).to(norm.weight))
    return model
