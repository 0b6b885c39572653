"""The `roofline` command: doctor, bench, profile, analyze."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape

app = typer.Typer(
    help="Make PyTorch programs run as fast as the GPU allows, and show how far each piece is from that limit.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help: each option's text under its name where the name is long, readable at 80 columns
    # and piped (rich's panels squeezed it into a column of two or three words a line, and cut it off)
    rich_markup_mode=None,
)
console = Console()
err = Console(stderr=True, soft_wrap=True)   # messages unbroken: a path in them stays one word to copy


def _gib(n: int | None) -> str:
    return "" if n is None else f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _device_facts(d) -> list[tuple[str, str]]:
    if d.kind == "cpu":
        facts = [("CPU", d.name), ("cores / threads", f"{d.cores} / {d.threads}"),
                 ("last-level cache", _gib(d.llc_bytes))]
    else:
        clocks = lambda now, top: f"{now} MHz (max {top} MHz)" if now else ""  # noqa: E731
        facts = [
            ("GPU", f"{d.name} (cuda:{d.index}, compute capability {d.capability})"),
            ("SMs", str(d.sm_count)),
            ("L2 cache", _gib(d.l2_bytes)),
            ("memory", _gib(d.memory_bytes)),
            ("SM clock", clocks(d.sm_clock_mhz, d.sm_clock_max_mhz) or "unknown (NVML unavailable)"),
            ("memory clock", clocks(d.mem_clock_mhz, d.mem_clock_max_mhz) or "unknown (NVML unavailable)"),
            ("driver / CUDA", f"{d.driver or 'unknown'} / {d.cuda}"),
        ]
    return facts + [("torch / triton", f"{d.torch} / {d.triton or 'not installed'}")]


@app.command()
def doctor(
    remeasure: bool = typer.Option(False, "--remeasure", help="Measure the ceilings again, even if cached."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Also write the report as JSON here."),
    device: Optional[str] = typer.Option(None, help="Device to examine, e.g. cuda:1 or cpu (default: the current GPU, else the CPU)."),
    nproc: Optional[int] = typer.Option(None, "--nproc", min=0, help="Ranks for the interconnect's ceilings: "
                                        "collectives timed over this many processes, one a GPU (default: every "
                                        "GPU where there are 2 or more; 0: none; on a CPU, gloo over N processes)."),
    plot_path: Optional[Path] = typer.Option(None, "--plot", help="Plot the interconnect's bus bandwidth against "
                                             "message size (PNG/SVG/PDF)."),
):
    """Say what this machine is and measure the ceilings every '% of roofline' is relative to: memory, matmul, and
    with several GPUs the interconnect (every collective from 1 KiB to 1 GiB, as nccl-tests measures it; gloo over
    CPU processes, --nproc N, to 16 MiB)."""
    from roofline import device as dev_mod
    from roofline.bench.ceilings import measure_ceilings
    from roofline.tables import Column, Row, show

    try:
        dev = dev_mod.resolve(device)
    except (ValueError, RuntimeError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--device") from exc
    ranks = _interconnect_ranks(nproc)   # a bad --nproc refused before anything is measured
    d = dev_mod.info(dev)
    show(console, "device", [Column("", justify="left", style="bold"), Column("", justify="left", fold=True)],
         [Row([k, v]) for k, v in _device_facts(d)], show_header=False)

    c = dev_mod.ceilings(dev)
    if remeasure or c.source != "measured":
        with console.status("measuring ceilings") as status:
            c = measure_ceilings(dev, progress=lambda text: status.update(f"measuring {text}"))
        note = f"measured now, cached in {dev_mod.cache_dir()}"
    else:
        note = f"measured {c.measured_at}, cached (--remeasure to measure again)"
    sheet = dev_mod.datasheet(d.name) if d.kind == "cuda" else None
    rows = []

    def add(label, value, unit, scale, peak):
        pct = f"{value / peak:.0%}" if value and peak else ""
        rows.append(Row([label, f"{value * scale:,.1f} {unit}" if value else "",
                         f"{peak * scale:,.1f} {unit}" if peak else "", pct]))

    add("DRAM bandwidth (copy, read+write)", c.dram_gbps, "GB/s", 1, sheet.dram_gbps if sheet else None)
    if c.l2_gbps:
        add("L2 bandwidth (copy within L2, read+write)", c.l2_gbps, "GB/s", 1, None)
    for key, value in c.matmul_tflops.items():
        if d.kind == "cpu":
            add(f"{key} matmul", value, "GFLOP/s", 1e3, None)
        else:
            add(f"{key} matmul", value, "TFLOP/s", 1, sheet.matmul_tflops.get(key) if sheet else None)
    show(console, f"ceilings ({note})", [Column("what", justify="left", fold=True), Column("measured"),
                                         Column("datasheet", "sheet"), Column("of datasheet", "of sheet")], rows)
    for key, found in c.details.items():
        if key.endswith("_warnings"):
            for w in found:
                console.print(f"[yellow]{key.removesuffix('_warnings').replace('_', ' ')}: {w}[/yellow]")
    if d.kind == "cpu":
        console.print("No CUDA GPU here: these are the CPU's ceilings; GPU measurements need a GPU.")
    links = _interconnect(ranks, remeasure, plot_path) if ranks >= 2 else None
    if json_path:
        json_path.write_text(json.dumps({"device": d.to_dict(), "ceilings": c.to_dict(),
                                         "datasheet": sheet.__dict__ if sheet else None,
                                         "interconnect": links.to_dict() if links else None}, indent=1))


def _interconnect_ranks(nproc: int | None) -> int:
    """The ranks doctor times the interconnect over (under 2: none), or a usage error naming --nproc."""
    import torch

    ranks = torch.cuda.device_count() if nproc is None else nproc
    if nproc == 1:
        raise typer.BadParameter("an interconnect needs at least 2 ranks", param_hint="--nproc")
    if ranks >= 2 and torch.cuda.is_available() and ranks > torch.cuda.device_count():
        raise typer.BadParameter(f"{ranks} ranks need {ranks} GPUs; this machine has {torch.cuda.device_count()}",
                                 param_hint="--nproc")
    return ranks


def _interconnect(ranks: int, remeasure: bool, plot_path: Path | None):
    """The interconnect's ceilings over `ranks` (measured, or from the cache), shown."""
    import torch

    from roofline.distributed import RankFailed, interconnect
    from roofline.distributed.launch import Interrupted

    found = None if remeasure else interconnect.cached(ranks)
    note = f"measured {found.measured_at}, cached" if found else "measured now, cached"
    if found is None:
        # gloo on a CPU moves data through the host's memory: messages up to 16 MiB tell its story in seconds
        sizes = interconnect.SIZES if torch.cuda.is_available() else interconnect.SIZES[:8]
        with console.status(f"timing collectives over {ranks} ranks, {len(sizes)} sizes each"):
            try:
                found = interconnect.measure(ranks, sizes=sizes)
            except Interrupted as exc:
                err.print(f"roofline: {exc}", markup=False, highlight=False)
                raise typer.Exit(128 + exc.signum)
            except RankFailed as exc:
                err.print(f"roofline: the interconnect could not be measured: {exc}", markup=False, highlight=False)
                raise typer.Exit(1)
    interconnect.render(found, console, note)
    if plot_path:
        console.print(f"[dim]plot written to {interconnect.plot(found, plot_path)}[/dim]")
    return found


def load_target(target: str):
    """'path/to/file.py:name' or 'package.module:name' -> the sweeps that name gives."""
    from roofline.bench import Sweep

    obj = _load_name(target, Sweep)
    sweeps = [obj] if isinstance(obj, Sweep) else list(obj) if isinstance(obj, (list, tuple)) else None
    if not sweeps or not all(isinstance(s, Sweep) for s in sweeps):
        raise typer.BadParameter(f"{target} must be a Sweep, a list of them, or a function returning one",
                                 param_hint="TARGET")
    return sweeps


def _load_name(target: str, kind: type):
    """The object TARGET names (roofline.targets), or a usage error naming TARGET."""
    from roofline.targets import TargetError, load_name

    try:
        return load_name(target, kind)
    except TargetError as exc:
        raise typer.BadParameter(str(exc), param_hint="TARGET") from exc


def _numbered(path: Path, i: int, count: int) -> Path:
    return path if count == 1 else path.with_name(f"{path.stem}-{i}{path.suffix}")


@app.command()
def bench(
    target: str = typer.Argument(..., help="FILE_OR_MODULE:FUNCTION giving a roofline.bench.Sweep."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the results (with samples) as JSON."),
    csv_path: Optional[Path] = typer.Option(None, "--csv", help="Write the results as CSV."),
    markdown_path: Optional[Path] = typer.Option(None, "--markdown", help="Write the table as markdown."),
    plot_path: Optional[Path] = typer.Option(None, "--plot", help="Plot throughput (or time) against size, as PNG/SVG/PDF."),
    cuda_graph: bool = typer.Option(False, "--cuda-graph", help="Time CUDA-graph replays (for microsecond kernels)."),
    flush: bool = typer.Option(True, "--flush/--no-flush", help="Flush the cache before every timed call."),
    rep_ms: float = typer.Option(100.0, min=1, help="Time budget for the timed repetitions, per provider and size."),
    device: Optional[str] = typer.Option(None, help="Device, e.g. cuda:0 or cpu."),
):
    """Run a sweep defined in Python: check every provider, time them side by side, show the table."""
    from roofline.bench import report, run_sweep

    sweeps = load_target(target)
    for i, sweep in enumerate(sweeps):
        try:
            result = run_sweep(sweep, device=device, cuda_graph=cuda_graph, flush=flush, rep_ms=rep_ms,
                               console=console)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from exc
        report.show(result, console)
        skipped = sorted({(r.provider, r.reason) for r in result.rows if r.status == "skipped"})
        for provider, reason in skipped:
            console.print(f"[dim]skipped {provider}: {reason}[/dim]")
        console.print(f"[dim]{result.seconds:.0f} s; timing: {'CUDA graphs' if cuda_graph else 'events' if result.device['kind'] == 'cuda' else 'perf_counter'}, "
                      f"{'cache flushed before each call' if flush else 'hot cache'}; roofline from {result.ceilings['source']} ceilings[/dim]")
        for path, write in ((json_path, report.write_json), (csv_path, report.write_csv), (plot_path, report.plot)):
            if path:
                write(result, _numbered(path, i, len(sweeps)))
        if markdown_path:
            _numbered(markdown_path, i, len(sweeps)).write_text(report.to_markdown(result) + "\n")


def _show_report(report, json_path: Optional[Path], html_path: Optional[Path], top: int) -> None:
    report.print(console, top=top)
    if json_path:
        report.write_json(json_path)
        console.print(f"[dim]report written to {json_path}[/dim]")
    if html_path:
        report.write_html(html_path)
        console.print(f"[dim]HTML report written to {html_path}[/dim]")


def _add_inside(report, launched: list, count: int) -> None:
    """--inspect K: the K heaviest Triton kernels of the profile, seen from inside (profiler.inside)."""
    import torch

    from roofline.profiler import inside

    if not report.kernels:
        err.print("roofline: --inspect needs GPU kernels; this trace has none")
        return
    if not launched:
        err.print("roofline: --inspect: the program launched no Triton kernel through Triton's JIT")
        return
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count \
        if torch.cuda.is_available() else None
    report.inside = inside.look_inside(report.kernels, launched, count, sms)
    inside.link(report.findings, report.inside)
    if not report.inside:
        err.print(f"roofline: --inspect: none of the top kernels is one of the program's {len(launched)} Triton "
                  "launches")


def _add_ncu(report, target: str, args: list[str], module: bool, count: int, skip: int, steps: int | None) -> None:
    """Nsight Compute's counters for the heaviest launches of the `count` kernels with the most time."""
    from roofline.profiler import ncu

    if report.attribution.device != "cuda":
        err.print("roofline: --ncu needs GPU kernels; this trace has none")
        return
    binary = ncu.binary()
    if binary is None:
        err.print("roofline: --ncu: Nsight Compute (ncu) is not installed here")
        return
    launches = [launch for k in report.kernels[:count] for launch in ncu.heaviest_launches(report.trace, k.full_name)]
    err.print(f"running Nsight Compute on {len(launches)} launches of the top {count} kernels "
              "(the program once per launch)...")
    report.ncu = ncu.measure(ncu.window_argv(target, args, module, skip, steps), launches, binary)


def _verify(report) -> None:
    """Measure the fixes of the report's findings (verify.py), with a line of progress per finding."""
    from roofline.profiler import verify

    if not report.findings:
        return
    err.print(f"measuring the fixes of {len(report.findings)} findings (--verify)...")
    verify.verify(report, progress=lambda f: err.print(f"[dim]  {f.id}: {f.title}[/dim]"))


def _program_failed(target: str, status: int, error: BaseException | None, steps: int) -> None:
    """The program's own failure, said before anything of roofline's: its exit status, the steps it ran, and the
    tail of its error (the report that follows covers what ran before it)."""
    said = f"roofline: {target} exited with status {status} after {steps} step{'s' * (steps != 1)}"
    if isinstance(error, KeyboardInterrupt):   # Ctrl-C: where it stopped is no error of the program's
        err.print(f"{said}: interrupted", markup=False, highlight=False)
        return
    if error is None:
        err.print(said, markup=False, highlight=False)
        return
    lines = _program_traceback(error).rstrip("\n").splitlines()
    err.print(f"{said}: {lines[-1]}", markup=False, highlight=False)
    tail = lines[-_TRACEBACK_TAIL:]
    if len(lines) > len(tail):
        tail = [f"  ... ({len(lines) - len(tail)} lines of the traceback above)"] + tail
    err.print("\n".join(tail), markup=False, highlight=False)


_TRACEBACK_TAIL = 16   # lines of the program's traceback shown: its innermost frames and the error


def _program_traceback(error: BaseException) -> str:
    """The program's traceback as Python would print it, without roofline's and runpy's frames above it."""
    import traceback

    tb = error.__traceback__
    while tb is not None and ("roofline" + "/" in tb.tb_frame.f_code.co_filename.replace("\\", "/")
                              or tb.tb_frame.f_code.co_filename.endswith(("runpy.py", "<frozen runpy>"))):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(error), error, tb))


# Everything after the program is the program's (as with python -m cProfile): click stops parsing options at the
# first positional argument, so `--steps` after it reaches the program, not roofline.
@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                               "allow_interspersed_args": False})
def profile(
    target: str = typer.Argument(..., help="The script to run (or, with -m, the module)."),
    args: Optional[List[str]] = typer.Argument(None, help="Arguments passed to the program."),
    module: bool = typer.Option(False, "-m", "--module", help="Run TARGET as a module, like python -m."),
    skip: int = typer.Option(0, min=0, help="Steps to leave out before recording (warm-up). A step is an "
                             "optimizer.step() or a call of roofline.profiler.step()."),
    steps: Optional[int] = typer.Option(None, min=1, help="Steps to record after the skipped ones (default: all)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the analysis as JSON (schema roofline.profile/1)."),
    html_path: Optional[Path] = typer.Option(None, "--html", help="Write a self-contained HTML report."),
    trace_path: Optional[Path] = typer.Option(None, "--trace", help="Keep the Chrome/Perfetto trace here (.json or .json.gz)."),
    memory: bool = typer.Option(False, help="Also record memory allocations."),
    shapes: bool = typer.Option(True, help="Record op input shapes (needed for FLOPs, bytes and the roofline)."),
    ops: bool = typer.Option(True, help="Record every op on the host (its name and shapes: the op table, FLOPs, "
                             "bytes). --no-ops (on a GPU) records kernels and their launches alone, tied to lines and "
                             "modules by roofline's own marks: where the host paces a step, it stretches the step less "
                             "than recording every op does, and it knows no op."),
    python_stack: bool = typer.Option(False, help="Also record torch's Python tracer (function-level stacks "
                                      "for work outside the user's lines; costs more)."),
    top: int = typer.Option(10, min=1, help="Rows per table in the terminal summary."),
    ncu: int = typer.Option(0, "--ncu", min=0, help="Also run Nsight Compute on the heaviest launches of the K "
                            "kernels with the most time (occupancy, DRAM and SM throughput, L2 hit rate, registers, "
                            "spills); it runs the program again once per launch."),
    inspect_top: int = typer.Option(0, "--inspect", min=0, help="Also look inside the K Triton kernels with the "
                                    "most time that the program launched through Triton's JIT (not torch.compile's), "
                                    "as roofline inspect does: registers, spills, shared memory, occupancy and what "
                                    "limits it, the instruction mix, findings at their lines."),
    verify: bool = typer.Option(False, "--verify", help="Measure each finding's fix where it has a concrete "
                                "replacement: the ops rebuilt on their recorded shapes, checked, and timed against "
                                "the replacement (speedup and its 95% interval beside the estimate)."),
    nproc_per_node: Optional[int] = typer.Option(None, "--nproc-per-node", min=1, help="Start this many ranks of "
                                                 "the program on this host, as torchrun does (OMP_NUM_THREADS=1 in "
                                                 "each where it is not set), and report them together (or run "
                                                 "roofline under torchrun yourself: torchrun ... -m roofline profile "
                                                 "train.py)."),
    rank_dir: Optional[Path] = typer.Option(None, "--rank-dir", help="The folder every rank writes its trace to "
                                            "(default: one in the temporary directory, named by the run; across "
                                            "hosts, give one they all share)."),
    nnodes: int = typer.Option(1, "--nnodes", min=1, help="With --nproc-per-node: the hosts of the job, each "
                               "running this command (torchrun's option; with --rdzv-endpoint and --rank-dir)."),
    rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint", help="HOST:PORT where the hosts meet "
                                                "(torchrun's option)."),
    rdzv_id: Optional[str] = typer.Option(None, "--rdzv-id", help="The job's id, the same on every host "
                                          "(torchrun's option; default: one for every job of --nnodes 1)."),
    rdzv_backend: str = typer.Option("c10d", "--rdzv-backend", help="c10d, or static with --node-rank "
                                     "(torchrun's option)."),
    node_rank: Optional[int] = typer.Option(None, "--node-rank", min=0, help="This host's place, for "
                                            "--rdzv-backend static (torchrun's option)."),
):
    """Run a Python program under the profiler and say where its GPU time goes, line by line, and what to do about it.

    Options come before the program; everything after it is the program's own arguments:

    \b
        roofline profile --skip 5 --steps 5 train.py --epochs 1
        roofline profile --nproc-per-node 2 --skip 5 --steps 5 train.py
    """
    from roofline.distributed import hang, launch, ledger, profiling
    from roofline.profiler import run_program
    from roofline.profiler.trace import TraceError

    program = [target, *(args or [])]
    ranked = profiling.under_torchrun()
    several = ranked is not None or (nproc_per_node or 1) * nnodes > 1
    if ranked is None and nnodes > 1 and not nproc_per_node:
        raise typer.BadParameter("needs --nproc-per-node (the ranks each host starts)", param_hint="--nnodes")
    if rank_dir is None and (nnodes > 1 or (ranked and profiling.hosts() > 1)):
        raise typer.BadParameter("the ranks run on several hosts: give a folder they all share, where rank 0 "
                                 "reads the others' traces", param_hint="--rank-dir")
    if not ops:
        import torch

        why = ("not with --verify (it rebuilds the recorded ops)" if verify
               else "not with --memory or --python-stack (they need the CPU activity it leaves out)"
               if memory or python_stack
               else "records kernels and their launches alone, and there is no CUDA device here"
               if not torch.cuda.is_available() else None)
        if why:
            raise typer.BadParameter(why, param_hint="--no-ops")
    for given, option in ((ncu, "--ncu"), (verify, "--verify")):
        if given and several:   # each reruns the program, which ranks cannot do alone
            raise typer.BadParameter("not with several ranks (it runs the program again, one process)",
                                     param_hint=option)
    if inspect_top and several:
        raise typer.BadParameter("one process only (each rank would note its own launches)", param_hint="--inspect")
    if inspect_top and importlib.util.find_spec("triton") is None:
        raise typer.BadParameter("looks inside Triton kernels, and Triton is not installed", param_hint="--inspect")
    if nproc_per_node and nproc_per_node * nnodes > 1 and ranked is None:
        try:
            rendezvous = profiling.Rendezvous(nnodes, rdzv_endpoint or "localhost:0", rdzv_id, rdzv_backend,
                                              node_rank)
        except ValueError as exc:
            field, why = str(exc).split(": ", 1)
            raise typer.BadParameter(why, param_hint="--" + field.replace("_", "-")) from None
        recording = ["--skip", str(skip), *(["--steps", str(steps)] if steps else []), *(["-m"] if module else []),
                     *(["--memory"] if memory else []), *([] if shapes else ["--no-shapes"]),
                     *(["--python-stack"] if python_stack else []), *([] if ops else ["--no-ops"])]
        raise typer.Exit(_profile_ranks(nproc_per_node, rendezvous, recording, program, json_path, html_path,
                                        trace_path, top, rank_dir))
    folder = Path(rank_dir or profiling.default_dir()) if ranked else None
    began = time.time()
    if ranked:
        ledger.enable()   # NCCL times the collectives of the steps outside the window
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        profiling.forget_earlier(folder, ranked[0])
        hang.arm(folder, ranked[0])   # a collective that times out, and where a stopped rank was, are told
    def run():
        return run_program(target, list(args or []), module=module, skip=skip, active=steps, memory=memory,
                           shapes=shapes, python_stack=python_stack, ops=ops,
                           trace=profiling.partial_path(folder, ranked[0]) if ranked else trace_path)

    launched = []   # with --inspect: the program's Triton launches, each kernel and configuration's first
    try:
        if inspect_top:
            from roofline.inspect import kernels as triton_kernels

            ran = []
            launched = triton_kernels.launches(lambda: ran.append(run()))
            prof, status, error = ran[0]
        else:
            prof, status, error = run()
    except FileNotFoundError as exc:
        err.print(f"roofline: {exc}")
        raise typer.Exit(2)
    if status or error is not None:
        _program_failed(f"rank {ranked[0]}: {target}" if ranked else target, status, error, prof.steps)
    if folder is not None:
        hang.disarm(folder, ranked[0])
        if error is not None:
            launch.note_error(folder, ranked[0], error)   # what the launcher says of this rank
            hang.note(folder, ranked[0], error)
            waited = hang.explain(folder, ranked[1]).get(ranked[0])
            if waited and os.environ.get(profiling.LAUNCHED) != "1":   # else the launcher says it, for every rank
                err.print(f"roofline: rank {ranked[0]} {waited}", markup=False, highlight=False)
    if ranked and (ranked[0] != 0 or os.environ.get(profiling.LAUNCHED) == "1"):
        if prof.recorded:
            profiling.publish(folder, ranked[0])
        raise typer.Exit(status)   # rank 0 (or the launcher) reports every rank
    if not prof.recorded:
        err.print(f"roofline: nothing was recorded: --skip {skip} steps were to be left out, but the program "
                  f"{'ended after' if status else 'marked only'} {prof.steps} (optimizer.step() or "
                  "roofline.profiler.step() calls)")
        raise typer.Exit(status or 2)
    try:
        report = prof.report
    except TraceError as exc:
        err.print(f"roofline: {exc}")
        raise typer.Exit(status or 2)
    if not report.attribution.work:
        err.print("roofline: nothing to analyze: the program ran no PyTorch operations in the profiled window")
        raise typer.Exit(status or 2)
    if ncu:
        _add_ncu(report, target, list(args or []), module, ncu, skip, steps)
    if inspect_top:
        _add_inside(report, launched, inspect_top)
    if verify:
        _verify(report)
    if ranked:
        profiling.publish(folder, 0)   # its own report read, rank 0's trace joins the others'
        paths, missing = profiling.wait_for(folder, ranked[1], since=began)
        if missing:
            err.print(f"roofline: no trace from ranks {missing} after {profiling.RANK_WAIT_S:.0f} s: they failed, or "
                      "write elsewhere (--rank-dir)")
        _show_ranks(report, paths, ranked[1], profiling.hosts(), json_path, html_path, trace_path, top)
        raise typer.Exit(status)
    _show_report(report, json_path, html_path, top)
    if trace_path:
        console.print(f"[dim]trace written to {trace_path} (open it in https://ui.perfetto.dev)[/dim]")
    raise typer.Exit(status)


def _profile_ranks(nproc: int, rendezvous, recording: list[str], program: list[str], json_path: Optional[Path],
                   html_path: Optional[Path], trace_path: Optional[Path], top: int, rank_dir: Optional[Path]) -> int:
    """Start this host's ranks (distributed.profiling.launch), then, on the host that ran rank 0, read every rank's
    trace together; the exit status."""
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    from roofline.distributed import RankFailed, hang, profiling
    from roofline.distributed.launch import Interrupted
    from roofline.profiler.report import analyze

    world = nproc * rendezvous.nnodes
    with tempfile.TemporaryDirectory(prefix="roofline-ranks-") as made:
        folder = Path(rank_dir or made)
        folder.mkdir(parents=True, exist_ok=True)
        if rendezvous.nnodes == 1:   # this host runs every rank (across hosts, each rank clears its own, armed)
            hang.forget(folder, range(world))
        began = time.time()
        os.environ[profiling.LAUNCHED] = "1"
        failed = None
        try:
            here = profiling.launch(nproc, [*recording, *program], folder, rendezvous)
            status = 0
        except Interrupted as exc:
            err.print(f"roofline: {exc}", markup=False, highlight=False)
            return 128 + exc.signum
        except RankFailed as exc:
            here, status, failed = list(exc.here), 1, exc
        except RendezvousError as exc:   # the hosts never met, or the one that held the meeting went
            err.print(f"roofline: the hosts did not meet at --rdzv-endpoint {rendezvous.endpoint}: {exc}")
            return 1
        finally:
            os.environ.pop(profiling.LAUNCHED, None)
        if rendezvous.nnodes > 1 and 0 not in here:
            if failed:   # the ranks' own errors: gloo's begin "[/__w/pytorch/...]", no markup
                err.print(f"roofline: {failed}", markup=False, highlight=False)
            ran = f"rank {here[0]}" if len(here) == 1 else f"ranks {here[0]}-{here[-1]}"
            console.print(f"roofline: {ran} ran on this host; rank 0's host reports every rank")
            return status
        # the other hosts' ranks end about when this host's do: their traces may take a moment to appear (after a
        # failure, those that failed write none)
        paths, missing = profiling.wait_for(folder, world, since=began,
                                            timeout_s=profiling.RANK_WAIT_S if rendezvous.nnodes > 1 and not status
                                            else 0)
        if failed and 0 not in paths:   # no report follows
            err.print(f"roofline: {failed}", markup=False, highlight=False)
        elif failed:   # said first, in the report itself: piped, it is what the file begins with
            console.print(f"[bold red]roofline: the run failed.[/bold red] {escape(str(failed))}. What follows is "
                          "what the ranks recorded before it; the findings across the ranks are left out (a rank "
                          "that stopped early is no straggler).", highlight=False, emoji=False)
        if missing:
            err.print(f"roofline: ranks {missing} recorded nothing"
                      + ("" if status else " (fewer steps ran than --skip left out?)"))
        if 0 not in paths:
            return status or 2
        _show_ranks(analyze(paths[0]), paths, world, rendezvous.nnodes, json_path, html_path, trace_path, top,
                    failed=str(failed) if failed else None)
    return status


def _show_ranks(report, paths: dict[int, Path], world: int, hosts: int, json_path: Optional[Path],
                html_path: Optional[Path], trace_path: Optional[Path], top: int, failed: str | None = None) -> None:
    """Rank 0's own report, then every rank's read together (distributed.merge), with doctor's interconnect where
    it measured these GPUs (the ranks all on this host); where a rank failed (`failed`: what the launcher said),
    without the findings across the ranks."""
    from roofline.distributed import profiling
    from roofline.distributed import report as ranks_report
    from roofline.distributed.merge import merge
    from roofline.profiler.trace import load

    console.print(f"[bold]rank 0[/bold] of {world}:")
    report.print(console, top=top)
    merged = merge({rank: load(path) for rank, path in paths.items()})
    console.print(f"[bold]every rank[/bold] ({merged.world} of {world} recorded):" if merged.world < world
                  else "[bold]every rank[/bold]:")
    ceiling = _ranks_ceiling(report.attribution.device, world, hosts)
    ranks_report.render(merged, console, ceiling, top, findings_too=not failed)
    ranks = {**merged.to_dict(), "failed": failed,
             "findings": [] if failed else [f.to_dict() for f in ranks_report.findings(merged, ceiling)]}
    if json_path:
        json_path.write_text(json.dumps({**report.to_dict(), "ranks": ranks}, default=str))
        console.print(f"[dim]report written to {json_path}[/dim]")
    if html_path:
        report.write_html(html_path, ranks)
        console.print(f"[dim]HTML report written to {html_path} (rank 0's, with every rank beside it)[/dim]")
    if trace_path:
        profiling.write_merged_trace(paths, merged.offsets_us, trace_path)
        console.print(f"[dim]every rank's trace written to {trace_path} (open it in https://ui.perfetto.dev)[/dim]")


def _ranks_ceiling(device: str, world: int, hosts: int):
    """Doctor's measurement of the interconnect the ranks ran over, where it measured it: these GPUs, or on a
    machine without any, gloo over as many processes (doctor --nproc N); None across hosts."""
    import torch

    from roofline.distributed import interconnect

    here = world <= torch.cuda.device_count() if device == "cuda" else not torch.cuda.is_available()
    return interconnect.cached(world) if hosts == 1 and here else None


@app.command()
def ladder(
    target: str = typer.Argument(..., help="FILE.py:TASK or module:TASK, a roofline.ladder.TrainTask or "
                                 "GenerateTask (or a function returning one)."),
    steps: Optional[int] = typer.Option(None, min=6, help="Steps timed per rung, or generations for a GenerateTask "
                                        "(default: the task's)."),
    skip: Optional[List[str]] = typer.Option(None, "--skip", help="A rung to leave out, by name (repeatable)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write every rung's result as JSON."),
    markdown_path: Optional[Path] = typer.Option(None, "--markdown", help="Write the table as markdown."),
    plot_path: Optional[Path] = typer.Option(None, "--plot", help="Write a waterfall plot (PNG) of the time each "
                                             "rung removed."),
    device: Optional[str] = typer.Option(None, help="Device, e.g. cuda:0 or cpu (default: cuda if there is one)."),
    nproc_per_node: Optional[int] = typer.Option(None, "--nproc-per-node", min=2, help="Climb a training task on "
                                                 "this many ranks of this host too (a GPU each; gloo processes on "
                                                 "CPUs), after one GPU: scaling efficiency, MFU, memory per rank."),
    parallel: Optional[List[str]] = typer.Option(None, "--parallel", help="With --nproc-per-node: ddp or fsdp2 "
                                                 "(repeatable; default both, in that order)."),
):
    """Climb the optimization ladder on a training step (each rung one known change on top of the ones before,
    timed, and its loss checked against the fp32 baseline's) or on greedy generation (CUDA graphs, int8 weights,
    speculative decoding; tokens checked against bf16 eager's).

    With --nproc-per-node N a training step climbs on one GPU, then on N ranks under DDP and FSDP2, each rank on
    the task's batch: each rung's loss is held against the one-GPU run's."""
    import dataclasses

    from roofline import ladder as _ladder
    from roofline.distributed.wrapping import STRATEGIES

    if parallel and not nproc_per_node:
        raise typer.BadParameter("only with --nproc-per-node", param_hint="--parallel")
    wrong = [p for p in parallel or () if p not in STRATEGIES]
    if wrong:
        raise typer.BadParameter(f"{', '.join(map(repr, wrong))}: the strategies are {', '.join(STRATEGIES)}",
                                 param_hint="--parallel")
    if nproc_per_node and device:
        raise typer.BadParameter("not with --nproc-per-node (each rank takes its own GPU)", param_hint="--device")
    task = _load_name(target, (_ladder.TrainTask, _ladder.GenerateTask))
    if not isinstance(task, (_ladder.TrainTask, _ladder.GenerateTask)):
        raise typer.BadParameter(f"{target} must be a roofline.ladder.TrainTask or GenerateTask, or a function "
                                 "returning one", param_hint="TARGET")
    names = [r.name for r in _ladder.ladder_rungs(task)]
    if nproc_per_node:   # and the strategies' own rungs, which ranks climb at the top
        from roofline.distributed.ladder import OWN_RUNGS

        names += OWN_RUNGS
    unknown = sorted(set(skip or ()) - set(names))
    if unknown:
        raise typer.BadParameter(f"no rung named {', '.join(map(repr, unknown))}; the rungs: " + ", ".join(names),
                                 param_hint="--skip")
    if isinstance(task, _ladder.TrainTask):
        task = dataclasses.replace(task, steps=steps or task.steps)
    elif steps:
        task = dataclasses.replace(task, repeats=steps)
    task = dataclasses.replace(task, skip=tuple(task.skip) + tuple(skip or ()))
    if nproc_per_node:
        _ladder_ranks(target, task, nproc_per_node, tuple(dict.fromkeys(parallel or STRATEGIES)), steps, skip,
                      json_path, markdown_path, plot_path)
        return
    result = _ladder.run(task, device=device, progress=lambda r: err.print(f"[dim]rung: {r.name}[/dim]"))
    _ladder.print_table(result, console)
    if json_path:
        result.write_json(json_path)
    if markdown_path:
        markdown_path.write_text(_ladder.markdown(result))
    if plot_path:
        if any(r.median_ms is not None for r in result.rungs):
            _ladder.waterfall(result, plot_path)
        else:
            err.print("no rung was timed: no waterfall to plot")


def _ladder_ranks(target, task, nproc, strategies, steps, skip, json_path, markdown_path, plot_path) -> None:
    """`roofline ladder --nproc-per-node N`: the task on one GPU, then on N ranks under each strategy."""
    import torch

    from roofline import ladder as _ladder
    from roofline.distributed import RankFailed
    from roofline.distributed import ladder as ranks_ladder
    from roofline.distributed.launch import Interrupted

    if not isinstance(task, _ladder.TrainTask):
        raise typer.BadParameter("several ranks climb a training task (TrainTask) only", param_hint="TARGET")
    if torch.cuda.is_available() and nproc > torch.cuda.device_count():
        raise typer.BadParameter(f"{nproc} ranks need {nproc} GPUs, and this machine has "
                                 f"{torch.cuda.device_count()}", param_hint="--nproc-per-node")
    try:
        result = ranks_ladder.run(target, nproc, strategies, steps=steps, skip=tuple(skip or ()))
    except Interrupted as exc:
        err.print(f"roofline ladder: {exc}", markup=False, highlight=False)
        raise typer.Exit(128 + exc.signum)
    except RankFailed as exc:
        err.print(f"roofline ladder: {exc}", markup=False, highlight=False)
        raise typer.Exit(1)
    ranks_ladder.print_tables(result, console)
    if json_path:
        json_path.write_text(json.dumps(result.to_dict(), indent=1))
    if markdown_path:
        markdown_path.write_text(ranks_ladder.markdown(result))
    if plot_path:
        ladders = [result.reference, *result.ladders]
        for i, each in enumerate(ladders):
            if any(r.median_ms is not None for r in each.rungs):
                _ladder.waterfall(each, _numbered(plot_path, i, len(ladders)))
    if result.failures:
        raise typer.Exit(1)


@app.command()
def analyze(
    trace: Path = typer.Argument(..., help="A torch.profiler trace (.json or .json.gz)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the analysis as JSON."),
    html_path: Optional[Path] = typer.Option(None, "--html", help="Write a self-contained HTML report."),
    top: int = typer.Option(10, min=1, help="Rows per table in the terminal summary."),
    verify: bool = typer.Option(False, "--verify", help="Measure each finding's fix on this machine's GPU "
                                "(see roofline profile --verify)."),
):
    """Analyze a trace recorded earlier (by roofline profile --trace, or torch.profiler's export_chrome_trace)."""
    from roofline.profiler.report import analyze as run_analysis
    from roofline.profiler.trace import TraceError

    try:
        report = run_analysis(trace)
    except TraceError as exc:
        err.print(f"roofline: {exc}")
        raise typer.Exit(2)
    if not report.attribution.work:
        err.print(f"roofline: nothing to analyze: {trace} holds no PyTorch operations or GPU activity")
        raise typer.Exit(2)
    if verify:
        _verify(report)
    _show_report(report, json_path, html_path, top)


@app.command()
def inspect(
    target: str = typer.Argument(..., help="FILE_OR_MODULE:FUNCTION: a function of no arguments that launches the "
                                 "Triton kernels to inspect (roofline's ops, or kernels of your own); "
                                 "FILE_OR_MODULE:KERNEL, a Triton kernel, with --args and --grid; or an op of "
                                 "roofline.ops by name, with --shape; with --kernel, a trace."),
    args: Optional[str] = typer.Option(None, "--args", help="With a Triton kernel as TARGET: its arguments in order, "
                                       "then by name: tensors as DTYPE[SIZES] (random), numbers, strings, "
                                       "NAME=VALUE for constexprs and num_warps, e.g. 'bf16[128x64] 128 BLOCK=64'."),
    grid: Optional[str] = typer.Option(None, "--grid", help="With a Triton kernel as TARGET: its grid, e.g. 4x4."),
    shape: Optional[str] = typer.Option(None, "--shape", help="With an op as TARGET: its sizes, e.g. 4096x4096 "
                                        "(what they mean is the op's: the error says it)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="With an op as TARGET: bf16 (the default), fp16 "
                                        "or fp32."),
    backward: bool = typer.Option(False, "--backward", help="With an op as TARGET: its backward's kernels too."),
    arch: Optional[str] = typer.Option(None, help="The GPU to compile for, e.g. sm_90 (default: this machine's GPU, "
                                       "else sm_90)."),
    sms: Optional[int] = typer.Option(None, min=1, help="The GPU's SM count, for the findings about the grid "
                                      "(default: this machine's GPU's)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write every kernel's report as JSON."),
    html_path: Optional[Path] = typer.Option(None, "--html", help="Write a page: each kernel's source beside what "
                                             "each line compiled to, its findings, PTX and SASS."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write each kernel's TTIR, TTGIR, LLVM IR, PTX and SASS "
                                       "(with its source lines) into this folder."),
    top: int = typer.Option(8, min=1, help="Source lines shown per kernel, and kernels of torch.compile's shown "
                            "with their lines."),
    compile: bool = typer.Option(False, "--compile", help="Run the function under torch.compile (a function that "
                                 "compiles its own modules needs no flag)."),
    runs: int = typer.Option(3, min=1, help="Runs timing torch.compile's kernels."),
    ncu: bool = typer.Option(False, "--ncu", help="Run the function again under Nsight Compute (on a GPU) and show "
                             "where each kernel's warps waited, line by line, and why."),
    kernel: Optional[str] = typer.Option(None, "--kernel", help="With a trace as TARGET (roofline profile --trace, "
                                         "or torch.profiler's): that kernel, looked inside from the binary the "
                                         "program ran, read from Triton's cache."),
    cache: Optional[list[Path]] = typer.Option(None, "--cache", help="With --kernel: where the program's Triton "
                                               "kernels were cached (default: TRITON_CACHE_DIR or ~/.triton/cache, "
                                               "and Inductor's)."),
):
    """Look inside the Triton kernels a function launches: registers, spills, shared memory, occupancy and what
    limits it, the instruction mix, and the source lines the machine code comes from. Without a GPU, the kernels
    run through Triton's interpreter and are compiled here for --arch. Every kernel torch.compile generates for
    the function is listed with its time, the lines of yours it fused, and (on a GPU) the same view of its code.
    An op of roofline.ops named as TARGET is called at --shape, on random inputs (its backward too, with
    --backward). With --kernel, TARGET is a trace, and the kernel of that name is read from the binary Triton
    cached.

    \b
        roofline inspect rms_norm --shape 8192x4096 --backward
        roofline inspect train.py:step --compile
        roofline inspect k.py:add --args 'fp32[64] fp32[64] 64 BLOCK=64' --grid 1"""
    import torch

    if kernel is not None:
        if ncu or compile or arch is not None or shape is not None or dtype is not None or backward or args or grid:
            raise typer.BadParameter("reads a kernel of a trace from the binary the program ran: --ncu, --compile, "
                                     "--arch, --shape, --dtype, --backward, --args and --grid are for a function, "
                                     "a kernel or an op",
                                     param_hint="--kernel")
        _write_inspection(_inspect_trace(target, kernel, cache, sms), f"roofline inspect {target} --kernel {kernel}",
                          top, json_path, html_path, out)
        return
    if cache:
        raise typer.BadParameter("is where --kernel finds the binaries of a trace's kernel", param_hint="--cache")

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")   # before the target's kernels are made
    from roofline.inspect.kernels import target as gpu_target

    try:
        gpu_target(arch)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--arch") from exc
    if ncu:
        from roofline.profiler.ncu import binary as ncu_binary

        if not torch.cuda.is_available() or arch is not None:
            raise typer.BadParameter("samples the kernels as this machine's GPU runs them: it needs a CUDA GPU, "
                                     "and no --arch", param_hint="--ncu")
        if ncu_binary() is None:
            raise typer.BadParameter("Nsight Compute (ncu) is not installed here", param_hint="--ncu")
    title = f"roofline inspect {target}"
    with tempfile.TemporaryDirectory(prefix="roofline-op-") as folder:
        op = ":" not in target
        if op:   # an op by name, run as a function of its own, so that ncu can run it too
            dtype = dtype or "bf16"
            title += f" --shape {shape} --dtype {dtype}" + (" --backward" if backward else "")
            target = _op_target(target, shape, dtype, backward, Path(folder))
        elif shape is not None or dtype is not None or backward:
            raise typer.BadParameter("are for an op of roofline.ops named as TARGET",
                                     param_hint="--shape/--dtype/--backward")
        launched = not op and (args is not None or grid is not None)
        if launched:   # a Triton kernel, launched once on example arguments by a function of its own
            title += f" --args {args!r} --grid {grid}"
            target = _kernel_target(target, args, grid, Path(folder))
        try:
            _inspect_function(target, title, compile, arch, sms, runs, ncu, top, json_path, html_path, out)
        except TypeError as exc:   # the kernel does not take these arguments (Triton's binding says which)
            if not launched:
                raise
            raise typer.BadParameter(str(exc), param_hint="--args") from None
        except ValueError as exc:   # the op refused the shape (a head_dim it does not take, an odd one for rope)
            if not op:
                raise
            raise typer.BadParameter(f"{shape!r}: {exc}", param_hint="--shape") from None


def _is_kernel(obj) -> bool:
    from triton.runtime.jit import KernelInterface

    return isinstance(obj, KernelInterface)


_KERNEL_ARGS_EXAMPLE = "--args 'fp32[4096] fp32[4096] 4096 BLOCK=1024' --grid 4"


def _kernel_target(target: str, args: str | None, grid: str | None, folder: Path) -> str:
    """roofline inspect FILE:KERNEL --args --grid: the kernel launched once (inspect.example_launch), as a
    FILE:FUNCTION target written into `folder`; usage errors name the option."""
    from roofline.inspect import example_launch

    if not _is_kernel(_load_name(target, object)):
        raise typer.BadParameter("are for a Triton kernel (@triton.jit) named as TARGET", param_hint="--args/--grid")
    for given, option, parse in ((args, "--args", example_launch.parse_args),
                                 (grid, "--grid", example_launch.parse_grid)):
        if given is None:
            raise typer.BadParameter(f"a kernel as TARGET needs {option}, e.g. {_KERNEL_ARGS_EXAMPLE}",
                                     param_hint=option)
        try:
            parse(given)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint=option) from None
    where, name = target.rsplit(":", 1)
    if where.endswith(".py") or "/" in where:
        where = str(Path(where).resolve())   # the function's file lies elsewhere
    path = folder / f"{name}_launch.py"
    path.write_text("from roofline.inspect.example_launch import launch\n\n\ndef kernel():\n"
                    f"    launch({where + ':' + name!r}, {args!r}, {grid!r})\n")
    return f"{path}:kernel"


def _op_target(name: str, shape: str | None, dtype: str, backward: bool, folder: Path) -> str:
    """roofline inspect OP --shape: the op called at that shape (roofline.ops.examples), as a FILE:FUNCTION target
    written into `folder`; usage errors name the option."""
    from roofline.ops.examples import EXAMPLES

    if name not in EXAMPLES:
        raise typer.BadParameter(f"{name!r} is neither FILE_OR_MODULE:FUNCTION nor an op of roofline.ops "
                                 f"({', '.join(sorted(EXAMPLES))})", param_hint="TARGET")
    example = EXAMPLES[name]
    if shape is None:
        raise typer.BadParameter(f"an op needs its sizes: {example.shape_means}", param_hint="--shape")
    try:
        sizes = tuple(int(s) for s in shape.lower().split("x"))
        example.check(sizes)
    except ValueError as exc:
        raise typer.BadParameter(f"{shape!r}: {example.shape_means}, as positive sizes joined by x ({exc})",
                                 param_hint="--shape") from None
    dtypes = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
              "fp32": "float32", "float32": "float32"}
    if dtype.lower() not in dtypes:
        raise typer.BadParameter(f"{dtype!r}: one of bf16, fp16, fp32", param_hint="--dtype")
    path = folder / f"{name}_op.py"
    path.write_text("import torch\nfrom roofline.ops.examples import run\n\n\ndef op():\n"
                    f"    return run({name!r}, {sizes!r}, device='cuda' if torch.cuda.is_available() else 'cpu',\n"
                    f"               dtype=torch.{dtypes[dtype.lower()]}, backward={backward!r})\n")
    return f"{path}:op"


def _inspect_function(target: str, title: str, compile: bool, arch, sms, runs: int, ncu: bool, top: int, json_path,
                      html_path, out) -> None:
    """inspect FILE:FUNCTION: the kernels the function launches (and torch.compile's, with --compile or where it
    compiles its own), and with --ncu where their warps waited."""
    import torch

    from roofline.inspect.report import inspect_function, stall_findings

    fn = _load_name(target, object)   # every object is a `kind` of object: the function loaded, not called
    if _is_kernel(fn):   # loaded once here: a kernel is launched by a function of its own (_kernel_target)
        raise typer.BadParameter(f"a kernel as TARGET needs --args and --grid, e.g. {_KERNEL_ARGS_EXAMPLE}",
                                 param_hint="--args")
    if not callable(fn):
        raise typer.BadParameter(f"{target} must be a function", param_hint="TARGET")
    found = inspect_function(torch.compile(fn) if compile else fn, arch=arch, sms=sms, runs=runs)
    if ncu:
        from roofline.inspect import stalls

        reports = found.launched + [k.report for k in found.made if k.report is not None]
        names = [r.name for r in reports if hasattr(r, "stalls")]
        try:   # a failing ncu run loses the stalls, not the inspection
            given = stalls.attach(reports, stalls.measure(target, names, compile)) if names else 0
            if names and not given:
                err.print("roofline: --ncu: ncu sampled none of the kernels inspected")
            for r in reports:
                if getattr(r, "stalls", None) is not None:
                    r.findings += stall_findings(r)
        except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
            err.print(f"roofline: --ncu: {exc}")
    _write_inspection(found, title, top, json_path, html_path, out)


def _inspect_trace(trace: str, kernel: str, cache: list[Path] | None, sms: int | None):
    """inspect --kernel: the trace's kernel of that name, from the binaries Triton cached for it."""
    from roofline.inspect.cached import inspect_trace
    from roofline.inspect.report import Inspection
    from roofline.profiler.trace import TraceError

    if not Path(trace).is_file():
        raise typer.BadParameter(f"{trace} is not a file: with --kernel, TARGET is a trace", param_hint="TARGET")
    for folder in cache or []:
        if not folder.is_dir():
            raise typer.BadParameter(f"{folder} is not a folder", param_hint="--cache")
    try:
        seen, reports = inspect_trace(trace, kernel, cache, sms)
    except TraceError as exc:
        raise typer.BadParameter(str(exc), param_hint="TARGET") from exc
    except ValueError as exc:
        err.print(f"roofline: {exc}")
        raise typer.Exit(2)
    grids = ", ".join("x".join(map(str, g)) for g in seen.grids[:3] if g) or "?"
    console.print(f"{kernel}: {seen.count} launch{'es' if seen.count != 1 else ''} in the trace, "
                  f"{seen.total_us / 1e3:,.3f} ms on the GPU; grid {grids}, {seen.threads or '?'} threads a block, "
                  f"{seen.registers if seen.registers is not None else '?'} registers a thread; "
                  + ("its binary read from Triton's cache" if len(reports) == 1 else
                     f"{len(reports)} binaries of it in Triton's cache match these launches, the latest first"),
                  highlight=False)
    return Inspection(reports, [])


def _write_inspection(found, title: str, top: int, json_path, html_path, out) -> None:
    from roofline.inspect.report import render, write_sections

    render(found, console, top)
    if json_path:
        json_path.write_text(json.dumps(found.to_dict(), indent=1))
        console.print(f"report written to {json_path}", highlight=False)
    if html_path:
        from roofline.inspect.html import render as render_html

        html_path.write_text(render_html(found, title))
        console.print(f"page written to {html_path}", highlight=False)
    if out:
        written = write_sections(found, out)
        console.print(f"{len(written)} files of code written to {out}", highlight=False)


if __name__ == "__main__":
    app()
