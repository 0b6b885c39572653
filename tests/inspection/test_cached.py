"""`roofline inspect TRACE --kernel NAME`: a kernel a trace names, looked inside from the binary Triton cached when
the program compiled it. Here the softmax example's forward kernel is compiled for sm_90 into a cache of the test's own
(as a program's JIT fills TRITON_CACHE_DIR), and a trace names their launches as CUPTI records them."""

import json
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from roofline import ops
from roofline.cli import app
from roofline.inspect import cached, kernels, sass
from roofline.inspect.report import report_of

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from examples import inspect_kernels  # noqa: E402

pytestmark = pytest.mark.long   # compiles kernels in a process of its own: run first (conftest)


def _kernel(name, grid, registers, ts, threads=256):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": 5.0,
            "args": {"device": 0, "stream": 7, "correlation": int(ts), "grid": list(grid), "block": [threads, 1, 1],
                     "registers per thread": registers}}


def _softmax_forward():
    """The softmax example's forward alone: the tests read its kernel, and compiling the backward's for sm_90 too
    doubled the set-up."""
    x = torch.randn(8, 1000, device=inspect_kernels.DEVICE, dtype=torch.bfloat16)
    ops.softmax(x, backend="triton")


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """(the cache the example's kernels were compiled into, a trace of their launches, the cached binaries'
    registers by kernel, the example inspected as a function)."""
    folder = tmp_path_factory.mktemp("cached")
    cache = folder / "triton-cache"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRITON_CACHE_DIR", str(cache))   # where the compiling process writes, as a program's JIT does
        launched = kernels.launches(_softmax_forward)
        built = kernels.compiled(launched, kernels.target("sm_90"))
    registers = {b["metadata"]["name"]: sass.resources(b["asm"]["cubin"])[b["metadata"]["name"]].registers
                 for b in built}
    events = [_kernel(launch.name, launch.grid, registers[launch.name], 100.0 * (k + 1))
              for k, launch in enumerate(launched * 3)]
    trace = folder / "trace.json"
    trace.write_text(json.dumps({"traceEvents": events, "deviceProperties": [{"id": 0, "numSms": 132}]}))
    # the function's inspection of the same binaries (as `roofline inspect FILE:FUNCTION` makes it)
    return cache, trace, registers, [report_of(launch, b, 132) for launch, b in zip(launched, built)]


def test_a_trace_s_kernel_is_read_from_the_binary_the_program_ran(program, tmp_path):
    cache, trace, registers, as_function = program
    out = tmp_path / "report.json"
    done = CliRunner().invoke(app, ["inspect", str(trace), "--kernel", "softmax_forward_kernel", "--cache", str(cache),
                                    "--json", str(out)], env={"COLUMNS": "80"})
    assert done.exit_code == 0, done.output
    text = " ".join(done.output.split())
    assert "softmax_forward_kernel: 3 launches in the trace" in text and "its binary read from Triton's cache" in text
    (report,) = json.loads(out.read_text())["kernels"]
    # what the function's inspection reads from the same kernel compiled for the same GPU
    (same,) = [r for r in as_function if r.name == "softmax_forward_kernel"]
    assert report["registers"] == same.resources.registers == registers["softmax_forward_kernel"]
    assert report["occupancy"] == same.occupancy.to_dict() and report["mix"] == same.mix.to_dict()
    # at its def (the function's inspection names the decorator's line, where Python's code object starts)
    source = (ROOT / "src/roofline/ops/softmax.py").read_text().splitlines()
    line = next(n for n, text in enumerate(source, 1) if text.strip().startswith("def softmax_forward_kernel("))
    assert report["where"] == f"src/roofline/ops/softmax.py:{line}"
    assert report["grid"] == [2, 1, 1] and not report["compiled_here"]
    # the SM count is the trace's GPU's: 2 blocks for 132 SMs
    assert {f["id"] for f in report["findings"]} == {f.id for f in same.findings} and "small-grid" in {
        f["id"] for f in report["findings"]}
    narrow = next(f for f in report["findings"] if f["id"] == "narrow-loads")
    assert "integer arguments not divisible by 16 (rows, n)" in narrow["message"]   # from the TTIR's specialization
    assert max(len(line) for line in done.output.splitlines()) <= 80


def test_what_is_missing_is_named(program, tmp_path):
    cache, trace, registers, _ = program
    run = CliRunner().invoke
    done = run(app, ["inspect", str(trace), "--kernel", "softmax_fwd", "--cache", str(cache)])
    assert done.exit_code == 2 and "no kernel named 'softmax_fwd'" in done.output
    assert "softmax_forward_kernel" in done.output   # the nearest names
    empty = tmp_path / "empty-cache"
    empty.mkdir()
    done = run(app, ["inspect", str(trace), "--kernel", "softmax_forward_kernel", "--cache", str(empty)])
    assert done.exit_code == 2 and "no compilation of softmax_forward_kernel" in " ".join(done.output.split())
    other = tmp_path / "other.json"   # a launch whose registers no cached binary has: that binary is not there
    other.write_text(json.dumps({"traceEvents": [_kernel("softmax_forward_kernel", (2, 1, 1),
                                                         registers["softmax_forward_kernel"] + 8, 1.0)]}))
    done = run(app, ["inspect", str(other), "--kernel", "softmax_forward_kernel", "--cache", str(cache)])
    assert done.exit_code == 2 and "none for the trace's launches" in " ".join(done.output.split())
    done = run(app, ["inspect", str(trace), "--kernel", "softmax_forward_kernel", "--ncu"])
    said = " ".join(done.output.split())
    assert done.exit_code == 2 and ("--arch, --shape, --dtype, --backward, --args and --grid are for a function, a "
                                    "kernel or an op") in said
    done = run(app, ["inspect", "examples/inspect_kernels.py:matmuls", "--cache", str(cache)])
    assert done.exit_code == 2 and "--kernel" in done.output


def test_the_specialization_is_read_from_the_cached_source():
    """A signature as Triton 3.6 writes it (attention's dK/dV kernel's, trimmed, with a bool added): a tensor
    descriptor is followed by its shape and strides under the same name, which are no arguments of the user's."""
    desc = "".join(f", %q_desc_{i}: {'i32' if i < 4 else 'i64'} loc(\"q_desc\"(#loc))" for i in range(8))
    text = ('#loc = loc("/src/attention.py":247:0)\nmodule {\n  tt.func public @k(%q_desc: '
            '!tt.tensordesc<tensor<1x1x64x128xbf16>> loc("q_desc"(#loc))' + desc + ', %lse_ptr: !tt.ptr<f32> '
            '{tt.divisibility = 16 : i32} loc("lse_ptr"(#loc)), %delta_ptr: !tt.ptr<f32> loc("delta_ptr"(#loc)), '
            '%heads: i32 loc("heads"(#loc)), %nq: i32 {tt.divisibility = 16 : i32} loc("nq"(#loc)), %causal: i1 '
            'loc("causal"(#loc)), %scale: f32 loc("scale"(#loc))) attributes {noinline = false} {\n')
    seen = cached.Launches("k", 1, 5.0, [(4, 1, 1)], 128, 40)
    launch = cached.launch_of({"source": text, "metadata": {"name": "k", "num_warps": 4}}, seen)
    assert launch.where == ("/src/attention.py", 247) and launch.grid == (4, 1, 1)
    assert launch.parameters == ["q_desc", "lse_ptr", "delta_ptr", "heads", "nq", "causal", "scale"]
    assert launch.unaligned() == ["integer arguments not divisible by 16 (heads)",
                                  "pointers not 16-byte aligned (delta_ptr)"]


def test_only_the_compilations_that_ran_are_kept_each_with_its_own_launches_grids():
    from collections import Counter

    def compilation(warps, registers, arch="sm_90", shared=0):
        return {"metadata": {"name": "k", "num_warps": warps, "shared": shared, "arch": arch}, "registers": registers}

    def resources(c):
        return sass.Resources(c["registers"], 0, 0, 0)

    launches = Counter({(128, 40, 0, (8, 1, 1)): 5, (256, 64, 0, (2, 1, 1)): 1})   # two configurations ran
    seen = cached.Launches("k", 6, 30.0, [(8, 1, 1), (2, 1, 1)], None, None, 132, "sm_90", launches)
    ran, stale, other_gpu = compilation(4, 40), compilation(4, 48), compilation(4, 40, arch="sm_80")
    second = compilation(8, 64)
    assert cached.matching([ran, stale, other_gpu, second], seen, resources) == [ran, second]
    assert seen.grids_of(128, 40) == [(8, 1, 1)] and seen.grids_of(256, 64) == [(2, 1, 1)]
