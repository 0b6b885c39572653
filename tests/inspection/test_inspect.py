"""`roofline inspect` end to end on a machine without a GPU: the launches run through Triton's interpreter, and
each kernel is compiled here for the H100 (sm_90) by Triton's own toolchain, as its JIT would compile it there."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from roofline.inspect import sass
from roofline.inspect.report import inspect_function

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from examples import inspect_kernels  # noqa: E402

# the path of a machine without a GPU (launches interpreted, kernels compiled here); test_inspect_gpu.py has the GPU's
pytestmark = [pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the launches compile there: "
                                 "tests/inspection/test_inspect_gpu.py"),
              pytest.mark.long]   # processes of their own that compile: run first (conftest)


@pytest.fixture(scope="module")
def matmuls(tmp_path_factory):
    folder = tmp_path_factory.mktemp("inspect")
    done = subprocess.run([sys.executable, "-m", "roofline", "inspect", "examples/inspect_kernels.py:matmuls",
                           "--arch", "sm_90", "--sms", "132", "--json", str(folder / "kernels.json"),
                           "--out", str(folder / "code"), "--html", str(folder / "kernels.html")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "80"})
    return done, folder


def test_the_same_matmul_three_ways_on_and_off_the_tensor_cores(matmuls):
    done, folder = matmuls
    assert done.returncode == 0, done.stderr[-3000:]
    kernels = json.loads((folder / "kernels.json").read_text())["kernels"]
    assert [k["constexprs"]["PRECISION"] for k in kernels] == ["'tf32'"] * 2 + ["'ieee'"]
    bf16, tf32, ieee = kernels
    assert all(k["name"] == "matmul_kernel" and k["arch"] == "sm_90" and k["grid"] == [2, 2, 1] for k in kernels)
    assert bf16["mix"]["counts"]["tensor core"] > 0 and tf32["mix"]["counts"]["tensor core"] > 0
    assert "tensor core" not in ieee["mix"]["counts"]
    (finding,) = [f for f in ieee["findings"] if f["id"] == "no-tensor-cores"]
    line = next(i for i, text in enumerate((ROOT / "examples/inspect_kernels.py").read_text().splitlines(), 1)
                if "tl.dot(" in text)
    assert finding["where"] == f"examples/inspect_kernels.py:{line}"
    assert not [f for f in bf16["findings"] if f["id"] == "no-tensor-cores"]
    # 4 blocks for 132 SMs, said of each
    assert all(any(f["id"] == "small-grid" for f in k["findings"]) for k in kernels)
    said = " ".join(done.stdout.split())
    assert "3 kernels, compiled for sm_90 here" in said and "tl.dot runs on the CUDA cores" in said
    assert "could not be compiled" not in said
    assert max(len(line) for line in done.stdout.splitlines()) <= 80 and "…" not in done.stdout   # nothing cut


def test_a_matmul_by_outer_products_is_told_to_take_tl_dot(tmp_path):
    done = subprocess.run([sys.executable, "-m", "roofline", "inspect", "examples/inspect_kernels.py:outer_products",
                           "--arch", "sm_90", "--sms", "132", "--json", str(tmp_path / "k.json")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr[-3000:]
    (kernel,) = json.loads((tmp_path / "k.json").read_text())["kernels"]
    assert "tensor core" not in kernel["mix"]["counts"]
    (finding,) = [f for f in kernel["findings"] if f["id"] == "outer-products"]
    line = next(i for i, text in enumerate((ROOT / "examples/inspect_kernels.py").read_text().splitlines(), 1)
                if "acc += a[:, None] * b[None, :]" in text)
    assert finding["where"] == f"examples/inspect_kernels.py:{line}" and "32 x 32 outer product" in finding["title"]
    assert "tl.dot(a, b, acc)" in finding["message"]


def test_registers_agree_with_ptxas_and_the_code_is_written(matmuls):
    """The registers read from the cubin (cuobjdump) are those ptxas reports compiling the same PTX, and the
    occupancy follows from them."""
    done, folder = matmuls
    assert done.returncode == 0, done.stderr[-3000:]
    kernels = json.loads((folder / "kernels.json").read_text())["kernels"]
    written = sorted(p.name for p in (folder / "code").iterdir())
    assert {"matmul_kernel.ptx", "matmul_kernel.sass", "matmul_kernel.ttgir", "matmul_kernel-3.ptx"} <= set(written)
    for k, stem in zip(kernels, ("matmul_kernel", "matmul_kernel-2", "matmul_kernel-3")):
        said = subprocess.run([sass.tool("ptxas"), "--gpu-name", "sm_90a", "-v", str(folder / "code" / f"{stem}.ptx"),
                               "-o", os.devnull], capture_output=True, text=True, check=True).stderr
        assert int(re.search(r"Used (\d+) registers", said)[1]) == k["registers"], said
        assert k["occupancy"]["registers"] == k["registers"] and k["occupancy"]["blocks"] >= 1
    assert "HGMMA" in (folder / "code" / "matmul_kernel.sass").read_text()


def test_the_page_shows_each_kernel_s_source_beside_its_machine_code(matmuls):
    done, folder = matmuls
    assert done.returncode == 0, done.stderr[-3000:]
    page = (folder / "kernels.html").read_text()
    kernels = json.loads((folder / "kernels.json").read_text())["kernels"]
    source = (ROOT / "examples/inspect_kernels.py").read_text().splitlines()
    dot = next(i for i, text in enumerate(source, 1) if "tl.dot(" in text)
    assert all(k["source"]["file"].endswith("examples/inspect_kernels.py") for k in kernels)
    assert kernels[0]["source"]["lines"][dot - kernels[0]["source"]["first_line"]] == source[dot - 1]
    # each kernel's source table: every line of the kernel, the line of its tl.dot with its tensor-core count
    for i, k in enumerate(kernels):
        table = page[page.index(f'id="launched-{i}-source"'):]
        table = table[:table.index("</table>")]
        assert table.count("<tr") == 1 + len(k["source"]["lines"])
        row = re.search(rf"<tr[^>]*><td>{dot}</td><td class=\"code\">[^<]*tl\.dot\(.*?</tr>", table)[0]
        tc = sum(x["counts"].get("tensor core", 0) for x in k["lines"] if x["line"] == dot)
        assert f'data-v="{tc}"' in row
    assert page.count("<summary>SASS, each instruction under its source line</summary>") == 3
    assert "HGMMA" in page and "could not be compiled" not in page


@pytest.mark.browser
def test_chromium_renders_the_inspect_page_without_script_errors(matmuls):
    import browser

    done, folder = matmuls
    assert done.returncode == 0, done.stderr[-3000:]
    dom, log = browser.dom((folder / "kernels.html").as_uri() + "#selftest")
    body = re.search(r"<body[^>]*>", dom)[0]
    assert 'data-ready="1"' in body and "data-script-error" not in body, body
    assert "Uncaught" not in log
    tables = dom.count('<table class="sortable"')
    assert tables == 4 and f'data-selftest="{len(re.findall(r"<th[ >]", dom))} {tables}"' in body


@pytest.mark.parametrize("columns, narrow", [(1000, True), (1024, False)])
def test_rows_of_an_odd_length_load_an_element_at_a_time(columns, narrow):
    """The JIT specializes on integers divisible by 16: rows of 1,024 bf16 load 128 bits a thread, rows of 1,000
    16 (their starts are not provably aligned), and the finding names the argument."""
    reports = inspect_function(inspect_kernels.softmax_forward_and_backward, 8, columns, arch="sm_90").launched
    assert [r.name for r in reports] == ["softmax_forward_kernel", "softmax_backward_kernel"]
    for r in reports:
        found = {f.id: f for f in r.findings}
        assert r.compiled_here and r.resources.registers > 0 and r.sms is None
        assert ("narrow-loads" in found) == narrow
        if narrow:
            assert max(r.mix.load_bits) == 16 and f"n={columns}" in found["narrow-loads"].message
        else:
            assert max(r.mix.load_bits) == 128


def test_a_kernel_that_takes_tensor_descriptors_compiles_too():
    """linear's kernel reads its operands through TMA descriptors: passed to the compiling process as their dtype,
    alignment, shape, strides and block."""
    from roofline import ops

    def run():
        x, w = torch.randn(64, 128, dtype=torch.bfloat16), torch.randn(96, 128, dtype=torch.bfloat16)
        ops.linear(x, w, backend="triton")

    (report,) = inspect_function(run, arch="sm_90").launched
    assert report.name == "linear_kernel" and report.resources.registers > 0 and report.mix.total > 100
    # compiled as a GPU's launch takes it: the interpreter's bf16 dot in fp32 (UPCAST) undone, on the tensor cores
    assert report.constexprs["UPCAST"] is False and report.constexprs["PRECISION"] == "tf32"
    assert report.mix.counts.get("tensor core", 0) > 0


def test_attention_is_compiled_as_the_gpu_runs_it_on_wgmma_and_tma():
    """flash_attention's bf16 forward, launched through the interpreter (which multiplies bf16 in fp32), compiled
    for sm_90 as a GPU's launch: Hopper's warpgroup MMAs and copy-engine loads, no spills at the chosen tiles."""
    (chosen,) = inspect_function(_attention_forward, arch="sm_90").launched
    assert chosen.constexprs["UPCAST"] is False
    assert re.search(r"\bHGMMA\.64x64x16\.F32\.BF16\b", chosen.asm["sass"])
    assert re.search(r"\bUTMALDG\b", chosen.asm["sass"]) and chosen.resources.local_memory == 0


def _attention_forward():
    from roofline import ops

    q, k, v = (torch.randn(1, 1, 64, 128, dtype=torch.bfloat16) for _ in range(3))
    ops.flash_attention(q, k, v, backend="triton")


def test_a_function_that_launches_nothing_says_so(capsys):
    from rich.console import Console

    from roofline.inspect.report import render

    found = inspect_function(lambda: torch.ones(3) + 1, arch="sm_90")
    assert found.launched == [] and found.made == []
    render(found, Console(width=80))
    assert "launched no Triton kernel, and torch.compile generated none" in capsys.readouterr().out


def test_bad_input_is_named_before_anything_runs(monkeypatch):
    from typer.testing import CliRunner

    from roofline.cli import app

    monkeypatch.chdir(ROOT)

    def run(*argv):
        done = CliRunner().invoke(app, ["inspect", *argv], env={"COLUMNS": "80"})
        return done.exit_code, " ".join(done.output.split())

    code, said = run("examples/inspect_kernels.py:matmuls", "--arch", "volta")
    assert code == 2 and "--arch" in said and "sm_90" in said
    code, said = run("examples/inspect_kernels.py:matmuls", "--arch", "sm_61")
    assert code == 2 and "arch must be one of" in said
    code, said = run("examples/inspect_kernels.py:DEVICE")
    assert code == 2 and "must be a function" in said
    code, said = run("examples/no_such_file.py:f")
    assert code == 2 and "no such file" in said
    code, said = run("examples/inspect_kernels.py:gpt2_block", "--runs", "0")
    assert code == 2 and "--runs" in said
    code, said = run("examples/inspect_kernels.py:matmuls", "--ncu", "--arch", "sm_90")
    assert code == 2 and "--ncu" in said and "needs a CUDA GPU, and no --arch" in said
    # a kernel as TARGET: its example arguments and grid, each named where it is wrong
    kernel = "examples/inspect_kernels.py:matmul_kernel"
    code, said = run(kernel, "--grid", "2x2")
    assert code == 2 and "--args" in said and "needs --args" in said
    code, said = run(kernel, "--args", "fp32[64x64] xx[3]", "--grid", "2")
    assert code == 2 and "--args" in said and "'xx[3]'" in said and "bf16" in said
    code, said = run(kernel, "--args", "BLOCK=4 fp32[64]", "--grid", "2")
    assert code == 2 and "positional ones come first" in said
    code, said = run(kernel, "--args", "fp32[64x64]", "--grid", "0x2")
    assert code == 2 and "--grid" in said and "positive sizes" in said
    code, said = run("examples/inspect_kernels.py:matmuls", "--args", "1", "--grid", "1")
    assert code == 2 and "are for a Triton kernel" in said
    code, said = run(kernel, "--args", "fp32[64x64] fp32[64x64]", "--grid", "2x2", "--arch", "sm_90")
    assert code == 2 and "--args" in said and "missing 8 required positional arguments" in said


def test_a_kernel_launched_on_example_arguments(tmp_path):
    """FILE:KERNEL with --args and --grid: the kernel launched once on random tensors, looked inside as a
    function's launches are; the example arguments' constexprs are the ones compiled."""
    done = subprocess.run([sys.executable, "-m", "roofline", "inspect", "examples/inspect_kernels.py:matmul_kernel",
                           "--args", "fp32[64x64] fp32[64x64] fp32[64x64] 64 64 64 BLOCK_M=32 BLOCK_N=32 BLOCK_K=16 "
                           "PRECISION=ieee num_warps=2", "--grid", "2x2", "--arch", "sm_90", "--sms", "132",
                           "--json", str(tmp_path / "k.json")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr[-3000:]
    (k,) = json.loads((tmp_path / "k.json").read_text())["kernels"]
    assert k["name"] == "matmul_kernel" and k["grid"] == [2, 2, 1] and k["num_warps"] == 2
    assert k["constexprs"]["BLOCK_K"] == "16" and k["constexprs"]["PRECISION"] == "'ieee'"
    assert any(f["id"] == "no-tensor-cores" for f in k["findings"])


def test_only_roofline_s_own_kernels_are_compiled_with_the_gpu_s_constexprs():
    """as_on_a_gpu knows roofline's constexprs; a user's kernel keeps its own, whatever their names."""
    from roofline.inspect import kernels

    assert all(kernels._roofline_s_interpreted(launch)
               for launch in kernels.launches(inspect_kernels.softmax_forward_and_backward))
    assert not any(kernels._roofline_s_interpreted(launch)
                   for launch in kernels.launches(inspect_kernels.matmuls, 32))
