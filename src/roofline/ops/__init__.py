"""Fused kernels that drop in where torch.nn.functional's ops stand.

Each op takes backend= ("triton", "torch", "compile", and "cuda" where a CUDA C++
version exists) so that implementations compare in one table.
"""

from roofline.ops._target_check import wait_for_target_checks
from roofline.ops.attention import flash_attention
from roofline.ops.cross_entropy import cross_entropy
from roofline.ops.gelu import gelu
from roofline.ops.int8_linear import int8_linear, quantize_int8
from roofline.ops.linear import linear
from roofline.ops.linear_cross_entropy import linear_cross_entropy
from roofline.ops.matmul_ladder import matmul_ladder
from roofline.ops.norm import add_rms_norm, layer_norm, rms_norm
from roofline.ops.rope import rope
from roofline.ops.softmax import log_softmax, softmax
from roofline.ops.swiglu import swiglu

__all__ = ["add_rms_norm", "cross_entropy", "flash_attention", "gelu", "int8_linear", "layer_norm", "linear",
           "linear_cross_entropy", "log_softmax", "matmul_ladder", "quantize_int8", "rms_norm", "rope", "softmax",
           "swiglu", "wait_for_target_checks"]
