"""The roofline command: real runs on this machine, and usage errors instead of tracebacks."""

import json

import pytest
import torch
from typer.testing import CliRunner

from roofline.cli import app

runner = CliRunner()


def flat(output: str) -> str:
    """The words of rich's output, without the boxes and line wrapping around them."""
    return " ".join(output.translate({ord(c): " " for c in "│╭╮╰╯─┃━┏┓┗┛┡┩"}).split())

SWEEP_FILE = '''
import torch
from roofline.bench import Provider, Sweep

def tiny():
    return Sweep(name="tiny add", x_name="n", x_values=[64, 256],
                 inputs=lambda n, dev: (torch.randn(n, device=dev),),
                 providers=[Provider("torch", lambda x: x + 1), Provider("again", lambda x: 1 + x)],
                 bytes=lambda n, x: 8 * n)

both = [tiny(), tiny()]
not_a_sweep = 42
'''


@pytest.fixture
def sweep_file(tmp_path):
    path = tmp_path / "sweeps.py"
    path.write_text(SWEEP_FILE)
    return path


def test_bench_runs_a_sweep_and_writes_every_output(sweep_file, tmp_path):
    out = {ext: tmp_path / f"r.{ext}" for ext in ("json", "csv", "png", "md")}
    res = runner.invoke(app, ["bench", f"{sweep_file}:tiny", "--rep-ms", "5", "--no-flush",
                              "--json", str(out["json"]), "--csv", str(out["csv"]),
                              "--plot", str(out["png"]), "--markdown", str(out["md"])])
    assert res.exit_code == 0, res.output
    assert "tiny add" in res.output and "again" in res.output
    assert ("events" if torch.cuda.is_available() else "perf_counter") in res.output
    data = json.loads(out["json"].read_text())
    assert [r["status"] for r in data["rows"]] == ["ok"] * 4
    assert out["csv"].read_text().count("\n") == 5
    assert out["png"].stat().st_size > 1000 and out["md"].read_text().startswith("| n |")


def test_bench_numbers_the_outputs_of_several_sweeps(sweep_file, tmp_path):
    res = runner.invoke(app, ["bench", f"{sweep_file}:both", "--rep-ms", "2", "--no-flush",
                              "--json", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "r-0.json").exists() and (tmp_path / "r-1.json").exists()


@pytest.mark.parametrize("target, message", [
    ("no_colon_here", "expected FILE_OR_MODULE:FUNCTION"),
    ("missing/file.py:fn", "no such file"),
    ("{file}:nothing", "has no attribute 'nothing'"),
    ("{file}:not_a_sweep", "must be a Sweep"),
    ("no_such_module_xyz:fn", "cannot import no_such_module_xyz"),
])
def test_bench_bad_targets_are_usage_errors(sweep_file, target, message):
    res = runner.invoke(app, ["bench", target.format(file=sweep_file)])
    assert res.exit_code == 2
    assert message in flat(res.output)
    assert "Traceback" not in res.output


def test_bench_bad_option_is_a_usage_error(sweep_file):
    res = runner.invoke(app, ["bench", f"{sweep_file}:tiny", "--rep-ms", "-3"])
    assert res.exit_code == 2 and "Traceback" not in res.output


def test_doctor_describes_the_machine_and_measures_then_caches(tmp_path, monkeypatch):
    from roofline.bench import ceilings

    monkeypatch.setenv("ROOFLINE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(ceilings, "_copy_bytes", lambda dev: 16 << 20)
    res = runner.invoke(app, ["doctor", "--device", "cpu", "--json", str(tmp_path / "d.json")])
    assert res.exit_code == 0, res.output
    assert "CPU" in res.output and "DRAM bandwidth" in res.output and "GFLOP/s" in res.output
    assert "measured now" in res.output and "TimingWarning" not in res.output
    data = json.loads((tmp_path / "d.json").read_text())
    assert data["device"]["kind"] == "cpu" and data["ceilings"]["source"] == "measured"
    again = runner.invoke(app, ["doctor", "--device", "cpu"])
    assert "cached (--remeasure to measure again)" in flat(again.output)


def test_doctor_bad_device_is_a_usage_error():
    res = runner.invoke(app, ["doctor", "--device", "meta"])
    assert res.exit_code == 2 and "--device" in res.output and "Traceback" not in res.output


# --------------------------------------------------------------------------- roofline profile / analyze

PROGRAM = '''
import sys
import torch
x = torch.randn(64, 64)
for _ in range(3):
    y = (x @ x).relu()
print("done", flush=True)
if len(sys.argv) > 1:
    raise ValueError("the program failed: " + sys.argv[1])
'''


@pytest.fixture
def program(tmp_path):
    path = tmp_path / "prog.py"
    path.write_text(PROGRAM)
    return path


def test_profile_a_cpu_program_writes_every_output(program, tmp_path):
    out_json, out_html, out_trace = tmp_path / "r.json", tmp_path / "r.html", tmp_path / "t.json.gz"
    result = runner.invoke(app, ["profile", "--json", str(out_json), "--html", str(out_html),
                                 "--trace", str(out_trace), str(program)])
    assert result.exit_code == 0, result.output
    text = flat(result.output)
    assert "No GPU activity in this trace" in text and "top lines by op time" in text
    report = json.loads(out_json.read_text())
    assert report["schema"] == "roofline.profile/1"
    assert set(report) >= {"device", "totals", "kernels", "memory_ops", "lines", "modules", "ops", "findings",
                           "tree", "syncs", "timeline"}
    assert report["device"]["kind"] == "cpu" and report["totals"]["attributed_share"] > 0.99
    line6 = next(r for r in report["lines"] if r["line"] == 6)
    assert line6["file"].endswith("prog.py") and line6["self_ms"] > 0
    mm = next(o for o in report["ops"] if o["name"] == "aten::mm")
    assert mm["flops"] == 3 * 2 * 64 ** 3 and mm["count"] == 3
    assert "<h2>Findings</h2>" in out_html.read_text() and out_trace.stat().st_size > 0


def test_profile_passes_arguments_and_exits_with_the_programs_status(program, tmp_path):
    result = runner.invoke(app, ["profile", "--json", str(tmp_path / "r.json"), str(program), "boom"])
    assert result.exit_code == 1
    assert "ValueError: the program failed: boom" in result.output
    assert "roofline/" not in result.output.split("Traceback")[1]   # the program's frames, not roofline's
    assert json.loads((tmp_path / "r.json").read_text())["lines"]      # what ran is still reported


def test_profile_leaves_every_argument_after_the_program_to_the_program(tmp_path):
    program = tmp_path / "echo_args.py"
    program.write_text("import sys, torch\ntorch.ones(2).sum()\nprint('argv', sys.argv[1:])\n")
    mine = tmp_path / "mine.json"
    result = runner.invoke(app, ["profile", "--json", str(mine), str(program), "train", "--mode", "x",
                                 "--steps", "7", "--json", "y.json", "-m"])
    assert result.exit_code == 0, result.output
    assert "argv ['train', '--mode', 'x', '--steps', '7', '--json', 'y.json', '-m']" in result.output
    assert json.loads(mine.read_text())["lines"] and not (tmp_path / "y.json").exists()


@pytest.mark.parametrize("argv, message", [
    (["profile", "nowhere/missing.py"], "no such file: nowhere/missing.py"),
    (["profile", "-m", "no_such_module_at_all"], "no module named 'no_such_module_at_all'"),
    (["analyze", "nowhere/trace.json"], "nowhere/trace.json"),
    (["profile", "--no-ops", "--verify", "train.py"], "--no-ops: not with --verify"),
    (["profile", "--no-ops", "--memory", "train.py"], "--no-ops: not with --memory or --python-stack"),
] + ([] if torch.cuda.is_available() else [
    (["profile", "--no-ops", "train.py"], "--no-ops: records kernels and their launches alone, and there is no CUDA"),
    (["profile", "--no-ops", "--nproc-per-node", "2", "train.py"],
     "--no-ops: records kernels and their launches alone, and there is no CUDA"),
]))
def test_profile_and_analyze_usage_errors(argv, message):
    result = runner.invoke(app, argv)
    assert result.exit_code == 2 and message in flat(result.output)
    assert "Traceback" not in result.output


def test_profile_ncu_and_inspect_on_a_program_without_gpu_kernels_say_so(program):
    result = runner.invoke(app, ["profile", "--ncu", "2", "--inspect", "2", str(program)])
    assert result.exit_code == 0 and "--ncu needs GPU kernels" in flat(result.output)
    assert "--inspect needs GPU kernels; this trace has none" in flat(result.output)
    assert "Inside the heaviest" not in result.output and "top lines by op time" in flat(result.output)


def test_profile_with_too_few_steps_says_so(program):
    result = runner.invoke(app, ["profile", "--skip", "2", str(program)])
    assert result.exit_code == 2 and "nothing was recorded" in flat(result.output)


def test_a_failed_program_is_reported_first_with_its_status_and_error(program):
    """Before the report (or the 'nothing was recorded' that follows an early failure): the exit status, the steps
    it ran, and the tail of its error, without roofline's or runpy's frames."""
    result = runner.invoke(app, ["profile", str(program), "boom"])
    text = flat(result.output)
    said = f"{program} exited with status 1 after 0 steps: ValueError: the program failed: boom"
    assert result.exit_code == 1 and said in text and text.index(said) < text.index("top lines by op time")
    traceback = result.output.split("Traceback")[1].split("ValueError")[0]
    assert "runpy" not in traceback and 'line 9, in <module>' in traceback
    early = runner.invoke(app, ["profile", "--skip", "2", str(program), "early"])
    text = flat(early.output)
    assert early.exit_code == 1 and text.index("exited with status 1") < text.index("nothing was recorded")
    assert "the program ended after 0" in text


def test_analyze_rejects_a_file_that_is_not_a_trace(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    result = runner.invoke(app, ["analyze", str(bad)])
    assert result.exit_code == 2 and "Traceback" not in result.output and str(bad) in flat(result.output)


def test_analyze_a_recorded_h100_trace(tmp_path):
    from pathlib import Path

    fixture = Path(__file__).parent / "profiler/fixtures/h100-eager_elementwise.json.gz"
    result = runner.invoke(app, ["analyze", "--json", str(tmp_path / "r.json"), str(fixture)])
    assert result.exit_code == 0, result.output
    assert "NVIDIA H100" in result.output and "eager-elementwise-chain" not in result.output   # ids stay in JSON
    found = json.loads((tmp_path / "r.json").read_text())["findings"]
    assert found[0]["id"] == "eager-elementwise-chain"
    assert found[0]["location"] == {"file": "examples/problems/eager_elementwise.py", "line": 22}


def test_analyze_verify_says_why_nothing_was_measured_without_a_gpu(tmp_path, monkeypatch):
    from pathlib import Path

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    fixture = Path(__file__).parent / "profiler/fixtures/h100-eager_elementwise.json.gz"
    result = runner.invoke(app, ["analyze", "--verify", "--json", str(tmp_path / "r.json"), str(fixture)])
    assert result.exit_code == 0, result.output
    assert "measuring the fixes" in result.output and "measured ms" in result.output
    found = json.loads((tmp_path / "r.json").read_text())["findings"]
    assert found[0]["verified"]["reason"] == "the trace ran on a GPU, and none is here"


@pytest.mark.parametrize("options, passed", [(["--no-ops", "--no-shapes"], ["--no-shapes", "--no-ops"]), ([], [])])
def test_profile_passes_its_recording_options_to_the_ranks_it_starts(monkeypatch, options, passed):
    """--nproc-per-node starts each rank as `roofline profile` with the same recording: --no-ops included (a GPU
    machine is pretended: the launch itself is caught)."""
    import roofline.cli as cli

    started = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cli, "_profile_ranks", lambda nproc, rendezvous, recording, *rest: started.append(recording)
                        or 0)
    result = runner.invoke(app, ["profile", *options, "--nproc-per-node", "2", "--skip", "1", "train.py"])
    assert result.exit_code == 0, result.output
    assert started == [["--skip", "1", *passed]]


def test_the_ranks_are_held_against_doctor_s_measurement_of_what_they_ran_over(monkeypatch):
    """GPUs: doctor's of these GPUs; CPU processes over gloo: doctor's gloo measurement (doctor --nproc N), but
    not on a machine whose cache holds its GPUs' measurement; across hosts, none."""
    import roofline.cli as cli
    from roofline.distributed import interconnect

    monkeypatch.setattr(interconnect, "cached", lambda world: f"doctor's for {world}")
    for gpus, device, world, hosts, found in ((0, "cpu", 2, 1, "doctor's for 2"), (2, "cpu", 2, 1, None),
                                              (2, "cuda", 2, 1, "doctor's for 2"), (2, "cuda", 4, 1, None),
                                              (2, "cuda", 4, 2, None)):
        monkeypatch.setattr(torch.cuda, "is_available", lambda gpus=gpus: gpus > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda gpus=gpus: gpus)
        assert cli._ranks_ceiling(device, world, hosts) == found, (gpus, device, world, hosts)


def test_profile_on_a_cpu_prints_nothing_of_kineto_s_own(program):
    """torch 2.13's CPU build logs "USDT:... profiler_start" and "profiler_stop" on stderr at every recording's
    edges: not where roofline records on a machine without a GPU, unless the user set KINETO_LOG_LEVEL."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-m", "roofline", "profile", str(program)], capture_output=True,
                          text=True, timeout=240, env=env, cwd=program.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "USDT" not in done.stderr and "profiler_start" not in done.stderr, done.stderr[-2000:]


def test_kineto_is_quieted_only_on_cpus_and_only_where_the_user_said_nothing(monkeypatch):
    import os

    from roofline.profiler import capture

    for gpu, set_before, after in ((False, None, capture.KINETO_QUIET), (True, None, None), (False, "2", "2")):
        if set_before is None:
            monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)
        else:
            monkeypatch.setenv("KINETO_LOG_LEVEL", set_before)
        monkeypatch.setattr(torch.cuda, "is_available", lambda gpu=gpu: gpu)
        capture._quiet_kineto_on_cpus()
        assert os.environ.get("KINETO_LOG_LEVEL") == after
