"""A kernel named in a profile's trace, looked inside from the binary the program ran (`roofline inspect TRACE
--kernel NAME`), without running the program again.

Triton writes every kernel it compiles into its cache: a folder per compilation holding NAME.json (the launch
options: warps, stages, shared memory, the GPU), NAME.cubin, its PTX, TTGIR and TTIR, and NAME.source, whose
first location is the kernel's def. torch.compile's kernels go to Inductor's own Triton cache. The trace names each
kernel launch with its grid, its block and (from CUPTI) its registers a thread; the compilations of that name
whose threads a block and registers agree with the launches are the binaries that ran. Their TTIR's signature says
how Triton's JIT specialized the launch: `tt.divisibility = 16` on each pointer that was 16-byte aligned and each
integer divisible by 16, which is what vectorized accesses need.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from roofline.profiler import trace as trace_file

_DEF = re.compile(r'^#loc\d* = loc\("(?P<file>[^"]+)":(?P<line>\d+):\d+\)', re.M)
_PARAMETER = re.compile(r"%(?P<name>\w+): (?P<type>!tt\.ptr<[^>]+>|i\d+|f\d+|bf16)(?P<attrs> \{[^}]*\})?")


@dataclass
class CachedLaunch:
    """A kernel launch seen in a trace, with the compilation Triton cached for it: what the inspection reads
    where a kernels.Launch would give the launch's own arguments."""
    name: str
    grid: tuple | None
    source: tuple[str, int] | None       # the kernel's def: (file, line)
    parameters: list[str] = field(default_factory=list)
    divisible: dict = field(default_factory=dict)   # parameter -> whether the JIT saw it 16-byte aligned or
                                                    # divisible by 16; pointers and integers only
    pointers: set = field(default_factory=set)
    kwargs: dict = field(default_factory=dict)      # constexprs are compiled in: the cache does not list them
    args: tuple = ()
    kernel: object = None

    @property
    def where(self) -> tuple[str, int]:
        return self.source if self.source is not None else ("?", 0)

    def unaligned(self) -> list[str]:
        """As kernels.Launch.unaligned, from the specialization the TTIR records (values are not kept)."""
        odd = [n for n, ok in self.divisible.items() if not ok and n not in self.pointers]
        misaligned = [n for n, ok in self.divisible.items() if not ok and n in self.pointers]
        return ([f"integer arguments not divisible by 16 ({', '.join(odd)})"] if odd else []) + (
            [f"pointers not 16-byte aligned ({', '.join(misaligned)})"] if misaligned else [])


@dataclass
class Launches:
    """A kernel's launches in the trace."""
    name: str
    count: int
    total_us: float
    grids: list                       # the distinct grids, most launched first
    threads: int | None               # a block's
    registers: int | None             # a thread's, as CUPTI recorded them
    sms: int | None = None            # the GPU's, where the trace records its properties


def cache_folders() -> list[Path]:
    """Where the program's Triton kernels were cached: TRITON_CACHE_DIR (or Triton's default, ~/.triton/cache),
    and Inductor's Triton caches (torch.compile's kernels), where they exist."""
    folders = [Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")]
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        folders += sorted((Path(default_cache_dir()) / "triton").glob("*"))
    except ImportError:
        pass
    return [f for f in folders if f.is_dir()]


def launches_in(trace_path: str | Path, name: str) -> Launches:
    """The launches of the kernel `name` (its function's name, or the whole name the trace gives) in the trace."""
    recorded = trace_file.load(trace_path)
    kernels = recorded.kernels
    mine = [k for k in kernels if k.name == name or k.name.split("(")[0].split("<")[0].strip() == name]
    if not mine:
        names = sorted({k.name for k in kernels}, key=lambda n: -sum(k.dur for k in kernels if k.name == n))
        near = [n for n in names if name.lower() in n.lower()][:5] or names[:5]
        raise ValueError(f"the trace has no kernel named {name!r}; "
                         + (f"the nearest: {', '.join(near)}" if near else "it holds no kernels"))
    grids: dict = {}
    for k in mine:
        grids[k.grid] = grids.get(k.grid, 0) + 1
    threads = {k.block[0] * k.block[1] * k.block[2] for k in mine if k.block}
    registers = {k.registers for k in mine if k.registers is not None}
    devices = {d.get("id"): d for d in recorded.meta.get("deviceProperties") or [] if isinstance(d, dict)}
    sms = (devices.get(mine[0].device) or {}).get("numSms")
    return Launches(name, len(mine), sum(k.dur for k in mine), sorted(grids, key=lambda g: -grids[g]),
                    threads.pop() if len(threads) == 1 else None, registers.pop() if len(registers) == 1 else None,
                    sms if isinstance(sms, int) else None)


def compilations(name: str, folders: list[Path]) -> list[dict]:
    """Every compilation of the kernel `name` in the cache folders, as kernels.compiled gives a kernel (its asm and
    metadata, "here": False: the binary the program ran), with its "source" text and its folder."""
    found = []
    for folder in folders:
        for meta_path in folder.glob(f"*/{name}.json"):
            entry = meta_path.parent
            cubin = entry / f"{name}.cubin"
            if not cubin.exists():
                continue   # a compilation for another backend, or one Triton did not finish
            meta = json.loads(meta_path.read_text())
            target = meta.get("target") or {}
            asm = {kind: (entry / f"{name}.{kind}").read_text() for kind in ("ttir", "ttgir", "llir", "ptx")
                   if (entry / f"{name}.{kind}").exists()}
            asm["cubin"] = cubin.read_bytes()
            source = entry / f"{name}.source"
            found.append({"asm": asm, "here": False, "folder": str(entry),
                          "source": source.read_text() if source.exists() else asm.get("ttir", ""),
                          "metadata": {"name": meta["name"], "num_warps": meta["num_warps"],
                                       "num_stages": meta["num_stages"], "shared": meta["shared"],
                                       "num_ctas": meta.get("num_ctas", 1), "arch": f"sm_{target.get('arch')}"},
                          "mtime": meta_path.stat().st_mtime})
    return sorted(found, key=lambda c: -c["mtime"])


def launch_of(compilation: dict, seen: Launches) -> CachedLaunch:
    """The launch as inspect reads it: the trace's most frequent grid, the def and the specialization the
    compilation's source records."""
    text = compilation["source"]
    found = _DEF.search(text)
    launch = CachedLaunch(seen.name, seen.grids[0] if seen.grids else None,
                          (found["file"], int(found["line"])) if found else None)
    signature = re.search(rf"tt\.func \w* ?@{re.escape(compilation['metadata']['name'])}\((.*?)\) (?:attributes|\{{)",
                          text)
    for p in _PARAMETER.finditer(signature[1] if signature else ""):
        launch.parameters.append(p["name"])
        if p["type"].startswith("!tt.ptr") or p["type"].startswith("i"):
            launch.divisible[p["name"]] = "tt.divisibility = 16" in (p["attrs"] or "")
        if p["type"].startswith("!tt.ptr"):
            launch.pointers.add(p["name"])
    return launch


def matching(compiled: list[dict], seen: Launches, registers_of) -> list[dict]:
    """The compilations whose block and registers agree with the trace's launches (where the trace records them).
    registers_of(compilation): a thread's registers, read from its cubin."""
    return [c for c in compiled
            if (seen.threads is None or c["metadata"]["num_warps"] * 32 == seen.threads)
            and (seen.registers is None or registers_of(c) == seen.registers)]


def inspect_trace(trace_path: str | Path, name: str, folders: list[Path] | None = None,
                  sms: int | None = None) -> tuple[Launches, list]:
    """(the kernel's launches in the trace, the KernelReport of each cached binary that ran them: the latest
    compilation first). Raises ValueError naming what is missing: the kernel in the trace, or its binary in the
    caches searched."""
    from roofline.inspect import sass
    from roofline.inspect.report import analyze

    seen = launches_in(trace_path, name)
    folders = cache_folders() if folders is None else folders
    compiled = compilations(name, folders)
    if not compiled:
        raise ValueError(f"no compilation of {name} in Triton's caches ({', '.join(map(str, folders)) or 'none found'})"
                         ": inspect reads the binaries the program left there; pass --cache DIR where it kept them "
                         "(TRITON_CACHE_DIR), or run `roofline profile --inspect K` on the program")

    def registers_of(c: dict) -> int | None:
        used = sass.resources(c["asm"]["cubin"]).get(c["metadata"]["name"])
        return None if used is None else used.registers

    ran = matching(compiled, seen, registers_of)
    if not ran:
        raise ValueError(f"{len(compiled)} compilation(s) of {name} in the caches, none with the trace's block of "
                         f"{seen.threads} threads and {seen.registers} registers a thread: the binary that ran is "
                         "not there (another cache, or since overwritten)")
    return seen, [analyze(launch_of(c, seen), c, sms or seen.sms) for c in ran]
