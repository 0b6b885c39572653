"""Loading what a command names: 'path/to/file.py:name' or 'package.module:name' (the ladder's task, bench's
sweeps). A module of its own so that the ranks of a multi-GPU ladder load their task as the command line did."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path


class TargetError(ValueError):
    """The target names nothing that can be loaded; the message says why."""


def load_name(target: str, kind: type | tuple):
    """The object `target` names; called first if it is a function (not itself a `kind`)."""
    if ":" not in target:
        raise TargetError(f"expected FILE_OR_MODULE:FUNCTION, got {target!r}")
    where, name = target.rsplit(":", 1)
    try:
        if where.endswith(".py") or "/" in where:
            path = Path(where)
            if not path.is_file():
                raise TargetError(f"no such file: {where}")
            spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(spec)
            sys.path.insert(0, str(path.parent.resolve()))
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except ImportError as exc:
        raise TargetError(f"cannot import {where}: {exc}") from exc
    if not hasattr(module, name):
        raise TargetError(f"{where} has no attribute {name!r}")
    obj = getattr(module, name)
    return obj() if callable(obj) and not isinstance(obj, kind) else obj
