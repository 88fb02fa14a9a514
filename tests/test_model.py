"""labkit.model: parity with transformers' LlamaForCausalLM, generation semantics,
sampling properties, checkpoints, validation. Whole file: well under a minute on 2 cores."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.model import (PRESETS, SamplingParams, Transformer, filter_logits, generate,
                          get_config, load_checkpoint, perplexity,
                          save_checkpoint, stream, unigram_perplexity)
from labkit.model.transformer import MATMUL_FORMS, Linear, split_k_matmul

transformers = pytest.importorskip("transformers")

# name -> HF LlamaConfig kwargs. A large initializer_range keeps random models from
# collapsing into one repeated token, so greedy parity is a real test.
HF_CONFIGS = {
    "gqa_odd_untied": dict(vocab_size=131, hidden_size=60, intermediate_size=94, num_hidden_layers=3,
                           num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=False,
                           rope_theta=5000.0),
    "mha_tied": dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True),
    "mqa_headdim": dict(vocab_size=113, hidden_size=40, intermediate_size=72, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                        tie_word_embeddings=False, rope_theta=100000.0, rms_norm_eps=1e-5),
    # Llama 3.1 RoPE scaling with a 32-token "original" context, so the test's 37-token
    # sequences span all three bands: wavelengths < 8 kept, 8..32 blended, > 32 slowed 8x
    "llama3_rope": dict(vocab_size=101, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                        rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 32}),
    # Qwen2: biases on q, k and v (HF initialises them to 0; _hf_pair makes them random)
    "qwen2_bias": dict(model="qwen2", vocab_size=109, hidden_size=48, intermediate_size=88,
                       num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                       tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6),
}


def _hf_model(name: str):
    """A random transformers model for HF_CONFIGS[name] (seeded), biases random too."""
    kwargs = dict(HF_CONFIGS[name])
    family = kwargs.pop("model", "llama")
    torch.manual_seed(0)
    if family == "qwen2":
        hf = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            max_position_embeddings=256, initializer_range=0.3, **kwargs))
    else:
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            max_position_embeddings=256, initializer_range=0.3, **kwargs))
    with torch.no_grad():
        for pname, p in hf.named_parameters():
            if pname.endswith(".bias"):  # zero biases would test nothing
                p.normal_(0.0, 0.3)
    return hf.eval()


def _hf_pair(name: str, tmp_path, **save_kwargs):
    hf = _hf_model(name)
    hf.generation_config.eos_token_id = None  # random models: never stop early (ours gets no stop token)
    hf.save_pretrained(tmp_path, **save_kwargs)
    return hf, load_checkpoint(tmp_path)


@pytest.fixture(scope="module", params=list(HF_CONFIGS))
def pair(request, tmp_path_factory):
    return _hf_pair(request.param, tmp_path_factory.mktemp(request.param))


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / a.abs().max())


def test_logits_match_transformers(pair):
    hf, ours = pair
    x = torch.randint(0, ours.config.vocab_size, (3, 37), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(x).logits
        assert _rel_err(ref, ours(x)) < 1e-4
        # Cached path: prefill all positions, then one decode step.
        cache = ours.new_cache(3, 40)
        pre = ours.prefill(x[:, :-1], cache, all_logits=True)
        assert _rel_err(ref[:, :-1], pre) < 1e-4
        step = ours.decode_step(x[:, -1], cache)
        assert _rel_err(ref[:, -1], step) < 1e-4


def test_greedy_generation_matches_transformers(pair):
    hf, ours = pair
    prompt = torch.randint(0, ours.config.vocab_size, (1, 11), generator=torch.Generator().manual_seed(2))
    ref = hf.generate(prompt, max_new_tokens=32, do_sample=False,
                      pad_token_id=0)[0, 11:].tolist()
    assert generate(ours, prompt[0].tolist(), max_new_tokens=32) == [ref]
    assert len(set(ref)) > 3, "degenerate reference; the parity test would be weak"


def test_left_padded_batch_matches_transformers(pair):
    hf, ours = pair
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, ours.config.vocab_size, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding, as HF batches it
    mask[2, :7] = 0
    ids = ids.masked_fill(mask == 0, 0)
    ref = hf.generate(ids, attention_mask=mask, max_new_tokens=12,
                      do_sample=False, pad_token_id=0)[:, 9:].tolist()
    assert generate(ours, ids, attention_mask=mask, max_new_tokens=12) == ref


def test_cache_nocache_batched_single_static_all_agree(pair):
    _, ours = pair
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, ours.config.vocab_size, (n,), generator=g).tolist() for n in (5, 13, 1, 8)]
    singles = [generate(ours, p, max_new_tokens=24)[0] for p in prompts]
    assert generate(ours, prompts, max_new_tokens=24) == singles
    assert generate(ours, prompts, max_new_tokens=24, use_cache=False) == singles
    assert generate(ours, prompts, max_new_tokens=24, static_cache=True) == singles
    assert [list(stream(ours, p, max_new_tokens=24)) for p in prompts] == singles


def test_chunked_prefill_equals_one_prefill(pair):
    _, ours = pair
    x = torch.randint(0, ours.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        c1 = ours.new_cache(2, 24)
        one = ours.prefill(x, c1)
        c2 = ours.new_cache(2, 24)
        ours.prefill(x[:, :7], c2, lengths=[7, 3])                  # row 1 stops early ...
        rest = torch.stack([torch.cat([x[0, 7:], x[0, :4]]), x[1, 3:]])  # ... and catches up
        two = ours.prefill(rest, c2, lengths=[13, 17])
    assert _rel_err(one, two) < 1e-5
    assert c2.lengths.tolist() == [20, 20]


def test_sharded_hf_checkpoint(tmp_path):
    hf, ours = _hf_pair("gqa_odd_untied", tmp_path, max_shard_size="20KB")
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    x = torch.arange(10)[None]
    with torch.no_grad():
        assert _rel_err(hf(x).logits, ours(x)) < 1e-4


def test_new_features_are_really_exercised(pair):
    """The llama3 and qwen2 pairs load what makes them different (else parity proves little)."""
    hf, ours = pair
    if (getattr(hf.config, "rope_parameters", None) or {}).get("rope_type") == "llama3":
        plain = 1.0 / (500.0 ** (torch.arange(0, ours.config.head_dim, 2).float() / ours.config.head_dim))
        assert ours.config.rope_scaling["factor"] == 8.0 and not torch.allclose(ours.inv_freq, plain)
        assert torch.equal(ours.inv_freq, hf.model.rotary_emb.inv_freq)
    if hf.config.model_type == "qwen2":
        assert ours.config.qkv_bias and ours.layers[0].attention.wqkv.bias.abs().min() > 0
        assert ours.layers[0].attention.wo.bias is None


@pytest.mark.parametrize("change, needle", [
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "yarn"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "linear"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}}, "low_freq_factor"),
    ({"attention_bias": True}, "attention_bias"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"hidden_act": "gelu"}, "gelu"),
    ({"model_type": "qwen2", "use_sliding_window": True}, "sliding"),
    ({"model_type": "gemma"}, "gemma"),
])
def test_unsupported_hf_features_are_refused_by_name(change, needle):
    from labkit.model.checkpoint import hf_config_to_labkit

    base = {"model_type": "llama", "vocab_size": 50, "hidden_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 4, "intermediate_size": 64}
    hf_config_to_labkit(base)  # the base itself is fine
    with pytest.raises(ValueError, match=needle):
        hf_config_to_labkit({**base, **change})


def test_llama3_scaling_round_trips_and_rejects_bad_values(tmp_path):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    model = Transformer.from_preset("tiny", seed=0, n_layers=1, rope_scaling=scaling, qkv_bias=True)
    save_checkpoint(model, tmp_path)
    back = load_checkpoint(tmp_path)
    assert back.config == model.config and torch.equal(back.inv_freq, model.inv_freq)
    x = torch.arange(12)[None]
    with torch.no_grad():
        assert torch.equal(back(x), model(x))
    for bad, needle in (({**scaling, "high_freq_factor": 0.5}, "low_freq_factor"),
                        ({**scaling, "factor": 0}, "factor"), ({"rope_type": "ntk"}, "ntk")):
        with pytest.raises(ValueError, match=needle):
            get_config("tiny", rope_scaling=bad)


@pytest.mark.parametrize("tie", [True, False])
def test_labkit_checkpoint_roundtrip(tmp_path, tie):
    m = Transformer.from_preset("tiny", n_layers=1, dim=64, n_heads=4, n_kv_heads=2, hidden_dim=96,
                                vocab_size=50, tie_embeddings=tie)
    save_checkpoint(m, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["format"] == "labkit"
    m2 = load_checkpoint(tmp_path)
    assert m2.config == m.config
    x = torch.arange(12)[None]
    with torch.no_grad():
        assert torch.equal(m(x), m2(x))
    assert m2.config.tie_embeddings == tie
    # The inference layout gives a tied head its own transposed copy; "nk" re-ties it.
    assert m2.weight_layout == "kn" and m2.num_params() == m.num_params()
    assert torch.equal(m2.output.weight, m2.tok_embeddings.weight) == tie
    m2.set_weight_layout("nk")
    assert (m2.output.weight is m2.tok_embeddings.weight) == tie
    with torch.no_grad():
        assert torch.equal(m(x), m2(x))


def _small_model() -> Transformer:
    return Transformer.from_preset("tiny", n_layers=1, dim=32, n_heads=4, n_kv_heads=2,
                                   hidden_dim=48, vocab_size=64, max_seq_len=64)


def test_sampling_is_seeded_and_reproducible():
    m = _small_model()
    sp = SamplingParams(temperature=1.5, top_k=20, top_p=0.9, repetition_penalty=1.3)
    a = generate(m, [[1, 2, 3], [4]], max_new_tokens=20, sampling=sp, seed=7)
    b = generate(m, [[1, 2, 3], [4]], max_new_tokens=20, sampling=sp, seed=7)
    c = generate(m, [[1, 2, 3], [4]], max_new_tokens=20, sampling=sp, seed=8)
    assert a == b and a != c


def test_stop_tokens_end_each_sequence():
    m = _small_model()
    free = generate(m, [[1, 2], [3]], max_new_tokens=16, sampling=SamplingParams(temperature=1.0), seed=0)
    stop = free[0][4]
    out = generate(m, [[1, 2], [3]], max_new_tokens=16, sampling=SamplingParams(temperature=1.0),
                   seed=0, stop_tokens=[stop])
    for full, cut in zip(free, out):
        k = full.index(stop) + 1 if stop in full else len(full)
        assert cut == full[:k]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 30), st.floats(0.05, 1.0))
def test_top_k_top_p_properties(seed, k, p):
    logits = torch.randn(3, 30, generator=torch.Generator().manual_seed(seed)) * 3
    kept = torch.isfinite(filter_logits(logits, SamplingParams(temperature=1.0, top_k=k)))
    assert (kept.sum(-1) >= k).all()  # ties may keep more, never fewer
    top = torch.topk(logits, k, dim=-1).indices
    assert kept.gather(-1, top).all()
    kept = torch.isfinite(filter_logits(logits, SamplingParams(temperature=1.0, top_p=p)))
    probs = logits.softmax(-1)
    mass = (probs * kept).sum(-1)
    assert (mass >= p - 1e-6).all()
    # minimal: dropping the least likely kept token falls below p
    least = probs.masked_fill(~kept, 2.0).min(-1).values
    assert (mass - least < p + 1e-6).all()
    # every kept token is at least as likely as every dropped one
    assert (probs.masked_fill(~kept, 2.0).min(-1).values
            >= probs.masked_fill(kept, -1.0).max(-1).values).all()


def test_sampled_tokens_respect_top_k():
    m = _small_model()
    with torch.no_grad():
        cache = m.new_cache(1, 4)
        logits = m.prefill(torch.tensor([[5, 6]]), cache)
    allowed = set(torch.topk(logits[0], 3).indices.tolist())
    g = torch.Generator().manual_seed(0)
    from labkit.model import sample
    draws = {int(sample(logits, SamplingParams(temperature=2.0, top_k=3), g)) for _ in range(200)}
    assert draws <= allowed and len(draws) > 1


@pytest.mark.parametrize("kwargs, needle", [
    (dict(sampling_kw=dict(top_p=0.0)), "top_p=0.0"),
    (dict(sampling_kw=dict(top_p=1.5)), "top_p=1.5"),
    (dict(sampling_kw=dict(temperature=-0.5)), "temperature=-0.5"),
    (dict(max_new_tokens=0), "max_new_tokens=0"),
    (dict(prompt_len=65), "65 tokens"),
])
def test_bad_input_raises_value_error_naming_value_and_range(kwargs, needle):
    m = _small_model()
    with pytest.raises(ValueError) as exc:
        sp = SamplingParams(**kwargs.get("sampling_kw", {}))
        generate(m, list(range(kwargs.get("prompt_len", 3))), sampling=sp,
                 max_new_tokens=kwargs.get("max_new_tokens", 1))
    msg = str(exc.value)
    assert needle in msg
    assert any(s in msg for s in ("(0, 1]", ">= 0", ">= 1", "1..64"))


def test_unknown_preset_names_allowed_ones():
    with pytest.raises(ValueError, match="'tiny'.*'small'.*'1b'.*'7b'"):
        get_config("huge")


def test_preset_sizes():
    assert get_config("tiny").num_params() <= 5_000_000
    assert 80e6 <= get_config("small").num_params() <= 130e6
    assert 0.9e9 <= get_config("1b").num_params() <= 1.3e9
    assert 6e9 <= get_config("7b").num_params() <= 7.5e9
    assert 7.5e9 <= get_config("8b").num_params() <= 8.5e9
    m = _small_model()
    assert m.num_params() == m.config.num_params()
    assert set(PRESETS) == {"tiny", "small", "1b", "7b", "8b"}


def test_perplexity_of_uniform_model_is_vocab_size():
    m = _small_model()
    with torch.no_grad():
        m.output.weight.zero_()  # tied: embeddings are zero too, logits all equal
    ids = torch.randint(0, 64, (300,), generator=torch.Generator().manual_seed(0))
    assert perplexity(m, ids, ctx=32) == pytest.approx(64, rel=1e-4)
    assert unigram_perplexity(ids, ids, 64) < 64


def test_weight_layouts_agree_and_bad_layout_raises():
    m = _small_model()
    x = torch.arange(20)[None] % 64
    with torch.no_grad():
        kn = m(x)
        assert m.layers[0].attention.wqkv.weight.t().is_contiguous()
        nk = m.set_weight_layout("nk")(x)
    assert _rel_err(kn, nk) < 1e-5
    with pytest.raises(ValueError, match="'kn'"):
        m.set_weight_layout("column-major")


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 9), n=st.integers(1, 40), k_blocks=st.integers(1, 12), splits=st.sampled_from([1, 2, 3, 4]),
       layout=st.sampled_from(["nk", "kn"]), seed=st.integers(0, 2**16))
def test_split_k_matmul_equals_x_times_w_transposed(m, n, k_blocks, splits, layout, seed):
    g = torch.Generator().manual_seed(seed)
    k = k_blocks * splits
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    w = w.t().contiguous().t() if layout == "kn" else w
    torch.testing.assert_close(split_k_matmul(x, w, splits), x @ w.t(), rtol=1e-5, atol=1e-5)


def test_split_k_matmul_refuses_a_split_that_does_not_divide_k():
    with pytest.raises(ValueError, match="dividing K=10, got splits=3"):
        split_k_matmul(torch.ones(1, 10), torch.ones(4, 10), 3)


def test_matmul_forms_and_tuning_keep_values():
    """Every (layout, form) the decoder may pick computes the same logits and tokens;
    tune_matmul's choice is one of them (which one depends on this machine's speed)."""
    m = _small_model()
    prompts = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11]]
    x = torch.arange(20)[None] % 64
    with torch.no_grad():
        ref, ref_tokens = m(x), generate(m, prompts, max_new_tokens=10)
    lins = [mod for mod in m.modules() if isinstance(mod, Linear)]
    for layout in ("nk", "kn"):
        m.set_weight_layout(layout)
        for form in MATMUL_FORMS:  # at decode batch 1 and 3, and in the 20-token pass
            for mod in lins:
                mod.forms, mod.splits = {1: form, 3: form, 20: form}, 2
            with torch.no_grad():
                assert _rel_err(m(x), ref) < 1e-5
            assert generate(m, prompts, max_new_tokens=10) == ref_tokens
            assert [generate(m, p, max_new_tokens=10)[0] for p in prompts] == ref_tokens
    choice = m.tune_matmul((1, 3), repeat=1)
    assert choice["layout"] == m.weight_layout in ("nk", "kn") and set(choice["forms"]) == {1, 3}
    assert all(mod.forms == {b: f for b, f in choice["forms"].items() if f != "xw"} for mod in lins)
    assert set(choice["forms"].values()) <= set(MATMUL_FORMS)
    assert generate(m, prompts, max_new_tokens=10) == ref_tokens


def test_decode_rates_interleaves_and_ratios_against_first():
    from labkit.benches.model import decode_rates
    calls = []

    def run(name):
        return lambda n: calls.append((name, n))
    out = decode_rates({"a": run("a"), "b": run("b")}, batch=2, new_tokens=4, repeat=3)
    assert calls[:2] == [("a", 4), ("b", 4)]  # one warm-up each, then rounds a, b, a, b ...
    assert [c[0] for c in calls[2:]] == ["a", "a", "b", "b"] * 3
    assert out["a"]["ratio"] == 1.0 or out["a"]["ratio"] != out["a"]["ratio"]  # 1, or NaN if t(N) <= t(1)
    assert set(out["b"]) == {"tok_s", "step_s", "total_s", "ratio", "step_s_rounds"} and len(out["b"]["step_s_rounds"]) == 3


def test_bench_helpers_smoke():
    from labkit.benches.model import bytes_per_step, cache_demo, to_hf
    m = _small_model()
    hf = to_hf(m)
    x = torch.arange(10)[None]
    with torch.no_grad():
        assert _rel_err(hf(x).logits, m(x)) < 1e-4
    assert hf.model.layers[0].self_attn.q_proj.weight.is_contiguous()  # HF keeps its own layout
    assert bytes_per_step(m, 2, 4, 8) > m.weight_bytes_per_step(2)
    demo = cache_demo(m, new_tokens=12, prompt_len=4)
    # The demo's figures agree with each other (speedup is a timing ratio, so no bound on its size here).
    assert demo["identical"] and demo["new_tokens"] == 12
    assert demo["cache_s"] > 0 and demo["nocache_s"] > 0
    assert demo["speedup"] == pytest.approx(demo["nocache_s"] / demo["cache_s"])


def test_matrix_read_bandwidth_is_every_linear_weight_over_the_measured_time(monkeypatch):
    """Speed-free: the timer is replaced, so the figure is pure bookkeeping of bytes."""
    import types
    from labkit.benches import model as model_bench
    m = _small_model()
    summed = []
    monkeypatch.setattr(torch.Tensor, "sum", lambda self, *a, **k: summed.append(self.shape))
    def fake_measure(fn, **kw):
        fn()
        return types.SimpleNamespace(median=0.5)
    monkeypatch.setattr(model_bench, "measure", fake_measure)
    weights = [mod.weight for mod in m.modules() if isinstance(mod, torch.nn.Linear)]
    assert model_bench.matrix_read_bandwidth(m) == sum(w.numel() * 4 for w in weights) / 0.5
    assert summed == [w.shape for w in weights]  # each matrix read once, in the model's order


# ------------------------------------------------------------------ int8 KV cache
@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**31 - 1), st.floats(1e-3, 1e3))
def test_quantize_kv_error_is_within_half_a_scale(seed, magnitude):
    from labkit.model.kv_quant import dequantize_kv, quantize_kv

    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(seed)) * magnitude
    codes, scale = quantize_kv(x)
    assert codes.dtype == torch.int8 and scale.shape == (3, 5, 1)
    err = (dequantize_kv(codes, scale, torch.float32) - x).abs()
    assert (err <= scale / 2 * (1 + 1e-5) + 1e-12).all()


def _gqa_toy() -> Transformer:
    return Transformer.from_preset("tiny", n_layers=2, vocab_size=97, dim=48, n_heads=6, n_kv_heads=2,
                                   hidden_dim=64, head_dim=8, seed=3)


def test_int8_kv_cache_bytes_storage_and_logits():
    from labkit.model.kv_quant import dequantize_kv

    m = _gqa_toy()
    cfg = m.config
    fp, q8 = m.new_cache(2, 20), m.new_cache(2, 20, kv_dtype="int8")
    slots = cfg.n_layers * 2 * cfg.n_kv_heads * 21  # layers x batch x heads x (max_len + spare)
    assert fp.nbytes == 2 * slots * cfg.head_dim * 4
    assert q8.nbytes == 2 * slots * (cfg.head_dim + 4)
    prompt = torch.randint(0, 97, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        a, b = m.prefill(prompt, fp, lengths=[5, 7]), m.prefill(prompt, q8, lengths=[5, 7])
        for _ in range(3):
            tok = a.argmax(-1)
            a, b = m.decode_step(tok, fp), m.decode_step(tok, q8)
    assert q8.lengths.tolist() == fp.lengths.tolist() == [8, 10]
    assert 0 < (a - b).abs().max() < 0.02 * a.abs().max()
    # Layer 0's keys and values depend only on the tokens, so they must sit within half a
    # scale of the fp32 cache's (deeper layers also see the rounding of the layers below).
    for row, n in enumerate([8, 10]):
        for codes, scale, ref in ((q8.k, q8.k_scale, fp.k), (q8.v, q8.v_scale, fp.v)):
            back = dequantize_kv(codes[0, row, :, :n], scale[0, row, :, :n], torch.float32)
            assert ((back - ref[0, row, :, :n]).abs() <= scale[0, row, :, :n] / 2 + 1e-6).all()
    with pytest.raises(ValueError, match="int8"):
        m.new_cache(1, 4, kv_dtype="int4")


def test_perplexity_through_the_cache():
    m = _gqa_toy()
    ids = torch.randint(0, 97, (130,), generator=torch.Generator().manual_seed(1))
    plain = perplexity(m, ids, ctx=32)
    assert perplexity(m, ids, ctx=32, kv_dtype="model") == pytest.approx(plain, rel=1e-5)
    p8 = perplexity(m, ids, ctx=32, kv_dtype="int8")
    assert p8 != plain and p8 == pytest.approx(plain, rel=0.02)
