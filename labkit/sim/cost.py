"""Cost models: how long one engine step takes.

    step_time(decode_batch, prefill_tokens, context_tokens) -> seconds

decode_batch: sequences producing one token this step; prefill_tokens: prompt tokens
processed this step; context_tokens: KV-cache tokens the step's attention reads (all
sequences in the step). Three sources, one interface:

* `LinearCost`  t = base + per_seq·B + per_prefill_token·P + per_context_token·C.
  With only `base` it is the constant model the queueing-theory checks use; fitted by
  least squares to measured rows (`LinearCost.fit`), it is the calibrated model.
* `RooflineCost` the analytic roofline of a decoder on one `data/hardware.csv` row:
  t = max(FLOPs / peak, bytes / bandwidth) + overhead.
* `labkit.sim.stepcost.StepCost` the per-step model (Vidur-style): model passes interpolated
  from a grid measured on the engine alone, plus the engine's measured overhead per step.
All models round-trip through JSON (`save` / `load`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np


class CostModel(Protocol):
    name: str

    def step_time(self, decode_batch: int, prefill_tokens: int, context_tokens: int) -> float: ...

    def to_dict(self) -> dict[str, Any]: ...


@dataclasses.dataclass(frozen=True)
class LinearCost:
    """t (s) = base + per_seq·B + per_prefill_token·P + per_context_token·C; all coefficients ≥ 0."""

    base: float = 0.0
    per_seq: float = 0.0
    per_prefill_token: float = 0.0
    per_context_token: float = 0.0
    name: str = "linear"
    source: str = ""

    def __post_init__(self) -> None:
        for f in ("base", "per_seq", "per_prefill_token", "per_context_token"):
            if not getattr(self, f) >= 0:
                raise ValueError(f"LinearCost.{f} must be >= 0 s, got {getattr(self, f)!r}")
        if self.base + self.per_seq + self.per_prefill_token == 0:
            raise ValueError("a step must cost something: set base, per_seq or per_prefill_token > 0")

    def step_time(self, decode_batch: int, prefill_tokens: int, context_tokens: int) -> float:
        return (self.base + self.per_seq * decode_batch + self.per_prefill_token * prefill_tokens
                + self.per_context_token * context_tokens)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "linear", **dataclasses.asdict(self)}

    @classmethod
    def fit(cls, rows: Sequence[Sequence[float]], name: str = "fitted", source: str = "") -> "LinearCost":
        """Least-squares fit to measured rows (decode_batch, prefill_tokens, context_tokens, seconds).

        Coefficients are fitted non-negative (a feature whose coefficient would be negative
        is dropped and the fit repeated), so the model never predicts faster steps for more work.
        """
        a = np.asarray(rows, dtype=float)
        if a.ndim != 2 or a.shape[1] != 4 or len(a) < 4:
            raise ValueError(f"need >= 4 rows of (batch, prefill_tokens, context_tokens, seconds); got shape {a.shape}")
        x = np.column_stack([np.ones(len(a)), a[:, :3]])
        keep = [0, 1, 2, 3]
        while True:
            coef, *_ = np.linalg.lstsq(x[:, keep], a[:, 3], rcond=None)
            if coef.min() >= 0 or len(keep) == 1:
                break
            keep.pop(int(np.argmin(coef)))
        full = np.zeros(4)
        full[keep] = np.maximum(coef, 0)
        if full[:3].sum() == 0:
            full[0] = float(a[:, 3].mean())
        return cls(*map(float, full), name=name, source=source)

    def residuals(self, rows: Sequence[Sequence[float]]) -> np.ndarray:
        """Relative error (predicted / measured − 1) per row."""
        a = np.asarray(rows, dtype=float)
        pred = np.array([self.step_time(*r[:3]) for r in a])
        return pred / a[:, 3] - 1


def constant(seconds: float) -> LinearCost:
    """Every step takes `seconds`, whatever is in it (queueing-theory checks)."""
    return LinearCost(base=seconds, name="constant")


@dataclasses.dataclass(frozen=True)
class RooflineCost:
    """Analytic step time of a Llama-style decoder on one hardware row.

    FLOPs = 2·(non-embedding params)·(B + P) + 2·d·vocab·(logit rows) + 4·layers·heads·head_dim·C
    bytes = weights + KV bytes per token·(C + B + P) (read the cache, write new entries)
    t = max(FLOPs / (peak·efficiency), bytes / (bandwidth·efficiency)) + overhead_s.
    `efficiency` is the fraction of datasheet ceilings a real engine reaches.
    """

    layers: int
    d_model: int
    heads: int
    kv_heads: int
    head_dim: int
    d_ff: int
    vocab: int
    peak_flops: float
    bandwidth: float
    dtype_bytes: int = 2
    efficiency: float = 0.6
    overhead_s: float = 0.0
    name: str = "roofline"
    source: str = ""

    @classmethod
    def for_hardware(cls, hardware: str, model: str = "8b", dtype: str = "bf16", efficiency: float = 0.6,
                     overhead_s: float = 0.0, label: str = "Llama-3-8B") -> "RooflineCost":
        """The roofline model of decoder preset `model` (a `labkit.model.config` preset: "8b" is
        Llama-3-8B-shaped; `label` names it) on the `data/hardware.csv` row named `hardware`."""
        from labkit import dtypes, roofline
        from labkit.model.config import get_config

        c = get_config(model)
        roof = roofline.Roofline.from_hardware(roofline.hardware(hardware))
        return cls(c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.hidden_dim, c.vocab_size,
                   roof.peak(dtype), roof.bandwidth, dtypes.nbytes(dtype), efficiency, overhead_s,
                   name=f"roofline {roof.name} {label} {dtype}", source=roof.source)

    @property
    def params(self) -> int:
        """Parameters in the transformer blocks (embedding/LM head counted separately)."""
        attn = self.d_model * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return self.layers * (attn + 3 * self.d_model * self.d_ff + 2 * self.d_model)

    @property
    def weight_bytes(self) -> float:
        return (self.params + 2 * self.vocab * self.d_model) * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def flops_bytes(self, decode_batch: int, prefill_tokens: int, context_tokens: int) -> tuple[float, float]:
        """(FLOPs, bytes moved) of one step."""
        tokens = decode_batch + prefill_tokens
        logit_rows = decode_batch + (1 if prefill_tokens else 0)
        flops = (2 * self.params * tokens + 2 * self.d_model * self.vocab * logit_rows
                 + 4 * self.layers * self.heads * self.head_dim * context_tokens)
        nbytes = self.weight_bytes + self.kv_bytes_per_token * (context_tokens + tokens)
        return flops, nbytes

    def step_time(self, decode_batch: int, prefill_tokens: int, context_tokens: int) -> float:
        if decode_batch + prefill_tokens == 0:
            return self.overhead_s
        flops, nbytes = self.flops_bytes(decode_batch, prefill_tokens, context_tokens)
        return max(flops / self.peak_flops, nbytes / self.bandwidth) / self.efficiency + self.overhead_s

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "roofline", **dataclasses.asdict(self)}


_KINDS = {"linear": LinearCost, "roofline": RooflineCost}


def from_dict(d: dict[str, Any]) -> CostModel:
    """Rebuild a cost model from `to_dict()` output."""
    d = dict(d)
    kind = d.pop("kind", None)
    if kind == "step":  # the per-step model nests its measured profile
        from labkit.sim.stepcost import StepCost

        return StepCost.from_dict(d)
    if kind not in _KINDS:
        raise ValueError(f"cost model kind {kind!r} unknown; choose one of {', '.join([*_KINDS, 'step'])}")
    return _KINDS[kind](**d)


def save(model: CostModel, path: str | Path, **extra: Any) -> Path:
    """Write `model` (and any `extra` metadata, e.g. the measured rows) as JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"model": model.to_dict(), **extra}, indent=1))
    return path


def load(path: str | Path) -> CostModel:
    """Read a cost model saved with `save`."""
    return from_dict(json.loads(Path(path).read_text())["model"])
