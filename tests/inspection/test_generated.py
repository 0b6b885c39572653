"""The kernels torch.compile generates for a function, each with the user's lines it fused, its time and its code:
on this machine Inductor writes C++ kernels and leaves matmuls to a library, which is what these tests read."""

import ast
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from roofline.inspect import generated
from roofline.inspect.generated import Line

ROOT = Path(__file__).resolve().parents[2]
BLOCK = ("Block", "CausalSelfAttention", "MLP")   # examples/models/gpt2.py's classes in a block
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU Inductor writes Triton kernels: "
                              "tests/inspection/test_inspect_gpu.py")


def _line(text: str, lines: list[str]) -> int:
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_the_wrapper_s_kernels_are_read_as_inductor_writes_them(tmp_path):
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(
        "async_compile = AsyncCompile()\n"
        "triton_poi_fused_add_0 = async_compile.triton('triton_poi_fused_add_0', '''\n"
        "@triton.jit\ndef triton_poi_fused_add_0(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):\n    pass\n"
        "''', device_str='cuda')\n"
        "cpp_fused_sum_1 = async_compile.cpp_pybinding(['const float*', 'float*'], r'''\n"
        "extern \"C\" void kernel(const float* in_ptr0, float* out_ptr0) {}\n''')\n"
        "other = something.else_('not a kernel')\n")
    sources = generated._sources(str(wrapper))
    assert set(sources) == {"triton_poi_fused_add_0", "cpp_fused_sum_1"}
    kind, code = sources["triton_poi_fused_add_0"]
    assert kind == "triton" and code.startswith("@triton.jit") and code.endswith("pass")
    assert sources["cpp_fused_sum_1"] == ("cpp", 'extern "C" void kernel(const float* in_ptr0, float* out_ptr0) {}')


def test_a_kernel_is_charged_to_the_user_s_innermost_line_not_to_torch_s():
    torch_file = str(Path(torch.__file__).parent / "nn/modules/linear.py")
    trace = (f'  File "/home/me/model.py", line 12, in forward\n    y = self.proj(x)\n    ^^^^\n'
             f'  File "{torch_file}", line 134, in forward\n    return F.linear(input, self.weight, self.bias)\n')
    only_torch = f'  File "{torch_file}", line 134, in forward\n    return F.linear(input, self.weight, self.bias)\n'
    assert generated._user_lines([trace, trace]) == [Line("/home/me/model.py", 12, "y = self.proj(x)")]
    assert generated._user_lines([only_torch]) == [Line(torch_file, 134, "return F.linear(input, self.weight, "
                                                                         "self.bias)")]
    assert generated._aten_name("extern_kernels.addmm") == "aten::addmm"
    assert generated._aten_name("torch.ops.aten.sort.stable") == "aten::sort"


def test_a_kernel_the_graph_calls_at_two_places_is_timed_at_each_and_a_loop_s_launches_at_its_last():
    """Inductor's backward of a GPT-2 block calls one reduction kernel at two places (found on an H100): each
    place its own entry, timed by its own launch, not both launches charged to the second."""
    from types import SimpleNamespace

    def launching(*kernels):   # a profiler event under the graph's range, with the GPU kernels it launched
        return SimpleNamespace(name="cuLaunchKernel", cpu_children=[], kernels=[
            SimpleNamespace(name=name, duration=us) for name, us in kernels])

    def kernel(name, line):
        return generated.GeneratedKernel(name, 1, "triton", [Line("model.py", line, "")], "code")

    found = [kernel("triton_per_fused_sum_2", 10), kernel("triton_poi_fused_add_0", 11),
             kernel("triton_per_fused_sum_2", 12), kernel("triton_poi_loop_1", 13)]
    graph_call = SimpleNamespace(name="roofline::graph 1", kernels=[], cpu_children=[
        launching(("triton_per_fused_sum_2", 5.0)), launching(("triton_poi_fused_add_0", 1.0)),
        launching(("triton_per_fused_sum_2", 7.0)),
        launching(("triton_poi_loop_1", 2.0), ("triton_poi_loop_1", 3.0))])
    times = {i: [] for i in range(len(found))}
    generated._one_call(found, 1, graph_call, times)
    assert times == {0: [5.0], 1: [1.0], 2: [7.0], 3: [2.0, 3.0]}


@cpu_only
@pytest.mark.long   # a process of its own that compiles a GPT-2 block: run first (conftest)
def test_a_compiled_gpt2_block_names_every_kernel_with_the_lines_it_fused_its_time_and_its_code(tmp_path):
    done = subprocess.run([sys.executable, "-m", "roofline", "inspect", "examples/inspect_kernels.py:gpt2_block",
                           "--runs", "1", "--json", str(tmp_path / "block.json"), "--out", str(tmp_path / "code"),
                           "--html", str(tmp_path / "block.html")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr[-3000:]
    made = json.loads((tmp_path / "block.json").read_text())["generated"]
    gpt2 = (ROOT / "examples/models/gpt2.py").read_text()
    at = functools.partial(_line, lines=gpt2.splitlines())
    qkv, sdpa, out = at("q, k, v = self.c_attn(x)"), at("F.scaled_dot_product_attention(q, k, v, is_causal"), \
        at("return self.c_proj(y.transpose")
    mlp, residual = at("return self.c_proj(self.gelu(self.c_fc(x)))"), at("x = x + self.attn(self.ln_1(x)")
    forward, backward = ([k for k in made if k["graph"] == g] for g in (0, 1))
    assert forward and backward and {k["graph"] for k in made} == {0, 1}
    lines = {id(k): [x["line"] for x in k["lines"]] for k in made}
    # each layer's matmul is charged to the line that called the layer, not to torch's linear.py
    assert [lines[id(k)] for k in forward if k["name"] == "extern_kernels.addmm"] == [[qkv], [out], [mlp], [mlp]]
    assert [lines[id(k)] for k in forward if "gelu" in k["name"]] == [[mlp]]
    assert [lines[id(k)] for k in forward if k["name"] == "cpp_fused_native_layer_norm_0"] == [[residual]]
    assert any(sdpa in lines[id(k)] for k in forward if "scaled_dot_product" in k["name"])
    # a backward kernel is charged to the forward lines whose gradients it computes
    assert any("gelu_backward" in k["name"] and mlp in lines[id(k)] for k in backward)
    forwards = {n for c in ast.parse(gpt2).body if isinstance(c, ast.ClassDef) and c.name in BLOCK
                for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "forward"
                for n in range(f.body[0].lineno, f.end_lineno + 1)}   # the lines of the block's forwards
    for k in made:
        assert k["calls"] == 1 and k["ms"] is not None and k["ms"] > 0 and k["lines"], k["name"]
        assert all(x["file"].endswith("examples/models/gpt2.py") and x["line"] in forwards for x in k["lines"])
        assert (k["code"] is None) == (k["kind"] == "library")
        assert k["kind"] != "cpp" or ('extern "C"' in k["code"] and "kernel(" in k["code"])
    written = sorted(p.name for p in (tmp_path / "code").iterdir())
    assert written == sorted(f"{k['name']}.cpp" for k in made if k["kind"] == "cpp")
    assert max(len(line) for line in done.stdout.splitlines()) <= 80
    assert "torch.compile generated" in done.stdout and "gpt2.py:" in done.stdout
    page = (tmp_path / "block.html").read_text()
    rows = page[page.index('id="generated"'):]
    rows = rows[:rows.index("</table>")]
    assert rows.count("<tr") == 1 + len(made)   # every kernel a row, then a card with its lines and code
    assert page.count("<div class='card'>") == len(made) and page.count("its code (") == len(written)
    assert "y = F.scaled_dot_product_attention(q, k, v, is_causal=True)" in page


@cpu_only
def test_each_graph_lists_its_own_kernels_when_several_compile_in_one_call():
    """Two compiled functions, each a forward and a backward: four graphs, each with its own kernel and lines
    (Inductor notes kernels in a table that its later compiles may share with earlier ones)."""
    import torch.nn.functional as F

    first = torch.compile(lambda x: F.gelu(x).sin().sum())       # planted: first
    second = torch.compile(lambda x: (x.cos() * 3).tanh().sum())  # planted: second
    x = torch.randn(16, 16, requires_grad=True)
    made = generated.generated(lambda: (first(x).backward(), second(x).backward()), runs=1)
    here = Path(__file__).read_text().splitlines()
    lines = [_line("# planted: first", here), _line("# planted: second", here)]
    assert [k.graph for k in made] == [0, 1, 2, 3] and all(k.kind == "cpp" and k.ms for k in made)
    assert [[x.line for x in k.lines] for k in made] == [[lines[0]]] * 2 + [[lines[1]]] * 2
    assert "gelu" in made[0].name and "gelu_backward" in made[1].name and "tanh_backward" in made[3].name


def test_without_inductor_s_provenance_the_wrapper_s_kernels_are_listed_without_lines(tmp_path):
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text("cpp_fused_sum_0 = async_compile.cpp_pybinding(['float*'], r'''\nvoid kernel() {}\n''')\n"
                       "cpp_fused_add_1 = async_compile.cpp_pybinding(['float*'], r'''\nvoid kernel() {}\n''')\n")
    graph = generated._Graph(0, str(wrapper), object(), {})
    assert [(k.name, k.kind, k.lines) for k in generated.kernels_of([graph])] == [
        ("cpp_fused_sum_0", "cpp", []), ("cpp_fused_add_1", "cpp", [])]


def test_a_kernel_compiled_in_inductor_s_workers_is_named_and_found_in_its_module(tmp_path):
    """Inductor compiles Triton kernels in worker processes; its launcher comes back with a JITFunction whose
    Python function is gone (fn=None). Its binary is kept, named, and placed at its def in Inductor's module."""
    from types import SimpleNamespace

    module = tmp_path / "cabc.py"
    module.write_text("import triton\n\n@triton.jit\ndef triton_poi_fused_add_0(in_ptr0, out_ptr0, xnumel, XBLOCK):\n"
                      "    pass\n")
    binary = object()
    launcher = SimpleNamespace(fn=SimpleNamespace(fn=None), bin=binary,
                               config=SimpleNamespace(kwargs={"XBLOCK": 128}, num_warps=4, num_stages=1))
    kernel = generated.GeneratedKernel("triton_poi_fused_add_0", 0, "triton", [], module.read_text())
    generated._keep_binary(kernel, SimpleNamespace(launchers=[launcher], filename=str(module)))
    launch = kernel.launch
    assert launch.name == "triton_poi_fused_add_0" and launch.where == (str(module), 4)
    assert launch.compiled is binary and launch.kwargs == {"XBLOCK": 128, "num_warps": 4, "num_stages": 1}
    from roofline.inspect.report import _kernel_source

    assert _kernel_source(launch) == (["def triton_poi_fused_add_0(in_ptr0, out_ptr0, xnumel, XBLOCK):", "    pass"],
                                      4)
    # where Inductor's module cannot be read, the kernel is still named, at no line
    generated._keep_binary(kernel, SimpleNamespace(launchers=[launcher], filename=str(tmp_path / "gone.py")))
    assert kernel.launch.source is None and kernel.launch.name == "triton_poi_fused_add_0"
    assert kernel.launch.where == ("?", 0) and _kernel_source(kernel.launch) == ([], 0)
