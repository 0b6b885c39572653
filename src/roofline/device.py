"""What the device is, what its datasheet promises, and what it measurably delivers.

Every "% of roofline" in roofline is relative to `ceilings()`: measured on this
very device when `roofline doctor` has run (cached per device and software
versions), the datasheet's figures otherwise, and it always says which.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import json
import os
import platform
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

MATMUL_DTYPES = ("bf16", "fp16", "tf32", "fp32")


def resolve(device=None) -> torch.device:
    """The device to work on: the one given, else the current CUDA device, else the CPU."""
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device} was asked for, but CUDA is not available")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    elif device.type != "cpu":
        raise ValueError(f"device must be a CUDA device or the CPU, got {device}")
    return device


def cache_dir() -> Path:
    """Where roofline keeps measured ceilings and compiled extensions."""
    if os.environ.get("ROOFLINE_CACHE_DIR"):
        return Path(os.environ["ROOFLINE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "roofline"


# --------------------------------------------------------------------------- NVML

@functools.cache
def _nvml():
    """The initialized pynvml module, or None where NVML cannot be used."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


def pci_address(device: torch.device, domain_digits: int = 8) -> str:
    """The CUDA device's PCI address, "00000000:3b:00.0" (NVML's form; sysfs writes the domain in 4 digits). By
    PCI address, because CUDA_VISIBLE_DEVICES renumbers devices for CUDA but not for NVML or the system."""
    props = torch.cuda.get_device_properties(device)
    return f"{props.pci_domain_id:0{domain_digits}x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"


def _nvml_handle(device: torch.device):
    nvml = _nvml()
    if nvml is None or device.type != "cuda":
        return None
    try:
        return nvml.nvmlDeviceGetHandleByPciBusId(pci_address(device).encode())
    except Exception:
        try:
            return nvml.nvmlDeviceGetHandleByIndex(device.index)
        except Exception:
            return None


def sm_clock_mhz(device=None) -> int | None:
    """The SM clock right now, from NVML; None where NVML cannot tell."""
    device = resolve(device)
    handle = _nvml_handle(device)
    if handle is None:
        return None
    try:
        return int(_nvml().nvmlDeviceGetClockInfo(handle, _nvml().NVML_CLOCK_SM))
    except Exception:
        return None


# NVML's clock-event reasons that mean the chip slowed itself down.
_SLOWDOWN_REASONS = {
    "nvmlClocksEventReasonSwPowerCap": "software power cap",
    "nvmlClocksEventReasonHwSlowdown": "hardware slowdown",
    "nvmlClocksEventReasonSwThermalSlowdown": "software thermal slowdown",
    "nvmlClocksEventReasonHwThermalSlowdown": "hardware thermal slowdown",
    "nvmlClocksEventReasonHwPowerBrakeSlowdown": "power brake",
}


def slowdown_reasons(device=None) -> list[str]:
    """Why the GPU is running below its clock right now (power, thermal), per NVML."""
    device = resolve(device)
    handle = _nvml_handle(device)
    if handle is None:
        return []
    nvml = _nvml()
    try:
        mask = nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
    except Exception:
        return []
    return [text for name, text in _SLOWDOWN_REASONS.items() if mask & getattr(nvml, name, 0)]


# --------------------------------------------------------------------------- what the device is

@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "cuda" or "cpu"
    name: str
    torch: str
    triton: str | None
    # CUDA devices
    index: int | None = None
    uuid: str | None = None
    capability: str | None = None
    sm_count: int | None = None
    l2_bytes: int | None = None
    memory_bytes: int | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    mem_clock_mhz: int | None = None
    mem_clock_max_mhz: int | None = None
    driver: str | None = None
    cuda: str | None = None
    # CPU
    cores: int | None = None
    threads: int | None = None
    llc_bytes: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _size_bytes(text: str) -> int:
    """'32768K' or '36M' (as sysfs writes cache sizes) in bytes."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def _cpu_last_level_cache_bytes() -> int | None:
    best_level, best_size = -1, None
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            size = _size_bytes((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if level > best_level:
            best_level, best_size = level, size
    return best_size


def _physical_cores() -> int | None:
    try:
        pairs = {
            tuple(line.split(":", 1)[1].strip() for line in block.splitlines()
                  if line.startswith(("physical id", "core id")))
            for block in Path("/proc/cpuinfo").read_text().split("\n\n") if block.strip()
        }
        return len(pairs) or None
    except OSError:
        return None


@functools.cache
def _info(device: torch.device) -> DeviceInfo:
    common = dict(torch=torch.__version__, triton=_package_version("triton"))
    if device.type == "cpu":
        return DeviceInfo(
            kind="cpu",
            name=_cpu_model(),
            cores=_physical_cores(),
            threads=os.cpu_count(),
            llc_bytes=_cpu_last_level_cache_bytes(),
            **common,
        )
    props = torch.cuda.get_device_properties(device)
    clocks: dict = {}
    driver = None
    handle = _nvml_handle(device)
    if handle is not None:
        nvml = _nvml()
        for key, fn, clock in (
            ("sm_clock_mhz", nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_SM),
            ("sm_clock_max_mhz", nvml.nvmlDeviceGetMaxClockInfo, nvml.NVML_CLOCK_SM),
            ("mem_clock_mhz", nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_MEM),
            ("mem_clock_max_mhz", nvml.nvmlDeviceGetMaxClockInfo, nvml.NVML_CLOCK_MEM),
        ):
            try:
                clocks[key] = int(fn(handle, clock))
            except Exception:
                pass
        try:
            driver = nvml.nvmlSystemGetDriverVersion()
            driver = driver.decode() if isinstance(driver, bytes) else driver
        except Exception:
            pass
    return DeviceInfo(
        kind="cuda",
        name=props.name,
        index=device.index,
        uuid=str(getattr(props, "uuid", "")) or None,
        capability=f"{props.major}.{props.minor}",
        sm_count=props.multi_processor_count,
        l2_bytes=props.L2_cache_size,
        memory_bytes=props.total_memory,
        driver=driver,
        cuda=torch.version.cuda,
        **clocks,
        **common,
    )


def info(device=None) -> DeviceInfo:
    """What the device is. Clocks are as read the first time it is asked for."""
    return _info(resolve(device))


# --------------------------------------------------------------------------- datasheets

@dataclass(frozen=True)
class Datasheet:
    """Vendor peak figures: DRAM GB/s and dense (no sparsity) matrix TFLOP/s."""

    model: str
    dram_gbps: float
    matmul_tflops: dict[str, float]


def _sheet(model, gbps, bf16, tf32, fp32, fp16=None):
    tflops = {"bf16": bf16, "fp16": fp16 if fp16 is not None else bf16, "tf32": tf32, "fp32": fp32}
    return Datasheet(model, gbps, {k: v for k, v in tflops.items() if v is not None})


# NVIDIA datasheets, dense figures. Order matters: the first pattern that
# matches the name torch reports wins, so specific names come first.
DATASHEETS: list[tuple[str, Datasheet]] = [
    (r"H200 NVL", _sheet("H200 NVL", 4800, bf16=835.5, tf32=417.5, fp32=60.0)),
    (r"H200", _sheet("H200 SXM", 4800, bf16=989.4, tf32=494.7, fp32=66.9)),
    (r"H100 NVL", _sheet("H100 NVL", 3900, bf16=835.5, tf32=417.5, fp32=60.0)),
    (r"H100 PCIe", _sheet("H100 PCIe", 2000, bf16=756.0, tf32=378.0, fp32=51.2)),
    (r"H100", _sheet("H100 SXM", 3350, bf16=989.4, tf32=494.7, fp32=66.9)),
    (r"A100.*(80GB PCIe|PCIE-80GB)", _sheet("A100 PCIe 80GB", 1935, bf16=312.0, tf32=156.0, fp32=19.5)),
    (r"A100.*PCIE", _sheet("A100 PCIe 40GB", 1555, bf16=312.0, tf32=156.0, fp32=19.5)),
    (r"A100.*80GB", _sheet("A100 SXM 80GB", 2039, bf16=312.0, tf32=156.0, fp32=19.5)),
    (r"A100", _sheet("A100 SXM 40GB", 1555, bf16=312.0, tf32=156.0, fp32=19.5)),
    (r"L40S", _sheet("L40S", 864, bf16=362.1, tf32=183.0, fp32=91.6)),
    (r"\bL4\b", _sheet("L4", 300, bf16=121.0, tf32=60.0, fp32=30.3)),
    (r"\bA10\b", _sheet("A10", 600, bf16=125.0, tf32=62.5, fp32=31.2)),
    (r"\bT4\b", _sheet("T4", 320, bf16=None, tf32=None, fp32=8.1, fp16=65.0)),
    (r"V100.*PCIE", _sheet("V100 PCIe", 900, bf16=None, tf32=None, fp32=14.0, fp16=112.0)),
    (r"V100", _sheet("V100 SXM2", 900, bf16=None, tf32=None, fp32=15.7, fp16=125.0)),
]


def datasheet(name: str) -> Datasheet | None:
    """The datasheet for a GPU, by the name torch reports; None for an unknown GPU."""
    for pattern, sheet in DATASHEETS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return sheet
    return None


# --------------------------------------------------------------------------- ceilings

@dataclass
class Ceilings:
    """The limits a "% of roofline" is relative to.

    source is "measured" (by `measure_ceilings`, on this device and software),
    "datasheet" (vendor peaks), or "none" (an unknown GPU that was never measured).
    """

    device: str
    source: str
    dram_gbps: float | None
    matmul_tflops: dict[str, float] = field(default_factory=dict)
    measured_at: str | None = None
    l2_gbps: float | None = None      # a copy that fits in the L2 cache (GPU only; measured, no datasheet gives it)
    l2_bytes: int | None = None       # the L2 cache's size
    versions: dict = field(default_factory=dict)
    details: dict = field(default_factory=dict)

    def tflops(self, dtype: torch.dtype) -> float | None:
        """The matrix ceiling that applies to a matmul on inputs of this dtype.

        float32 uses the TF32 ceiling when torch lets matmuls use TF32.
        """
        return self.matmul_tflops.get(matmul_key(dtype))

    def ridge_point(self, dtype: torch.dtype) -> float | None:
        """FLOPs per byte above which a kernel on this dtype is compute-bound."""
        peak = self.tflops(dtype)
        if peak is None or not self.dram_gbps:
            return None
        return peak * 1e12 / (self.dram_gbps * 1e9)

    def to_dict(self) -> dict:
        return asdict(self)


def matmul_key(dtype: torch.dtype) -> str | None:
    if dtype == torch.float32:
        return "tf32" if torch.get_float32_matmul_precision() != "highest" else "fp32"
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype)


def cache_key(device: torch.device) -> str:
    """What a measurement on this device holds for: the device itself, its driver, CUDA and torch."""
    d = info(device)
    parts = [d.kind, d.name, d.uuid or "", d.driver or "", d.cuda or "", d.torch]
    return "|".join(parts)


def read_cache(name: str) -> dict:
    """The JSON object cached under cache_dir()/name, or {} if there is none (or it cannot be read)."""
    try:
        return json.loads((cache_dir() / name).read_text())
    except (OSError, ValueError):
        return {}


def write_cache(name: str, key: str, value) -> None:
    """Set key to value in the JSON object cached under cache_dir()/name."""
    entries = read_cache(name)
    entries[key] = value
    path = cache_dir() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(entries, indent=2))
    tmp.replace(path)  # atomic: a reader never sees half a file


CEILINGS_CACHE = "ceilings.json"


def ceilings(device=None) -> Ceilings:
    """Measured ceilings if this device was measured with this software, else the datasheet's."""
    device = resolve(device)
    cached = read_cache(CEILINGS_CACHE).get(cache_key(device))
    if cached is not None:
        return Ceilings(**cached)
    d = info(device)
    sheet = datasheet(d.name) if d.kind == "cuda" else None
    if sheet is None:
        return Ceilings(device=d.name, source="none", dram_gbps=None)
    return Ceilings(
        device=d.name,
        source="datasheet",
        dram_gbps=sheet.dram_gbps,
        matmul_tflops=dict(sheet.matmul_tflops),
        details={"datasheet": sheet.model},
    )


@contextlib.contextmanager
def float32_matmul_precision(precision: str):
    """torch.set_float32_matmul_precision(precision) for the block: "high" lets fp32 matmuls use TF32."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)
