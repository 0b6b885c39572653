"""On a GPU: every op's replayed forward and backward (entry points and plans replayed from C++, the C++ autograd
node's recorded backward) give exactly what its Python path gives on the same inputs. The Python path runs in a
process of its own with ROOFLINE_FORWARD_REPLAY=0 and ROOFLINE_EAGER_NODE=0, so that nothing of the replay
machinery is loaded there."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_launch import CALLS

from roofline.ops import _eager_node

pytestmark = pytest.mark.gpu

PYTHON_PATH = '''
import sys, torch
from test_launch import CALLS
cases = torch.load(sys.argv[1])
results = {}
for name, (args, cotangents) in cases.items():
    args = [a.clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]
    out = CALLS[name][1](*args)
    out = out if isinstance(out, tuple) else (out,)
    wrt = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    results[name] = ([o.detach() for o in out], list(torch.autograd.grad(out, wrt, cotangents)))
torch.save(results, sys.argv[2])
'''


def _inputs(name):
    torch.manual_seed(sorted(CALLS).index(name))
    args = CALLS[name][0](True)
    out = CALLS[name][1](*args)
    out = out if isinstance(out, tuple) else (out,)
    return [a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args], \
        [torch.randn_like(o) for o in out]


@pytest.fixture(scope="module")
def python_path(tmp_path_factory):
    """Each op's outputs and gradients through its Python path, on the inputs _inputs makes."""
    folder = tmp_path_factory.mktemp("replay")
    cases = {name: _inputs(name) for name in CALLS}
    torch.save(cases, folder / "cases.pt")
    env = {**os.environ, "ROOFLINE_FORWARD_REPLAY": "0", "ROOFLINE_EAGER_NODE": "0",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", PYTHON_PATH, str(folder / "cases.pt"), str(folder / "out.pt")],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return cases, torch.load(folder / "out.pt")


@pytest.mark.parametrize("name", sorted(CALLS))
def test_replayed_forward_and_backward_equal_the_python_path(name, python_path):
    cases, expected = python_path
    args, cotangents = cases[name]
    for _ in range(3):   # compiled and recorded, then replayed
        leaves = [a.clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]
        out = CALLS[name][1](*leaves)
        out = out if isinstance(out, tuple) else (out,)
        wrt = [a for a in leaves if isinstance(a, torch.Tensor) and a.requires_grad]
        grads = torch.autograd.grad(out, wrt, cotangents)
    assert f"roofline::{name}" not in _eager_node.refusals, _eager_node.refusals.get(f"roofline::{name}")
    want_out, want_grads = expected[name]
    for got, want in zip([*out, *grads], [*want_out, *want_grads]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
