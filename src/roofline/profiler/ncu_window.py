"""The program run as `roofline profile` ran it, its recorded window marked for Nsight Compute: what `--ncu` has ncu
run (profiler.ncu), a module of its own so that ncu's analysis needs nothing of the recorder.

    python -m roofline.profiler.ncu_window [--skip S] [--steps N] [-m] -- TARGET ARGS...
"""

from __future__ import annotations

import argparse
import sys

from roofline.profiler.capture import run_window


def main(argv: list[str] | None = None) -> int:
    """The program, its recorded window marked by cudaProfilerStart/Stop; the program's exit status."""
    parser = argparse.ArgumentParser(prog="python -m roofline.profiler.ncu_window")
    parser.add_argument("--skip", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("-m", dest="module", action="store_true")
    parser.add_argument("target")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    status, error = run_window(options.target, options.args, module=options.module, skip=options.skip,
                               active=options.steps)
    if error is not None:
        raise error
    return status


if __name__ == "__main__":
    sys.exit(main())
