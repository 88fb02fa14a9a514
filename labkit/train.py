"""Train the workbook's tiny checkpoint: ``python -m labkit.train``.

Reads ``data/corpus/train.txt`` / ``valid.txt`` and ``data/tiny/tokenizer.json``,
trains the ``tiny`` preset from a fixed seed for a fixed number of steps (so the
result does not depend on how fast the machine is), evaluates validation perplexity
and a unigram baseline, and writes ``data/tiny/{model.safetensors, config.json,
README.md}``. Defaults take ~10–12 min on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from labkit.device import describe
from labkit.model.checkpoint import save_checkpoint
from labkit.model.config import get_config
from labkit.model.evaluate import perplexity, unigram_perplexity
from labkit.model.generate import SamplingParams, generate
from labkit.model.transformer import Transformer
from labkit.paths import CORPUS, TINY
from labkit.session import seed_everything
from labkit.tokenizer import load_tokenizer


@dataclasses.dataclass
class TrainConfig:
    """Training budget and optimiser settings (lengths in tokens, lr in 1/step units)."""

    preset: str = "tiny"
    steps: int = 700
    batch_size: int = 8
    seq_len: int = 256
    lr: float = 3e-3
    min_lr_frac: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    eval_ctx: int = 256
    log_every: int = 25

    @property
    def tokens(self) -> int:
        return self.steps * self.batch_size * self.seq_len


def lr_at(step: int, tc: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to `min_lr_frac` of the peak."""
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    t = (step - tc.warmup_steps) / max(1, tc.steps - tc.warmup_steps)
    return tc.lr * (tc.min_lr_frac + (1 - tc.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def train(model: Transformer, train_ids: torch.Tensor, tc: TrainConfig,
          log=print) -> dict[str, float]:
    """Train `model` in place on random windows of `train_ids`; returns timing figures
    (seconds, tokens, tokens/s) and the last smoothed training loss (nats/token)."""
    g = torch.Generator().manual_seed(tc.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tc.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=tc.lr, betas=(0.9, 0.95), eps=1e-8)
    model.train()
    n = train_ids.numel() - tc.seq_len - 1
    offsets = torch.arange(tc.seq_len + 1)
    t0 = time.perf_counter()
    smooth = None
    for step in range(tc.steps):
        starts = torch.randint(0, n, (tc.batch_size,), generator=g)
        win = train_ids[starts[:, None] + offsets]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, tc)
        logits = model(win[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), win[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        smooth = loss.item() if smooth is None else 0.95 * smooth + 0.05 * loss.item()
        if (step + 1) % tc.log_every == 0 or step == tc.steps - 1:
            el = time.perf_counter() - t0
            log(f"step {step + 1:5d}/{tc.steps}  loss {smooth:.3f}  lr {lr_at(step, tc):.2e}  "
                f"{el:6.0f} s  {(step + 1) * tc.batch_size * tc.seq_len / el:6.0f} tok/s")
    model.eval()
    seconds = time.perf_counter() - t0
    return {"train_seconds": seconds, "train_tokens": tc.tokens,
            "tokens_per_s": tc.tokens / seconds, "final_train_loss": smooth}


def _readme(tc: TrainConfig, figures: dict, cfg_dict: dict, sample: str, cmd: str) -> str:
    f = figures
    return f"""# data/tiny: the workbook's trained tiny checkpoint

- `model.safetensors` + `config.json`: labkit format (`labkit.model.load_tiny()`), fp32,
  {f['params']:,} parameters ({f['bytes'] / 1e6:.1f} MB). Llama architecture: RMSNorm, RoPE
  (theta {cfg_dict['rope_theta']:g}), SwiGLU, grouped-query attention ({cfg_dict['n_heads']} query /
  {cfg_dict['n_kv_heads']} KV heads), {cfg_dict['n_layers']} layers, d={cfg_dict['dim']},
  hidden {cfg_dict['hidden_dim']}, tied embeddings, vocab {cfg_dict['vocab_size']}.
- Tokenizer: `tokenizer.json` (see README_tokenizer.md), `labkit.tokenizer.load_tokenizer()`.
- Data: `data/corpus/train.txt` (training), `valid.txt` (evaluation); public domain.
- Licence: the weights are derived from public-domain text and are part of labkit (MIT).

## How it was made

    {cmd}

Seeded (seed {tc.seed}): random 256-token windows of the training stream, AdamW
(betas 0.9/0.95, weight decay {tc.weight_decay}), peak lr {tc.lr:g}, {tc.warmup_steps} warm-up steps,
cosine decay to {tc.min_lr_frac:g}× peak, gradient clipping {tc.grad_clip}.
Same seed, same torch build and thread count give the same weights; other thread
counts or CPUs can differ in the last bits (floating-point reduction order).

| budget | value |
|---|---|
| steps | {tc.steps:,} |
| batch | {tc.batch_size} × {tc.seq_len} tokens |
| training tokens | {tc.tokens:,} ({tc.tokens / f['train_stream_tokens']:.2f} epochs of {f['train_stream_tokens']:,}) |
| training time | {f['train_seconds']:.0f} s on {f['threads']} CPU threads ({f['tokens_per_s']:.0f} tokens/s) |
| whole script | {f['total_seconds']:.0f} s |
| machine | {f['machine']} |

Trained on 256-token windows: the architecture accepts `max_seq_len` =
{cfg_dict['max_seq_len']} tokens (useful for timing long contexts), but text quality
degrades past 256.

## Quality

| metric (validation set, {f['valid_tokens']:,} tokens) | perplexity |
|---|---|
| this model, context {tc.eval_ctx} | **{f['val_ppl']:.1f}** |
| unigram baseline (train-set token frequencies, add-one) | {f['unigram_ppl']:.1f} |

Final smoothed training loss: {f['final_train_loss']:.3f} nats/token.

Sample (temperature 0.8, top-k 40, seed 0) after the prompt `ROMEO.`:

```
{sample}
```
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labkit.train", description=__doc__.split("\n\n")[0])
    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        ap.add_argument("--" + f.name.replace("_", "-"), type=type(getattr(defaults, f.name)),
                        default=getattr(defaults, f.name))
    ap.add_argument("--out", type=Path, default=TINY, help="output directory")
    ap.add_argument("--corpus", type=Path, default=CORPUS, help="directory with train.txt, valid.txt")
    ap.add_argument("--tokenizer", type=Path, default=None, help="tokenizer.json (default: shipped)")
    ap.add_argument("--max-train-chars", type=int, default=None, help="use only a prefix (smoke tests)")
    args = ap.parse_args(argv)
    tc = TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)})

    t_start = time.perf_counter()
    seed_everything(tc.seed)
    tok = load_tokenizer(args.tokenizer)
    train_text = (args.corpus / "train.txt").read_text(encoding="utf-8")[: args.max_train_chars]
    valid_text = (args.corpus / "valid.txt").read_text(encoding="utf-8")[: args.max_train_chars]
    train_ids = torch.tensor(tok.encode(train_text), dtype=torch.long)
    valid_ids = torch.tensor(tok.encode(valid_text), dtype=torch.long)
    print(f"tokens: train {train_ids.numel():,}  valid {valid_ids.numel():,}  "
          f"(tokenized in {time.perf_counter() - t_start:.1f} s)", flush=True)

    cfg = get_config(tc.preset, vocab_size=tok.vocab_size)
    torch.manual_seed(tc.seed)
    model = Transformer(cfg)
    model.init_weights()
    print(f"model: {tc.preset}, {model.num_params():,} params; {tc.steps} steps × "
          f"{tc.batch_size}×{tc.seq_len} = {tc.tokens:,} tokens", flush=True)
    figures = train(model, train_ids, tc, log=lambda s: print(s, flush=True))

    val_ppl = perplexity(model, valid_ids, ctx=min(tc.eval_ctx, tc.seq_len))
    uni_ppl = unigram_perplexity(train_ids, valid_ids, cfg.vocab_size)
    print(f"validation perplexity {val_ppl:.2f}  unigram baseline {uni_ppl:.2f}", flush=True)
    prompt = tok.encode("ROMEO.")
    out = generate(model, prompt, max_new_tokens=120, seed=0,
                   sampling=SamplingParams(temperature=0.8, top_k=40), stop_tokens=[tok.eos_id])[0]
    sample = tok.decode(prompt + out)
    print(sample, flush=True)

    figures.update(params=model.num_params(), bytes=model.num_params() * 4, val_ppl=val_ppl,
                   unigram_ppl=uni_ppl, valid_tokens=valid_ids.numel(),
                   train_stream_tokens=train_ids.numel(), threads=torch.get_num_threads(),
                   machine=f"{describe('cpu').name}, torch {torch.__version__}, "
                           f"Python {platform.python_version()}",
                   total_seconds=time.perf_counter() - t_start)
    cmd = "python -m labkit.train" + ("" if argv is None and len(sys.argv) == 1
                                      else " " + " ".join(argv if argv is not None else sys.argv[1:]))
    save_checkpoint(model, args.out, extra={"training": {**dataclasses.asdict(tc), **{
        k: v for k, v in figures.items() if k != "machine"}, "command": cmd}})
    (args.out / "README.md").write_text(_readme(tc, figures, cfg.to_dict(), sample, cmd))
    print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in figures.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
