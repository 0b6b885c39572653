"""Timing GPU (and CPU) code the way experts do, and comparing implementations honestly.

    from roofline import bench
    m = bench.time(torch.nn.functional.gelu, x)            # a Measurement
    c = bench.compare(eager_fn, fused_fn, x)               # speedup with a 95% CI
    result = bench.Sweep(...).run()                        # sizes x providers, checked, then timed
    t = bench.time_collective("all_reduce", 256 << 20)     # on every rank: busbw, the slowest rank's time
"""

from roofline.bench.collective import CollectiveTiming, bus_factor, time_collective
from roofline.bench.compare import Comparison, compare
from roofline.bench.stats import Speedup, Summary, speedup_ci, summarize
from roofline.bench.sweep import Provider, Row, Skip, Sweep, SweepResult, geometric_sizes, run_sweep
from roofline.bench.timer import BenchTimeout, Measurement, TimingWarning, flush_cache, time

__all__ = [
    "BenchTimeout", "CollectiveTiming", "Comparison", "Measurement", "Provider", "Row", "Skip", "Speedup", "Summary", "Sweep",
    "SweepResult", "TimingWarning", "compare", "flush_cache", "geometric_sizes", "run_sweep", "speedup_ci",
    "summarize", "time", "time_collective", "bus_factor",
]
