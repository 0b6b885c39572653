"""`roofline inspect` on a GPU: the binary inspected is the one the launch ran, and its resources are Triton's own
(CompiledKernel.n_regs, n_spills) and the GPU's."""

import sys
from pathlib import Path

import pytest
import torch

from roofline.inspect import kernels
from roofline.inspect.report import KernelReport, inspect_function

pytestmark = pytest.mark.gpu
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples import inspect_kernels  # noqa: E402


@pytest.mark.parametrize("fn, count", [(inspect_kernels.matmuls, 3), (inspect_kernels.softmax_forward_and_backward, 2)])
def test_registers_and_spills_are_triton_s_for_the_binary_that_ran(fn, count):
    found = kernels.launches(fn)
    assert len(found) == count and all(launch.compiled is not None for launch in found)
    reports = inspect_function(fn).launched
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    for launch, report in zip(found, reports):
        compiled = launch.compiled
        compiled._init_handles()
        assert report.arch == f"sm_{props.major}{props.minor}" and not report.compiled_here
        assert report.resources.registers == compiled.n_regs, report.name
        assert bool(report.mix.counts.get("spill")) == (compiled.n_spills > 0), report.name
        assert report.sms == props.multi_processor_count
    assert any(r.mix.counts.get("tensor core") for r in reports) == (fn is inspect_kernels.matmuls)


def test_torch_compile_s_triton_kernels_get_the_view_of_the_binary_that_ran():
    """A compiled GPT-2 block: every kernel timed on the GPU and charged to lines of gpt2.py; every Triton kernel
    Inductor wrote inspected from the binary it launched (Triton's own register count)."""
    found = inspect_function(inspect_kernels.gpt2_block, runs=2)
    made = found.made
    triton = [k for k in made if k.kind == "triton"]
    assert found.launched == [] and triton and {k.graph for k in made} == {0, 1}
    for k in made:
        assert k.ms is not None and k.ms > 0 and k.lines, k.name
        assert all(x.file.endswith("examples/models/gpt2.py") for x in k.lines), k.name
    for k in triton:
        assert isinstance(k.report, KernelReport), (k.name, k.report)
        k.launch.compiled._init_handles()
        assert k.report.resources.registers == k.launch.compiled.n_regs, k.name
        assert k.report.name == k.name and k.report.mix.total > 0 and not k.report.compiled_here
        assert "XBLOCK" in k.launch.kwargs or "R0_BLOCK" in k.launch.kwargs or "YBLOCK" in k.launch.kwargs


def test_ncu_s_samples_land_on_each_kernel_s_own_lines(tmp_path):
    """--ncu: the softmax example run again under Nsight Compute; each kernel's warps sampled at lines of
    softmax.py, and the terminal says where they waited."""
    import json
    import os
    import subprocess

    from roofline.profiler.ncu import binary

    if binary() is None:
        pytest.fail("ncu (Nsight Compute) is not installed on this GPU machine: --ncu cannot be checked")
    out = tmp_path / "stalls.json"
    done = subprocess.run([sys.executable, "-m", "roofline", "inspect",
                           "examples/inspect_kernels.py:softmax_forward_and_backward", "--ncu", "--json", str(out)],
                          cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "100"})
    assert done.returncode == 0, done.stderr[-3000:]
    kernels_seen = json.loads(out.read_text())["kernels"]
    assert [k["name"] for k in kernels_seen] == ["softmax_forward_kernel", "softmax_backward_kernel"]
    for k in kernels_seen:
        assert k["stalls"]["samples"] > 0, k["name"]
        assert all(Path(x["file"]).name == "softmax.py" for x in k["stalls"]["lines"])
        assert sum(x["samples"] for x in k["stalls"]["lines"]) == k["stalls"]["samples"]
    assert "where its warps waited (ncu" in done.stdout


def test_a_profiled_kernel_is_read_from_the_binary_its_program_cached(tmp_path):
    """profile --trace, then inspect TRACE --kernel: the softmax kernel the program ran, found in the program's own
    Triton cache by the block and registers CUPTI recorded, with the trace's grid and GPU."""
    import json
    import os
    import subprocess

    program = tmp_path / "softmaxes.py"
    program.write_text("import torch\nfrom roofline import ops\nx = torch.randn(4096, 1000, device='cuda', "
                       "dtype=torch.bfloat16)\nfor _ in range(6):\n    ops.softmax(x)\ntorch.cuda.synchronize()\n")
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "cache"), "COLUMNS": "100"}
    trace, out = tmp_path / "trace.json.gz", tmp_path / "inside.json"
    # the whole program is the window: it marks no steps
    done = subprocess.run([sys.executable, "-m", "roofline", "profile", "--trace", str(trace), str(program)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    done = subprocess.run([sys.executable, "-m", "roofline", "inspect", str(trace), "--kernel",
                           "softmax_forward_kernel", "--json", str(out)], capture_output=True, text=True, timeout=600,
                          env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "launches in the trace" in done.stdout
    reports = json.loads(out.read_text())["kernels"]
    assert reports and all(r["name"] == "softmax_forward_kernel" and not r["compiled_here"] for r in reports)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    assert reports[0]["arch"] == f"sm_{props.major}{props.minor}" and reports[0]["sms"] == props.multi_processor_count
    assert reports[0]["grid"] is not None and reports[0]["where"].split(":")[0].endswith("softmax.py")
