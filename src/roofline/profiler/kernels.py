"""The kernel and memory-operation tables, as Nsight Systems' summaries show them.

Kernel names come demangled from CUPTI, often hundreds of characters of templates;
`short_name` keeps the function and the one template argument that says what it computes
(`vectorized_elementwise_kernel<bfloat16_copy_kernel_cuda>`). `category` sorts kernels
into the families a performance engineer reasons about.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from roofline.profiler.trace import Trace

CATEGORIES = ("gemm", "attention", "elementwise", "reduction", "normalization", "softmax", "copy",
              "memset", "communication", "triton", "other")

# First match wins; checked against the lower-cased full kernel name.
_CATEGORY_PATTERNS = [
    ("communication", r"nccl|allreduce|all_reduce|allgather|reducescatter"),
    ("attention", r"flash|fmha|attention|sdpa|_attn|mha_"),
    ("softmax", r"softmax"),
    ("normalization", r"layer_?norm|rms_?norm|batch_?norm|group_?norm|instance_?norm|gammabeta|welford"),
    ("gemm", r"gemm|nvjet|cutlass|xmma|cublas|matmul|\bmm_|_mm\b|wgmma|hmma|sm\d\d_xmma|dot_kernel|splitk"),
    ("triton", r"^triton_|^triton\b"),
    ("reduction", r"reduce|reduction|_sum_|argmax|argmin|cumsum|scan|norm_kernel"),
    ("copy", r"copy|cat_?array|transpose|permute|gather|scatter|index_|embedding"),
    ("memset", r"memset"),   # torch's fills, masked_fill among them, are elementwise kernels
    ("elementwise", r"elementwise|pointwise|unrolled|vectorized|multi_tensor_apply|foreach|fill"),
]
_COMPILED = [(name, re.compile(pattern)) for name, pattern in _CATEGORY_PATTERNS]


def category(name: str, kind: str = "kernel") -> str:
    """One of CATEGORIES for a kernel (memcpy and memset events are "copy" and "memset")."""
    if kind == "memcpy":
        return "copy"
    if kind == "memset":
        return "memset"
    lowered = name.lower()
    for cat, pattern in _COMPILED:
        if pattern.search(lowered):
            return cat
    return "other"


_FUNCTOR = re.compile(r"([A-Za-z_]\w*(?:_kernel_cuda|Functor|_functor|KernelImpl|_impl|Impl|Ops|Op|_op|_kernel)\b)")
# Wrappers that appear in many kernels' template arguments and say nothing about what is computed.
_GENERIC_KERNELS = {"Kernel", "Kernel2", "kernel", "device_kernel", "GemmKernel"}
_GENERIC = {"gpu_kernel_impl_nocast", "gpu_kernel_impl", "ReduceOp", "func_wrapper_t", "launch_vectorized_kernel",
            "launch_legacy_kernel", "elementwise_kernel", "vectorized_elementwise_kernel"}


def _skip_balanced(text: str, i: int, open_: str, close: str) -> int:
    depth = 0
    while i < len(text):
        c = text[i]
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return i


def _split_function(name: str) -> tuple[str, str]:
    """(the function's own name, the text from its template arguments or argument list on) of a demangled name."""
    text = name.strip()
    if text.startswith("void "):
        text = text[5:]
    # The function's qualified name runs to the first '<' or '(' outside of '(anonymous namespace)'.
    head, i = [], 0
    while i < len(text):
        if text.startswith("(anonymous namespace)", i):
            i += len("(anonymous namespace)")
            continue
        if text[i] in "<(":
            break
        head.append(text[i])
        i += 1
    return "".join(head).rsplit("::", 1)[-1].strip(), text[i:]


def function_name(name: str) -> str:
    """The kernel's function name alone: no return type, namespaces, template arguments or argument list (what
    Nsight Compute matches with --kernel-name-base function). Launches of one template share it."""
    return _split_function(name)[0] or name.strip()


def short_name(name: str, limit: int = 90) -> str:
    """A readable kernel name: no return type, namespaces or argument list; the telling template argument kept."""
    base, text = _split_function(name)
    base = base or name.strip()[:limit]
    i = 0
    detail = ""
    if i < len(text) and text[i] == "<":
        end = _skip_balanced(text, i, "<", ">")
        found = [m for m in _FUNCTOR.findall(text[i:end]) if m != base and m not in _GENERIC]
        if not found and base in _GENERIC_KERNELS:   # cutlass::Kernel2<cutlass_80_simt_sgemm_...>: the argument is the kernel
            found = re.findall(r"[A-Za-z_]\w{3,}", text[i:end])[:1]
        if found:
            detail = f"<{found[0]}>"
    short = base + detail
    return short if len(short) <= limit else short[: limit - 1] + "…"


@dataclass
class KernelRow:
    name: str                     # short name
    full_name: str
    category: str
    count: int = 0
    total_us: float = 0.0
    min_us: float = float("inf")
    max_us: float = 0.0
    share: float = 0.0            # of all GPU time

    @property
    def avg_us(self) -> float:
        return self.total_us / self.count if self.count else 0.0


def kernel_table(trace: Trace) -> list[KernelRow]:
    """Kernels grouped by full name, by total time. Shares are of all GPU time (kernels, copies and memsets)."""
    rows: dict[str, KernelRow] = {}
    total = 0.0
    for g in trace.gpu:
        total += g.dur
        if g.kind != "kernel":
            continue
        row = rows.get(g.name)
        if row is None:
            row = rows[g.name] = KernelRow(short_name(g.name), g.name, category(g.name))
        row.count += 1
        row.total_us += g.dur
        row.min_us = min(row.min_us, g.dur)
        row.max_us = max(row.max_us, g.dur)
    for row in rows.values():
        row.share = row.total_us / total if total else 0.0
    return sorted(rows.values(), key=lambda r: -r.total_us)


def category_table(rows: list[KernelRow], memory: list["MemoryRow"]) -> dict[str, float]:
    """GPU time (us) per category, kernels and memory operations together."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    for r in rows:
        out[r.category] += r.total_us
    for m in memory:
        out["memset" if m.kind == "memset" else "copy"] += m.total_us
    return {k: v for k, v in out.items() if v > 0}


_MEMCPY = re.compile(r"Memcpy (\w+) \((\w+) -> (\w+)\)")


@dataclass
class MemoryRow:
    kind: str                     # "HtoD" | "DtoH" | "DtoD" | "HtoH" | "PtoP" | "memset"
    source: str                   # "Pageable" | "Pinned" | "Device" | ...
    destination: str
    count: int = 0
    bytes: int = 0
    total_us: float = 0.0

    @property
    def gbps(self) -> float | None:
        return self.bytes / self.total_us / 1e3 if self.total_us > 0 else None

    @property
    def pageable(self) -> bool:
        return "Pageable" in (self.source, self.destination)


def memory_table(trace: Trace) -> list[MemoryRow]:
    """Copies and memsets grouped by direction and memory kind, by total time."""
    rows: dict[tuple, MemoryRow] = {}
    for g in trace.gpu:
        if g.kind == "kernel":
            continue
        if g.kind == "memset":
            key = ("memset", "", "Device")
        else:
            m = _MEMCPY.match(g.name)
            key = (m[1], m[2], m[3]) if m else (g.name, "", "")
        row = rows.get(key)
        if row is None:
            row = rows[key] = MemoryRow(*key)
        row.count += 1
        row.bytes += g.bytes or 0
        row.total_us += g.dur
    return sorted(rows.values(), key=lambda r: -r.total_us)
