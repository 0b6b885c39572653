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
