"""Where libraries' code lives on this machine: the standard library, installed packages, torch, roofline itself
and the code torch.compile generates. A frame in none of them is the user's own code, which roofline charges time
to (profile's lines, inspect's fused lines)."""

from __future__ import annotations

import os
import sysconfig
import tempfile
from pathlib import Path

import torch


def library_roots() -> list[str]:
    roots = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= {str(Path(torch.__file__).resolve().parent.parent), str(Path(__file__).resolve().parent),
              tempfile.gettempdir() + os.sep + "torchinductor_"}   # code torch.compile generated
    return sorted(os.path.join(r, "") if not r.endswith("_") else r for r in roots if r)
