"""Sampling and generation: greedy / temperature / top-k / top-p / repetition penalty,
batched (ragged prompts, left- or right-padded input), streaming, stop tokens,
with or without the KV cache.

The loop is deliberately lean (one `decode_step`, one sampling call and one
bookkeeping op per step, all under `torch.inference_mode`): for a small model the
Python around the model is a real share of each step.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Iterable, Iterator, Sequence

import torch

from labkit.model.transformer import Transformer


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token from logits.

    temperature 0 is greedy (argmax). top_k 0 and top_p 1 switch those filters off.
    repetition_penalty > 1 discourages tokens already in the sequence (HF/CTRL
    rule: divide a positive logit by it, multiply a negative one).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature={self.temperature!r} must be >= 0 (0 means greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p!r} must lie in (0, 1]")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise ValueError(f"top_k={self.top_k!r} must be an integer >= 0 (0 = off)")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty={self.repetition_penalty!r} must be > 0 (1 = off)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def filter_logits(logits: torch.Tensor, params: SamplingParams,
                  seen: torch.Tensor | None = None) -> torch.Tensor:
    """Apply repetition penalty, temperature, top-k and top-p to `logits` (B, V).

    Tokens filtered out get -inf. `seen` (B, V, bool) marks tokens the repetition
    penalty applies to. Returns a new tensor; order as in HF: penalty, temperature,
    top-k, top-p.
    """
    logits = logits.float()
    if params.repetition_penalty != 1.0 and seen is not None:
        p = params.repetition_penalty
        logits = torch.where(seen, torch.where(logits > 0, logits / p, logits * p), logits)
    if params.greedy:
        return logits
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens ranked above it already hold >= top_p of the
        # mass: what is kept is the smallest set reaching top_p (never empty).
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= params.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None,
           seen: torch.Tensor | None = None) -> torch.Tensor:
    """Next token ids (B,) from `logits` (B, V) under `params`; seeded by `generator`."""
    logits = filter_logits(logits, params, seen)
    if params.greedy:
        return logits.argmax(dim=-1)
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def _pack(prompts, attention_mask, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn ragged prompts or a padded (B, T) tensor + mask into right-padded
    tokens (B, T) and lengths (B,). Left padding is handled by moving each row's real
    tokens to the front (positions then start at 0, as HF's position_ids do)."""
    if isinstance(prompts, torch.Tensor):
        ids = prompts if prompts.dim() == 2 else prompts[None]
        if attention_mask is None:
            rows = [r.tolist() for r in ids]
        else:
            m = torch.as_tensor(attention_mask).bool()
            if m.shape != ids.shape:
                raise ValueError(f"attention_mask shape {tuple(m.shape)} != input shape {tuple(ids.shape)}")
            rows = [r[mr].tolist() for r, mr in zip(ids, m)]
    else:
        rows = ([[int(t) for t in prompts]] if len(prompts) and isinstance(prompts[0], numbers.Integral)
                else [[int(t) for t in r] for r in prompts])
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError("every prompt needs at least 1 token")
    width = max(len(r) for r in rows)
    tokens = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    return tokens.to(device), lengths.to(device)


def generate_stream(
    model: Transformer,
    prompts: Sequence[Sequence[int]] | Sequence[int] | torch.Tensor,
    *,
    max_new_tokens: int,
    sampling: SamplingParams | None = None,
    stop_tokens: Iterable[int] = (),
    generator: torch.Generator | None = None,
    seed: int | None = None,
    use_cache: bool = True,
    attention_mask: torch.Tensor | None = None,
    static_cache: bool = False,
) -> Iterator[torch.Tensor]:
    """Yield one step of new tokens at a time: a (B,) tensor, -1 where a sequence has
    already stopped. Stops after `max_new_tokens` steps or when every sequence has
    produced a stop token (the stop token itself is yielded).

    `prompts`: one prompt (list of ids), several (ragged lists), or a (B, T) tensor
    with an optional `attention_mask` (left or right padding). `seed` makes a fresh
    generator; pass `generator` to continue one. `use_cache=False` recomputes the
    whole prefix every step (the quadratic-cost baseline).
    """
    sampling = sampling or SamplingParams()
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} must be an integer >= 1")
    device = model.device
    tokens, lengths = _pack(prompts, attention_mask, device)
    B, T = tokens.shape
    ctx = model.config.max_seq_len
    longest = int(lengths.max())
    if longest > ctx:
        raise ValueError(f"prompt of {longest} tokens is longer than the context: "
                         f"allowed 1..{ctx} tokens (model.config.max_seq_len)")
    if longest + max_new_tokens > ctx:
        raise ValueError(f"prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
                         f"the context of {ctx} tokens; allowed max_new_tokens 1..{ctx - longest}")
    if generator is None and seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    stop = torch.tensor(sorted(set(stop_tokens)), dtype=torch.long, device=device)
    need_seen = sampling.repetition_penalty != 1.0
    vocab = model.config.vocab_size
    rows = torch.arange(B, device=device)

    # inference_mode is entered per phase, never held across a `yield`: it is
    # thread-wide state and must not leak into the caller's code between tokens.
    with torch.inference_mode():
        seen = None
        if need_seen:
            seen = torch.zeros(B, vocab, dtype=torch.bool, device=device)
            valid = torch.arange(T, device=device) < lengths[:, None]
            seen[rows[:, None].expand(B, T)[valid], tokens[valid]] = True
        if use_cache:
            cache = model.new_cache(B, longest + max_new_tokens, static=static_cache)
            logits = model.prefill(tokens, cache, lengths)
        else:
            # Full-prefix recompute: keep every sequence in one right-padded buffer.
            buf = torch.zeros(B, longest + max_new_tokens, dtype=torch.long, device=device)
            buf[:, :T] = tokens
            cur = lengths.clone()
            logits = model(buf[:, :longest])[rows, cur - 1]
        done = torch.zeros(B, dtype=torch.bool, device=device)
    for step in range(max_new_tokens):
        with torch.inference_mode():
            nxt = sample(logits, sampling, generator, seen)
            out = nxt.masked_fill(done, -1)
            if stop.numel():
                done = done | torch.isin(nxt, stop)
        yield out
        if step == max_new_tokens - 1 or (stop.numel() and bool(done.all())):
            return
        with torch.inference_mode():
            if need_seen:
                seen[rows, nxt] = True
            if use_cache:
                logits = model.decode_step(nxt, cache)
            else:
                buf[rows, cur] = nxt
                cur += 1
                logits = model(buf[:, : longest + step + 1])[rows, cur - 1]


def generate(model: Transformer, prompts, *, max_new_tokens: int, **kwargs) -> list[list[int]]:
    """Generate for one or many prompts; returns the new tokens of each sequence
    (a list per prompt, ending with the stop token when one was produced).
    Keyword arguments as in `generate_stream`."""
    steps = list(generate_stream(model, prompts, max_new_tokens=max_new_tokens, **kwargs))
    if not steps:
        return []
    table = torch.stack(steps, dim=1).tolist()
    return [[t for t in row if t >= 0] for row in table]


def stream(model: Transformer, prompt: Sequence[int], *, max_new_tokens: int, **kwargs) -> Iterator[int]:
    """Stream the new tokens of a single prompt one int at a time (see `generate_stream`)."""
    for step in generate_stream(model, [list(prompt)], max_new_tokens=max_new_tokens, **kwargs):
        tok = int(step[0])
        if tok < 0:
            return
        yield tok
