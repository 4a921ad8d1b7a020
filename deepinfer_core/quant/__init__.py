"""Weight quantization: the FP8 / FP4 formats of DeepSeek's checkpoints and a checkpoint rewriter."""

from deepinfer_core.quant.formats import (
    dequant,
    dequant_rows,
    quantize_fp4_e2m1,
    quantize_fp8_block,
)

__all__ = ["dequant", "dequant_rows", "quantize_fp4_e2m1", "quantize_fp8_block"]
