"""Unit tests of labkit.distill (CPU, seconds)."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st
from torch.utils.flop_counter import FlopCounterMode

from labkit.distill import (KDConfig, OrderBudget, check_order, dequantized, distill_loss, distill_step,
                            forward_flops_per_token, kl_divergence, make_optimizer, matmul_params, new_student,
                            run_order, student_config, summary, train_student, training_flops)
from labkit.distill.experiments import pareto_front
from labkit.model import Transformer
from labkit.prune import RecoveryBudget
from labkit.quant import QuantLinear, quantize_model
from labkit.train import TrainConfig

SHAPE = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=96, max_seq_len=512)


def micro(seed: int = 0, **over) -> Transformer:
    return Transformer.from_preset("tiny", seed=seed, **{**SHAPE, **over})


def ids(n=4000, seed=1):
    return torch.randint(0, 4096, (n,), generator=torch.Generator().manual_seed(seed))


def test_a_distillation_step_lowers_the_kl_on_a_fixed_batch():
    teacher = micro(seed=1)
    student = new_student(student_config(teacher.config, n_layers=1), seed=2)
    window = ids(2 * 33).view(2, 33)
    with torch.no_grad():
        t_logits = teacher(window[:, :-1])
        before = kl_divergence(student(window[:, :-1]), t_logits).item()
    opt = make_optimizer(student, TrainConfig(lr=1e-3))
    parts, teacher_s = distill_step(student, teacher, window, opt, KDConfig(temperature=1.0, kd_weight=1.0))
    with torch.no_grad():
        after = kl_divergence(student(window[:, :-1]), t_logits).item()
    assert parts["kl"] == pytest.approx(before, rel=1e-4) and teacher_s > 0
    assert after < before


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 1000), T=st.floats(0.5, 4), w=st.floats(0, 1))
def test_loss_is_the_weighted_sum_of_its_parts(seed, T, w):
    g = torch.Generator().manual_seed(seed)
    s, t = torch.randn(2, 5, 11, generator=g), torch.randn(2, 5, 11, generator=g) * 3
    y = torch.randint(0, 11, (2, 5), generator=g)
    loss, parts = distill_loss(s, t, y, T, w)
    ce = F.cross_entropy(s.flatten(0, 1), y.flatten())
    # KL(t || s) at temperature T, written out
    pt, ls = F.softmax(t / T, -1), F.log_softmax(s / T, -1)
    kl = (pt * (pt.log() - ls)).sum(-1).mean()
    if w > 0:
        assert parts["kl"] >= 0 and parts["kl"] == pytest.approx(kl.item(), rel=1e-4, abs=1e-6)
    expect = w * T * T * kl + (1 - w) * ce if w > 0 else ce
    assert loss.item() == pytest.approx(expect.item(), rel=1e-4, abs=1e-6)
    assert kl_divergence(s, s, T).item() == pytest.approx(0, abs=1e-6)


def test_without_a_teacher_the_loss_is_cross_entropy():
    s, y = torch.randn(3, 7), torch.randint(0, 7, (3,))
    loss, parts = distill_loss(s, None, y)
    assert torch.equal(loss, F.cross_entropy(s, y)) and set(parts) == {"ce"}


@pytest.mark.parametrize("kw", [dict(temperature=0), dict(kd_weight=1.5), dict(kd_weight=-0.1)])
def test_bad_kd_settings_raise(kw):
    with pytest.raises(ValueError, match="temperature|kd_weight"):
        KDConfig(**kw)


def test_forward_flops_match_torch_flop_counter():
    model = micro(n_heads=8, n_kv_heads=8)  # MHA: the counter sees plain attention matmuls
    cfg, B, T = model.config, 2, 32
    x = ids(B * T).view(B, T)
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        model(x)
    counted, linear = fc.get_total_flops(), 2 * matmul_params(cfg) * B * T
    # Some torch builds count the CPU attention kernel (as full, non-causal attention:
    # 4*T*T*H*D per layer and sequence), some do not; the matmuls must match exactly.
    attention_full = cfg.n_layers * B * 4 * T * T * cfg.n_heads * cfg.head_dim
    assert counted in (linear, linear + attention_full)
    # Causal attention, counted position by position: QK^T and AV over i+1 keys each.
    causal = cfg.n_layers * B * sum(4 * cfg.n_heads * cfg.head_dim * (i + 1) for i in range(T))
    assert forward_flops_per_token(cfg, T) * B * T == linear + causal
    assert training_flops(cfg, 1000, T) == 3 * forward_flops_per_token(cfg, T) * 1000


def test_student_training_is_deterministic_and_ends_ready_for_inference():
    teacher, data = micro(seed=1), ids()
    tc = TrainConfig(steps=3, batch_size=2, seq_len=32, warmup_steps=1)
    runs = []
    for t in (teacher, teacher, None):
        s = new_student(student_config(teacher.config, n_layers=1))
        fig = train_student(s, data, tc, teacher=t, kd=KDConfig(1.0, 0.5))
        runs.append(s)
        assert fig["train_tokens"] == 3 * 2 * 32 and fig["teacher_seconds"] >= 0
        assert s.weight_layout == "kn" and not s.training
        assert torch.equal(s.output.weight, s.tok_embeddings.weight)
    a, b, c = (r.state_dict()["layers.0.feed_forward.w2.weight"] for r in runs)
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("scheme,kernel,atol", [("int8", "dequant", 1e-4), ("int4-g32", "auto", 2e-2)])
def test_dequantized_matches_the_quantized_model(scheme, kernel, atol):
    model = micro()
    q = quantize_model(model, scheme, kernel=kernel)
    d = dequantized(q)
    assert not any(isinstance(m, QuantLinear) for m in d.modules())
    x = ids(32).view(2, 16)
    with torch.no_grad():
        ref = q(x)
        assert (d(x) - ref).abs().max() <= atol * ref.abs().max()


def test_every_order_delivers_the_same_final_architecture():
    teacher, data = micro(), ids(6000)
    budget = OrderBudget(distill=TrainConfig(steps=2, batch_size=2, seq_len=32, warmup_steps=1),
                         recovery=RecoveryBudget(steps=1, batch_size=2, seq_len=32),
                         student_overrides={"n_layers": 1}, sparsity=0.5, windows=1, calib_windows=1)
    valid = ids(300, seed=2)
    steps, finals = [], {}
    for order in ("DPQ", "PDQ", "QDP"):
        rows, final = run_order(teacher, order, data, valid[:257], budget)
        assert [r["step"] for r in rows] == list(range(len(rows)))
        assert len(rows) == (5 if order == "QDP" else 4)  # quantizing first forces a second Q at the end
        assert rows[-1]["op"].startswith("quantize") and all(r["ppl"] > 1 for r in rows)
        assert any(isinstance(m, QuantLinear) for m in final.modules())
        # a quantized model still counts its weights once (tied head included)
        assert rows[-1]["params_M"] == pytest.approx(rows[-2]["params_M"])
        finals[rows[0]["order"]] = final
        steps += rows
    shapes = {(m.config.n_layers, m.config.hidden_dim, m.config.n_kv_heads) for m in finals.values()}
    assert shapes == {(1, 48, 1)}
    table = summary(steps, {"D→P→Q": 123.0})
    assert [r["final_ppl"] for r in table] == sorted(r["final_ppl"] for r in table)
    assert {r["order"] for r in table} == {"D→P→Q", "P→D→Q", "Q→D→P→Q"}
    assert next(r for r in table if r["order"] == "D→P→Q")["decode_tok_s"] == 123.0
    with pytest.raises(ValueError, match="exactly once"):
        check_order("DDQ")


def test_pareto_front_keeps_only_undominated_points():
    rows = [{"tok_s": 10, "ppl": 50}, {"tok_s": 20, "ppl": 60}, {"tok_s": 5, "ppl": 55}, {"tok_s": 30, "ppl": 40}]
    assert pareto_front(rows) == [{"tok_s": 30, "ppl": 40}]


def test_prune_jumps_reads_each_orders_prune_step():
    from labkit.distill.experiments import prune_jumps

    rows = [{"order": "D→P→Q", "op": "teacher", "ppl": 30.0}, {"order": "D→P→Q", "op": "distill", "ppl": 40.0},
            {"order": "D→P→Q", "op": "prune + recover", "ppl": 60.0}, {"order": "P→D→Q", "op": "teacher", "ppl": 30.0},
            {"order": "P→D→Q", "op": "prune + recover", "ppl": 33.0}]
    assert prune_jumps(rows) == {"D→P→Q": 1.5, "P→D→Q": pytest.approx(1.1)}
