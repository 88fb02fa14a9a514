"""Token log-probabilities in the OpenAI sense: log softmax of the model's raw logits (before
temperature, top-k or top-p, as vLLM reports them), the chosen token's and the top-k
alternatives'. Natural log (nats)."""

from __future__ import annotations

from typing import Any

import torch

TokenLogprob = tuple[int, float, dict[int, float]]  # (token id, its logprob, {alternative id: logprob})


def token_logprob(logits: torch.Tensor, token: int, k: int) -> TokenLogprob:
    """Logprob of `token` under one row of `logits` (vocab,), and the `k` most likely tokens'
    (the chosen one added if it is not among them, as vLLM does)."""
    lsm = torch.log_softmax(logits.float(), dim=-1)
    top = {}
    if k:
        vals, ids = lsm.topk(k)
        top = dict(zip(ids.tolist(), vals.tolist()))
    chosen = float(lsm[token])
    top.setdefault(int(token), chosen)
    return int(token), chosen, top


def prompt_logprobs(model: Any, ids: list[int], k: int) -> list[TokenLogprob | None]:
    """Each prompt token's logprob given the tokens before it (the first has none: None), from one
    causal pass without a KV cache. This is what lm-eval-harness's loglikelihood asks for with
    echo=True, max_tokens=0, logprobs=k. Call it off the event loop (it is a model pass)."""
    with torch.inference_mode():
        logits = model(torch.tensor([ids], device=model.device))[0]
    return [None] + [token_logprob(logits[i - 1], ids[i], k) for i in range(1, len(ids))]
