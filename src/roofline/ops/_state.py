"""Where the ops run now, asked by every layer of them (kept apart so that each can ask without the others)."""

import os

import torch


def interpreting() -> bool:
    """Whether Triton kernels run through its CPU interpreter (how the tests check them without a GPU)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False without CUDA)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def dot_settings(dtype: torch.dtype, fp32: str = "tf32") -> dict:
    """PRECISION and UPCAST of a kernel's tl.dot for inputs of `dtype`. On a GPU fp16 and bf16 multiply on the
    tensor cores, fp32 as `fp32` says ("ieee": exact; "tf32"). Triton 3.6's interpreter returns garbage from a bf16
    tl.dot: there bf16 multiplies in fp32 (UPCAST), exactly. as_on_a_gpu undoes that for roofline inspect."""
    upcast = interpreting() and dtype == torch.bfloat16
    return dict(PRECISION="ieee" if upcast else fp32 if dtype == torch.float32 else "tf32", UPCAST=upcast)


def as_on_a_gpu(constexprs: dict, dtype: torch.dtype | None) -> dict:
    """A launch's constexprs, made under Triton's interpreter, as a GPU's launch of the same call takes them: a bf16
    dot's UPCAST and its PRECISION (dot_settings), and linear's ROUND_TF32 (no tf32 to round to there), back to
    the GPU's values. `dtype`: the launch's first tensor's. What roofline inspect compiles where there is no GPU."""
    out = dict(constexprs)
    if out.get("UPCAST") is True:
        out["UPCAST"] = False
        if "PRECISION" in out:
            out["PRECISION"] = "tf32"
    if "ROUND_TF32" in out:
        out["ROUND_TF32"] = dtype == torch.float32
    return out
