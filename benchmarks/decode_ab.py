"""Eager decoding, modes side by side in one process: where a host-bound decode step's time goes, call by call.

    python benchmarks/decode_ab.py OUT_DIR [--model gpt2|llama] [--modes eager int8 ...] [--rounds 12]
                                   [--tokens 24] [--warmup 10] [--tiny]

models.py says which mode decodes faster; this says why. Each mode's model is made ready as models.py makes it
(benchmarks/models.py's Decoding), then the modes decode in rounds of `tokens` tokens, the order reversed every
other round, so that the host's drift falls on all. Reported per mode: the median of its rounds' median ms a token,
its speedup over the first mode (the median of per-round ratios) and the rounds in which it was faster. Then, in
more rounds, every call of the timed module classes (LayerNorm, Linear, attention...: --time) is wrapped in a timer
inside the model, and the host time of a call of each class is reported per mode: a call that wins in a loop and
loses in the program shows here (benchmarks/results/h100-models.md, "2026-11-26").

Modes: models.py's generation modes that run eagerly (eager, patch, patch-all, int8, int8+patch), and
patch-without-OP[,OP...]: patch with those ops left alone (patch's own keywords: layer_norm, rms_norm, gelu,
swiglu, rope, attention, cross_entropy). Writes OUT_DIR/decode_ab.json. --tiny: small configs on whatever device
there is (the CPU test).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import models  # noqa: E402
import roofline  # noqa: E402

TIMED = ("LayerNorm", "RMSNorm", "Linear", "Int8Linear", "GELU", "CausalSelfAttention", "Attention", "MLP")
EAGER_MODES = ("eager", "patch", "patch-all", "int8", "int8+patch")
WITHOUT = "patch-without-"


class _Timed(nn.Module):
    """A child module's calls, timed on the host (perf_counter around the call, no synchronization)."""

    def __init__(self, inner: nn.Module, totals: list):
        super().__init__()
        self.inner, self.totals = inner, totals

    def forward(self, *args, **kwargs):
        start = time.perf_counter_ns()
        out = self.inner(*args, **kwargs)
        self.totals[0] += time.perf_counter_ns() - start
        self.totals[1] += 1
        return out


def _decoding(name: str, mode: str, args) -> models.Decoding:
    """models.py's Decoding of the mode; a patch-without mode patches with those ops off."""
    if not mode.startswith(WITHOUT):
        return models.Decoding(name, mode, 1, args)
    off = mode[len(WITHOUT):].split(",")
    return models.Decoding(name, "patch", 1, args,
                           patch=lambda model, _mode: roofline.patch(model, **{op: False for op in off}))


def _rounds(decodings: dict, rounds: int, tokens: int) -> dict:
    modes = list(decodings)
    medians = {mode: [] for mode in modes}
    for r in range(rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            d = decodings[mode]
            d.samples, d.logits = [], []
            d.steps(tokens)
            medians[mode].append(statistics.median(d.samples))
    first = medians[modes[0]]
    return {mode: dict(ms=statistics.median(m), rounds_ms=m,
                       speedup=statistics.median([a / b for a, b in zip(first, m)]),
                       faster_rounds=sum(a > b for a, b in zip(first, m)))
            for mode, m in medians.items()}


def _time_calls(decodings: dict, classes: tuple, rounds: int, tokens: int) -> dict:
    """Host us a call of each timed class, per mode, over `rounds` more rounds with the timers in place."""
    totals = {mode: defaultdict(lambda: [0, 0]) for mode in decodings}
    for mode, d in decodings.items():
        for parent in list(d.model.modules()):
            for child_name, child in list(parent.named_children()):
                if type(child).__name__ in classes:
                    parent._modules[child_name] = _Timed(child, totals[mode][type(child).__name__])
    _rounds(decodings, rounds, tokens)
    return {mode: {cls: dict(us=t / n / 1e3, calls=n) for cls, (t, n) in per.items() if n}
            for mode, per in totals.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", choices=list(models.MODELS), default="gpt2")
    parser.add_argument("--modes", nargs="+", default=["eager", "int8"])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=24, help="tokens a mode decodes per round")
    parser.add_argument("--time", nargs="*", default=list(TIMED), help="module classes whose calls are timed")
    parser.add_argument("--warmup", type=int, default=models.WARMUP, help="tokens decoded before the rounds")
    parser.add_argument("--tiny", action="store_true", help="tiny configs (for the CPU test)")
    args = parser.parse_args(argv)
    for mode in args.modes:
        if mode not in EAGER_MODES and not mode.startswith(WITHOUT):
            parser.error(f"--modes: {mode!r} is not an eager decoding mode")
    args.device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    timed_rounds = max(2, args.rounds // 2)
    args.tokens_per_round = args.tokens
    args.tokens = (args.rounds + timed_rounds) * args.tokens   # what each mode's KV cache must hold
    decodings = {mode: _decoding(args.model, mode, args) for mode in args.modes}
    result = dict(model=args.model, device=str(args.device),
                  rounds=_rounds(decodings, args.rounds, args.tokens_per_round))
    result["host_us"] = _time_calls(decodings, tuple(args.time), timed_rounds, args.tokens_per_round)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "decode_ab.json").write_text(json.dumps(result, indent=1))
    for mode, r in result["rounds"].items():
        print(f"{mode:32s} {r['ms']:.3f} ms a token  {r['speedup']:.3f}x {args.modes[0]}  "
              f"faster in {r['faster_rounds']} of {args.rounds} rounds")
    for mode, per in result["host_us"].items():
        print(f"{mode:32s} " + "  ".join(f"{cls} {v['us']:.2f} us" for cls, v in sorted(per.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
