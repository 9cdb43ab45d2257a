"""The bit-faithful numerics oracle: FP4/FP8 formats, scale layouts and reference GEMM, in pure torch.

Every native kernel and the ``emulated`` backend are judged against these functions. Naming: a
``*_quantize`` returns the stored tensors (codes packed / fp8, scales), the matching ``*_dequantize``
takes exactly those tensors back to float32; a ``*_fake_quantize_*`` is the two in one step, in the
input dtype; ``*_encode`` / ``*_decode`` convert single elements to and from their bit patterns.
Spec: nvfp4-and-kernels.md §3, §4, §6; dsv4-architecture.md §2.3, §12.
"""
from .e2m1 import E2M1_MAX, E2M1_VALUES, e2m1_decode, e2m1_encode, pack_nibbles, unpack_nibbles
from .e4m3 import E4M3_MAX, e4m3_decode, e4m3_encode, to_float8_e4m3fn
from .fp8 import (FP8_WEIGHT_BLOCK, fp8_act_dequantize, fp8_act_quantize, fp8_block_dequantize, fp8_block_quantize,
                  fp8_fake_quantize_pow2)
from .gemm_reference import nvfp4_gemm_reference
from .hadamard import hadamard_transform
from .mxfp4 import MXFP4_BLOCK, fp4_fake_quantize_pow2, mxfp4_dequantize, mxfp4_quantize
from .nvfp4 import (NVFP4_BLOCK, RECIPES, SCALE_LAYOUTS, check_global_scale, nvfp4_dequantize, nvfp4_quantize,
                    nvfp4_runtime_global_scale)
from .swizzle import swizzle_scales, swizzled_numel, unswizzle_scales
from .ue8m0 import ue8m0_decode

__all__ = [
    "E2M1_MAX", "E2M1_VALUES", "E4M3_MAX", "FP8_WEIGHT_BLOCK", "MXFP4_BLOCK", "NVFP4_BLOCK", "RECIPES",
    "SCALE_LAYOUTS", "check_global_scale", "e2m1_decode", "e2m1_encode", "e4m3_decode", "e4m3_encode",
    "fp4_fake_quantize_pow2", "fp8_act_dequantize", "fp8_act_quantize", "fp8_block_dequantize",
    "fp8_block_quantize", "fp8_fake_quantize_pow2", "hadamard_transform", "mxfp4_dequantize", "mxfp4_quantize",
    "nvfp4_dequantize", "nvfp4_gemm_reference", "nvfp4_quantize", "nvfp4_runtime_global_scale",
    "pack_nibbles", "swizzle_scales", "swizzled_numel", "to_float8_e4m3fn", "unpack_nibbles",
    "unswizzle_scales", "ue8m0_decode",
]
