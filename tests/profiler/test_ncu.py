"""`roofline profile --ncu K`: which launches are measured (the heaviest the profile timed, named by their ordinal in
the window), the ncu command, the parsing of its CSV, the window marked for ncu, and the run through a stand-in for
ncu (the real one runs in scripts/gpu-check)."""

import json
import re
import stat
import sys

import pytest
import torch

from roofline.profiler import capture, ncu, ncu_window
from roofline.profiler.kernels import function_name
from roofline.profiler.trace import load

from .synth import TraceBuilder

SOFTMAX_BWD = ("void at::native::(anonymous namespace)::cunn_SoftMaxBackward<4, float, float, float, "
               "at::native::(anonymous namespace)::SoftMaxBackwardEpilogue>(float*, float const*, float const*, long)")
OTHER_ANON = ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
              "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)")
COPY = ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::"
        "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda(float)#1}>"
        "(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::"
        "operator()() const::{lambda(float)#1} const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast)")
CSV = '''==PROF== Connected to process 123
"ID","Kernel Name","dram__throughput.avg.pct_of_peak_sustained_elapsed","gpu__time_duration.sum",\
"l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum","launch__registers_per_thread","lts__t_sector_hit_rate.pct",\
"sm__throughput.avg.pct_of_peak_sustained_elapsed","sm__warps_active.avg.pct_of_peak_sustained_active",\
"launch__grid_size","launch__block_size"
"","","%","usecond","Kbyte","register/thread","%","%","%","",""
"0","cunn_SoftMaxBackward","91.52","2,404.35","2.05","18","40.01","22.3","87.6","16,384","128"
'''


@pytest.mark.parametrize("name, function", [
    (SOFTMAX_BWD, "cunn_SoftMaxBackward"), (OTHER_ANON, "cunn_SoftMaxForward"), (COPY, "elementwise_kernel"),
    ("triton_poi_fused_add_mul_0", "triton_poi_fused_add_mul_0"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_tn_align4>(Params)", "Kernel2"),
])
def test_a_kernel_s_function_name_is_what_ncu_matches(name, function):
    """The old pattern cut the name at its first '(': '(anonymous namespace)' made it 'void at::native::', which
    matched every such kernel, and ncu measured another kernel than the profile's."""
    assert function_name(name) == function


def _trace(tmp_path, launches):
    """A window of kernels: (name, grid, duration) in launch order, 100 us apart."""
    b = TraceBuilder()
    for i, (name, grid, dur) in enumerate(launches):
        b.kernel(name, 1000.0 + 100 * i, dur, grid=grid)
    return load(b.write(tmp_path / "t.json"))


def test_the_heaviest_launch_group_is_measured_by_its_ordinal_in_the_window(tmp_path):
    """cunn_SoftMaxBackward at two sizes, and its forward in between: the ordinal counts the window's launches of
    the same function only, in launch order (the forward is another function, not counted)."""
    small, big = (64, 1, 1), (16384, 1, 1)
    trace = _trace(tmp_path, [(SOFTMAX_BWD, small, 3.0), (OTHER_ANON, big, 50.0), (SOFTMAX_BWD, small, 3.5),
                              (SOFTMAX_BWD, big, 2260.0), (SOFTMAX_BWD, big, 2250.0), (SOFTMAX_BWD, big, 2270.0)])
    (launch,) = ncu.heaviest_launches(trace, SOFTMAX_BWD)
    assert launch.grid == big and launch.ordinal == 2 and launch.trace_us == 2260.0   # the median of its group
    assert launch.group_launches == 3 and launch.group_share == pytest.approx(6780 / 6786.5)
    cmd = ncu.command("ncu", ["python", "prog.py"], launch)
    assert cmd[cmd.index("--launch-skip") + 1] == "2" and cmd[cmd.index("--launch-count") + 1] == "1"
    assert cmd[cmd.index("--profile-from-start") + 1] == "off"
    assert cmd[cmd.index("--kernel-name-base") + 1] == "function"
    pattern = cmd[cmd.index("--kernel-name") + 1].removeprefix("regex:")
    assert re.search(pattern, "cunn_SoftMaxBackward") and re.search(pattern, "at::native::cunn_SoftMaxBackward")
    assert not re.search(pattern, "cunn_SoftMaxBackwardSmem") and not re.search(pattern, "cunn_SoftMaxForward")


def test_a_kernel_spread_over_sizes_gets_its_two_heaviest_groups(tmp_path):
    """A copy kernel at many sizes, none holding half its time: the two heaviest groups are measured."""
    launches = [(COPY, (n, 1, 1), float(n)) for n in (400, 300, 200, 100, 400, 300)]
    first, second = ncu.heaviest_launches(trace := _trace(tmp_path, launches), COPY)
    assert (first.grid, first.group_launches, first.ordinal) == ((400, 1, 1), 2, 0)
    assert (second.grid, second.group_launches) == ((300, 1, 1), 2)
    assert first.group_share == pytest.approx(800 / 1700) and len(ncu.heaviest_launches(trace, COPY, 1)) == 1


def test_counters_are_read_with_their_units():
    got = ncu.parse(CSV)
    assert got == {"occupancy_pct": 87.6, "dram_pct": 91.52, "sm_pct": 22.3, "l2_hit_pct": 40.01, "registers": 18.0,
                   "spill_bytes": 2050.0, "duration_us": 2404.35, "grid_size": 16384.0, "block_size": 128.0}
    assert ncu.parse("==PROF== no kernels were profiled\n") is None


def _launch(grid=(16384, 1, 1), us=2260.0):
    return ncu.Launch(SOFTMAX_BWD, "cunn_SoftMaxBackward", 3, grid, (128, 1, 1), us, 3, 0.99)


def test_where_ncu_measured_another_launch_the_row_says_so():
    found = ncu.parse(CSV)
    assert ncu.disagreement(_launch(), found) is None   # 2404 against 2260 us: base clocks, the same launch
    said = ncu.disagreement(_launch(grid=(64, 1, 1), us=2260.0), {**found, "duration_us": 3.55})
    assert "16,384 blocks of 128 threads, the profile 64 of 128" in said
    assert "3.5 us against the profile's 2,260.0 us" in said


def test_measure_runs_the_window_under_ncu_once_per_launch(tmp_path):
    log = tmp_path / "calls.json"
    stand_in = tmp_path / "ncu"
    stand_in.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                        f"calls = json.load(open({str(log)!r})) if os.path.exists({str(log)!r}) else []\n"
                        f"json.dump(calls + [sys.argv[1:]], open({str(log)!r}, 'w'))\n"
                        f"sys.stdout.write({CSV!r} if 'SoftMax' in ' '.join(sys.argv) else 'no kernels')\n")
    stand_in.chmod(stand_in.stat().st_mode | stat.S_IEXEC)
    program = ncu.window_argv("train.py", ["--epochs", "1"], module=False, skip=3, active=None)
    other = ncu.Launch("other_kernel", "other_kernel", 0, (1, 1, 1), (32, 1, 1), 5.0, 1, 1.0)
    run = ncu.measure(program, [_launch(), other], str(stand_in))
    softmax, missing = run.kernels
    assert softmax.dram_pct == 91.52 and softmax.error is None and softmax.note is None and run.seconds > 0
    assert softmax.trace_us == 2260.0 and ncu.row_note(vars(softmax)).startswith("grid 16384x1x1, block 128x1x1: 3 ")
    assert missing.dram_pct is None and "no kernels" in missing.error
    calls = json.loads(log.read_text())
    assert [c[c.index("--launch-skip") + 1] for c in calls] == ["3", "0"]
    assert calls[0][-7:] == ["roofline.profiler.ncu_window", "--skip", "3", "--", "train.py", "--epochs", "1"]
    assert ncu.window_argv("pkg.main", ["--x"], True, 0, 4)[2:] == ["roofline.profiler.ncu_window", "--skip", "0",
                                                                     "--steps", "4", "-m", "--", "pkg.main", "--x"]


@pytest.mark.parametrize("skip, active", [(0, None), (0, 2), (2, None), (3, 2), (5, 2), (7, None)])
def test_the_range_marked_for_ncu_holds_the_steps_the_profile_records(skip, active):
    """cudaProfilerStart/Stop around exactly the steps a Profiler of the same skip and active records."""
    events, steps_in_range = [], []
    marks = capture.CudaProfilerRange(skip, active, start=lambda: events.append("start"),
                                      stop=lambda: events.append("stop"))
    with marks:
        for i in range(6):
            if events[-1:] == ["start"]:
                steps_in_range.append(i)
            marks.step()
    with capture.Profiler(skip=skip, active=active) as prof:
        for _ in range(6):
            prof.step()
    recorded = [i for i in range(6) if prof._records(i)]
    assert steps_in_range == recorded and prof.window_steps == len(recorded)
    assert events == ([] if skip > 6 else ["start", "stop"])


def test_the_window_runner_runs_the_program_as_profile_does(tmp_path, monkeypatch):
    """`python -m roofline.profiler.ncu_window --skip 2 --steps 3 -- prog.py ARGS` (what ncu runs): steps counted from
    optimizer.step(), as roofline profile counts them; the program's arguments and exit status its own."""
    events = []
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: events.append(("start", capture._active.steps)))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: events.append(("stop", capture._active.steps)))
    program = tmp_path / "prog.py"
    program.write_text("import sys, torch\n"
                       "w = torch.nn.Parameter(torch.ones(2))\n"
                       "opt = torch.optim.SGD([w], lr=0.1)\n"
                       "for _ in range(int(sys.argv[1])):\n"
                       "    w.sum().backward(); opt.step()\n"
                       "sys.exit(int(sys.argv[2]))\n")
    assert ncu_window.main(["--skip", "2", "--steps", "3", "--", str(program), "6", "0"]) == 0
    assert events == [("start", 2), ("stop", 5)]
    events.clear()
    assert ncu_window.main(["--skip", "2", "--", str(program), "4", "3"]) == 3
    assert events == [("start", 2), ("stop", 4)] and capture._active is None
