"""A kernel named in a profile's trace, looked inside from the binary the program ran (`roofline inspect TRACE
--kernel NAME`), without running the program again.

Triton writes every kernel it compiles into its cache: a folder per compilation holding NAME.json (the launch
options: warps, stages, shared memory, the GPU), NAME.cubin, its PTX, TTGIR and TTIR, and NAME.source, whose
first location is the kernel's def. torch.compile's kernels go to Inductor's own Triton cache. The trace names each
kernel launch with its grid, its block and (from CUPTI) its registers a thread and shared memory; the compilations
of that name for the trace's GPU whose threads a block, registers and shared memory agree with a launch's are the
binaries that ran, each with the grids of its own launches. Their TTIR's signature says how Triton's JIT
specialized the launch: `tt.divisibility = 16` on each pointer that was 16-byte aligned and each integer divisible
by 16, which is what vectorized accesses need.
"""

from __future__ import annotations

import collections
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from roofline.inspect.kernels import unaligned_text
from roofline.profiler import trace as trace_file

_DEF = re.compile(r'^#loc\d* = loc\("(?P<file>[^"]+)":(?P<line>\d+):\d+\)', re.M)
# a parameter of the kernel's tt.func: its SSA name, type, attributes, and the Python parameter it comes from (a
# tensor descriptor's is followed by its shape and strides, as integers of the same Python name)
_PARAMETER = re.compile(r'%\w+: (?P<type>\S+?)(?P<attrs> \{[^}]*\})? loc\("(?P<name>\w+)"')
NAME_LIMIT = 150   # Triton names a cache entry's files after the kernel's first 150 characters


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
    kernel: object = None                           # no Python function: the source is read from `source`

    @property
    def where(self) -> tuple[str, int]:
        return self.source if self.source is not None else ("?", 0)

    def unaligned(self) -> list[str]:
        """As kernels.Launch.unaligned, from the specialization the TTIR records (values are not kept)."""
        return unaligned_text([n for n, ok in self.divisible.items() if not ok and n not in self.pointers],
                              [n for n, ok in self.divisible.items() if not ok and n in self.pointers])


@dataclass
class Launches:
    """A kernel's launches in the trace."""
    name: str
    count: int
    total_us: float
    grids: list                       # the distinct grids, most launched first
    threads: int | None               # a block's, where every launch had the same
    registers: int | None             # a thread's, as CUPTI recorded them, where every launch had the same
    sms: int | None = None            # the GPU's, where the trace records its properties
    arch: str | None = None           # "sm_90": the GPU's, where the trace records it
    configurations: collections.Counter = field(default_factory=collections.Counter)
    # (threads, registers, shared bytes, grid) -> launches: what tells the binaries that ran apart

    def grids_of(self, threads: int, registers: int | None) -> list:
        """The grids of the launches with this block and these registers, most launched first."""
        counts: collections.Counter = collections.Counter()
        for (t, r, _shared, grid), n in self.configurations.items():
            if t in (None, threads) and (r is None or registers is None or r == registers):
                counts[grid] += n
        return [g for g, _ in counts.most_common()]


def cache_folders() -> list[Path]:
    """Where the program's Triton kernels were cached: Triton's cache (TRITON_CACHE_DIR, else under TRITON_HOME or
    ~/.triton), and Inductor's Triton caches (torch.compile's kernels: under TORCHINDUCTOR_CACHE_DIR, else its
    default), where they exist."""
    folders = []
    try:
        import triton

        folders.append(Path(triton.knobs.cache.dir))
    except (ImportError, AttributeError):
        folders.append(Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache"))
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir()
        folders += sorted((Path(inductor) / "triton").glob("*"))
    except ImportError:
        pass
    return [f for f in folders if f.is_dir()]


def launches_in(trace_path: str | Path, name: str) -> Launches:
    """The launches of the kernel `name` (its function's name, or the whole name the trace gives) in the trace."""
    recorded = trace_file.load(trace_path)
    kernels = recorded.kernels
    mine = [k for k in kernels if k.name == name or k.name.split("(")[0].split("<")[0].strip() == name]
    if not mine:
        time: collections.Counter = collections.Counter()
        for k in kernels:
            time[k.name] += k.dur
        names = [n for n, _ in time.most_common()]
        near = [n for n in names if name.lower() in n.lower()][:5] or names[:5]
        raise ValueError(f"the trace has no kernel named {name!r}; "
                         + (f"the nearest: {', '.join(near)}" if near else "it holds no kernels"))
    configurations: collections.Counter = collections.Counter(
        (k.block[0] * k.block[1] * k.block[2] if k.block else None, k.registers, k.shared_bytes, k.grid) for k in mine)
    grids: collections.Counter = collections.Counter(k.grid for k in mine)
    threads = {c[0] for c in configurations if c[0] is not None}
    registers = {c[1] for c in configurations if c[1] is not None}
    devices = {d.get("id"): d for d in recorded.meta.get("deviceProperties") or [] if isinstance(d, dict)}
    device = devices.get(mine[0].device) or {}
    sms, major, minor = device.get("numSms"), device.get("computeMajor"), device.get("computeMinor")
    return Launches(name, len(mine), sum(k.dur for k in mine), [g for g, _ in grids.most_common()],
                    threads.pop() if len(threads) == 1 else None, registers.pop() if len(registers) == 1 else None,
                    sms if isinstance(sms, int) else None,
                    f"sm_{major}{minor}" if isinstance(major, int) and isinstance(minor, int) else None,
                    configurations)


def compilations(name: str, folders: list[Path]) -> list[dict]:
    """Every compilation of the kernel `name` in the cache folders, as kernels.compiled gives a kernel (its asm and
    metadata, "here": False: the binary the program ran), with its "source" text and its folder."""
    found = []
    stem = name[:NAME_LIMIT]
    for folder in folders:
        for meta_path in folder.glob(f"*/{stem}.json"):
            entry = meta_path.parent
            cubin = entry / f"{stem}.cubin"
            if not cubin.exists():
                continue   # a compilation for another backend, or one Triton did not finish
            meta = json.loads(meta_path.read_text())
            if meta.get("name") != name:
                continue   # another kernel whose name starts with the same 150 characters
            target = meta.get("target") or {}
            asm = {kind: (entry / f"{stem}.{kind}").read_text() for kind in ("ttir", "ttgir", "llir", "ptx")
                   if (entry / f"{stem}.{kind}").exists()}
            asm["cubin"] = cubin.read_bytes()
            source = entry / f"{stem}.source"
            found.append({"asm": asm, "here": False, "folder": str(entry),
                          "source": source.read_text() if source.exists() else asm.get("ttir", ""),
                          "metadata": {"name": meta["name"], "num_warps": meta["num_warps"],
                                       "num_stages": meta["num_stages"], "shared": meta["shared"],
                                       "num_ctas": meta.get("num_ctas", 1), "arch": f"sm_{target.get('arch')}"},
                          "mtime": meta_path.stat().st_mtime})
    return sorted(found, key=lambda c: -c["mtime"])


def launch_of(compilation: dict, seen: Launches, registers: int | None = None) -> CachedLaunch:
    """The launch as inspect reads it: the most frequent grid of the trace's launches of this compilation (its
    block and registers), the def and the specialization the compilation's source records."""
    text = compilation["source"]
    found = _DEF.search(text)
    grids = seen.grids_of(compilation["metadata"]["num_warps"] * 32, registers) or seen.grids
    launch = CachedLaunch(seen.name, grids[0] if grids else None,
                          (found["file"], int(found["line"])) if found else None)
    signature = re.search(rf"tt\.func \w* ?@{re.escape(compilation['metadata']['name'])}\((.*?)\) (?:attributes|\{{)",
                          text)
    for p in _PARAMETER.finditer(signature[1] if signature else ""):
        if p["name"] in launch.parameters:
            continue   # a tensor descriptor's shape and strides
        launch.parameters.append(p["name"])
        kind = p["type"]
        if kind.startswith("!tt.ptr") or (kind.startswith("i") and kind != "i1"):   # not a bool, a descriptor
            launch.divisible[p["name"]] = "tt.divisibility = 16" in (p["attrs"] or "")
        if kind.startswith("!tt.ptr"):
            launch.pointers.add(p["name"])
    return launch


def matching(compiled: list[dict], seen: Launches, resources_of) -> list[dict]:
    """The compilations for the trace's GPU (where it records which) that agree with one of the trace's launches
    in block, registers and shared memory, each as far as the trace records it. resources_of(compilation): its
    sass.Resources, read from its cubin."""
    kept = []
    for c in compiled:
        meta, used = c["metadata"], resources_of(c)
        if seen.arch is not None and meta["arch"] != seen.arch:
            continue
        threads, registers = meta["num_warps"] * 32, None if used is None else used.registers
        shared = {meta["shared"], meta["shared"] + (0 if used is None else used.static_shared_bytes)}
        if any(t in (None, threads) and (r is None or r == registers) and (b is None or b in shared)
               for t, r, b, _grid in seen.configurations):
            kept.append(c)
    return kept


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

    used = {id(c): sass.resources(c["asm"]["cubin"]).get(c["metadata"]["name"]) for c in compiled}   # cuobjdump, once

    def resources_of(c: dict):
        return used[id(c)]

    ran = matching(compiled, seen, resources_of)
    if not ran:
        raise ValueError(f"{len(compiled)} compilation(s) of {name} in the caches, none for the trace's launches "
                         f"(GPU {seen.arch or '?'}, {seen.threads or 'several'} threads a block, "
                         f"{seen.registers or 'several'} registers a thread): the binary that ran is not there "
                         "(another cache, or since overwritten)")
    return seen, [analyze(launch_of(c, seen, getattr(resources_of(c), "registers", None)), c, sms or seen.sms)
                  for c in ran]
