"""A Llama-architecture decoder in plain PyTorch, readable top to bottom.

Layout (same maths as Hugging Face's LlamaForCausalLM, so its checkpoints load
without any weight permutation):

    tokens -> embedding -> n_layers x [x + Attn(RMSNorm(x)); x + SwiGLU(RMSNorm(x))]
           -> RMSNorm -> output projection (tied to the embedding or not) -> logits

Choices that cut the op count per decode step (a 4-layer model is overhead-bound:
each eager op costs a few µs of dispatch, so every small op counts):

* q, k, v come from one fused matmul (``wqkv``) and gate/up from one (``w13``);
* RoPE is applied to q and k in one call (they are adjacent in ``wqkv``'s output),
  with the rotate-half convention HF Llama uses; cos/sin are looked up in a table;
* the attention mask is built once per pass as an additive tensor (none at all for
  one unpadded sequence), hidden states stay 2-D (B·T, dim) so linears are one mm;
* how each linear multiplies (weight layout; ``x @ W.T``, ``(W @ x.T).T`` or the K axis
  split across threads) is chosen per batch size by `Transformer.tune_matmul`, by timing
  them on this machine (`labkit.model.matmul`).

Inference goes through a static `KVCache`; `prefill()` runs a prompt (or a chunk
of one) and `decode_step()` one token per sequence. `forward()` is the cache-free
full-sequence pass used for training, perplexity and the ``use_cache=False`` demo.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from labkit.model.config import LLAMA3_KEYS, ModelConfig, get_config
from labkit.model.kv_quant import check_kv_dtype, dequantize_kv, quantize_kv
from labkit.model.matmul import INFERENCE_LAYOUT, Linear, set_weight_layout, tune_matmul
from labkit.model.matmul import MATMUL_FORMS, WEIGHT_LAYOUTS, split_k_matmul  # noqa: F401  (re-exported)


class KVCache:
    """Static, preallocated key/value cache with per-sequence lengths.

    `k` and `v` have shape ``(n_layers, batch, n_kv_heads, max_len + 1, head_dim)``:
    layer ``i`` is the usual ``(batch, kv_heads, max_len, head_dim)`` block plus one
    spare slot at index `max_len` that soaks up writes from padding tokens (so a
    right-padded batch never needs data-dependent shapes). `lengths[b]` is how many
    tokens sequence ``b`` holds; the next token of ``b`` goes to slot ``lengths[b]``.

    `filled` is ``max(lengths)`` kept on the host, so eager attention reads only the
    filled prefix without a device sync. With ``static=True`` attention always reads
    all `max_len` slots (masking the unused ones): every step has the same shapes,
    which is what CUDA graphs and ``torch.compile`` without recompiles need.

    ``kv_dtype="int8"`` stores int8 codes plus one fp32 scale per (token, head) vector
    (`labkit.model.kv_quant`): `k`/`v` are int8 and `k_scale`/`v_scale` have shape
    ``(n_layers, batch, n_kv_heads, max_len + 1, 1)``; attention reads dequantized copies.

    Any object with `lengths`, `filled`, `max_len`, `static`, `nbytes` and `writer()`
    (see `writer`) can stand in for this class; the server's paged cache does (its writer is
    ragged: rows read in groups, each to its own length; see `Attention.forward`).
    """

    def __init__(self, cfg: ModelConfig, batch: int, max_len: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 static: bool = False, kv_dtype: str = "model"):
        if batch < 1 or max_len < 1:
            raise ValueError(f"KVCache needs batch >= 1 and max_len >= 1, got {batch}, {max_len}")
        self.kv_dtype = check_kv_dtype(kv_dtype)
        shape = (cfg.n_layers, batch, cfg.n_kv_heads, max_len + 1, cfg.head_dim)
        store = torch.int8 if kv_dtype == "int8" else dtype
        self.k = torch.zeros(shape, dtype=store, device=device)
        self.v = torch.zeros(shape, dtype=store, device=device)
        if kv_dtype == "int8":
            self.k_scale = torch.zeros(shape[:-1] + (1,), dtype=torch.float32, device=device)
            self.v_scale = torch.zeros_like(self.k_scale)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self.batch, self.max_len, self.static, self.dtype = batch, max_len, static, dtype
        self.filled = 0

    def reset(self) -> None:
        """Empty the cache (contents are left in place; lengths go to 0)."""
        self.rewind(0)

    def rewind(self, tokens: int) -> None:
        """Make every row hold only its first `tokens` tokens again (contents stay in place;
        the next pass overwrites what follows), so a timed decode step can be repeated over
        the same context: `labkit.timing.time_decode_steps` does this before every call."""
        if not 0 <= tokens <= self.max_len:
            raise ValueError(f"can rewind to 0..{self.max_len} tokens, got {tokens!r}")
        self.lengths.fill_(tokens)
        self.filled = tokens

    @property
    def nbytes(self) -> int:
        """Bytes allocated for keys and values (int8: codes + scales), spare slot included."""
        tensors = [self.k, self.v] + ([self.k_scale, self.v_scale] if self.kv_dtype == "int8" else [])
        return sum(t.numel() * t.element_size() for t in tensors)

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `i`'s (k, v) blocks as the model dtype, each (batch, kv_heads, max_len, head_dim)."""
        if self.kv_dtype == "int8":
            n = self.max_len
            return (dequantize_kv(self.k[i, :, :, :n], self.k_scale[i, :, :, :n], self.dtype),
                    dequantize_kv(self.v[i, :, :, :n], self.v_scale[i, :, :, :n], self.dtype))
        return self.k[i, :, :, : self.max_len], self.v[i, :, :, : self.max_len]

    def writer(self, positions: torch.Tensor, valid: torch.Tensor, kv_len: int):
        """Plan one cached pass; returns ``write(layer, k, v) -> (K, V)``.

        `positions` (B, T): absolute positions of this pass's tokens; `valid` (B, T):
        False for right padding. `write` stores k, v (B, kv_heads, T, head_dim) at those
        positions (padding goes to the spare slot) and returns the first `kv_len`
        positions of the layer's keys and values, (B, kv_heads, kv_len, head_dim), in the
        model dtype."""
        slots = torch.where(valid, positions, self.max_len)
        if self.kv_dtype == "model":
            return contiguous_writer(self.k, self.v, slots, kv_len)

        def write(i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = []
            for codes, scales, new in ((self.k[i], self.k_scale[i], k), (self.v[i], self.v_scale[i], v)):
                q, s = quantize_kv(new)
                codes.scatter_(2, _slot_index(slots, q.shape[1], q.shape[3]), q)
                scales.scatter_(2, _slot_index(slots, q.shape[1], 1), s)
                out.append(dequantize_kv(codes[:, :, :kv_len], scales[:, :, :kv_len], self.dtype))
            return out[0], out[1]
        return write


def _slot_index(slots: torch.Tensor, heads: int, width: int) -> torch.Tensor:
    """(B, T) slot numbers → the (B, heads, T, width) index `scatter_` along dim 2 wants."""
    B, T = slots.shape
    return slots[:, None, :, None].expand(B, heads, T, width)


def contiguous_writer(k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor, kv_len: int):
    """`write(layer, k_new, v_new)` for plain contiguous K/V tensors (n_layers, B, kv_heads,
    slots, head_dim): scatter the new vectors into `slots` (B, T), return the first
    `kv_len` slots. Tensor-only, so ``torch.compile`` and CUDA graphs capture it whole."""
    idx = _slot_index(slots, k.shape[2], k.shape[4])  # once per pass, not per layer

    def write(i: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        kc, vc = k[i], v[i]
        kc.scatter_(2, idx, k_new)
        vc.scatter_(2, idx, v_new)
        return kc[:, :, :kv_len], vc[:, :, :kv_len]
    return write


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None) -> torch.Tensor:
    """RoPE inverse frequencies (rad/token), computed exactly as HF Llama does; with a
    llama3 `scaling` dict (see `ModelConfig.rope_scaling`), rescaled by `llama3_scale`."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    return inv_freq if scaling is None else llama3_scale(inv_freq, **{k: scaling[k] for k in LLAMA3_KEYS})


def llama3_scale(inv_freq: torch.Tensor, factor: float, low_freq_factor: float, high_freq_factor: float,
                 original_max_position_embeddings: int) -> torch.Tensor:
    """Llama 3.1's RoPE frequency scaling (as transformers' `_compute_llama3_parameters`).

    Wavelengths (tokens per turn, 2π / inv_freq) shorter than the original context /
    `high_freq_factor` are kept: they resolve nearby positions, which a longer context
    doesn't change. Those longer than original context / `low_freq_factor` are slowed
    by `factor`, so positions past the trained context map onto angles the model saw.
    In between, the two are blended linearly in context / wavelength."""
    old_ctx = original_max_position_embeddings
    low_freq_wavelen, high_freq_wavelen = old_ctx / low_freq_factor, old_ctx / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and *signed* sin, each (B, T, 1, head_dim), for integer `positions` (B, T).

    The sign of rotate-half (``cat(-x2, x1)``) is folded into the first half of sin,
    so `apply_rope` needs a single `roll` instead of chunk + neg + cat.
    """
    freqs = positions.float()[..., None] * inv_freq  # fp32 like HF, whatever the model dtype
    cos = torch.cat((freqs, freqs), dim=-1).cos()
    sin = freqs.sin()
    sin = torch.cat((-sin, sin), dim=-1)
    return cos[:, :, None, :].to(dtype), sin[:, :, None, :].to(dtype)


def rope_table(max_len: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """(max_len, 2, head_dim) table of `rope_cos_sin` for positions 0..max_len-1 (fp32):
    a decode step then looks its cos and sin up with one index op instead of ~10 ops."""
    cos, sin = rope_cos_sin(torch.arange(max_len)[None], inv_freq.float(), torch.float32)
    return torch.cat((cos, sin), dim=2)[0]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` (B, T, heads, head_dim) by position, rotate-half convention (HF Llama):
    x·cos + cat(−x2, x1)·sin, written as x·cos + roll(x, D/2)·signed_sin."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.layer_idx = layer_idx
        # Qwen2-style checkpoints add a bias to q, k and v (never to the output projection)
        self.wqkv = Linear(cfg.dim, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim, bias=cfg.qkv_bias)
        self.wo = Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                write=None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """`x`: (B·T, dim), the B sequences' T tokens (B, T from `cos`: (B, T, 1, D)).
        `write` is None (no cache: causal attention over `x` alone) or a cache's
        ``write(layer, k, v) -> (K, V)`` (see `KVCache.writer`); `mask` (B, 1, n_rep·T, L)
        is added to the scores of the L cached positions (-inf: not visible), or None
        when every query sees every one of them. A ragged writer (one with `write.groups`,
        [(rows, length)]: `labkit.serve.paged`) returns one (K, V) per group and `mask` is a
        list with one mask per group."""
        B, T = cos.shape[:2]
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = self.wqkv(x).reshape(B, T, H + 2 * Hkv, D)  # reshape: a "wx" product is transposed
        qk = apply_rope(qkv[:, :, : H + Hkv], cos, sin)
        q = qk[:, :, :H].transpose(1, 2)  # (B, H, T, D)
        k = qk[:, :, H:].transpose(1, 2)  # (B, Hkv, T, D)
        v = qkv[:, :, H + Hkv:].transpose(1, 2)
        if write is None:
            # Training / no-cache path: plain causal attention over this sequence.
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=H != Hkv)
        else:
            kv = write(self.layer_idx, k, v)
            # Grouped-query attention without copying K/V: fold the n_rep query heads
            # that share a KV head into the query-length axis (the mask was folded alike).
            q = q.reshape(B, Hkv, (H // Hkv) * T, D)
            if isinstance(kv, tuple):  # every row reads the same kv_len positions
                y = F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=mask)
            else:  # ragged (labkit.serve.paged): one attention per group of rows, each to its own length
                y = q.new_empty(q.shape)
                for (idx, _), (kc, vc), m in zip(write.groups, kv, mask):
                    y.index_copy_(0, idx, F.scaled_dot_product_attention(q.index_select(0, idx), kc, vc, attn_mask=m))
            y = y.reshape(B, H, T, D)  # CUDA's SDPA may return it strided: view would fail there
        return self.wo(y.transpose(1, 2).reshape(B * T, H * D))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(x W_gate) * (x W_up)), gate and up fused into one matmul (w13)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w13 = Linear(cfg.dim, 2 * cfg.hidden_dim, bias=False)
        self.w2 = Linear(cfg.hidden_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # HF's LlamaRMSNorm maths (statistics in fp32), bit for bit: x * x is what pow(x, 2)
        # computes, without pow's scalar wrapping, and the in-place add_/rsqrt_ work on a
        # fresh temporary. Written out rather than F.rms_norm: on CPU that op dispatches more
        # ops than these (profiled, torch 2.13). An fp32 x skips the two casts: even a no-op
        # .float() costs a dispatch (~2 µs, 18 per step).
        xf = x if x.dtype == torch.float32 else x.float()
        xf = xf * (xf * xf).mean(-1, keepdim=True).add_(self.eps).rsqrt_()
        return self.weight * (xf if xf.dtype == x.dtype else xf.to(x.dtype))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg, layer_idx)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x, cos, sin, write=None, mask=None):
        x = x + self.attention(self.attention_norm(x), cos, sin, write, mask)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    """The decoder. Build with ``Transformer(cfg)`` or ``Transformer.from_preset("tiny")``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.init_rope()
        self.weight_layout = "nk"

    def init_rope(self) -> None:
        """(Re)build the RoPE buffers: `inv_freq` and the `rope_cache` table of cos/sin for
        every position of the context (rebuilt after loading on the meta device)."""
        cfg = self.config
        inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("rope_cache", rope_table(cfg.max_seq_len, inv_freq).to(self.dtype),
                             persistent=False)

    def _rope(self, positions: torch.Tensor, bound: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (B, T, 1, head_dim) at `positions` (B, T), all < `bound` (a host int):
        looked up in `rope_cache`, computed only for positions past the context."""
        if bound > self.rope_cache.shape[0]:
            return rope_cos_sin(positions, self.inv_freq, self.dtype)
        cs = self.rope_cache[positions]  # (B, T, 2, D)
        return cs[:, :, :1], cs[:, :, 1:]

    @classmethod
    def from_preset(cls, name: str, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                    device: torch.device | str = "cpu", **overrides) -> "Transformer":
        """A randomly initialised model of preset `name` (see `labkit.model.config.PRESETS`)."""
        torch.manual_seed(seed)
        model = cls(get_config(name, **overrides))
        model.init_weights()
        return model.to(device=device, dtype=dtype).eval().set_weight_layout(INFERENCE_LAYOUT)

    def init_weights(self, std: float = 0.02) -> None:
        """GPT-2-style init: N(0, std), residual output projections scaled by 1/sqrt(2·layers)."""
        resid_std = std / math.sqrt(2 * self.config.n_layers)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(("wo.weight", "w2.weight")):
                nn.init.normal_(p, 0.0, resid_std)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, 0.0, std)

    def num_params(self) -> int:
        """Parameter count (a tied embedding counted once, even in the "kn" layout)."""
        n = sum(p.numel() for p in self.parameters())
        if self.config.tie_embeddings and self.output.weight is not self.tok_embeddings.weight:
            n -= self.output.weight.numel()  # the "kn" layout's private copy of the tied matrix
        return n

    def set_weight_layout(self, layout: str) -> "Transformer":
        """Store every linear layer's weight as "nk" or "kn" (`labkit.model.matmul.set_weight_layout`)."""
        return set_weight_layout(self, layout)

    def tune_matmul(self, batches: tuple[int, ...] = (1, 8), repeat: int = 3, steps: int = 4,
                    context: int = 16) -> dict:
        """Choose this machine's weight layout and matmul form per decode batch by timing
        decode steps (`labkit.model.matmul.tune_matmul`)."""
        return tune_matmul(self, batches, repeat, steps, context)

    def weight_bytes_per_step(self, batch: int = 1) -> int:
        """Bytes of weights one decode step must read: every matrix and norm once, plus
        `batch` embedding rows when the embedding is not shared with the output projection.
        Submodules' buffers count too (a quantized linear keeps its codes and scales in
        buffers); the model's own buffers are RoPE position tables, not weights."""
        tensors = list(self.named_parameters()) + [(n, b) for n, b in self.named_buffers() if "." in n]
        total = sum(t.numel() * t.element_size() for n, t in tensors if n != "tok_embeddings.weight")
        w = self.tok_embeddings.weight
        if getattr(self.output, "weight", None) is w:  # tied (a quantized head has no .weight)
            total += w.numel() * w.element_size()  # the output head reads it all
        else:
            total += batch * w.shape[1] * w.element_size()
        return total

    @property
    def device(self) -> torch.device:
        return self.tok_embeddings.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.tok_embeddings.weight.dtype

    def new_cache(self, batch: int, max_len: int, static: bool = False, kv_dtype: str = "model") -> KVCache:
        """A `KVCache` matching this model's shape, dtype and device (`kv_dtype` "model" | "int8")."""
        return KVCache(self.config, batch, max_len, dtype=self.dtype, device=self.device, static=static,
                       kv_dtype=kv_dtype)

    # ------------------------------------------------------------------ no-cache pass
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, vocab) for every position of `tokens` (B, T), causal, no cache."""
        B, T = tokens.shape
        positions = torch.arange(T, device=tokens.device).expand(B, T)
        cos, sin = self._rope(positions, T)
        x = self.tok_embeddings(tokens.reshape(B * T))  # hidden states are (B·T, dim) throughout
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.output(self.norm(x)).reshape(B, T, -1)

    # ---------------------------------------------------------------- cached passes
    def prefill(self, tokens: torch.Tensor, cache: KVCache,
                lengths: torch.Tensor | list[int] | None = None,
                all_logits: bool = False) -> torch.Tensor:
        """Append `tokens` (B, T) to `cache` and return next-token logits (B, vocab).

        `lengths[b]` is how many of row b's tokens are real; the rest are right
        padding, never attended to and never kept. Each row continues where its
        sequence in the cache stopped (``cache.lengths``), so this also does chunked
        prefill. With `all_logits` the result is (B, T, vocab), for every position.
        """
        B, T = tokens.shape
        if lengths is None:
            new_len = torch.full((B,), T, dtype=torch.long, device=tokens.device)
            host_new_max = T
        else:
            new_len = torch.as_tensor(lengths, dtype=torch.long, device=tokens.device)
            host_new_max = int(new_len.max())
            if int(new_len.min()) < 1 or host_new_max > T:
                raise ValueError(f"lengths must lie in [1, {T}] (the padded width), got {new_len.tolist()}")
        if cache.filled == 0:
            filled = host_new_max
        else:  # a chunk after earlier content: rows may differ, so ask the device once
            filled = int((cache.lengths + new_len).max())
        self._check_room(cache, filled)
        kv_len = cache.max_len if cache.static else filled
        x = self._forward_cached(tokens, new_len, cache.lengths, kv_len, cache.writer).view(B, T, -1)
        cache.filled = filled
        if not all_logits:
            return self.output(self.norm(x[torch.arange(B, device=x.device), new_len - 1]))
        return self.output(self.norm(x.reshape(B * T, -1))).reshape(B, T, -1)

    def decode_step(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Append one token per sequence (`tokens`: (B,)) and return logits (B, vocab)."""
        self._check_room(cache, cache.filled + 1)
        kv_len = cache.max_len if cache.static else cache.filled + 1
        if isinstance(cache, KVCache) and cache.kv_dtype == "model":
            # Plain tensors in, logits out: the form compile_decode / CUDA graphs capture.
            # One sequence whose cache holds exactly its own tokens sees every key: no mask.
            masked = cache.static or tokens.shape[0] > 1
            logits = self._decode_fn(tokens, cache.k, cache.v, cache.lengths, kv_len, cache.max_len, masked)
        else:
            ones = torch.ones_like(tokens)
            x = self._forward_cached(tokens[:, None], ones, cache.lengths, kv_len, cache.writer)
            logits = self.output(self.norm(x))
        cache.filled += 1
        return logits

    def compile_decode(self, **compile_kwargs) -> None:
        """Route `decode_step` through ``torch.compile`` (use a ``static=True`` cache so
        every step has the same shapes and nothing recompiles)."""
        self._decode_fn = torch.compile(self._decode_logits, **compile_kwargs)

    def __getattr__(self, name: str):
        if name == "_decode_fn":  # eager unless compile_decode() replaced it
            return self._decode_logits
        return super().__getattr__(name)

    @staticmethod
    def _check_room(cache: KVCache, filled: int) -> None:
        if filled > cache.max_len:
            raise ValueError(f"{filled} tokens do not fit the KV cache (max_len={cache.max_len})")

    def _decode_logits(self, tokens, k, v, lengths, kv_len: int, spare: int, masked: bool = True) -> torch.Tensor:
        """One decode step on a plain contiguous cache's tensors (slot `spare` takes padding);
        `masked=False` when every query may see all `kv_len` slots."""
        def writer(positions, valid, kv_len):
            # decode tokens are never padding: the slots are the positions themselves
            return contiguous_writer(k, v, positions, kv_len)
        x = self._forward_cached(tokens[:, None], None, lengths, kv_len, writer, masked)
        return self.output(self.norm(x))

    def _visible(self, positions: torch.Tensor, kv_len: int) -> torch.Tensor:
        """Additive mask (B, 1, n_rep·T, kv_len) for queries at `positions` (B, T): position p
        sees keys 0..p (causal; positions past a row's length are stale or empty and are excluded
        by the same test). Built once per pass: SDPA would otherwise convert a bool mask in
        every layer."""
        B, T = positions.shape
        seen = torch.arange(kv_len, device=positions.device) <= positions[:, :, None]  # (B, T, L)
        n_rep = self.config.n_rep
        seen = seen[:, None].expand(B, n_rep, T, kv_len).reshape(B, 1, n_rep * T, kv_len)
        return torch.zeros(seen.shape, dtype=self.dtype, device=positions.device).masked_fill_(~seen, -math.inf)

    def _forward_cached(self, tokens: torch.Tensor, new_len: torch.Tensor | None, lengths: torch.Tensor,
                        kv_len: int, writer, masked: bool = True) -> torch.Tensor:
        """Core of the cached passes (no host state, so it compiles whole): stores K/V
        through ``writer(positions, valid, kv_len)``, advances `lengths` in place and
        returns hidden states (B·T, dim). `new_len` None: every token is real (decode)."""
        B, T = tokens.shape
        if B != lengths.shape[0]:
            raise ValueError(f"batch of {B} sequences does not match the cache's batch {lengths.shape[0]}")
        steps = torch.arange(T, device=tokens.device)
        positions = lengths[:, None] + steps  # (B, T) absolute positions
        valid = None if new_len is None else steps < new_len[:, None]  # False: right padding, never kept
        cos, sin = self._rope(positions, kv_len)
        write = writer(positions, valid, kv_len)
        groups = getattr(write, "groups", None)  # a ragged writer's row groups: one mask each
        if not masked:
            mask = None
        elif groups is None or len(groups) == 1:  # one group reads every row, in order, to kv_len
            mask = self._visible(positions, kv_len)
        else:
            mask = [self._visible(positions.index_select(0, idx), n) for idx, n in groups]
        x = self.tok_embeddings(tokens.reshape(B * T))
        for layer in self.layers:
            x = layer(x, cos, sin, write, mask)
        lengths += T if new_len is None else new_len
        return x
