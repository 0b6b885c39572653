"""The generation ladder: greedy decoding of the user's model, one token a step through its KV cache, rung by rung.

    task = GenerateTask("llama", model=build_model, prompt=make_prompt, draft=build_draft)
    result = roofline.ladder.run(task)        # or: roofline ladder examples/ladder_tasks.py:llama_generate

Rungs: bf16 eager, CUDA graphs (each decode step captured), int8 weight-only (roofline.quantize_int8_weight_only),
int8 + CUDA graphs, and speculative decoding (the int8 model under CUDA graphs checks a bf16 draft's k guesses in
one pass, roofline.decoding.speculative; k chosen by timing each of task.draft_k once over every prompt). Each
rung builds the model afresh, generates task.new_tokens tokens after each prompt once to warm up (compiling
kernels, capturing graphs), then times task.repeats such rounds by CUDA events: ms per token (median, the sign
test's 95% interval) and tokens/s. Its tokens are held against the bf16 eager baseline's (below).
Memory: what the rung holds once ready (weights, KV caches, graphs).

Free-running generations part at the first token where two models' choices differ, after which their texts are
unrelated: a near-tie that int8 weights flip at token 9 says little of the other 119. So each rung's model is
also fed the baseline's tokens (teacher-forced, one pass) and the share of them it picks too is its agreement; a
rung's numerics are off where its first check_tokens tokens differ from the baseline's and its agreement is under
task.agreement.
"""

from __future__ import annotations

import gc
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from roofline.bench.stats import median_ci
from roofline.decoding import SpeculativeStats, Steps, greedy, speculative
from roofline.ladder_results import RungResult


def check_counts(task, fields: tuple[str, ...], timed: str) -> None:
    """A ladder task's counts: each of `fields` a positive int, and `timed` (the samples of a rung's median) at least
    6, for a 95% interval."""
    for what in fields:
        value = getattr(task, what)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{what} must be a positive int, got {value!r}")
    if getattr(task, timed) < 6:
        raise ValueError(f"{timed} must be at least 6 for a 95% interval of the median, got {getattr(task, timed)}")


@dataclass
class GenerateTask:
    """A model to decode with. model() builds it (weights loaded; the runner seeds torch, sets the device and casts
    it to bf16); it follows roofline.decoding's protocol (setup_cache, model(idx, input_pos)). prompt(device) gives
    the prompts [P, T], each decoded on its own at batch 1 (speculative decoding takes one row): a rung's time
    and its draft's acceptance are over all P, its tokens checked on the first (its agreement on all). draft(),
    where given, is a small model of the same vocabulary for speculative decoding."""
    name: str
    model: Callable[[], torch.nn.Module]
    prompt: Callable[[torch.device], torch.Tensor]
    draft: Callable[[], torch.nn.Module] | None = None
    new_tokens: int = 128
    repeats: int = 7
    check_tokens: int = 16
    agreement: float = 0.9     # teacher-forced: the share of the baseline's tokens the rung's model picks too
    draft_k: tuple[int, ...] = (2, 4, 6, 8, 10, 12, 16)
    skip: tuple[str, ...] = ()
    rungs: tuple = ()          # the task's own rungs (roofline.ladder.task_rung), after the built-in ones

    def __post_init__(self):
        check_counts(self, ("new_tokens", "repeats", "check_tokens"), timed="repeats")
        if not self.draft_k or any(not isinstance(k, int) or k < 1 for k in self.draft_k):
            raise ValueError(f"draft_k must be positive ints, got {self.draft_k!r}")


@dataclass(frozen=True)
class GenerateConfig:
    int8: bool = False
    graphs: bool = False
    speculative: bool = False
    changes: tuple[str, ...] = ()   # the task's own rungs applied (by name)


def _build(make, device: torch.device, int8: bool) -> torch.nn.Module:
    import roofline

    torch.manual_seed(0)
    with torch.device(device):
        model = make()
    model = model.to(torch.bfloat16).eval()
    if int8:
        roofline.quantize_int8_weight_only(model)
    return model


def _timed(run, device: torch.device):
    """(ms, run()'s result), by CUDA events on a GPU."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end), out
    begin = time.perf_counter()
    out = run()
    return (time.perf_counter() - begin) * 1e3, out


def _agreement(model, prompt: torch.Tensor, reference: list[int]) -> float:
    """Teacher-forced: the share of the reference's tokens that the model picks, fed the prompt and the reference
    before each (one forward pass over them all): a measure of how far its numerics moved that does not stop at
    the first token it picks differently."""
    sequence = torch.cat([prompt[:1], torch.tensor([reference], device=prompt.device)], dim=1)
    picks = model(sequence, torch.arange(sequence.shape[1], device=prompt.device)).argmax(-1)[0]
    picked = picks[prompt.shape[1] - 1:-1]
    return float((picked == sequence[0, prompt.shape[1]:]).float().mean())


def climb_one(task: GenerateTask, rung, config: GenerateConfig, device: torch.device, changes: dict,
              reference=None):
    """One rung's result; changes: the task's rungs' model changes by name; reference: the baseline's tokens after
    each prompt, which the rung's model is checked against (teacher-forced), or None for the baseline itself."""
    result = RungResult(rung.name, rung.change, asdict(config), "ok")
    gc.collect()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
    held_before = torch.cuda.memory_allocated() if cuda else 0
    try:
        start = time.perf_counter()
        model = _build(task.model, device, config.int8)   # outside inference mode: the task may train it first
        for name in config.changes:
            changes[name](model)
        draft = _build(task.draft, device, False) if config.speculative else None
        with torch.inference_mode():
            prompts = list(task.prompt(device).split(1))
            tokens_timed = len(prompts) * task.new_tokens   # a generation after every prompt
            max_seq = prompts[0].shape[1] + task.new_tokens + max(task.draft_k) + 2
            model.setup_cache(1, max_seq, torch.bfloat16)
            steps = Steps(model, 1, config.graphs)
            if config.speculative:
                draft.setup_cache(1, max_seq, torch.bfloat16)
                draft_steps = Steps(draft, 1, config.graphs)

                def generate(k):   # every prompt's tokens, and the draft's guesses over them all
                    outputs, total = [], SpeculativeStats()
                    for prompt in prompts:
                        tokens, stats = speculative(steps, draft_steps, prompt, task.new_tokens, k)
                        outputs.append(tokens)
                        total.add(stats)
                    return outputs, total
                swept, kept = {}, {}
                for k in task.draft_k:   # each k once after a warm-up (which captures its verify graph)
                    generate(k)
                    swept[k], (_, stats) = _timed(lambda k=k: generate(k), device)
                    kept[str(k)] = stats.acceptance
                result.draft_k = min(swept, key=swept.get)
                result.k_sweep_ms = {str(k): ms / tokens_timed for k, ms in swept.items()}
                result.k_sweep_acceptance = kept

                def run():
                    return generate(result.draft_k)
            else:
                def run():
                    return [greedy(steps, prompt, task.new_tokens) for prompt in prompts], None
                run()
            result.warmup_s = time.perf_counter() - start
            if cuda:
                result.peak_gib = (torch.cuda.memory_allocated() - held_before) / 2**30
            samples, timed = [], SpeculativeStats()
            for _ in range(task.repeats):
                ms, (outputs, stats) = _timed(run, device)
                samples.append(ms / tokens_timed)
                if stats is not None:
                    timed.add(stats)
        result.samples_ms = samples
        result.low_ms, result.median_ms, result.high_ms = median_ci(samples)
        result.tokens_per_s = 1e3 / result.median_ms
        result.tokens = outputs[0][0].tolist()
        result.generations = [o[0].tolist() for o in outputs]
        with torch.inference_mode():
            result.agreement = sum(_agreement(model, prompt, theirs) for prompt, theirs in
                                   zip(prompts, reference or result.generations)) / len(prompts)
        if timed.proposed:
            result.acceptance = timed.acceptance
            result.draft_share = timed.accepted / (timed.accepted + timed.rounds)   # a round adds the model's token
    except Exception as exc:   # a rung that fails to build or run is reported, and the ladder goes on
        result.status, result.reason = "failed", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return result


def compare(results, check_tokens: int, agreement: float) -> None:
    """Speedups over the rung before and over the baseline; each rung's tokens against the baseline's: numerics
    are off where the first check_tokens differ and the teacher-forced agreement is under `agreement`."""
    timed = [r for r in results if r.median_ms is not None]
    if not timed:
        return
    base = timed[0]
    for before, r in zip([None, *timed[:-1]], timed):
        r.vs_baseline = base.median_ms / r.median_ms
        r.vs_previous = before.median_ms / r.median_ms if before else None
        same = 0
        for ours, theirs in zip(r.tokens, base.tokens):
            if ours != theirs:
                break
            same += 1
        r.tokens_matched = same
        if same < min(check_tokens, len(base.tokens)) and (r.agreement or 0.0) < agreement:
            r.status = "numerics"
