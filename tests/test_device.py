import json
import subprocess
import sys

import pytest
import torch

from roofline import device
from roofline.bench import ceilings


@pytest.mark.parametrize("name, model", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200 SXM"),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"),
    ("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB"),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", "L40S"),
    ("Tesla T4", "T4"),
])
def test_datasheets_match_the_names_torch_reports(name, model):
    assert device.datasheet(name).model == model


def test_unknown_gpu_has_no_datasheet():
    assert device.datasheet("NVIDIA GeForce GT 710") is None
    assert device.datasheet("NVIDIA L40") is None  # not an L4, not an L40S


def test_h100_datasheet_figures():
    sheet = device.datasheet("NVIDIA H100 80GB HBM3")
    assert sheet.dram_gbps == 3350
    assert sheet.matmul_tflops == {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}


def test_cpu_info():
    d = device.info("cpu")
    assert d.kind == "cpu" and d.threads >= 1 and d.name
    assert d.torch == torch.__version__


def test_resolve_rejects_what_is_not_here():
    assert device.resolve("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            device.resolve("cuda")
    with pytest.raises(ValueError, match="CUDA device or the CPU"):
        device.resolve("meta")


def test_unmeasured_cpu_has_no_ceilings_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("ROOFLINE_CACHE_DIR", str(tmp_path))
    c = device.ceilings("cpu")
    assert c.source == "none" and c.dram_gbps is None


def test_measured_ceilings_are_cached_and_returned(tmp_path, monkeypatch):
    monkeypatch.setenv("ROOFLINE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ceilings, "_copy_bytes", lambda dev: 32 << 20)
    progress = []
    measured = ceilings.measure_ceilings("cpu", progress=progress.append)
    assert progress == ["DRAM bandwidth (device-to-device copy)", "fp32 matmul"]
    assert measured.source == "measured" and measured.dram_gbps > 0.1
    assert set(measured.matmul_tflops) == {"fp32"} and measured.matmul_tflops["fp32"] > 1e-3
    assert measured.details["copy_bytes"] == 32 << 20
    again = device.ceilings("cpu")
    assert again == measured
    assert json.loads((tmp_path / "ceilings.json").read_text())  # one readable file


def test_ceilings_for_dtypes():
    c = device.Ceilings(device="x", source="datasheet", dram_gbps=1000.0,
                        matmul_tflops={"bf16": 100.0, "tf32": 50.0, "fp32": 10.0})
    assert c.tflops(torch.bfloat16) == 100.0 and c.tflops(torch.float16) is None
    assert c.ridge_point(torch.bfloat16) == pytest.approx(100.0)  # FLOPs per byte
    saved = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert c.tflops(torch.float32) == 10.0
        torch.set_float32_matmul_precision("high")
        assert c.tflops(torch.float32) == 50.0
    finally:
        torch.set_float32_matmul_precision(saved)


def test_import_is_fast_quiet_and_touches_no_gpu():
    code = ("import sys, time; t = time.perf_counter(); import roofline; dt = time.perf_counter() - t; "
            "assert 'torch' not in sys.modules, 'torch imported'; print(dt)")
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stderr == "" and float(out.stdout) < 0.5
