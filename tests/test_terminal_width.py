"""Output for terminals: every table and help text reads at 80 columns and when piped. No column shrinks away,
no text is cut with an ellipsis; headers are abbreviated by each column's rule, long text folds, and a table too
wide for all of that is split in parts that repeat its first column."""

import io
from collections import Counter

import pytest
from rich.console import Console
from rich.text import Text
from typer.testing import CliRunner

from roofline import ladder
from roofline.cli import app
from roofline.tables import Column, Row, fit, show

runner = CliRunner()
WIDTH = 80


def _render(tables, width=WIDTH) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    for t in tables:
        console.print(t)
    return console.file.getvalue()


def _assert_reads(text: str, width: int = WIDTH) -> None:
    lines = text.splitlines()
    widest = max((Text(line).cell_len for line in lines), default=0)
    assert widest <= width, next(line for line in lines if Text(line).cell_len > width)
    assert "…" not in text, next(line for line in lines if "…" in line)


NUMBERS = [Column("calls"), Column("milliseconds", "ms"), Column("TFLOP/s", "TF/s"), Column("GB/s"),
           Column("of roofline", "roof")]


def _rows(name_length: int, count: int = 4):
    return [Row([f"op_{'x' * name_length}_{i}", f"{i},512x{1024 + i}", str(7 * i), f"{1.5 * i:,.2f}", "0.0123",
                 "1,234", f"{i * 9}%"]) for i in range(count)]


def test_a_table_that_fits_is_left_as_it_is():
    columns = [Column("op", justify="left", fold=True), Column("inputs", justify="left", fold=True), *NUMBERS]
    (table,) = fit("ops", columns, _rows(3), WIDTH)
    text = _render([table])
    _assert_reads(text)
    assert "milliseconds" in text and "of roofline" in text and "┃" in text   # whole headers, boxed


@pytest.mark.parametrize("name_length", [20, 60, 200])
def test_a_wide_table_folds_its_text_abbreviates_by_rule_and_loses_nothing(name_length):
    columns = [Column("op", justify="left", fold=True), Column("inputs", "in", justify="left", fold=True), *NUMBERS]
    rows = _rows(name_length)
    text = _render(fit("ops", columns, rows, WIDTH))
    _assert_reads(text)
    _assert_nothing_lost(text, [cell for row in rows for cell in row.cells])
    for c in columns:
        assert c.header in text or c.short in text, c.header


def _assert_nothing_lost(text: str, cells: list[str]) -> None:
    """Every character of every cell is on the screen: folding moves text to the next line, never drops it."""
    shown, wanted = Counter(text), Counter("".join(cells))
    missing = {c: n - shown[c] for c, n in wanted.items() if not c.isspace() and shown[c] < n}
    assert not missing, missing


def test_too_many_columns_split_into_parts_that_repeat_the_first():
    columns = [Column("name", justify="left", fold=True)] + [Column(f"counter number {i}", f"c{i}") for i in range(24)]
    rows = [Row(["kernel_a", *(f"{1000 * i + 7:,}" for i in range(24))]), Row(["kernel_b", *("1" for _ in range(24))])]
    tables = fit("counters", columns, rows, WIDTH)
    text = _render(tables)
    _assert_reads(text)
    assert len(tables) >= 2 and text.count("kernel_a") == len(tables)
    assert f"(1/{len(tables)})" in text
    _assert_nothing_lost(text, [cell for row in rows for cell in row.cells[1:]])


def _run(argv, **kwargs):
    result = runner.invoke(app, argv, env={"COLUMNS": str(WIDTH), "NO_COLOR": "1"}, **kwargs)
    return result


@pytest.mark.parametrize("command", [[], ["doctor"], ["bench"], ["profile"], ["analyze"], ["ladder"], ["inspect"]])
def test_help_reads_at_80_columns(command):
    result = _run([*command, "--help"])
    assert result.exit_code == 0, result.output
    _assert_reads(result.output)
    assert "Usage:" in result.output and "  --help" in result.output


PROGRAM = '''
import torch
x = torch.randn(48, 96)
model = torch.nn.Sequential(torch.nn.Linear(96, 96), torch.nn.GELU(), torch.nn.LayerNorm(96))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(4):
    y = model(x).softmax(-1).log_softmax(-1)
    (y.mean() + x.resolve_conj().sum() * 0).backward()
    opt.step()
'''


def test_profile_at_80_columns(tmp_path):
    program = tmp_path / "a_program_with_a_rather_long_name_for_its_path.py"
    program.write_text(PROGRAM)
    result = _run(["profile", "--skip", "1", str(program)])
    assert result.exit_code == 0, result.output
    _assert_reads(result.output)
    for title in ("top lines by op time", "top ops on the roofline", "modules"):
        assert title in result.output
    for header in (("op",), ("inputs", "in"), ("TFLOP/s", "TF/s"), ("of roofline", "roof"), ("headroom ms", "room")):
        assert any(h in result.output for h in header), header


SWEEP = '''
import torch
from roofline.bench import Provider, Sweep

def sweep():
    return Sweep(name="a sweep with a long name, against a baseline with a long name", x_name="elements",
                 x_values=[1024, 4096],
                 inputs=lambda n, dev: (torch.randn(n, device=dev),),
                 providers=[Provider("the baseline, written by hand", lambda x: x + 1),
                            Provider("another way, with a long name too", lambda x: 1 + x)],
                 bytes=lambda n, x: 8 * n)
'''


def test_bench_at_80_columns(tmp_path):
    path = tmp_path / "sweep.py"
    path.write_text(SWEEP)
    result = _run(["bench", f"{path}:sweep", "--rep-ms", "2", "--no-flush"])
    assert result.exit_code == 0, result.output
    _assert_reads(result.output)
    text = " ".join(result.output.split())
    assert "vs the" in text or "vs base" in text   # the speedup column is there, whole or abbreviated
    assert "note" in text and "GB/s" in text and "CV" in text


def test_doctor_at_80_columns(monkeypatch, tmp_path):
    from roofline.bench import ceilings

    monkeypatch.setenv("ROOFLINE_CACHE_DIR", str(tmp_path))   # measured here, not read from another test's cache
    monkeypatch.setattr(ceilings, "_copy_bytes", lambda dev: 16 << 20)
    result = _run(["doctor", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    _assert_reads(result.output)
    assert "measured" in result.output and ("of datasheet" in result.output or "of sheet" in result.output)


def test_the_ladder_table_at_80_columns():
    rungs = [ladder.RungResult(rung=name, change=f"the change of {name}", config={}, median_ms=ms, low_ms=ms * 0.99,
                               high_ms=ms * 1.01, vs_previous=1.2, vs_baseline=2.0, peak_gib=3.25, warmup_s=12.5,
                               loss=2.3456, loss_step=6, loss_error=1e-4, tolerance=1e-2, status="ok")
             for name, ms in (("fp32 baseline", 206.4), ("bf16 autocast and a fused optimizer", 35.2))]
    result = ladder.LadderResult(task="gpt2 (12 layers, d 768, 8x1024 tokens)", device="NVIDIA H100 80GB HBM3",
                                 kind="train", rungs=rungs)
    console = Console(file=io.StringIO(), width=WIDTH, color_system=None)
    ladder.print_table(result, console)
    text = console.file.getvalue()
    _assert_reads(text)
    assert "206.40" in text and "2.3456" in text and "numerics" in text


def test_a_table_of_one_column_too_wide_is_still_shown():
    text = _render(fit("words", [Column("text", justify="left")], [Row(["x" * 200])], WIDTH))
    assert "x" * 50 in text and "words" in text


def test_tables_show_prints_every_part_to_the_console():
    console = Console(file=io.StringIO(), width=40, color_system=None)
    show(console, "t", [Column("a", justify="left"), Column("bbbbbbbbbbbbbbbbbbbb"), Column("cccccccccccccccccccc")],
         [Row(["x", "1", "2"])])
    text = console.file.getvalue()
    _assert_reads(text, 40)
    assert "bbbbbbbbbbbbbbbbbbbb" in text and "cccccccccccccccccccc" in text


FIXTURES = __import__("pathlib").Path(__file__).parent / "profiler" / "fixtures"


@pytest.mark.parametrize("trace", sorted(p.name for p in FIXTURES.glob("h100-*.json.gz")))
def test_analyze_of_a_gpu_trace_at_80_columns(trace):
    """A GPU program's report (H100 traces): kernels, findings and the roofline's ops read at 80 columns; a kernel's
    name too long for three folded lines ends in an ellipsis by the kernel column's rule, nothing else does."""
    result = _run(["analyze", str(FIXTURES / trace)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(Text(line).cell_len for line in lines) <= WIDTH
    assert "top kernels" in result.output and "top ops on the roofline" in result.output
    start = next(i for i, line in enumerate(lines) if line.startswith("top kernels"))
    end = next((i for i, line in enumerate(lines) if i > start and line.startswith(("modules", "memory operations"))),
               len(lines))
    assert all(start < i < end for i, line in enumerate(lines) if "…" in line), result.output


def test_memory_bound_ops_over_the_dram_roof_are_said_to_have_run_from_a_cache(monkeypatch):
    """An op can move its bytes faster than DRAM allows only from a cache; where doctor measured no cache ceiling
    to hold it against (a CPU), its "of roofline" is over 100% and a line under the table says why. Here the DRAM
    roof is made 10x too low, with no L2 ceiling, and the H100 trace's elementwise ops go over it."""
    import dataclasses

    from roofline.profiler.costs import Peaks

    real = Peaks.from_ceilings.__func__

    def too_low(cls, c):
        peaks = real(cls, c)
        return dataclasses.replace(peaks, gbps=peaks.gbps / 10, l2_gbps=None)

    monkeypatch.setattr(Peaks, "from_ceilings", classmethod(too_low))
    over = _run(["analyze", str(FIXTURES / "h100-eager_elementwise.json.gz")]).output
    assert "Over 100%:" in over and "stayed in a cache" in over
    _assert_reads(over.split("top ops on the roofline", 1)[1].split("top kernels", 1)[0])
    monkeypatch.undo()
    assert "Over 100%:" not in _run(["analyze", str(FIXTURES / "h100-eager_elementwise.json.gz")]).output
