"""Where the ops run now, asked by every layer of them (kept apart so that each can ask without the others)."""

import os

import torch


def interpreting() -> bool:
    """Whether Triton kernels run through its CPU interpreter (how the tests check them without a GPU)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False without CUDA)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
