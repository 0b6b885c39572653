"""A sweep's result as a table, CSV, JSON, markdown and plot."""

import csv
import json

import pytest
import torch
from rich.console import Console

from roofline.bench import Provider, Sweep, report


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    # a cache of its own: no CPU ceiling measured by another test of this run (in any order) is read
    mp = pytest.MonkeyPatch()
    mp.setenv("ROOFLINE_CACHE_DIR", str(tmp_path_factory.mktemp("no-ceilings")))
    sweep = Sweep(
        name="add", x_name="n", x_values=[1024, 4096],
        inputs=lambda n, dev: (torch.randn(n),),
        providers=[Provider("torch", lambda x: x + 1), Provider("broken", lambda x: x),
                   Provider("elsewhere", lambda x: x + 1, skip="needs a CUDA GPU")],
        bytes=lambda n, x: 8 * n,
    )
    try:
        return sweep.run(device="cpu", flush=False, rep_ms=5, progress=False)
    finally:
        mp.undo()


def test_table_shows_throughput_failures_and_leaves_out_skips(result):
    console = Console(record=True, width=200)
    report.show(result, console)
    text = console.export_text()
    assert "add on" in text and "GB/s" in text and "% roofline" not in text  # CPU: no ceiling measured
    assert "2^10" in text and "2^12" in text
    assert "failed" in text and "differ from the baseline" in text
    assert "elsewhere" not in text


def test_table_shows_percent_of_roofline_when_a_ceiling_is_known(result):
    rows = [type(r)(**r.__dict__) for r in result.rows]
    for r in rows:
        if r.status == "ok":
            r.pct_of_roofline = 12.5
    with_ceiling = type(result)(**{**result.__dict__, "rows": rows,
                                   "ceilings": dict(result.ceilings, dram_gbps=10.0, source="measured")})
    console = Console(record=True, width=200)
    report.show(with_ceiling, console)
    text = console.export_text()
    assert "% roofline" in text and "12.5" in text
    assert "(roofline: 10 GB/s, measured)" in text


def test_csv_has_one_row_per_size_and_provider(result, tmp_path):
    path = tmp_path / "r.csv"
    report.write_csv(result, path)
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == 6
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["provider"] for r in ok} == {"torch"}
    assert float(ok[0]["median_ms"]) == pytest.approx(result.row(1024, "torch").median_ms)
    assert {r["status"] for r in rows if r["provider"] == "elsewhere"} == {"skipped"}


def test_json_is_versioned_and_holds_samples(result, tmp_path):
    path = tmp_path / "r.json"
    report.write_json(result, path)
    data = json.loads(path.read_text())
    assert data["schema"] == "roofline.sweep" and data["schema_version"] == report.JSON_SCHEMA_VERSION
    assert data["device"]["kind"] == "cpu" and data["options"]["flush"] is False
    row = next(r for r in data["rows"] if r["provider"] == "torch" and r["x"] == 4096)
    assert row["timing"]["samples_ms"] == result.row(4096, "torch").measurement.samples_ms
    assert row["gbps"] == pytest.approx(result.row(4096, "torch").gbps)


def test_markdown_table(result):
    md = report.to_markdown(result).splitlines()
    assert md[0].startswith("| n | provider | median |") and len(md) == 2 + 6


@pytest.mark.parametrize("metric", [None, "time"])
def test_plot_writes_an_image(result, tmp_path, metric):
    path = tmp_path / "r.png"
    chosen = report.plot(result, path, metric=metric)
    assert chosen == (metric or "gbps")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_plot_rejects_an_unknown_metric(result, tmp_path):
    with pytest.raises(ValueError, match="metric"):
        report.plot(result, tmp_path / "r.png", metric="speed")
