"""Whole models as the benchmark: a training step and token-by-token generation of GPT-2 small and a Llama-style
model (examples/models), and of transformers' own LlamaForCausalLM and Qwen2ForCausalLM built from a config
(hf-llama, hf-qwen2: hf_models.py; decoding through their DynamicCache, a StaticCache under CUDA graphs and
compile), eager and patched, compiled, under CUDA
graphs and with int8 weights, side by side in one run. The third level of every speed claim: an op that wins alone
but not here has not won.

    python benchmarks/models.py OUT_DIR [--models gpt2 llama] [--train MODE ...] [--generate MODE ...]
                                [--batches 1 8] [--steps 10] [--warmup 10] [--tokens 64] [--tiny]
                                [--train-tokens 8 1024]

Training (bf16 autocast, fp32 weights, fused AdamW; batch 8 x 1024 tokens unless --train-tokens says otherwise;
the model computes its loss, F.cross_entropy, in its forward, as nanoGPT's does):
  eager            the model as written
  patch            roofline.patch(model): each norm, GELU, SwiGLU gate, RoPE, attention and loss call served by
                   roofline's kernel only where measured faster here (the decisions are in the JSON)
  patch-all        roofline.patch(model, policy="always"): every call roofline can serve, faster or not
  patch-all+tiled  the same with flash_attention's Hopper kernels off (ROOFLINE_SM90_ATTENTION=0) during its own
                   turns only: against patch-all, what they bring where they are routed (head_dim 128, as
                   hf-llama-hd128's, on a Hopper GPU)
  liger            Liger-Kernel on transformers' models (its RMSNorm, SwiGLU, RoPE and fused linear
                   cross-entropy; the wheel carried to the GPU machine), in force during its own turns only
  compile          torch.compile(model)
  compile+patch    roofline.patch, then torch.compile: under compile patch leaves every call to Inductor
  graphs           the whole step (forward, backward, optimizer) captured as one CUDA graph and replayed: the
                   GPU's work alone, with no host time per step
  graphs+patch     the same with roofline.patch
Generation (bf16 weights, a KV cache (the examples' static one; transformers' own), one token a step after a
32-token prompt; batch 1 and 8):
  eager, patch, patch-all, liger, graphs, graphs+patch as above (graphs: one decode step captured), int8,
  int8+patch, int8+graphs and int8+graphs+patch (roofline.quantize_int8_weight_only: every nn.Linear int8
  weight-only, the LM head too), compile (torch.compile(mode="reduce-overhead"), which is Inductor plus CUDA
  graphs) and compile+patch (roofline.patch first: under compile it leaves every call to Inductor).
Every mode is made ready first (training: built, patched, compiled or captured, warmed up; generation: the
prompt prefilled too), then the modes take turns (TURNS turns of steps / TURNS steps or tokens / TURNS tokens
each, the order reversed every other turn), so that a drift of the machine's speed (an eager decode step is bound
by its host's) falls on every mode alike. Every mode's model stays in memory meanwhile: for transformers' Llama,
about 8 GB of weights and AdamW state a training mode.

Every mode starts from the same weights and sees the same tokens: generation feeds a fixed random sequence
(teacher forcing), so that every mode's logits can be compared with eager's at every step; a step costs what a
greedy decoding step costs, less one argmax. Checked: training losses within 1% of eager's at the first 3 steps
compared (later ones reported); generation logits within a relative error (norm) of 3% of eager's, 15% for
int8. Times: CUDA events between consecutive steps with no synchronization in between (host time shows wherever
the GPU waits for it); the median step, and the speedup over eager with a 95% interval. It is paired by
turn: each turn's ratio of medians, the speedup their median and the interval the sign test's over turns
(roofline.bench.stats.speedup_ci with rounds), as the host's speed drifts from turn to turn by more than an
interval over independent samples shows (a GPT-2 decode step's rounds spread from 4.0 to 7.0 ms on the H100
machine); with fewer turns than the test needs, a bootstrap of the samples. Memory (torch.cuda's peak
allocated, less what the other modes hold), training: over the timed steps ("peak GiB"; under CUDA graphs the
capture's, whose memory the graph keeps), and over what came before them ("warm-up": compiling, capturing, patch
measuring its routes); generation: the memory the mode holds once ready ("held GiB": weights, KV cache, a graph's
tensors).
Writes OUT_DIR/models.json and models.md. --tiny: small configs on whatever device there is (the CPU test).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import roofline  # noqa: E402
from roofline import routing  # noqa: E402
from roofline.ops import attention  # noqa: E402
from roofline.bench.stats import min_rounds, speedup_ci  # noqa: E402
from examples.models.gpt2 import GPT2, GPT2Config  # noqa: E402
from examples.models.llama import Llama, LlamaConfig  # noqa: E402
from roofline.bench.steps import CAPTURE_WARMUP, StepTimer, capture  # noqa: E402
import hf_models  # noqa: E402  (beside this file)

MODELS = {
    "gpt2": (GPT2, GPT2Config(), GPT2Config(vocab_size=96, max_seq=64, n_layer=2, n_head=2, d_model=32)),
    "llama": (Llama, LlamaConfig(), LlamaConfig(vocab_size=96, max_seq=64, n_layer=2, n_head=4, n_kv_head=2,
                                                 d_model=64, intermediate_size=96)),
}
TRAIN_MODES = ("eager", "patch", "patch-all", "patch-all+tiled", "liger", "compile", "compile+patch", "graphs",
               "graphs+patch")
GENERATE_MODES = ("eager", "patch", "patch-all", "liger", "graphs", "graphs+patch", "int8", "int8+patch",
                  "int8+graphs", "int8+graphs+patch", "compile", "compile+patch")
MODEL_NAMES = (*MODELS, *hf_models.FAMILIES)
LOSS_TOLERANCE = 0.01
CHECKED_STEPS = 3
TURNS = 8            # generation: the modes take turns, each decoding tokens / TURNS tokens a turn
LOGITS_TOLERANCE = {"int8": 0.15}
PROMPT = 32
WARMUP = routing.SETTLE_CALLS + 2   # steps before timing (default): lazy decisions made, patch's routes settled


def _sizes(args) -> dict:
    """The training batch and sequence (--train-tokens where given; decode_ab.py's arguments have none) and the
    generation prompt's length."""
    sizes = dict(train_batch=2, train_seq=16, prompt=8) if args.tiny else dict(train_batch=8, train_seq=1024,
                                                                              prompt=PROMPT)
    if getattr(args, "train_tokens", None):
        sizes["train_batch"], sizes["train_seq"] = args.train_tokens
    return sizes


def build(name: str, tiny: bool, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.device(device):
        if name in hf_models.FAMILIES:
            return hf_models.build(name, tiny)
        cls, config, tiny_config = MODELS[name]
        return cls(tiny_config if tiny else config)


def _liger(model, mode: str):
    """Liger-Kernel on transformers' models (hf_models.Liger, in force while its mode runs) for the liger mode;
    else None."""
    if mode != "liger":
        return None
    if not isinstance(model, hf_models.CausalLM):
        raise ValueError("the liger mode serves transformers' models (hf-llama, hf-qwen2), as Liger-Kernel does")
    return hf_models.Liger(model)


@contextlib.contextmanager
def _in_force(liger, mode: str):
    """What a mode changes outside its model, in force while it runs: Liger-Kernel's replacements (a Liger of
    _liger, or None), and for a "+tiled" mode flash_attention's Hopper kernels switched off."""
    switched = attention.SM90_ATTENTION
    if mode.endswith("+tiled"):
        attention.SM90_ATTENTION = False
    try:
        with liger.active() if liger is not None else contextlib.nullcontext():
            yield
    finally:
        attention.SM90_ATTENTION = switched


def _patch(model, mode: str):
    """roofline.patch's report for the patch modes, None for the others."""
    if "patch" not in mode:
        return None
    return roofline.patch(model, policy="always" if mode.startswith("patch-all") else "faster")


JUDGING_STEPS = 400   # steps at most that a patch mode warms up further while its ops are on trial in the program


def _until_judged(report, run, mode: str) -> list[str]:
    """Run more warm-up steps while patch's program check has ops on trial (roofline.program_check): a timed step
    must not be half of a trial, served by torch. Returns the ops still unjudged when JUDGING_STEPS ran out (the
    trial then goes on into the timed steps). Under torch.compile no trial can run (Inductor serves the compiled
    step's calls, whatever patch would): nothing to wait for."""
    if mode.startswith("compile"):
        return []
    steps = 0
    while report is not None and report.check is not None and report.check.pending() and steps < JUDGING_STEPS:
        run()
        steps += 1
    return report.check.unjudged() if report is not None and report.check is not None else []


def _patch_fields(report, unjudged=(), mode: str = "") -> dict:
    """A row's routes (who served each call signature, read after the run), swapped and left; and the verdicts,
    with the ops still unjudged when the timing began. Under torch.compile the routes are those of the calls made
    eagerly (generation: the prompt's prefill): the compiled steps' are Inductor's."""
    if report is None:
        return dict(routes=None, swapped=None, left=None, settled=None, verdicts=None)
    verdicts = [str(v) for v in report.check.verdicts.values()] if report.check else []
    verdicts += [f"{op}: not judged before the timing began (timed half served by torch)" for op in unjudged]
    if mode.startswith("compile"):
        verdicts.append("none judged: under torch.compile Inductor serves every call of the timed steps; patch's "
                        "routes served only calls made eagerly (generation's: the prompt's prefill)")
    return dict(routes=report.router.report(), swapped=[list(s) for s in report.swapped],
                left=[list(s) for s in report.left], settled=report.settled(), verdicts=verdicts)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def _peak_above(device: torch.device, others: int) -> float | None:
    """The peak of memory in use since _reset_peak, less `others` bytes held meanwhile by other modes (GiB; None
    on a CPU)."""
    return (torch.cuda.max_memory_allocated(device) - others) / 2**30 if device.type == "cuda" else None


# --------------------------------------------------------------------------- training

def _time_turn(mode, n: int, step) -> None:
    """A turn of a mode (a Training or a Decoding): step() n times, each timed, counted in mode.done, its times
    added to mode.samples and their count to mode.turns."""
    timer = StepTimer(mode.device)
    timer.mark()
    for _ in range(n):
        step()
        mode.done += 1
        timer.mark()
    samples = timer.samples_ms()
    mode.samples += samples
    mode.turns.append(len(samples))


class Training:
    """One mode's training, made ready (the model built, patched or given Liger-Kernel, compiled or captured as the
    mode says, warm-up steps run, patch's judge done), then stepped a few steps at a time in turns with the other
    modes: steps(n) runs its next n steps, each timed.

    Every mode's model stays in memory while the others take their turns (weights and optimizer state; gradients
    are dropped between turns). Its peak is counted above what the others hold: the memory in use when its turn
    or its making began, less its own."""

    def __init__(self, name: str, mode: str, args):
        self.mode, self.device = mode, args.device
        cuda = self.device.type == "cuda"
        self.others = _allocated(self.device)
        _reset_peak(self.device)
        start = time.perf_counter()
        model = build(name, args.tiny, self.device)
        self.liger = _liger(model, mode)
        with _in_force(self.liger, self.mode):
            self._ready(model, mode, args, _sizes(args), cuda)
        self.setup_s = time.perf_counter() - start
        self.warmup_peak_gib = _peak_above(self.device, self.others)
        self._drop_gradients()
        self.held = _allocated(self.device) - self.others
        self.peak_gib = self.warmup_peak_gib if self.graphs else None
        self.samples, self.turns, self.done = [], [], 0

    def _ready(self, model, mode: str, args, sizes: dict, cuda: bool) -> None:
        self.patched = _patch(model, mode)
        self.graphs = graphs = mode.startswith("graphs")
        optimizer = self.optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=cuda, capturable=graphs)
        forward = torch.compile(model) if mode.startswith("compile") else model
        generator = torch.Generator(self.device).manual_seed(1)   # every mode sees the same batch
        vocab = model.config.vocab_size
        idx, targets = (torch.randint(0, vocab, (sizes["train_batch"], sizes["train_seq"]), device=self.device,
                                      generator=generator) for _ in range(2))
        self.batch, self.seq = sizes["train_batch"], sizes["train_seq"]

        def step():
            optimizer.zero_grad(set_to_none=True)   # in a capture, backward then writes the graph's own gradients
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=cuda, cache_enabled=not graphs):
                loss = forward(idx, targets=targets)[1]   # the logits go as soon as the loss is computed
            loss.backward()
            optimizer.step()
            return loss.detach()

        self.losses, self.unjudged = [], []
        if graphs:
            self.run = capture(step)
        else:
            self.run = step
            for _ in range(args.warmup):
                self.losses.append(step().clone())
            # steps patch's judge asks for count as steps: the losses stay comparable with eager's step by step
            self.unjudged = _until_judged(self.patched, lambda: self.losses.append(step().clone()), mode)

    def _drop_gradients(self) -> None:
        """Between turns, the other modes' memory; a captured step keeps its own (the graph writes them)."""
        if not self.graphs:
            self.optimizer.zero_grad(set_to_none=True)

    def steps(self, n: int) -> None:
        others = _allocated(self.device) - self.held
        _reset_peak(self.device)
        with _in_force(self.liger, self.mode):
            _time_turn(self, n, lambda: self.losses.append(self.run().clone()))
        peak = _peak_above(self.device, others)
        # a CUDA graph's memory was taken at its capture, and its replays allocate nothing
        if peak is not None and not self.graphs:
            self.peak_gib = max(self.peak_gib or 0.0, peak)
        self._drop_gradients()

    def row(self, name: str) -> dict:
        median = statistics.median(self.samples)
        return dict(model=name, mode=self.mode, batch=self.batch, seq=self.seq, samples_ms=self.samples,
                    turns=self.turns, median_ms=median, tokens_per_s=self.batch * self.seq / median * 1e3,
                    peak_gib=self.peak_gib, warmup_peak_gib=self.warmup_peak_gib, warmup_s=self.setup_s,
                    losses=[float(x) for x in torch.stack(self.losses).float().cpu()],
                    first_step=CAPTURE_WARMUP if self.graphs else 0,
                    **_patch_fields(self.patched, self.unjudged, self.mode))


def train(name: str, modes, args) -> list[dict]:
    """Rows of every mode's training, the modes stepping in turns (TURNS of them, the order reversed every other
    turn) so that a drift of the machine's speed falls on all."""
    _free(args.device)
    return _in_turns(name, modes, lambda mode: Training(name, mode, args), args.steps, "training")


def _check_losses(rows: list[dict]) -> None:
    """Each row's losses against eager's, step by step. Checked: the first CHECKED_STEPS steps the row recorded
    (the graphs modes record from their first replay, step CAPTURE_WARMUP), each within LOSS_TOLERANCE of eager's.
    Later steps are reported, not checked: the batch is memorized within a dozen steps, and in that steep
    descent bf16 rounding (and the backward's atomics: compile against itself) spread losses by a few percent,
    where a wrong gradient moves the loss by far more at the first step after it."""
    eager = next((r for r in rows if r["mode"] == "eager" and "error" not in r), None)
    for row in rows:
        if "error" in row:
            continue
        if eager is None:
            row["loss_error"] = row["loss_spread"] = row["numerics_ok"] = None
            continue
        first = row["first_step"]
        eager_losses = eager["losses"][first:first + len(row["losses"])]
        errors = [abs(a - b) / abs(b) for a, b in zip(row["losses"], eager_losses)]
        row["loss_error"], row["loss_spread"] = max(errors[:CHECKED_STEPS]), max(errors)
        row["numerics_ok"] = row["loss_error"] <= LOSS_TOLERANCE


# --------------------------------------------------------------------------- generation

class Decoding:
    """One mode's generation, made ready (the model built, patched, quantized, compiled or captured as the mode
    says, the prompt prefilled, warm-up steps run), then decoded a few tokens at a time, in turns with the other
    modes: steps(n) decodes its next n tokens, each timed. patch(model, mode) patches it (_patch: as the mode
    says); the liger mode's Liger-Kernel is in force while it is made ready and during its turns."""

    def __init__(self, name: str, mode: str, batch: int, args, patch=None):
        self.mode, self.batch, self.device = mode, batch, args.device
        cuda = self.device.type == "cuda"
        before = torch.cuda.memory_allocated() if cuda else 0
        start = time.perf_counter()
        self.model = build(name, args.tiny, self.device).to(torch.bfloat16).eval()
        self.liger = _liger(self.model, mode)
        with _in_force(self.liger, self.mode):
            self._ready(self.model, mode, batch, args, patch or _patch)
        self.setup_s = time.perf_counter() - start
        self.held_gib = (torch.cuda.memory_allocated() - before) / 2**30 if cuda else None
        self._restart()

    def _ready(self, model, mode: str, batch: int, args, patch) -> None:
        self.patched = patch(model, mode)   # first: patch finds SwiGLU MLPs by their nn.Linear children
        if mode.startswith("int8"):
            roofline.quantize_int8_weight_only(model)
        self.prompt = prompt = _sizes(args)["prompt"]
        # CUDA graphs (ours, or compile's reduce-overhead) replay a step: transformers' models take a StaticCache
        compiled = mode.startswith("compile")
        model.setup_cache(batch, prompt + args.tokens, torch.bfloat16,
                          **({"static": "graphs" in mode or compiled} if isinstance(model, hf_models.CausalLM) else {}))
        generator = torch.Generator(self.device).manual_seed(2)   # every mode sees the same tokens
        self.sequence = torch.randint(0, model.config.vocab_size, (batch, prompt + args.tokens), device=self.device,
                                      generator=generator)
        self.positions = torch.arange(prompt + args.tokens, device=self.device)
        forward = torch.compile(model, mode="reduce-overhead", fullgraph=True) if compiled else model
        self.token = self.sequence[:, prompt:prompt + 1].clone()
        self.position = self.positions[prompt:prompt + 1].clone()

        def decode():
            return forward(self.token, self.position)[:, -1]

        # transformers' models decode through their own cache, a DynamicCache cropped to the position decoded (the
        # host's count: warm-up decodes one position again and again) or a StaticCache written at it; the
        # examples' caches are static
        self.cropped = isinstance(model, hf_models.CausalLM)
        self.unjudged: list[str] = []   # patch's ops still unjudged when the timing began
        with torch.inference_mode():
            self._warm_up(model, mode, args, decode)

    def _warm_up(self, model, mode: str, args, decode) -> None:
        """The prompt prefilled, then the decode step captured as a CUDA graph or warmed up (and patch's ops
        judged)."""
        model(self.sequence[:, :self.prompt], self.positions[:self.prompt])     # prefill
        if self.cropped:
            model.at = self.prompt
        if "graphs" in mode:
            self.run = capture(decode)
            return
        self.run = decode
        for _ in range(args.warmup):
            decode()
        if self.cropped and not model.static:   # a DynamicCache grows a key a step: a new call
            self._restart()    # signature for patch to decide, so the steady state is a second pass
            self.steps(args.tokens)
            self.model.at = self.prompt
        self.unjudged = _until_judged(self.patched, decode, mode)

    def _restart(self) -> None:
        """No token decoded yet, nothing timed."""
        self.logits, self.samples, self.done = [], [], 0
        self.turns: list[int] = []   # samples taken in each turn, in order

    def steps(self, n: int) -> None:
        """Decode the next n tokens, each timed."""
        def step():
            i = self.prompt + self.done
            self.token.copy_(self.sequence[:, i:i + 1])
            self.position.copy_(self.positions[i:i + 1])
            if self.cropped:
                self.model.at = i
            self.logits.append(self.run().clone())

        with _in_force(self.liger, self.mode), torch.inference_mode():
            _time_turn(self, n, step)

    def row(self, name: str) -> dict:
        median = statistics.median(self.samples)
        return dict(model=name, mode=self.mode, batch=self.batch, samples_ms=self.samples, turns=self.turns,
                    median_ms=median,
                    tokens_per_s=self.batch / median * 1e3, held_gib=self.held_gib, warmup_s=self.setup_s,
                    logits=torch.stack(self.logits).float(), **_patch_fields(self.patched, self.unjudged, self.mode))


def generate(name: str, modes, batch: int, args) -> list[dict]:
    """Rows of every mode's generation, the modes decoding in turns (TURNS of them, the order reversed every
    other turn) so that a drift of the host's speed, which an eager decode step is bound by, falls on all."""
    _free(args.device)
    return _in_turns(name, modes, lambda mode: Decoding(name, mode, batch, args), args.tokens,
                     f"generation, batch {batch}")


def _in_turns(name: str, modes, make, total: int, what: str) -> list[dict]:
    """Every mode made ready by make(mode), then its `total` steps run in TURNS turns, a turn's share each (the
    order reversed every other turn); a row per mode, in the order asked, or the row of how it failed."""
    ready, failed = [], {}
    for mode in modes:
        print(f"== {name} {what}: {mode}", flush=True)
        try:
            ready.append(make(mode))
        except Exception as exc:  # noqa: BLE001 - reported in the results, and the exit status
            failed[mode] = _failure(name, mode, exc)
    per_turn = -(-total // TURNS)
    for turn in range(TURNS):
        for r in ready if turn % 2 == 0 else ready[::-1]:
            if r.mode in failed or r.done >= total:
                continue
            try:
                r.steps(min(per_turn, total - r.done))
            except Exception as exc:  # noqa: BLE001
                failed[r.mode] = _failure(name, r.mode, exc)
    rows = {r.mode: r.row(name) for r in ready if r.mode not in failed}
    del ready
    return [failed.get(mode) or rows[mode] for mode in modes]


def _check_logits(rows: list[dict]) -> None:
    """Each row's logits at every step against eager's: relative error as a norm over all of them."""
    eager = next((r["logits"] for r in rows if r["mode"] == "eager" and "error" not in r), None)
    for row in rows:
        if "error" in row:
            continue
        logits = row.pop("logits")
        if eager is None:
            row["logits_error"], row["numerics_ok"] = None, None
            continue
        error = ((logits - eager).norm() / eager.norm()).item()
        row["logits_error"] = error
        row["numerics_ok"] = error <= LOGITS_TOLERANCE.get(row["mode"].split("+")[0], 0.03)


# --------------------------------------------------------------------------- speedups and output

def _speedups(rows: list[dict], against: str, column: str) -> None:
    base = next((r for r in rows if r["mode"] == against and "error" not in r), None)
    for row in rows:
        if "error" in row:
            continue
        if base is None or len(row["samples_ms"]) < 2:
            row[column] = None
            continue
        turns = base.get("turns"), row.get("turns")
        paired = None not in turns and len(turns[0]) == len(turns[1]) >= min_rounds(0.95)
        s = speedup_ci(base["samples_ms"], row["samples_ms"], rounds=turns if paired else None)
        row[column] = dict(ratio=s.ratio, low=s.low, high=s.high, paired=paired)


def _x(s: dict | None) -> str:
    return "" if s is None else f"{s['ratio']:.3f}x ({s['low']:.3f}-{s['high']:.3f})"


def _served(row: dict) -> str:
    """Who served each op's calls; under torch.compile those made eagerly (the compiled steps' are Inductor's)."""
    if row["routes"] is None:
        return ""
    by_op = {}
    for r in row["routes"]:
        by_op.setdefault(r["op"], set()).add(r["served_by"])
    served = ", ".join(f"{op}: {'/'.join(sorted(who))}" for op, who in sorted(by_op.items()))
    return f"eager calls only: {served}" if served and row["mode"].startswith("compile") else served


def _check_mark(row) -> str:
    return {True: "ok", False: "**differs**", None: "-"}[row["numerics_ok"]]


def markdown(result: dict) -> str:
    env = result["environment"]
    out = [f"# Whole models: training step and generation ({env['gpu']})", "",
           f"{env['date']}; torch {env['torch']}, triton {env['triton']}. Command: `{env['command']}`", ""]
    for name, rows in result["train"].items():
        out += [f"## {name}: training step (batch {rows[0]['batch']} x {rows[0]['seq']} tokens, bf16 autocast, "
                "fused AdamW)", "",
                "| mode | ms/step | vs eager (95% CI) | vs compile | tokens/s | peak GiB | warm-up: s, peak GiB | "
                "loss vs eager: 3 steps, all | served |", "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if "error" in r:
                out.append(f"| {r['mode']} | failed: {r['error']} ||||||||")
                continue
            error = "" if r["loss_error"] is None else \
                f"{r['loss_error']:.1e} {_check_mark(r)}, {r['loss_spread']:.1e}"
            out.append(f"| {r['mode']} | {r['median_ms']:.2f} | {_x(r['vs_eager'])} | "
                       f"{_x(r['vs_compile']) if r['mode'].startswith('compile') else ''} | {r['tokens_per_s']:,.0f} | "
                       f"{_gib(r['peak_gib'])} | {r['warmup_s']:.1f}, {_gib(r['warmup_peak_gib'])} | {error} | "
                       f"{_served(r)} |")
        out.append("")
    for name, rows in result["generate"].items():
        out += [f"## {name}: generation, one token a step (bf16, KV cache)", "",
                "| batch | mode | ms/token | vs eager (95% CI) | vs graphs or compile | tokens/s | set-up s | "
                "held GiB | logits vs eager | served |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if "error" in r:
                out.append(f"| {r['batch']} | {r['mode']} | failed: {r['error']} ||||||||")
                continue
            error = "" if r["logits_error"] is None else f"{r['logits_error']:.1e} {_check_mark(r)}"
            out.append(f"| {r['batch']} | {r['mode']} | {r['median_ms']:.3f} | {_x(r['vs_eager'])} | "
                       f"{_x(r['vs_compile'] if r['mode'].startswith('compile') else r['vs_graphs'])} | "
                       f"{r['tokens_per_s']:,.0f} | {r['warmup_s']:.1f} | "
                       f"{_gib(r.get('held_gib'))} | {error} | {_served(r)} |")
        out.append("")
    judged = [(kind, name, r) for kind in ("train", "generate") for name, rows in result[kind].items() for r in rows
              if r.get("verdicts")]
    if judged:
        out += ["## patch's ops judged in the program (roofline.program_check)", ""]
        for kind, name, r in judged:
            where = f"{name} {'training' if kind == 'train' else 'generation, batch ' + str(r['batch'])}, {r['mode']}"
            out += [f"- {where}: {verdict}" for verdict in r["verdicts"]]
        out.append("")
    return "\n".join(out)


def _gib(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def _failure(name: str, mode: str, exc: Exception) -> dict:
    print(f"{name} {mode} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    return dict(model=name, mode=mode, error=f"{type(exc).__name__}: {exc}"[:300], numerics_ok=False)


def write(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "models.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "models.md").write_text(markdown(result))


def needs_gpu(train_modes, generate_modes) -> list[str]:
    """The modes asked for that run only on a CUDA GPU: CUDA graphs, and compile's reduce-overhead mode."""
    return sorted({m for m in (*train_modes, *generate_modes) if "graphs" in m} |
                  {m for m in generate_modes if m.startswith("compile")})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--models", nargs="+", choices=MODEL_NAMES, default=list(MODELS))
    parser.add_argument("--train", nargs="*", choices=TRAIN_MODES, default=list(TRAIN_MODES), metavar="MODE")
    parser.add_argument("--generate", nargs="*", choices=GENERATE_MODES, default=list(GENERATE_MODES),
                        metavar="MODE")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8], help="generation batch sizes")
    parser.add_argument("--steps", type=int, default=24, help=f"training steps timed per mode (in {TURNS} turns)")
    parser.add_argument("--warmup", type=int, default=WARMUP, help="steps run before timing (not under CUDA graphs)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens generated (timed) per mode")
    parser.add_argument("--tiny", action="store_true", help="tiny configs (for the CPU test)")
    parser.add_argument("--train-tokens", nargs=2, type=int, metavar=("BATCH", "SEQ"),
                        help="the training step's batch and sequence length (default 8 x 1024; tiny 2 x 16)")
    args = parser.parse_args(argv)
    if args.train_tokens and min(args.train_tokens) < 1:
        parser.error(f"--train-tokens must be two positive integers, got {args.train_tokens}")
    for name in args.models if args.train_tokens else ():
        if name in MODELS:   # they hold max_seq positions (a causal mask of that size); transformers' models do not
            limit = MODELS[name][2 if args.tiny else 1].max_seq
            if args.train_tokens[1] > limit:
                parser.error(f"--train-tokens: {name} takes sequences of at most {limit} tokens, got "
                             f"{args.train_tokens[1]}")
    args.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    unavailable = needs_gpu(args.train, args.generate) if args.device.type != "cuda" else []
    if unavailable:
        parser.error(f"modes {unavailable} need a CUDA GPU")
    import triton
    result = dict(environment=dict(
        gpu=torch.cuda.get_device_name() if args.device.type == "cuda" else "CPU", date=time.strftime("%Y-%m-%d"),
        torch=torch.__version__, triton=triton.__version__, python=sys.version.split()[0],
        command="python benchmarks/models.py " + " ".join(argv if argv is not None else sys.argv[1:])),
        train={}, generate={})
    for name in args.models:
        rows = train(name, args.train, args) if args.train else []
        if rows:
            _check_losses(rows)
            _speedups(rows, "eager", "vs_eager")
            _speedups(rows, "compile", "vs_compile")
            result["train"][name] = rows
        rows = []
        for batch in args.batches:
            batch_rows = [row | dict(batch=batch) for row in generate(name, args.generate, batch, args)] \
                if args.generate else []
            _check_logits(batch_rows)
            _speedups(batch_rows, "eager", "vs_eager")
            _speedups(batch_rows, "graphs", "vs_graphs")
            _speedups(batch_rows, "compile", "vs_compile")
            rows += batch_rows
        if rows:
            result["generate"][name] = rows
        write(result, args.out)   # after each model: a run stopped by a time limit keeps what it measured
    print(markdown(result))
    failed = [f"{r['model']} {r['mode']}" for rows in (*result["train"].values(), *result["generate"].values())
              for r in rows if r["numerics_ok"] is False]
    if failed:
        print(f"numerics differ from eager's: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
