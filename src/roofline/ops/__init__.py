"""Fused kernels that drop in where torch.nn.functional's ops stand.

Each op takes backend= ("triton", "torch", "compile", and "cuda" where a CUDA C++
version exists) so that implementations compare in one table.
"""

from roofline.ops.gelu import gelu
from roofline.ops.softmax import log_softmax, softmax

__all__ = ["gelu", "log_softmax", "softmax"]
