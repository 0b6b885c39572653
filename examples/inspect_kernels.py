"""Kernels to look inside with `roofline inspect` (docs/inspect.md):

    roofline inspect examples/inspect_kernels.py:softmax_forward_and_backward --arch sm_90
    roofline inspect examples/inspect_kernels.py:matmuls --out kernels/
    roofline inspect examples/inspect_kernels.py:outer_products --arch sm_90
    roofline inspect examples/inspect_kernels.py:gpt2_block          (on a GPU: gpt2_small_block)
    roofline inspect examples/inspect_kernels.py:ops_tour            roofline.ops' own kernels
    roofline inspect examples/inspect_kernels.py:attention_forward_tiles --arch sm_90 --sms 132
    roofline inspect examples/inspect_kernels.py:attention_backward --arch sm_90 --sms 132

Each function launches Triton kernels once, at shapes small enough for Triton's interpreter on a machine without
a GPU (the kernels are then compiled for --arch there); on a GPU, pass the shapes you run.
"""

import functools
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.models.gpt2 import Block, GPT2Config  # noqa: E402
from roofline import ops  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def softmax_forward_and_backward(rows: int = 8, columns: int = 1000):
    """roofline's softmax, forward and backward, on rows of an odd length (1000 bf16: 2,000 bytes, no multiple of
    16: see what that does to its loads)."""
    x = torch.randn(rows, columns, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    ops.softmax(x, backend="triton").sum().backward()


def ops_tour(rows: int = 64, columns: int = 1000, tokens: int = 64):
    """roofline.ops' Triton kernels, forward and backward, each once: the norms, GELU, SwiGLU, cross-entropy and
    causal flash attention (bf16, odd widths)."""
    def leaf(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device=DEVICE, dtype=dtype, requires_grad=True)

    x, weight, bias = leaf(rows, columns), leaf(columns), leaf(columns)
    ops.layer_norm(x, (columns,), weight, bias, backend="triton").sum().backward()
    ops.rms_norm(x, (columns,), weight, backend="triton").sum().backward()
    ops.gelu(x, approximate="tanh", backend="triton").sum().backward()
    ops.swiglu(x, leaf(rows, columns), backend="triton").sum().backward()
    logits = leaf(rows, columns, dtype=torch.float32)
    target = torch.randint(0, columns, (rows,), device=DEVICE)
    ops.cross_entropy(logits, target, backend="triton").backward()
    q, k, v = (leaf(1, 2, tokens, 64) for _ in range(3))
    ops.flash_attention(q, k, v, causal=True, backend="triton").sum().backward()


# flash_attention's forward tiles at head_dim 128 (queries held, keys walked, warps, stages) that run 7 of
# benchmarks/results/h100-tune.md timed: the chosen one first
FORWARD_TILES = [(64, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (64, 128, 4, 3), (128, 64, 4, 3)]


def attention_forward_tiles(tokens: int = 256):
    """flash_attention's bf16 forward at head_dim 128 with each of FORWARD_TILES, not causal, then each causal:
    what each tiling compiles to (registers, spills, shared memory, occupancy, the wgmma shapes), beside the times
    the tuning run measured."""
    import importlib

    from roofline.ops._launch import clear_plans

    attention = importlib.import_module("roofline.ops.attention")
    chosen = attention.TILES["forward"][128]
    try:
        for causal in (False, True):
            for tiles in FORWARD_TILES:
                attention.TILES["forward"][128] = attention.Tiles(*tiles)
                clear_plans()   # a plan keeps the tiles it was built with
                q, k, v = (torch.randn(1, 2, tokens, 128, device=DEVICE, dtype=torch.bfloat16) for _ in range(3))
                ops.flash_attention(q, k, v, causal=causal, backend="triton")
    finally:
        attention.TILES["forward"][128] = chosen
        clear_plans()


def attention_backward(tokens: int = 256):
    """flash_attention's bf16 forward and backward at head_dim 128 and its chosen tiles, not causal, then causal."""
    for causal in (False, True):
        q, k, v = (torch.randn(1, 2, tokens, 128, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        ops.flash_attention(q, k, v, causal=causal, backend="triton").sum().backward()


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    """C = A B for row-major A [M, K], B [K, N], C [M, N] (M, N, K multiples of the blocks)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + rows[:, None] * K + (k + ks)[None, :])
        b = tl.load(b_ptr + (k + ks)[:, None] * N + cols[None, :])
        acc += tl.dot(a, b, input_precision=PRECISION)
    tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc.to(c_ptr.dtype.element_ty))


def matmul(a: torch.Tensor, b: torch.Tensor, precision: str = "tf32", block: int = 64) -> torch.Tensor:
    c = torch.empty(a.shape[0], b.shape[1], device=a.device, dtype=a.dtype)
    grid = (a.shape[0] // block, b.shape[1] // block)
    matmul_kernel[grid](a, b, c, a.shape[0], b.shape[1], a.shape[1], BLOCK_M=block, BLOCK_N=block, BLOCK_K=32,
                        PRECISION=precision, num_warps=4)
    return c


def matmuls(size: int = 128):
    """The same kernel three ways: bf16 (tensor cores), fp32 as TF32 (tensor cores), and fp32 in IEEE precision
    (CUDA cores: no tensor core takes fp32 at full precision)."""
    a, b = (torch.randn(size, size, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    matmul(a, b)
    matmul(a.float(), b.float(), "tf32")
    matmul(a.float(), b.float(), "ieee")


@triton.jit
def outer_product_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """C = A B one step of K at a time, as a CUDA matmul's first lesson writes it: an outer product a step."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(K):
        a = tl.load(a_ptr + rows * K + k)
        b = tl.load(b_ptr + k * N + cols)
        acc += a[:, None] * b[None, :]
    tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc)


def outer_products(size: int = 64, block: int = 32):
    """A matmul by outer products: no tl.dot, so no tensor cores (inspect's finding "outer-products")."""
    a, b = (torch.randn(size, size, device=DEVICE) for _ in range(2))
    c = torch.empty(size, size, device=DEVICE)
    outer_product_matmul_kernel[(size // block, size // block)](a, b, c, size, size, size, BLOCK_M=block,
                                                                BLOCK_N=block)
    torch.testing.assert_close(c, a @ b, rtol=1e-4, atol=1e-4)


def gpt2_block(batch: int = 2, seq: int = 32, d_model: int = 64, heads: int = 4):
    """One GPT-2 block (examples/models/gpt2.py) under torch.compile, forward and backward: the kernels Inductor
    generates for it, each with the lines of gpt2.py it fused. Small, for a machine without a GPU."""
    block, x = _compiled_block(batch, seq, d_model, heads)
    block(x).sum().backward()


def gpt2_small_block():
    """gpt2_block at GPT-2 small's sizes, 8 x 1024 tokens, under bf16 autocast as it trains on a GPU."""
    with torch.autocast("cuda", torch.bfloat16):
        gpt2_block(batch=8, seq=1024, d_model=768, heads=12)


@functools.cache
def _compiled_block(batch: int, seq: int, d_model: int, heads: int):
    """Made once: inspect calls the function again to time it, and a new module would be compiled again."""
    config = GPT2Config(max_seq=seq, n_head=heads, d_model=d_model)
    block = torch.compile(Block(config).to(DEVICE))
    return block, torch.randn(batch, seq, d_model, device=DEVICE, requires_grad=True)
