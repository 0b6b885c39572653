"""`roofline inspect OP --shape ...`: an op of roofline.ops looked inside at a shape, its backward's kernels too,
with no file of the user's; a shape, dtype or name it cannot take is named before anything runs."""

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the launches compile there"),
              pytest.mark.long]   # a process of its own that compiles: run first (conftest)


def test_an_op_and_its_backward_at_a_shape(tmp_path):
    out = tmp_path / "rms_norm.json"
    done = subprocess.run([sys.executable, "-m", "roofline", "inspect", "rms_norm", "--shape", "16x64", "--backward",
                           "--json", str(out), "--html", str(tmp_path / "page.html")], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr[-3000:]
    kernels = {k["name"]: k for k in json.loads(out.read_text())["kernels"]}
    # the forward's kernel, and the backward's two (the rows' gradient, then the weight's summed over the rows)
    assert set(kernels) == {"norm_forward_kernel", "norm_backward_kernel", "norm_parameter_grads_kernel"}
    assert all(k["registers"] > 0 and k["lines"] and k["source"]["file"].endswith("norm.py")
               for k in kernels.values())
    assert "roofline inspect rms_norm --shape 16x64 --dtype bf16 --backward" in (tmp_path / "page.html").read_text()


def test_what_an_op_cannot_take_is_named():
    from typer.testing import CliRunner

    from roofline.cli import app

    def run(*argv):
        done = CliRunner().invoke(app, ["inspect", *argv], env={"COLUMNS": "80"})
        return done.exit_code, " ".join(done.output.split())

    code, said = run("rmsnorm", "--shape", "4x4")
    assert code == 2 and "neither FILE_OR_MODULE:FUNCTION nor an op of roofline.ops" in said and "rms_norm" in said
    code, said = run("flash_attention")
    assert code == 2 and "--shape" in said and "batch x heads x seq x head_dim" in said
    code, said = run("flash_attention", "--shape", "1x2x64")
    assert code == 2 and "--shape" in said and "4 sizes" in said
    code, said = run("rms_norm", "--shape", "16xa")
    assert code == 2 and "--shape" in said and "positive sizes joined by x" in said
    code, said = run("rms_norm", "--shape", "16x64", "--dtype", "int8")
    assert code == 2 and "--dtype" in said and "bf16, fp16, fp32" in said
    code, said = run("examples/inspect_kernels.py:matmuls", "--shape", "4x4")
    assert code == 2 and "for an op of roofline.ops" in said


def test_a_shape_the_op_itself_refuses_is_named_as_the_shape():
    from typer.testing import CliRunner

    from roofline.cli import app

    done = CliRunner().invoke(app, ["inspect", "rope", "--shape", "1x5x33"], env={"COLUMNS": "80"})
    said = " ".join(done.output.split())
    assert done.exit_code == 2 and "--shape" in said and "'1x5x33'" in said and "even" in said, said
    done = CliRunner().invoke(app, ["inspect", "examples/inspect_kernels.py:matmuls", "--dtype", "fp16"],
                              env={"COLUMNS": "80"})
    assert done.exit_code == 2 and "for an op of roofline.ops" in " ".join(done.output.split())


def test_example_arguments_read_as_a_kernel_takes_them():
    from roofline.inspect.example_launch import parse_args, parse_grid

    positional, named = parse_args("bf16[128x64] i32[7] 128 0.5 true tf32 BLOCK=64 num_warps=4 scale=1e-3")
    assert positional == [(torch.bfloat16, (128, 64)), (torch.int32, (7,)), 128, 0.5, True, "tf32"]
    assert named == {"BLOCK": 64, "num_warps": 4, "scale": 1e-3}
    assert parse_grid("4x2") == (4, 2) and parse_grid("7") == (7,)
    for bad, said in (("", "no argument"), ("fp8[4]", "dtype is one of"), ("fp32[4x]", "a tensor is DTYPE"),
                      ("A=1 A=2", "given twice"), ("1-x=2", "NAME=VALUE"), ("A=1 2", "positional ones come first")):
        with pytest.raises(ValueError, match=said):
            parse_args(bad)
    for bad in ("", "0", "1x2x3x4", "2xa"):
        with pytest.raises(ValueError, match="positive sizes"):
            parse_grid(bad)
