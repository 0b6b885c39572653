"""`roofline profile --ncu K`: the ncu command per kernel, the parsing of its CSV, and the run through a stand-in
for ncu (the real one runs in scripts/gpu-check)."""

import json
import re
import stat
import sys

from roofline.profiler import ncu

KERNEL = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>(int, float*)"
CSV = '''==PROF== Connected to process 123
"ID","Kernel Name","dram__throughput.avg.pct_of_peak_sustained_elapsed","gpu__time_duration.sum",\
"l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum","launch__registers_per_thread","lts__t_sector_hit_rate.pct",\
"sm__throughput.avg.pct_of_peak_sustained_elapsed","sm__warps_active.avg.pct_of_peak_sustained_active"
"","","%","usecond","Kbyte","register/thread","%","%","%"
"0","vectorized_elementwise_kernel","91.52","1,204.35","2.05","18","40.01","22.3","87.6"
'''


def test_the_pattern_matches_the_demangled_name_whatever_its_arguments():
    pattern = ncu.kernel_pattern(KERNEL).removeprefix("regex:")
    assert re.match(pattern, "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>"
                             "(int, float *)")
    assert not re.match(pattern, "void at::native::vectorized_elementwise_kernel<4, at::native::Other>(int)")
    cmd = ncu.command("ncu", ["python", "train.py", "--steps", "3"], KERNEL, skip=3)
    assert cmd[cmd.index("--launch-skip") + 1] == "3" and cmd[cmd.index("--launch-count") + 1] == "1"
    assert cmd[-4:] == ["python", "train.py", "--steps", "3"] and "--csv" in cmd


def test_counters_are_read_with_their_units():
    got = ncu.parse(CSV)
    assert got == {"occupancy_pct": 87.6, "dram_pct": 91.52, "sm_pct": 22.3, "l2_hit_pct": 40.01, "registers": 18.0,
                   "spill_bytes": 2050.0, "duration_us": 1204.35}
    assert ncu.parse("==PROF== no kernels were profiled\n") is None


def test_measure_runs_the_program_under_ncu_once_per_kernel(tmp_path):
    log = tmp_path / "calls.json"
    stand_in = tmp_path / "ncu"
    stand_in.write_text(f"#!{sys.executable}\nimport json, sys\n"
                        f"calls = json.load(open({str(log)!r})) if __import__('os').path.exists({str(log)!r}) else []\n"
                        f"json.dump(calls + [sys.argv[1:]], open({str(log)!r}, 'w'))\n"
                        f"sys.stdout.write({CSV!r} if 'gelu' in ' '.join(sys.argv) else 'no kernels')\n")
    stand_in.chmod(stand_in.stat().st_mode | stat.S_IEXEC)
    run = ncu.measure(["python", "prog.py"], [("gelu_kernel", 40), ("other_kernel", 1)], str(stand_in))
    gelu, other = run.kernels
    assert gelu.dram_pct == 91.52 and gelu.error is None and run.seconds > 0
    assert other.dram_pct is None and "no kernels" in other.error
    calls = json.loads(log.read_text())
    assert [c[c.index("--launch-skip") + 1] for c in calls] == ["3", "0"]   # a kernel launched once: not skipped
    assert ncu.program_argv("pkg.main", ["--x"], module=True)[1:] == ["-m", "pkg.main", "--x"]
