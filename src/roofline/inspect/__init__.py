"""Inside a kernel: `roofline inspect FILE:FUNCTION` (cli), or in Python:

    from roofline.inspect.report import inspect_function, render
    reports = inspect_function(fn, arch="sm_90")   # every Triton kernel fn launches, compiled for the H100

kernels.py finds the launches and compiles them, sass.py reads the machine code, occupancy.py applies CUDA's
occupancy rules, report.py puts them together with findings at the kernel's source lines.
"""
