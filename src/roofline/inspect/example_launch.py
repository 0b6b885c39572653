"""A Triton kernel launched once on example arguments, for `roofline inspect FILE:KERNEL --args ... --grid ...`.

The arguments are written as the kernel takes them, in order, then by name:

    bf16[128x64]      a tensor of that dtype and shape, random (normal for floats, 0..15 for integers)
    128, 0.5, true    an int, a float, a bool
    tf32              anything else: a string (a constexpr such as input_precision)
    BLOCK_M=64        by name: a constexpr, or a launch option (num_warps=4, num_stages=3)

and the grid as sizes joined by x (`4x4`). On a machine without a GPU the tensors are made on the CPU and the launch
runs through Triton's interpreter, as `roofline inspect` runs any function there.
"""

from __future__ import annotations

import re

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64,
          "i8": torch.int8, "i16": torch.int16, "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8,
          "bool": torch.bool}
_TENSOR = re.compile(r"^(\w+)\[(\d+(?:x\d+)*)\]$")
_NAME = re.compile(r"^[A-Za-z_]\w*$")


def _value(token: str):
    """One argument: a tensor's (dtype, shape), or an int, float, bool or string."""
    tensor = _TENSOR.match(token)
    if tensor:
        if tensor[1] not in DTYPES:
            raise ValueError(f"{token!r}: a tensor's dtype is one of {', '.join(DTYPES)}")
        return DTYPES[tensor[1]], tuple(int(n) for n in tensor[2].split("x"))
    if "[" in token or "]" in token:
        raise ValueError(f"{token!r}: a tensor is DTYPE[SIZES], e.g. bf16[128x64]")
    if token.lower() in ("true", "false"):
        return token.lower() == "true"
    for number in (int, float):
        try:
            return number(token)
        except ValueError:
            pass
    return token


def parse_args(text: str) -> tuple[list, dict]:
    """--args: (positional arguments, named ones), each a value or a tensor's (dtype, shape)."""
    positional, named = [], {}
    for token in text.split():
        name, is_named, value = token.partition("=")
        if is_named:
            if not _NAME.match(name):
                raise ValueError(f"{token!r}: a named argument is NAME=VALUE")
            if name in named:
                raise ValueError(f"{name} is given twice")
            named[name] = _value(value)
        elif named:
            raise ValueError(f"{token!r} comes after a named argument: positional ones come first")
        else:
            positional.append(_value(token))
    if not positional and not named:
        raise ValueError("no argument: the kernel's, in order, e.g. 'bf16[128x64] bf16[128x64] 128 BLOCK=64'")
    return positional, named


def parse_grid(text: str) -> tuple[int, ...]:
    """--grid: 1 to 3 positive sizes joined by x."""
    try:
        grid = tuple(int(n) for n in text.lower().split("x"))
    except ValueError:
        grid = ()
    if not 1 <= len(grid) <= 3 or min(grid) < 1:
        raise ValueError(f"{text!r}: the grid is 1 to 3 positive sizes joined by x, e.g. 4x4")
    return grid


def _made(value, device: str, generator: torch.Generator):
    if not isinstance(value, tuple):
        return value
    dtype, shape = value
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator, device=device).to(dtype)
    return torch.randint(0, 16, shape, generator=generator, device=device).to(dtype)


def launch(target: str, args: str, grid: str) -> None:
    """kernel[grid](*args) once, the kernel loaded from `target` (FILE_OR_MODULE:KERNEL), its tensors random."""
    from roofline.targets import load_name

    kernel = load_name(target, object)
    positional, named = parse_args(args)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device).manual_seed(0)
    kernel[parse_grid(grid)](*(_made(v, device, generator) for v in positional),
                             **{k: _made(v, device, generator) for k, v in named.items()})
