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
    from roofline import device

    monkeypatch.setenv("ROOFLINE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(device, "_copy_bytes", lambda dev: 16 << 20)
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
