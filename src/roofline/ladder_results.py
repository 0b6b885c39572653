"""What a ladder climb gives: a result per rung, training's and generation's alike (roofline.ladder and
roofline.generation_ladder both make them; a module of their own, so that neither needs the other for them)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class RungResult:
    rung: str
    change: str
    config: dict
    status: str                     # "ok", "numerics" (loss off the baseline's), "skipped", "failed"
    reason: str | None = None
    median_ms: float | None = None
    low_ms: float | None = None
    high_ms: float | None = None
    samples_ms: list[float] = field(default_factory=list)
    peak_gib: float | None = None   # the timed steps' peak memory
    warmup_peak_gib: float | None = None   # the warm-up's: compiling, capturing, patch measuring its routes
    warmup_s: float | None = None   # the warm-up steps' wall time: compilation, capture, routing
    losses: list = field(default_factory=list)   # every step's loss (None: run inside a CUDA graph's capture)
    loss: float | None = None       # the loss checked: after check_steps steps, or the first step after it seen
    loss_step: int | None = None    # ... which step that was (1-based)
    loss_error: float | None = None  # relative to the baseline's at that step
    tolerance: float | None = None
    vs_previous: float | None = None   # speedup over the last timed rung
    vs_baseline: float | None = None
    # on several ranks (roofline.distributed.ladder), against the same rung on one GPU:
    scaling: float | None = None       # the one-GPU step time over this one's
    mfu: float | None = None           # model FLOPs a second on each GPU over its dense bf16 peak
    # generation (median_ms and the samples are then per token):
    tokens_per_s: float | None = None
    tokens: list = field(default_factory=list)   # the first timed generation's tokens (the first prompt's)
    generations: list = field(default_factory=list)   # ... after each of the task's prompts
    tokens_matched: int | None = None   # leading tokens the same as the baseline's
    agreement: float | None = None      # teacher-forced: the share of the baseline's tokens this model picks
    acceptance: float | None = None     # speculative decoding: the draft's guesses kept
    draft_share: float | None = None    # ... the generated tokens that were the draft's guesses
    draft_k: int | None = None          # ... the guesses a round, chosen by timing each of the task's
    k_sweep_ms: dict | None = None      # ... ms per token at each k tried
    k_sweep_acceptance: dict | None = None   # ... and the share of guesses kept at each


@dataclass
class LadderResult:
    task: str
    device: str
    rungs: list[RungResult]
    kind: str = "train"             # or "generate"
    ranks: int = 1
    parallel: str | None = None     # on several ranks: "ddp" or "fsdp2"

    def to_dict(self) -> dict:
        return {"task": self.task, "device": self.device, "kind": self.kind, "ranks": self.ranks,
                "parallel": self.parallel, "rungs": [asdict(r) for r in self.rungs]}

    def write_json(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def read_json(cls, path) -> "LadderResult":
        data = json.loads(Path(path).read_text())
        return cls(data["task"], data["device"], [RungResult(**r) for r in data["rungs"]], data.get("kind", "train"),
                   data.get("ranks", 1), data.get("parallel"))
