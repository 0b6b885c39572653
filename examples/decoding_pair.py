"""A model and a small draft of it for speculative decoding, trained briefly on text every machine has offline: the
Python standard library's own source, byte by byte (a vocabulary of 256). Random weights would make a draft's
acceptance meaningless; these two have learned the same text, so the draft guesses what the model would say.

    python examples/decoding_pair.py [--family gpt2] [--minutes 5]   # trains both (on a GPU: minutes), caches them
    target, draft = decoding_pair.load(device)          # from the cache, training first if it is empty

The model is the example Llama-style model (examples/models/llama.py: 16 layers, d 2048, grouped-query attention
32/8) with a byte vocabulary, and its draft 2 layers of d 1024; or (family "gpt2") GPT-2 small (examples/models/gpt2.py)
with a byte vocabulary and a 2-layer draft of d 384. A draft step at batch 1 is bound by its kernels' latency, not
its width, so the drafts are as wide as that allows and as shallow as can be. Both train on the same batches (bf16
autocast, fused AdamW, torch.compile on a GPU, the learning rate warmed up, then down a cosine) for the first 70%
of the time given. The rest distills the draft from the trained model: the model is frozen and the draft learns its
distribution over the next byte (KL divergence from the model's softmax), which is what speculative decoding asks
of a draft, rather than the text's. The checkpoints go to roofline's cache directory
(ROOFLINE_CACHE_DIR, else ~/.cache/roofline), under a name holding the corpus's hash and the configs, so another
Python's library or another config trains anew; they are never committed. The last 1% of the corpus is held out:
prompts come from it. On a machine without a GPU, tiny configs train for a few seconds (the tests).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import sys
import sysconfig
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.models.gpt2 import GPT2, GPT2Config  # noqa: E402
from examples.models.llama import Llama, LlamaConfig  # noqa: E402
from roofline.device import cache_dir  # noqa: E402

VOCAB = 256                 # bytes
CORPUS_BYTES = 48 << 20     # the first 48 MB of the library's .py files, in sorted order
HELD_OUT = 0.01
CONFIGS = {   # (model class, config class, {machine: (the model's config, the draft's)})
    "llama": (Llama, LlamaConfig, {
        "gpu": (LlamaConfig(vocab_size=VOCAB), LlamaConfig(vocab_size=VOCAB, n_layer=2, n_head=16, n_kv_head=4,
                                                          d_model=1024, intermediate_size=2816)),
        "cpu": (LlamaConfig(vocab_size=VOCAB, max_seq=256, n_layer=2, n_head=4, n_kv_head=2, d_model=64,
                            intermediate_size=128),
                LlamaConfig(vocab_size=VOCAB, max_seq=256, n_layer=1, n_head=2, n_kv_head=1, d_model=32,
                            intermediate_size=64))}),
    "gpt2": (GPT2, GPT2Config, {
        "gpu": (GPT2Config(vocab_size=VOCAB), GPT2Config(vocab_size=VOCAB, n_layer=2, n_head=6, d_model=384)),
        "cpu": (GPT2Config(vocab_size=VOCAB, max_seq=256, n_layer=2, n_head=2, d_model=64),
                GPT2Config(vocab_size=VOCAB, max_seq=256, n_layer=1, n_head=2, d_model=32))}),
}
TRAINING = {"gpu": dict(batch=8, seq=1024, lr=6e-4, minutes=5.0, distill=0.3, warmup=0.03),
            "cpu": dict(batch=4, seq=64, lr=3e-3, minutes=0.1, distill=0.25, warmup=0.03)}


@functools.cache   # read once a process: every rung's model and prompt comes from it
def corpus() -> bytes:
    """The standard library's .py files (site-packages left out), in sorted order, up to CORPUS_BYTES."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, size = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "dist-packages" in path.parts:
            continue
        try:
            text = path.read_bytes()
        except OSError:
            continue
        chunks.append(text)
        size += len(text)
        if size >= CORPUS_BYTES:
            break
    return b"\n\n".join(chunks)[:CORPUS_BYTES]


def split(data: bytes) -> tuple[bytes, bytes]:
    """(training text, held-out text)."""
    cut = int(len(data) * (1 - HELD_OUT))
    return data[:cut], data[cut:]


def prompt(device, length: int = 64, count: int = 1) -> torch.Tensor:
    """[count, length] bytes of held-out text: the starts of its first `count` functions (lines starting "def "),
    or of its first lines where it has fewer."""
    held = split(corpus())[1]
    starts, at = [], 0
    while len(starts) < count:
        at = held.find(b"\ndef ", at) + 1
        if at == 0:   # fewer functions than asked: line starts
            lines = [i + 1 for i, c in enumerate(held[:-length]) if c == 10 and i + 1 not in starts]
            starts += lines[:count - len(starts)]
            break
        starts.append(at)
    return torch.tensor([list(held[s:s + length]) for s in starts], device=device)


def _kind(device: torch.device) -> str:
    return "gpu" if device.type == "cuda" else "cpu"


def _checkpoint_dir(device: torch.device, data: bytes, family: str) -> Path:
    target, draft = CONFIGS[family][2][_kind(device)]
    digest = hashlib.sha256(data + json.dumps([asdict(target), asdict(draft), TRAINING[_kind(device)]],
                                              sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "decoding-pair" / f"{family}-{_kind(device)}-{digest}"


def learning_rate(peak: float, done: float, warmup: float) -> float:
    """The rate at `done` (0..1) of a phase: linear warm-up over its first `warmup`, then a cosine down to a tenth."""
    if done < warmup:
        return peak * (done + 1e-3) / warmup
    progress = min(1.0, (done - warmup) / (1 - warmup))
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def _windows(text: torch.Tensor, batch: int, seq: int, generator: torch.Generator):
    """(inputs, next bytes) of `batch` random windows of `seq` bytes."""
    device = text.device
    starts = torch.randint(0, len(text) - seq - 1, (batch,), device=device, generator=generator)
    window = text[starts[:, None] + torch.arange(seq + 1, device=device)].long()
    return window[:, :-1], window[:, 1:].contiguous()


def _set_rate(optimizer, rate: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = rate


@torch.no_grad()
def draft_agreement(model, draft, text: torch.Tensor, seq: int, windows: int = 4) -> float:
    """Teacher-forced on held-out text: the share of positions where the draft's most likely next byte is the
    model's. Speculative decoding keeps a guess exactly when they agree."""
    generator = torch.Generator(text.device).manual_seed(2)
    inputs, _ = _windows(text, windows, seq, generator)
    with torch.autocast(text.device.type, dtype=torch.bfloat16, enabled=text.device.type == "cuda"):
        return float((model(inputs).argmax(-1) == draft(inputs).argmax(-1)).float().mean())


def train(device, minutes: float | None = None, log=print, family: str = "llama") -> Path:
    """Train the model of `family` and its draft on the corpus for `minutes` (default: TRAINING's), then distill the
    draft from the model, and save both; returns the checkpoints' directory."""
    device = torch.device(device)
    cls = CONFIGS[family][0]
    kind = _kind(device)
    data = corpus()
    training, held_out = (torch.frombuffer(bytearray(part), dtype=torch.uint8).to(device) for part in split(data))
    settings = TRAINING[kind]
    minutes = settings["minutes"] if minutes is None else minutes
    together_s, total_s = minutes * 60 * (1 - settings["distill"]), minutes * 60
    torch.manual_seed(0)
    with torch.device(device):
        models = [cls(config) for config in CONFIGS[family][2][kind]]
    gpu = device.type == "cuda"
    optimizers = [torch.optim.AdamW(m.parameters(), lr=settings["lr"], betas=(0.9, 0.95), weight_decay=0.1,
                                    fused=gpu) for m in models]
    forwards = [torch.compile(m) if gpu else m for m in models]
    batch, seq, peak, warmup = settings["batch"], settings["seq"], settings["lr"], settings["warmup"]
    generator = torch.Generator(device).manual_seed(1)
    steps, distill_steps, losses, start = 0, 0, [0.0, 0.0], time.perf_counter()

    def step_of(optimizer, loss, rate):
        _set_rate(optimizer, rate)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    # Both models on the text, the same batches. The draft's rate runs over the whole time, the model's over this phase.
    while (elapsed := time.perf_counter() - start) < together_s:
        inputs, targets = _windows(training, batch, seq, generator)
        for i, (forward, optimizer) in enumerate(zip(forwards, optimizers)):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = forward(inputs, targets=targets)[1]
            step_of(optimizer, loss, learning_rate(peak, elapsed / (together_s if i == 0 else total_s), warmup))
            losses[i] = loss.detach()
        steps += 1
        if steps % 100 == 0:
            log(f"step {steps}: loss {float(losses[0]):.3f} (model), {float(losses[1]):.3f} (draft), {elapsed:.0f} s")
    model, draft = models
    model.eval()
    before = draft_agreement(model, draft, held_out, seq)
    # The draft distilled from the frozen model: KL(model || draft) over each position's next byte.
    kl = torch.zeros((), device=device)
    while (elapsed := time.perf_counter() - start) < total_s:
        inputs, _ = _windows(training, batch, seq, generator)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            with torch.no_grad():
                teacher = F.log_softmax(model(inputs).float(), -1).flatten(0, 1)
            student = F.log_softmax(draft(inputs).float(), -1).flatten(0, 1)
        loss = F.kl_div(student, teacher, log_target=True, reduction="batchmean")
        step_of(optimizers[1], loss, learning_rate(peak, elapsed / total_s, warmup))
        kl = loss.detach()   # read as a number below: detached, as torch asks
        distill_steps += 1
        if distill_steps % 100 == 0:
            log(f"distillation step {distill_steps}: KL {float(kl):.3f} nats/byte, {elapsed:.0f} s")
    after = draft_agreement(model, draft, held_out, seq)
    where = _checkpoint_dir(device, data, family)
    where.mkdir(parents=True, exist_ok=True)
    for name, trained, loss in zip(("target", "draft"), models, losses):
        torch.save({"config": asdict(trained.config), "state": trained.state_dict(), "steps": steps,
                    "tokens": steps * batch * seq, "loss": float(loss), "distill_steps": distill_steps,
                    "distill_kl": float(kl), "agreement_before_distillation": before,
                    "agreement": after}, where / f"{name}.pt")
    log(f"trained {steps} steps ({steps * batch * seq:,} bytes): loss {float(losses[0]):.3f} nats/byte (model), "
        f"{float(losses[1]):.3f} (draft); distilled the draft {distill_steps} steps (KL {float(kl):.3f}); the "
        f"draft's next byte is the model's at {before:.1%} of held-out positions before distillation, {after:.1%} "
        f"after; {time.perf_counter() - start:.0f} s in all; saved in {where}")
    return where


def load(device, log=print, family: str = "llama") -> tuple[torch.nn.Module, torch.nn.Module]:
    """(model, draft) of `family` from the cache, trained first if the cache does not have them."""
    device = torch.device(device)
    where = _checkpoint_dir(device, corpus(), family)
    if not (where / "target.pt").exists() or not (where / "draft.pt").exists():
        log(f"no trained pair in {where}: training one ({TRAINING[_kind(device)]['minutes']} min)")
        train(device, log=log, family=family)
    cls, config_cls = CONFIGS[family][:2]
    models = []
    for name in ("target", "draft"):
        saved = torch.load(where / f"{name}.pt", map_location=device, weights_only=True)
        with torch.device(device):
            model = cls(config_cls(**saved["config"]))
        model.load_state_dict(saved["state"])
        models.append(model)
    return models[0], models[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=None, help="training time (default: 5 on a GPU)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--family", choices=sorted(CONFIGS), default="llama")
    args = parser.parse_args(argv)
    train(args.device, args.minutes, family=args.family)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
