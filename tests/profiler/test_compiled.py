"""torch.compile's kernels in a profile, with the lines each fused: read from the kernels Inductor noted while the
program compiled (a synthetic trace), and end to end on a compiled program profiled on this machine's CPU."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from roofline.profiler.report import analyze

from .synth import TraceBuilder

NOTED = [{"name": "triton_poi_fused_add_gelu_0", "graph": 0, "kind": "triton",
          "lines": [["/work/model.py", 12, "h = F.gelu(h)"], ["/work/model.py", 11, "h = h + b"]]},
         {"name": "triton_poi_fused_add_gelu_0", "graph": 1, "kind": "triton",
          "lines": [["/work/model.py", 12, "h = F.gelu(h)"], ["/work/model.py", 20, "y = h * 2"]]},
         {"name": "cpp_fused_sum_1", "graph": 0, "kind": "cpp", "lines": [["/work/model.py", 30, "s = y.sum()"]]},
         {"name": "extern_kernels.mm", "graph": 0, "kind": "library", "lines": [["/work/model.py", 9, "x @ w"]]},
         {"name": "triton_red_fused_never_ran_2", "graph": 1, "kind": "triton", "lines": []}]


def test_each_compiled_kernel_that_ran_has_its_time_and_the_lines_of_every_graph_it_appears_in(tmp_path):
    b = TraceBuilder()
    b.facts["compiled_kernels"] = NOTED
    for i in range(3):
        b.kernel("triton_poi_fused_add_gelu_0", 100 + 50 * i, 20)
    b.kernel("ampere_sgemm_128x64_nn", 300, 40)
    b.op("graph_0_cpp_fused_sum_1", 400, 7)   # a C++ kernel's own range, as Inductor writes it on a CPU
    report = analyze(b.write(tmp_path / "t.json"))
    rows = {r.name: r for r in report.compiled}
    assert list(rows) == ["triton_poi_fused_add_gelu_0", "cpp_fused_sum_1"]   # by time; library calls and
    gelu, total = rows["triton_poi_fused_add_gelu_0"], report.attribution.total_us   # kernels that never ran: none
    assert (gelu.count, gelu.total_us) == (3, 60)
    assert [(x.line, x.code) for x in gelu.lines] == [(11, "h = h + b"), (12, "h = F.gelu(h)"), (20, "y = h * 2")]
    assert (rows["cpp_fused_sum_1"].count, rows["cpp_fused_sum_1"].total_us) == (1, 7)
    said = report.to_dict()["compiled"][0]
    assert said["total_ms"] == 0.06 and said["share"] == pytest.approx(60 / total) and len(said["lines"]) == 3


PROGRAM = textwrap.dedent('''\
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, 64)
            self.norm = nn.LayerNorm(64)

        def forward(self, x):
            h = F.gelu(self.fc(x))              # planted: gelu
            return self.norm(h * 2 + 1).sum()   # planted: norm

    model = torch.compile(Block())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    for step in range(5):
        model(x).backward()
        opt.step(); opt.zero_grad()
''')


@pytest.mark.long   # a process of its own that compiles: run first (conftest)
def test_a_compiled_program_s_profile_names_the_lines_each_kernel_fused(tmp_path):
    (tmp_path / "train.py").write_text(PROGRAM)
    done = subprocess.run([sys.executable, "-m", "roofline", "profile", "--skip", "2", "--steps", "2", "--json",
                           "out.json", "--html", "out.html", "train.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = json.loads((tmp_path / "out.json").read_text())["compiled"]
    lines = PROGRAM.splitlines()
    gelu, norm = (next(i for i, text in enumerate(lines, 1) if f"planted: {what}" in text) for what in ("gelu", "norm"))
    assert compiled and all(c["kind"] == "cpp" and c["count"] >= 2 and c["total_ms"] > 0 for c in compiled)
    fused = {x["line"] for c in compiled for x in c["lines"]}
    assert {gelu, norm} <= fused and all(x["file"].endswith("train.py") for c in compiled for x in c["lines"])
    assert any("gelu" in c["name"] and gelu in {x["line"] for x in c["lines"]} for c in compiled)
    assert "torch.compile's kernels" in done.stdout and f"train.py:{gelu}" in " ".join(done.stdout.split())
    assert max(len(line) for line in done.stdout.splitlines()) <= 80
    page = (tmp_path / "out.html").read_text()
    table = page[page.index('id="compiled"'):]
    table = table[:table.index("</table>")]
    assert table.count("<tr") == 1 + len(compiled) and all(c["name"] in table for c in compiled)


def test_a_program_that_never_compiles_never_imports_inductor():
    """Inductor's modules take seconds to import: the profiler starts noting compiled kernels only at the
    program's first torch.compile, and puts torch.compile back as it was."""
    code = ("import sys, torch, roofline; from roofline.inspect import generated; compile = torch.compile; "
            "kept = []; roofline.profile(lambda: kept.append(torch.compile) or torch.ones(3) + 1); "
            "print('torch._inductor.graph' in sys.modules, torch.compile is compile, kept[0] is not compile); "
            # the watched torch.compile, kept and called after the profile: torch.compile's work alone
            "kept[0](lambda x: x + 1); print(generated._Patch.undo is None)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-4:] == ["False", "True", "True", "True"]
