"""labkit.quant: weight-only and activation quantization, calibration, outliers.

Public API::

    from labkit.quant import Scheme, parse_scheme, quantize, dequantize, QuantizedTensor
    from labkit.quant import pack_int4, unpack_int4
    from labkit.quant import QuantLinear, quantize_model, kernel_paths, model_bytes
    from labkit.quant import collect_act_stats, calibrate, plant_outliers, smooth
    from labkit.quant import kv_bytes_per_token, sequences_that_fit
    from labkit.quant import experiments   # the chapter's measurements as row-returning functions

Decode speed is `labkit.timing.decode_tok_s`; weight bytes read per decode step,
`Transformer.weight_bytes_per_step` (quantized buffers included).

`python -m labkit.quant.bench [--quick]` prints the chapter's acceptance figures.
"""

from labkit.quant.core import (GRANULARITIES, GROUP_SIZES, QuantizedTensor, Scheme, dequantize, pack_int4,
                               parse_scheme, quantize, unpack_int4)
from labkit.quant.linear import (ACT_MODES, KERNELS, QuantLinear, fake_quant_act, kernel_paths, model_bytes,
                                 quantize_model)
from labkit.quant.calib import CALIB_METHODS, ActStats, calibrate, collect_act_stats, plant_outliers, smooth
from labkit.quant.kv import kv_bytes_per_token, sequences_that_fit

__all__ = [
    "ACT_MODES", "CALIB_METHODS", "GRANULARITIES", "GROUP_SIZES", "KERNELS", "ActStats", "QuantLinear",
    "QuantizedTensor", "Scheme", "calibrate", "collect_act_stats", "dequantize",
    "fake_quant_act", "kernel_paths", "model_bytes", "pack_int4", "parse_scheme", "plant_outliers",
    "quantize", "quantize_model", "smooth", "unpack_int4",
    "kv_bytes_per_token", "sequences_that_fit",
]
