"""Train the GPT-2-small or Llama-style model of examples/models on random tokens, as a user's script does.

    python examples/train_lm.py --model gpt2 --steps 20
    roofline profile --skip 3 --steps 5 examples/train_lm.py --model gpt2 --steps 20
    python examples/train_lm.py --model llama --patch      # roofline.patch: fused norms, SwiGLU, RoPE where they win

By default bf16 autocast, fused AdamW, SDPA attention (the models' own): the configuration the profiler should
find little wrong with. The options undo or add one piece of the usual advice each, so that the advice can be
measured: --precision fp32 or tf32, --attention by_hand, --optimizer foreach, --graphs (the whole step replayed
as one CUDA graph); --time prints the median step time of the steps after the first three, by CUDA events.
On a CPU it trains a two-layer model of the same code in seconds.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.models.attention import ATTENTION  # noqa: E402
from examples.models.gpt2 import GPT2, GPT2Config  # noqa: E402
from examples.models.llama import Llama, LlamaConfig  # noqa: E402
from roofline.bench.steps import CAPTURE_WARMUP, StepTimer, capture  # noqa: E402

MODELS = {
    "gpt2": (GPT2, GPT2Config, dict(vocab_size=96, max_seq=64, n_layer=2, n_head=2, d_model=32)),
    "llama": (Llama, LlamaConfig, dict(vocab_size=96, max_seq=64, n_layer=2, n_head=4, n_kv_head=2, d_model=64,
                                       intermediate_size=96)),
}
UNTIMED = 3   # steps before --time starts: the first calls' compilation, cuBLAS heuristics, allocator growth


def main(argv=None):
    gpu = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(MODELS), default="gpt2")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8 if gpu else 2)
    p.add_argument("--seq", type=int, default=1024 if gpu else 16)
    p.add_argument("--patch", action="store_true", help="swap in roofline's fused ops where they are faster")
    p.add_argument("--precision", choices=("bf16", "tf32", "fp32"), default="bf16" if gpu else "fp32",
                   help="bf16: autocast; tf32: fp32 with TF32 matmuls; fp32: fp32 throughout")
    p.add_argument("--attention", choices=ATTENTION, default="sdpa")
    p.add_argument("--optimizer", choices=("fused", "foreach"), default="fused" if gpu else "foreach")
    p.add_argument("--graphs", action="store_true", help="capture the step as a CUDA graph and replay it")
    p.add_argument("--time", action="store_true", help="print the median step time as a JSON line")
    args = p.parse_args(argv)
    if args.graphs and not gpu:
        p.error("--graphs needs a GPU")
    if args.time and args.steps <= UNTIMED + 1:
        p.error(f"--time needs more than {UNTIMED + 1} steps")

    device = "cuda" if gpu else "cpu"
    cls, config, tiny = MODELS[args.model]
    torch.manual_seed(0)
    with torch.device(device):
        model = cls(config(attention=args.attention) if gpu else config(**tiny, attention=args.attention))
    if args.patch:
        import roofline

        roofline.patch(model)
    if args.precision == "tf32":
        torch.set_float32_matmul_precision("high")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, capturable=args.graphs,
                                  **({"fused": True} if args.optimizer == "fused" else {"foreach": True}))
    vocab = model.config.vocab_size
    idx, targets = (torch.randint(0, vocab, (args.batch, args.seq), device=device) for _ in range(2))

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=args.precision == "bf16",
                            cache_enabled=not args.graphs):
            _, loss = model(idx, targets=targets)
        loss.backward()
        optimizer.step()
        return loss.detach()

    run = capture(step) if args.graphs else step
    timer = StepTimer(device)
    for i in range(args.steps - (CAPTURE_WARMUP if args.graphs else 0)):   # a capture runs its warm-up steps
        if args.time and i >= UNTIMED:
            timer.mark()
        loss = run()
    print(f"{args.model}: loss {loss.item():.4f} after {args.steps} steps")
    if args.time:
        timer.mark()
        samples = timer.samples_ms()
        print("timing: " + json.dumps({"step_ms": statistics.median(samples), "steps_timed": len(samples),
                                       "clock": "cuda-events" if gpu else "perf_counter"}))


if __name__ == "__main__":
    main()
