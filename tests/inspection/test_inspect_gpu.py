"""`roofline inspect` on a GPU: the binary inspected is the one the launch ran, and its resources are Triton's own
(CompiledKernel.n_regs, n_spills) and the GPU's."""

import sys
from pathlib import Path

import pytest
import torch

from roofline.inspect import kernels
from roofline.inspect.report import inspect_function

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
        assert (report.resources.local_bytes > 0) == (compiled.n_spills > 0), report.name
        assert report.sms == props.multi_processor_count
    assert any(r.mix.counts.get("tensor core") for r in reports) == (fn is inspect_kernels.matmuls)
