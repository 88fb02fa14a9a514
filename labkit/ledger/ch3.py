"""Chapter 3's claims: the eager per-op cost (C6), fusion (C7), Conv+BN+activation folding
(C8) and memory without autograd (C9).

C6 fits the time of one eager op against its work (elements) and takes the intercept as the
fixed cost per op; the ops of one decode step of the trained tiny decoder are counted, the
fixed cost's share predicted (ops x intercept), and the step timed. C7 compiles two memory-bound elementwise chains with
``torch.compile`` (one compile each), counts the ATen graph nodes inductor is handed and the
kernels that run, and times eager vs fused. C8 folds BatchNorm into the conv and the ReLU
into the conv's epilogue (oneDNN's fused conv on CPU), then compares outputs on random
inputs and counts ops. C9 reads the peak tensor bytes of one decoder forward with autograd
on and under inference_mode.
"""

from __future__ import annotations

from typing import Any, Mapping

from labkit import presets
from labkit.fusion import elementwise, memory
from labkit.fusion import experiments as fx
from labkit.ledger.verdict import Prediction, Verdict, decide, distance_from_range, inconclusive, settle
from labkit.model import Transformer, load_tiny

# C6: "a large share" = at least half of the eager time is the per-op cost (measured <= 2x
# the prediction); the prediction is confirmed when the chain is not much faster than
# ops x cost either (measured >= CONFIRM_LO x predicted).
LARGE_SHARE, CONFIRM_LO = 0.5, 2 / 3
# C7: graph nodes "to a third or fewer"; latency cut "by 20-40 %".
NODE_CUT, CUT_BAND = 3.0, (0.20, 0.40)
# C8: "the same result": allclose with these tolerances, relative to the output's scale
# (fp32 rounding of a re-ordered sum is ~1e-6; a wrong fold is off by O(1)).
RTOL, ATOL_REL = 1e-4, 1e-4
# C9: "lowers peak memory": inference_mode's peak at most 2/3 of training mode's. Bytes are
# counted, not timed, so a smaller margin would not be noise; a third is a visible saving.
MEM_GAIN = 1.5


# ------------------------------------------------------------------------------- C6
# The intercept is a fixed cost only if time grows linearly with work: R^2 of the fit.
FIT_R2 = 0.9


def predict_c6(n_ops: int, per_op_s: float) -> Prediction:
    """A model step of `n_ops` eager ops pays `n_ops` x `per_op_s` (s: the fixed cost per op,
    the intercept of time vs work) whatever its arithmetic."""
    if n_ops < 1 or per_op_s <= 0:
        raise ValueError(f"need n_ops >= 1 and per_op_s > 0, got n_ops={n_ops}, per_op_s={per_op_s}")
    pred = n_ops * per_op_s
    return Prediction.of("C6", f"{n_ops} ops x {per_op_s * 1e6:.2f} µs fixed cost per op = {pred * 1e3:.2f} ms of "
                               "every step is launch cost; it is a large share if the step takes under "
                               f"{pred / LARGE_SHARE * 1e3:.2f} ms",
                         ops=(n_ops, ""), **{"per-op cost": (per_op_s * 1e6, "µs"), "predicted": (pred * 1e3, "ms")})


def judge_c6(prediction: Prediction, counted_ops: int, measured_s: float, fit: dict[str, Any] | None = None) -> Verdict:
    """`counted_ops`: ops the profiler saw in one model step; `measured_s`: its time (s);
    `fit`: `fixed_cost_fit`'s line (its R^2 says whether a fixed cost was separable from work)."""
    predicted_s = prediction.values["predicted"].value / 1e3
    ratio = measured_s / predicted_s
    share = min(1 / ratio, 1.0)
    ev: dict[str, Any] = {"counted ops": (counted_ops, ""), "measured": (measured_s * 1e3, "ms"),
                          "measured / fixed cost": (ratio, "x"), "fixed-cost share": (100 * share, "%")}
    tol = (f"fixed-cost share (ops x intercept / step time) >= {100 * LARGE_SHARE:.0f}% ('a large share'); the step "
           f">= {CONFIRM_LO:.2f}x ops x intercept; the time-vs-work fit R^2 >= {FIT_R2}")
    if fit is not None:
        ev["fit R^2"] = (fit["r2"], "")
        ev["cost per element"] = (fit["slope_s_per_element"] * 1e9, "ns")
        if fit["r2"] < FIT_R2 or fit["intercept_s"] <= 0:
            return inconclusive(prediction, f"op time did not grow linearly with work (R^2 {fit['r2']:.2f}, "
                                            f"intercept {fit['intercept_s'] * 1e6:.2f} µs): no fixed cost to "
                                            "separate here", ev, tol)
    problems = []
    if share < LARGE_SHARE:
        problems.append(f"the fixed cost per op explains only {100 * share:.0f}% of the step: its ops' own work "
                        "dominates")
    if ratio < CONFIRM_LO:
        problems.append(f"the step ran {1 / ratio:.1f}x faster than ops x fixed cost: the fitted cost does not "
                        "describe these ops")
    return settle(prediction, problems,
                  why_holds=f"{counted_ops} ops x the fixed cost are {100 * share:.0f}% of the step's time",
                  evidence=ev, tolerance=tol)


def run_c6(size: str = "smoke", device: Any = None) -> Verdict:
    """C6 for `labkit ledger`: the fixed cost per op fitted (intercept of time vs work), the ops
    of one decode step of the trained tiny decoder counted, the prediction, then the step timed."""
    dev = device or "cpu"
    P = presets.sizes("fusion", size, dev)
    fit = fx.fixed_cost_fit(dev)
    step = fx.decode_step(load_tiny(dev), P["decode_context"])
    ops = fx.count_step_ops(step, dev)
    pred = predict_c6(ops, max(fit["intercept_s"], 1e-12))
    return judge_c6(pred, ops, fx.measure_c6_step(step, dev), fit)


# ------------------------------------------------------------------------------- C7
def predict_c7(numel: int, itemsize: int = 4) -> Prediction:
    """From the chains' traffic models: bytes eager vs fused and the cut in time if both run
    at one bandwidth; the claim's own numbers beside them."""
    vals: dict[str, Any] = {}
    cuts = []
    for chain in elementwise.CHAINS:
        e, f = (elementwise.traffic_bytes(chain, v, numel, itemsize) for v in ("eager", "fused"))
        cuts.append(1 - f / e)
        vals[f"{chain} bytes cut"] = (100 * (1 - f / e), "%")
    return Prediction.of("C7", f"fusing each chain into one kernel leaves <= 1/{NODE_CUT:g} of its graph nodes; bytes "
                               f"alone would cut its time by {100 * min(cuts):.0f}-{100 * max(cuts):.0f}%, the claim "
                               f"says {100 * CUT_BAND[0]:.0f}-{100 * CUT_BAND[1]:.0f}%",
                         **vals, elements=(numel, ""))


def judge_c7(prediction: Prediction, chains: Mapping[str, Mapping[str, float]] | None,
             failure: str = "") -> Verdict:
    """`chains`: per chain {"aten_nodes", "eager_kernels", "fused_kernels", "eager_s", "fused_s"}
    (s, median); None with `failure` when no compiler worked here."""
    tol = (f"every chain's graph nodes / fused kernels >= {NODE_CUT:g}; mean latency cut in "
           f"{100 * CUT_BAND[0]:.0f}-{100 * CUT_BAND[1]:.0f}%")
    if not chains:
        return inconclusive(prediction, failure or "no chain was compiled", tolerance=tol)
    ev: dict[str, Any] = {}
    node_cuts, cuts = {}, []
    for name, c in chains.items():
        node_cuts[name] = c["aten_nodes"] / max(c["fused_kernels"], 1)
        cuts.append(1 - c["fused_s"] / c["eager_s"])
        ev[f"{name} nodes -> kernels"] = (f"{c['aten_nodes']:.0f} -> {c['fused_kernels']:.0f} "
                                          f"(eager {c['eager_kernels']:.0f})", "")
        ev[f"{name} cut"] = (100 * cuts[-1], "%")
    cut = sum(cuts) / len(cuts)
    dist = distance_from_range(cut, *CUT_BAND)
    ev["mean cut"] = (100 * cut, "%")
    ev["distance from 20-40%"] = (100 * dist, "points")
    problems = [f"{n}: graph nodes fell only {r:.1f}x" for n, r in node_cuts.items() if r < NODE_CUT]
    if dist < 0:
        problems.append(f"fusion cut latency by {100 * cut:.0f}%, {100 * -dist:.0f} points short of the claim's 20%")
    elif dist > 0:
        problems.append(f"fusion cut latency by {100 * cut:.0f}%, {100 * dist:.0f} points more than the claim's 40%")
    return settle(prediction, problems,
                  why_holds=f"graph nodes fell {min(node_cuts.values()):.0f}x or more and latency by {100 * cut:.0f}%",
                  evidence=ev, tolerance=tol)


def run_c7(size: str = "smoke", device: Any = None) -> Verdict:
    """C7 for `labkit ledger`: both chains at the preset's size, eager vs compiled; inconclusive if
    no compiler works."""
    dev = device or "cpu"
    P = presets.sizes("fusion", size, dev)
    pred = predict_c7(P["chain_numel"])
    try:
        m = fx.measure_c7(P["chain_numel"], dev, repeat=max(5, P["chain_repeat"]))
    except Exception as exc:  # noqa: BLE001 - a missing compiler is this machine's answer
        return judge_c7(pred, None, f"torch.compile did not work here ({type(exc).__name__}: "
                                    f"{str(exc).splitlines()[0] if str(exc) else ''})")
    return judge_c7(pred, m)


# ------------------------------------------------------------------------------- C8
def predict_c8(unfolded_ops: int = 3) -> Prediction:
    """BN is a per-channel affine in eval mode: conv -> BN -> ReLU (`unfolded_ops` ops) becomes
    one conv with the activation in its epilogue, same output up to fp32 rounding."""
    return Prediction.of("C8", f"{unfolded_ops} ops (conv, BatchNorm, ReLU) become 1 fused op; outputs equal "
                               f"within rtol {RTOL:g}", **{"ops before": (unfolded_ops, ""), "ops after": (1, "")})


def judge_c8(prediction: Prediction, max_rel_error: float, unfolded_ops: int, folded_ops: int,
             fused_act: bool = True) -> Verdict:
    """`max_rel_error`: max |folded - unfolded| / max |unfolded| over the random inputs;
    op counts (kernels) of one call each; `fused_act`: the device had a conv+activation op."""
    ev = {"max relative error": (max_rel_error, ""), "ops unfolded": (unfolded_ops, ""),
          "ops folded": (folded_ops, "")}
    tol = f"max |diff| <= {RTOL:g} x |y| + {ATOL_REL:g} x max|y|; 1 op after folding"
    same = max_rel_error <= RTOL + ATOL_REL
    if same and not fused_act:
        return inconclusive(prediction, "BatchNorm folded into the conv with the same result, but this device has no "
                                        "fused conv+activation op, so the activation stays a separate op", ev, tol)
    problems = []
    if not same:
        problems.append(f"folded output differs by {max_rel_error:.1e} of its scale")
    if folded_ops != 1:
        problems.append(f"folding left {folded_ops} ops, not one")
    return settle(prediction, problems,
                  why_holds=f"{unfolded_ops} ops became 1 and the outputs agree to {max_rel_error:.1e} of their scale",
                  evidence=ev, tolerance=tol)


def run_c8(size: str = "smoke", device: Any = None) -> Verdict:
    """C8 for `labkit ledger`: a ConvBNReLU block at the preset's shape, unfolded vs folded + fused."""
    dev = device or "cpu"
    P = presets.sizes("fusion", size, dev)
    m = fx.measure_c8(P["conv_batch"], P["conv_channels"], P["conv_hw"], device=dev)
    return judge_c8(predict_c8(), m["max_rel_error"], m["unfolded_ops"], m["folded_ops"], m["fused_act"])


# ------------------------------------------------------------------------------- C9
def activation_bytes(cfg: Any, batch: int, seq: int, itemsize: int = 4) -> dict[str, float]:
    """Bytes a decoder forward of `cfg` at `batch` x `seq` tokens must hold, from its shape.

    saved: what autograd keeps for backward, per layer per token: the block inputs and norms
    (4 x dim), q/k/v (heads + 2 kv heads) x head_dim, the attention weights (heads x seq),
    the MLP's gate, up and product (3 x hidden), plus the logits (vocab) once.
    live: what inference needs at its peak: the logits plus the residual stream and the
    widest intermediate (2 x hidden), as nothing else outlives the op that reads it."""
    tokens = batch * seq
    per_layer = 4 * cfg.dim + (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim + cfg.n_heads * seq + 3 * cfg.hidden_dim
    saved = tokens * itemsize * (cfg.n_layers * per_layer + cfg.vocab_size)
    live = tokens * itemsize * (cfg.vocab_size + cfg.dim + 2 * cfg.hidden_dim)
    return {"saved": float(saved), "live": float(live)}


def predict_c9(cfg: Any, batch: int, seq: int) -> Prediction:
    """Training mode holds every saved activation; inference a few live tensors."""
    b = activation_bytes(cfg, batch, seq)
    return Prediction.of("C9", f"with autograd on a forward keeps ~{b['saved'] / 2**20:.0f} MiB of activations; "
                               f"under inference_mode ~{b['live'] / 2**20:.0f} MiB are live at once "
                               f"(~{b['saved'] / b['live']:.1f}x less)",
                         **{"saved (train)": (b["saved"] / 2**20, "MiB"),
                            "live (inference)": (b["live"] / 2**20, "MiB"),
                            "predicted ratio": (b["saved"] / b["live"], "x")})


def judge_c9(prediction: Prediction, peaks: Mapping[str, int], method: str = "") -> Verdict:
    """`peaks`: peak tensor bytes of one forward per mode ("train", "inference_mode", opt. "no_grad")."""
    ratio = peaks["train"] / max(peaks["inference_mode"], 1)
    ev: dict[str, Any] = {f"peak {k}": (v / 2**20, "MiB") for k, v in peaks.items()}
    ev["train / inference_mode"] = (ratio, "x")
    if method:
        ev["measured with"] = (method, "")
    return decide(prediction, ratio >= MEM_GAIN,
                  why_holds=f"without autograd the forward peaked at {1 / ratio:.0%} of training mode's bytes",
                  why_not=f"inference_mode peaked at {1 / ratio:.0%} of training mode's bytes: no real saving",
                  evidence=ev, tolerance=f"train / inference_mode peak >= {MEM_GAIN:g}x (at least a third less)")


def run_c9(size: str = "smoke", device: Any = None) -> Verdict:
    """C9 for `labkit ledger`: peak tensor bytes of one forward of the preset's `mem_model`, per
    autograd mode."""
    dev = device or "cpu"
    P = presets.sizes("fusion", size, dev)
    model = Transformer.from_preset(P["mem_model"], **P["mem_overrides"]).to(dev)
    pred = predict_c9(model.config, P["mem_batch"], P["mem_seq"])
    m = memory.forward_peaks(model, P["mem_batch"], P["mem_seq"])
    return judge_c9(pred, m.peaks, m.method)
