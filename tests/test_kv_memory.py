"""The KV memory calculator (labkit.model.kv_memory) against allocated caches and HF configs."""

import json

import pytest
import torch
from hypothesis import given, settings, strategies as st

from labkit.model import KVCache, ModelConfig, get_config
from labkit.model.checkpoint import hf_config_to_labkit
from labkit.model.kv_memory import (KVShape, kv_bytes_per_token, kv_cache_bytes, kv_shape,
                                    max_concurrent_sequences)

LLAMA2_7B, LLAMA3_8B = get_config("7b"), get_config("8b")  # Llama-2-7B- and Llama-3-8B-shaped presets

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


CONFIGS = {
    "tiny (GQA 8/4)": get_config("tiny"),
    "GQA 8/2, explicit head_dim 48 != dim/heads": ModelConfig(dim=256, n_layers=3, n_heads=8, n_kv_heads=2,
                                                              head_dim=48, hidden_dim=64),
    "MQA 4/1": ModelConfig(dim=128, n_layers=2, n_heads=4, n_kv_heads=1, hidden_dim=64),
}
# (torch dtype of the model, KVCache kv_dtype, calculator dtype)
STORAGE = [(torch.float32, "model", torch.float32), (torch.bfloat16, "model", "bf16"),
           (torch.float16, "model", "fp16"), (torch.float32, "int8", "int8")]


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("dtype,cache_kind,calc_dtype", STORAGE)
def test_matches_allocated_cache_bytes_exactly(name, dtype, cache_kind, calc_dtype):
    cfg = CONFIGS[name]
    batch, max_len = 3, 37
    cache = KVCache(cfg, batch, max_len, dtype=dtype, kv_dtype=cache_kind)
    # KVCache allocates max_len + 1 slots per row: one spare slot soaks up padding writes.
    assert cache.nbytes == kv_cache_bytes(cfg, batch, max_len + 1, calc_dtype)
    assert cache.nbytes == batch * (max_len + 1) * kv_bytes_per_token(cfg, calc_dtype)


def test_int8_costs_head_dim_plus_a_4_byte_scale_per_vector():
    cfg = CONFIGS["GQA 8/2, explicit head_dim 48 != dim/heads"]
    assert kv_bytes_per_token(cfg, "int8") == 2 * 3 * 2 * (48 + 4)
    assert kv_bytes_per_token(cfg, "fp8") == 2 * 3 * 2 * 48  # per-tensor scales: not per token


def test_hf_config_dicts_and_paths(tmp_path):
    llama3 = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}
    assert kv_bytes_per_token(llama3, "bf16") == 131072  # the well-known 128 KiB/token
    gemma2 = {"num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8,
              "hidden_size": 3584, "head_dim": 256}  # 16 * 256 != 3584: head_dim must win
    assert kv_shape(gemma2) == KVShape(42, 8, 256)
    falcon = {"num_hidden_layers": 32, "num_attention_heads": 71, "hidden_size": 4544, "multi_query": True}
    assert kv_shape(falcon) == KVShape(32, 1, 64)
    mha = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "head_dim": None}
    assert kv_shape(mha) == KVShape(2, 4, 16)  # no num_key_value_heads: MHA
    assert kv_shape({"text_config": gemma2, "vision_config": {}}) == KVShape(42, 8, 256)
    (tmp_path / "config.json").write_text(json.dumps(gemma2))
    assert kv_shape(tmp_path) == kv_shape(tmp_path / "config.json") == kv_shape(str(tmp_path))


def test_agrees_with_the_other_config_types():
    assert kv_bytes_per_token(LLAMA3_8B, "bf16") == 131072
    assert kv_bytes_per_token(LLAMA2_7B, 2) == 4 * 131072
    assert kv_bytes_per_token({"layers": 32, "kv_heads": 8, "head_dim": 128}, "fp16") == 131072
    hf = {"vocab_size": 100, "hidden_size": 256, "num_hidden_layers": 3, "num_attention_heads": 8,
          "num_key_value_heads": 2, "head_dim": 48, "intermediate_size": 64}
    assert kv_bytes_per_token(hf, "fp32") == kv_bytes_per_token(hf_config_to_labkit(hf), torch.float32)


def test_parity_with_transformers_dynamic_cache():
    transformers = pytest.importorskip("transformers")
    hf = dict(vocab_size=64, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=48, intermediate_size=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**hf)).eval()
    batch, seq = 2, 7
    with torch.no_grad():
        out = model(torch.randint(0, 64, (batch, seq)), use_cache=True)
    cache = out.past_key_values
    layers = cache.layers if hasattr(cache, "layers") else None
    tensors = [t for l in layers for t in (l.keys, l.values)] if layers is not None \
        else list(cache.key_cache) + list(cache.value_cache)
    assert sum(t.numel() * t.element_size() for t in tensors) == kv_cache_bytes(hf, batch, seq, "fp32")


@settings(max_examples=60, deadline=None)
@given(layers=st.integers(1, 80), kv_heads=st.integers(1, 16), head_dim=st.sampled_from([16, 64, 80, 128, 256]),
       dtype=st.sampled_from(["fp32", "fp16", "bf16", "fp8", "int8"]), batch=st.integers(1, 64),
       context=st.integers(1, 5000), block=st.sampled_from([1, 8, 16, 32]))
def test_totals_are_consistent(layers, kv_heads, head_dim, dtype, batch, context, block):
    s = KVShape(layers, kv_heads, head_dim)
    per_token = kv_bytes_per_token(s, dtype)
    assert per_token == 2 * layers * kv_heads * kv_bytes_per_token(KVShape(1, 1, head_dim), dtype) // 2
    total = kv_cache_bytes(s, batch, context, dtype, block_size=block)
    assert total >= batch * context * per_token  # blocks only ever round up ...
    assert total < batch * (context + block) * per_token  # ... by less than one block per sequence
    memory = 10 * total + 12345
    n = max_concurrent_sequences(s, memory, context, dtype, weight_bytes=12345, block_size=block)
    assert n == 10 * batch  # exactly: the weights leave 10 batches' worth of room


def test_max_concurrency_beside_the_weights():
    # Llama-3-8B, bf16 weights (16.06 GB) on an 80 GB card at 90% utilisation, 4096-token sequences.
    weights = 8.03e9 * 2
    n = max_concurrent_sequences(LLAMA3_8B, 80e9, 4096, "bf16", weight_bytes=weights, utilization=0.9)
    assert n == int((0.9 * 80e9 - weights) // (4096 * 131072))
    assert max_concurrent_sequences(LLAMA3_8B, 80e9, 4096, "int8", weight_bytes=weights, utilization=0.9) > 1.9 * n
    assert max_concurrent_sequences(LLAMA3_8B, 16e9, 4096, "bf16", weight_bytes=weights) == 0  # no room


@pytest.mark.parametrize("call,match", [
    (lambda: kv_bytes_per_token(get_config("tiny"), "int3"), "int3"),
    (lambda: kv_bytes_per_token(get_config("tiny"), 0), "bytes per value"),
    (lambda: kv_cache_bytes(get_config("tiny"), 0, 10), "batch"),
    (lambda: kv_cache_bytes(get_config("tiny"), 1, 10, block_size=0), "block_size"),
    (lambda: max_concurrent_sequences(get_config("tiny"), 1e9, 10, utilization=1.5), "utilization"),
    (lambda: kv_shape({"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 64}), "head_dim"),
    (lambda: kv_shape({"vocab_size": 10}), "lacks a field"),
    (lambda: kv_shape("/nonexistent/config.json"), "no config.json"),
    (lambda: KVShape(0, 1, 1), "layers"),
])
def test_bad_input_names_the_value(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------------------ on the serving engine
@pytest.fixture(scope="module")
def tiny():
    from labkit.model import load_tiny

    return load_tiny()


def test_engine_pool_bytes_match_the_calculator(tiny):
    from labkit.serve.paged import PagedKVCache

    for kind, calc in (("model", torch.float32), ("int8", "int8")):
        pool = PagedKVCache(tiny.config, 10, 16, kv_dtype=kind)
        assert pool.nbytes == kv_cache_bytes(tiny.config, 10 + 1, 16, calc)  # + the sink block


def test_paged_vs_max_len_reservation_on_the_engine(tiny):
    """Seeded and greedy, so the engine's schedule (and every count below) is deterministic."""
    from labkit.serve import kv_capacity as kb

    wl = kb.mixed_workload(24, 8, 8, 64, seed=1)
    budget = 128 * kv_bytes_per_token(tiny.config, tiny.dtype)
    contig = kb.run(tiny, wl, budget, kv_reserve="max_len")
    paged = kb.run(tiny, wl, budget, block_size=4)
    int8 = kb.run(tiny, wl, budget, block_size=4, kv_dtype="int8")
    # max-length reservation: exactly capacity // max_len sequences, never a preemption
    assert contig["peak_running"] == 128 // 64 == kb.predict(wl, 128, 16, "max_len")["max_concurrency"]
    assert contig["preemptions"] == 0
    assert paged["peak_running"] > 2 * contig["peak_running"] and paged["waste"] < contig["waste"] / 4
    for r in (contig, paged):  # the measured waste is what the arithmetic predicts
        assert abs(r["waste"] - kb.predict(wl, r["capacity_tokens"], r["block_size"], r["kv_reserve"])["waste"]) < 0.05
    assert int8["capacity_tokens"] == budget // (4 * kv_bytes_per_token(tiny.config, "int8")) * 4
    assert int8["peak_running"] > 1.5 * paged["peak_running"]


def test_a_run_time_kv_setting_maps_to_what_it_stores():
    """Run time names the choice ("model" | "int8"); sizing names what is stored per value."""
    from labkit.model.kv_memory import stored_as

    cfg = get_config("tiny")
    assert stored_as(torch.bfloat16, "model") == torch.bfloat16
    assert stored_as(torch.float32, "int8") == "int8"
    for kind in ("model", "int8"):
        cache = KVCache(cfg, 2, 20, dtype=torch.float32, kv_dtype=kind)
        assert cache.nbytes == kv_cache_bytes(cfg, 2, 21, stored_as(torch.float32, kind))
    with pytest.raises(ValueError, match="kv_dtype 'fp8' not allowed"):
        stored_as(torch.float32, "fp8")


def test_ragged_decode_times_both_reads_of_one_batch(tiny):
    """The bench's comparison runs both reads and counts the groups the ragged read makes: one
    for equal rows (nothing to save), several for one long row among short ones. No timing is
    asserted: speed is the bench's to print (`python -m labkit.benches.kv`)."""
    from labkit.serve import kv_capacity as kb

    mixed = kb.ragged_decode(tiny, [200] + [20] * 7, steps=2, rounds=1)
    equal = kb.ragged_decode(tiny, [60] * 4, steps=2, rounds=1)
    assert mixed["groups"] == 2 and equal["groups"] == 1
    assert all(r[k] > 0 for r in (mixed, equal) for k in ("ragged_s", "padded_s"))
