"""roofline.profiler: where a PyTorch program's time goes, down to the source line, and what to do about it.

    with roofline.profile() as prof: ...     see capture.Profiler
    roofline profile script.py [args]        the same from the command line
"""

from roofline.profiler.capture import Profiler, ProgramExit, profile, run_program, step

__all__ = ["Profiler", "ProgramExit", "profile", "run_program", "step"]
