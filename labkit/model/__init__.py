"""labkit.model: the workbook's Llama-architecture decoder.

Public API::

    from labkit.model import Transformer, ModelConfig, get_config, PRESETS, KVCache
    from labkit.model import SamplingParams, generate, generate_stream, stream, sample
    from labkit.model import save_checkpoint, load_checkpoint, load_hf_llama, load_tiny
    from labkit.model import perplexity, unigram_perplexity
    from labkit.model import kv_memory   # KV bytes per token, totals, sequences that fit

Inference constructors return the "kn" weight layout (`Transformer.set_weight_layout`);
`Transformer.tune_matmul(batches)` re-chooses layout and matmul form by timing them here.
See the submodules' docstrings for the details (config, transformer, generate,
checkpoint, evaluate, bench).
"""

from labkit.model.checkpoint import load_checkpoint, load_hf_llama, load_tiny, save_checkpoint
from labkit.model.config import PRESETS, ModelConfig, get_config
from labkit.model.evaluate import perplexity, unigram_perplexity
from labkit.model import kv_memory
from labkit.model.generate import SamplingParams, filter_logits, generate, generate_stream, sample, stream
from labkit.model.transformer import KVCache, Transformer

__all__ = [
    "PRESETS", "KVCache", "ModelConfig", "SamplingParams", "Transformer", "filter_logits",
    "generate", "generate_stream", "get_config", "kv_memory", "load_checkpoint", "load_hf_llama", "load_tiny",
    "perplexity", "sample", "save_checkpoint", "stream", "unigram_perplexity",
]
