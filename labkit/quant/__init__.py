"""labkit.quant: weight-only and activation quantization, calibration, outliers.

Public API::

    from labkit.quant import Scheme, parse_scheme, quantize, dequantize, QuantizedTensor
    from labkit.quant import pack_int4, unpack_int4
    from labkit.quant import QuantLinear, quantize_model, kernel_paths, model_bytes
    from labkit.quant import collect_act_stats, calibrate, plant_outliers, smooth
    from labkit.quant import experiments   # the chapter's measurements as row-returning functions

Decode speed is `labkit.timing.decode_tok_s`; weight bytes read per decode step,
`Transformer.weight_bytes_per_step` (quantized buffers included).

KV int8 lives in the decoder: `KVCache(kv_dtype="int8")` (`labkit.model.kv_quant`) stores
each cached key or value vector (one token, one KV head, `head_dim` values) as int8 codes
plus one fp32 scale, and perplexity through that cache (`perplexity(..., kv_dtype="int8")`)
is the real accuracy cost. Bytes per token and sequences that fit:
`labkit.model.kv_memory` (`experiments.kv_table` measures both).

`python -m labkit.benches.quant [--size smoke|full]` prints the chapter's acceptance figures.
"""

from labkit.quant.core import (GRANULARITIES, GROUP_SIZES, QuantizedTensor, Scheme, dequantize, pack_int4,
                               parse_scheme, quantize, unpack_int4)
from labkit.quant.linear import (ACT_MODES, KERNEL_CHOICES, QuantLinear, fake_quant_act, kernel_paths, model_bytes,
                                 quantize_model)
from labkit.quant.calib import CALIB_METHODS, ActStats, calibrate, collect_act_stats, plant_outliers, smooth

__all__ = [
    "ACT_MODES", "CALIB_METHODS", "GRANULARITIES", "GROUP_SIZES", "KERNEL_CHOICES", "ActStats", "QuantLinear",
    "QuantizedTensor", "Scheme", "calibrate", "collect_act_stats", "dequantize",
    "fake_quant_act", "kernel_paths", "model_bytes", "pack_int4", "parse_scheme", "plant_outliers",
    "quantize", "quantize_model", "smooth", "unpack_int4",
]
