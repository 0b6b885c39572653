"""Inside a kernel: `roofline inspect FILE:FUNCTION` (cli), or in Python:

    from roofline.inspect.report import inspect_function, render
    found = inspect_function(fn, arch="sm_90")   # every Triton kernel fn launches, compiled for the H100, and
                                                 # every kernel torch.compile generated for it (found.made)

kernels.py finds the launches and compiles them, sass.py reads the machine code (ptx.py and ttgir.py the PTX
and TTGIR, at the same source lines), occupancy.py applies CUDA's occupancy rules, generated.py finds
torch.compile's kernels and the lines each fused, report.py puts them together with findings at the kernel's
source lines, html.py draws the page.
"""
