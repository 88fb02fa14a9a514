"""The claims of the article, by id: what each says, where it is tested, and how.

`experiment` names the function (``module:function``) that runs the claim's whole
experiment on this machine, prediction first, and returns its `Verdict`; it is imported
only when the claim runs, so reading the ledger stays cheap.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Claim:
    id: str
    chapter: int
    words: str            # the article's claim, paraphrased
    notebooks: tuple[str, ...]   # notebook stems that must record a verdict for it
    test_here: str        # how this machine tests it (the README's ledger column)
    experiment: str       # "module:function", (size, device) -> Verdict
    flip: str = ""        # what measurement, on some machine, would turn the outcome over


def _c(id: str, chapter: int, words: str, notebooks: str, test_here: str, module: str) -> Claim:
    return Claim(id, chapter, words, tuple(notebooks.split()), test_here,
                 f"labkit.ledger.{module}:run_{id.lower()}", FLIPS[id])


# What would turn each verdict over: the measurement that, on some machine, decides the other
# way (the README's "what flips it" column). A claim none could flip would be a demonstration.
FLIPS: dict[str, str] = {
    "C1": "prefill under 5x decode's tokens/s or under 25 % of the GEMM peak; batch-1 decode under 50 % of the "
          "bandwidth; a batch-B step costing over B/2 single steps",
    "C2": "the typical path's time outside the model below 10 % (slow model, fast tokenizer) or above 20 %; heavy "
          "retrieval adding nothing",
    "C3": "decode keeping over a third of the GEMM's gain from more threads (one core could not saturate memory)",
    "C4": "the fitted knee over 3x from the predicted ridge, or its slope / plateau over 3x from the measured "
          "bandwidth / peak",
    "C5": "the GEMV's counters showing >= 30 % compute or < 50 % bandwidth, or the GEMM showing the same signature",
    "C6": "the per-op fixed cost (intercept of time vs work per op) x ops below half of a real decode step's time "
          "(a fast dispatcher, or a model of few large ops)",
    "C7": "graph nodes falling under 3x, or the eager-to-fused latency cut outside 20-40 %",
    "C8": "the folded output off by more than 1e-4 of its scale, or more than one op left",
    "C9": "inference mode's peak above 2/3 of the autograd forward's peak",
    "C10": "the best int8 decode speed-up outside 50-150 % of its bytes ratio (dequantization cost, or weights "
           "that fit a cache)",
    "C11": "on the trained model's own activations and weights: int4 under +3 % perplexity, W8A8 no worse than "
           "int8 weights, or calibration / mixed precision removing under half of W8A8's damage",
    "C12": "unstructured sparsity >= 1.1x dense, or structured under half its bytes-predicted speed-up",
    "C13": "another order ending over 2 % lower in perplexity than D->P->Q",
    "C14": "distillation's measured seconds outside 1.5-2.5x scratch; quantize+fuse outside 1.15-1.45x on the "
           "memory-bound model; the smaller student under 2x",
    "C15": "a batch-8 engine step yielding under half the bytes-predicted tokens (compute or per-step overhead "
           "growing with the batch); on the real server continuous not cutting static's p99 E2E or short requests' "
           "E2E by 1.2x",
    "C16": "FIFO interactive p99 TTFT under 2x alone with offline work arriving as a stream, or priority removing "
           "under 75 % of the excess",
    "C17": "allocated KV tensor bytes not linear in length x sequences (R^2 < 0.99, a point > 15 % off) or the "
           "slope > 15 % off the calculator; paging or int8 fitting < 1.2x the sequences",
    "C18": "the cache answering under half of the trace's repeats, the mean latency falling by under half of "
           "what the skipped model calls would save (a slow embedding, a fast model), or hit precision under 99 %",
    "C19": "on the real server, mean and p99 moving together (|dmean - dp99| < 2/3 of the larger), or neither "
           "moving 20 %",
    "C20": "on the real server, p99 climbing from the lightest load, throughput lagging the load below the knee, "
           "or rising > 33 % past it",
    "C21": "a step of the method pointing away from the planted cause (the tail spread over the path, the cores "
           "or bandwidth near a ceiling, < 25 % of busy samples at the lock), or the first rung by measured cost "
           "to meet the SLO changing answers",
    "C22": "the shipped stage's p99 outside 3-8x the fixed stage's at the same rate (cores that queue the fixed "
           "service too, or a lock near saturation), the fix alone missing the SLO, or int8 weights with the bug "
           "meeting it",
}


CLAIMS: dict[str, Claim] = {c.id: c for c in [
    _c("C1", 1, "Prefill handles the prompt in parallel and is compute-heavy; decode emits one token per step "
       "and is memory-bound.", "01_prefill_vs_decode",
       "prefill and decode of a decoder with weights past the cache timed against measured ceilings: prefill "
       "vs decode tokens/s, prefill's share of the GEMM peak, decode's share of the bandwidth, a batch's cost",
       "ch1"),
    _c("C2", 1, "Pre/post-processing can take 10-20 % of end-to-end latency, more with heavy retrieval.",
       "01_prefill_vs_decode", "the request path's spans timed; the typical path's share outside the model "
       "against 10-20 %", "ch1"),
    _c("C3", 2, "A memory-bound model barely speeds up on a card with far more compute.", "02_roofline",
       "compute changed at fixed bandwidth (1 vs all threads, or a faster dtype): decode's speed-up against "
       "the GEMM's", "ch2"),
    _c("C4", 2, "Below the ridge attainable = intensity x bandwidth; above it, the compute peak.", "02_roofline",
       "a kernel of tunable intensity swept across the ridge; the knee located from the data vs the "
       "predicted ridge", "ch2"),
    _c("C5", 2, "Low compute utilisation with high bandwidth utilisation means memory-bound.", "02_roofline",
       "hardware counters (NVML on GPU, perf events on Linux) during a GEMM and a GEMV; inconclusive "
       "without counters", "ch2"),
    _c("C6", 3, "In eager mode every op is a launch with a fixed cost; many small ops lose much time to it.",
       "03_fusion", "an eager op timed at several widths: the fixed cost is the intercept of time vs work; ops of a "
       "decode step of the trained tiny decoder counted, the step timed: share = ops x intercept / step time", "ch3"),
    _c("C7", 3, "Fusion can cut graph nodes to a third or fewer and latency by 20-40 % on memory-bound models.",
       "03_fusion", "kernels and time of memory-bound chains, eager vs fused, against the 1/3 and 20-40 % bands",
       "ch3"),
    _c("C8", 3, "Conv + BatchNorm + activation fold into one op with the same result.", "03_fusion",
       "folded vs unfolded outputs on random inputs, and their op counts", "ch3"),
    _c("C9", 3, "Inference need not keep activations: buffer reuse lowers peak memory.", "03_fusion",
       "peak memory of a forward with autograd on vs inference mode", "ch3"),
    _c("C10", 4, "Lower-precision weights cut decode time nearly in proportion to bytes moved.",
       "04_quantization", "measured decode speed-up of each kernel path vs its bytes ratio", "ch4"),
    _c("C11", 4, "4-bit weights can break accuracy; activations are harder (outliers); calibration and mixed "
       "precision repair much of it.", "04_quantization",
       "perplexity of the trained model with int8/int4 weights and W8A8 on its own activations; repair by "
       "calibration, SmoothQuant and a measured sensitivity ranking; planted outliers shown as a demonstration, "
       "not judged", "ch4"),
    _c("C12", 4, "Unstructured sparsity gives no speed-up on dense hardware; structured pruning does.",
       "05_pruning_distillation", "decode speed of kept-dense, CSR and structured pruning at equal sparsity",
       "ch4"),
    _c("C13", 4, "Distill, then prune, then quantize is a stable order; evaluate after each step.",
       "05_pruning_distillation", "every order run end to end; final perplexities compared", "ch4"),
    _c("C14", 4, "Distillation roughly doubles training cost; quantization + fusion give ~30 %; integer-multiple "
       "speed-ups need a smaller model.", "05_pruning_distillation",
       "measured training seconds with and without the teacher (tiny model); decode speed-ups of "
       "quantize+fuse and of the student shape measured on C12's memory-bound model", "ch4"),
    _c("C15", 5, "Batching amortises weight reads; static batching makes short requests wait; continuous "
       "batching fixes it.", "06_batching 08_p99_and_load",
       "decode steps of the real engine on C10's memory-bound model, batch 1 vs 8; static vs continuous "
       "batching on the real server at 60 % of static's measured capacity: p99 E2E and short requests' E2E", "ch5"),
    _c("C16", 5, "Mixed online + offline traffic in one FIFO hurts interactive latency; priorities or pools "
       "fix it.", "06_batching", "the real engine, interactive requests (30 % of its measured capacity) "
       "interleaved with a stream of offline jobs (65 %): interactive p99 TTFT alone, FIFO, priority", "ch5"),
    _c("C17", 5, "KV cache grows with sequence length x concurrency; quantized KV and paged blocks fit more "
       "requests.", "06_batching 07_kv_and_result_cache",
       "tensor storage of the KV cache generate allocates, measured as sequences and length grow (model "
       "dtype and int8) and fitted against the calculator; sequences the engine fits paged vs max-length, int8 vs "
       "model dtype", "ch5"),
    _c("C18", 5, "A semantic result cache removes repeated work.", "07_kv_and_result_cache",
       "a threshold chosen on labelled pairs; a trace with repeats (the held-out pairs) served by the tiny "
       "model with and without the semantic cache: model calls and mean latency removed, hit precision as the guard", "ch5"),
    _c("C19", 6, "The mean hides the tail; a 30 % better mean can come with a 5 % better p99.",
       "08_p99_and_load", "mean vs p99 change between two configurations of the real server", "ch6"),
    _c("C20", 6, "At low concurrency throughput and latency don't conflict; a load sweep finds the knee.",
       "06_batching 08_p99_and_load", "a load sweep on the real server; the knee located from the latency "
       "curve, checked against the throughput plateau", "ch6"),
    _c("C21", 6, "Troubleshoot in order: time the request path, compare compute vs bandwidth use, profile, vary "
       "config; cheapest fixes first.", "09_case_study",
       "the method walked on the real server: spans, CPU and bandwidth against the ceilings, the in-server "
       "profiler, one knob at a time with the ladder ordered by measured cost (answers changed, then effort)",
       "ch6_case"),
    _c("C22", 6, "A pre-processing step unsafe for concurrent use pushed p99 to ~5x normal; fixing it met the "
       "target without quantization.", "09_case_study",
       "a retrieval service sized on this machine (25 % of its measured capacity; a lock held across a "
       "document-store call, busy 90 %; every load run replays one arrival sequence, the typical one of 101 "
       "for its lock tail): p99 E2E shipped vs fixed vs unloaded at the same rate, and int8 "
       "weights with the bug still in, on the real server", "ch6_case"),
]}


def claim(claim_id: str) -> Claim:
    """The claim with id `claim_id` (e.g. "C4"); a clear error for an unknown id."""
    key = claim_id.strip().upper()
    if key not in CLAIMS:
        raise ValueError(f"unknown claim {claim_id!r}; known: {', '.join(CLAIMS)}")
    return CLAIMS[key]


def for_notebook(stem: str) -> list[str]:
    """Ids of the claims notebook `stem` must record a verdict for."""
    return [c.id for c in CLAIMS.values() if stem in c.notebooks]


def markdown_table() -> str:
    """The README's ledger table: id, chapter, the claim, how this machine tests it and what
    would flip the outcome
    (tests/test_ledger.py checks that README.md holds exactly this table)."""
    rows = ["| id | ch. | claim | how this machine tests it | what would flip it |", "|---|---|---|---|---|"]
    rows += [f"| {c.id} | {c.chapter} | {c.words} | {c.test_here} | {c.flip} |" for c in CLAIMS.values()]
    return "\n".join(rows)
