"""The GPT-2-small and Llama-style models of examples/models as ladder tasks: their training step as a user writes
it (the model computes its loss), climbed rung by rung.

    roofline ladder examples/ladder_tasks.py:gpt2
    roofline ladder examples/ladder_tasks.py:llama --json llama.json
    roofline ladder examples/ladder_tasks.py:llama_generate      # generation: graphs, int8, speculative decoding
    roofline ladder examples/ladder_tasks.py:gpt2_generate

Training, on a GPU: 8 x 1024 tokens, the models' full sizes (fp32 by hand, attention by hand: the baseline the
ladder starts from). On a CPU: a two-layer model of the same code, 2 x 16 tokens, in seconds.
Generation: the Llama-style model or GPT-2, each with its draft, trained on the Python standard library's source
(examples/decoding_pair.py; trained on first use, minutes on a GPU, then cached), greedy after each of 3 held-out
prompts (2 on a CPU).
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples import decoding_pair  # noqa: E402
from examples.models.gpt2 import GPT2, GPT2Config  # noqa: E402
from examples.models.llama import Llama, LlamaConfig  # noqa: E402
from roofline.ladder import GenerateTask, TrainTask, task_rung  # noqa: E402

TINY = {"gpt2": dict(vocab_size=96, max_seq=64, n_layer=2, n_head=2, d_model=32),
        "llama": dict(vocab_size=96, max_seq=64, n_layer=2, n_head=4, n_kv_head=2, d_model=64,
                      intermediate_size=96)}


def _use_sdpa(model):
    """Attention through F.scaled_dot_product_attention instead of by hand: the same math (tests/test_models.py)."""
    model.config.attention = "sdpa"
    for module in model.modules():
        if hasattr(module, "by_hand"):
            module.by_hand = False


# the models' own rung: patch serves calls of SDPA (with flash_attention where it wins), not attention by hand
SDPA = task_rung("SDPA", "y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # not softmax(q k^T) v",
                 _use_sdpa, before="roofline.patch")


def _task(name, cls, config, batch: int) -> TrainTask:
    gpu = torch.cuda.is_available()
    # attention written by hand, as models often are first: SDPA comes with roofline.patch's rung (or compile)
    settings = dict(attention="by_hand") if gpu else dict(TINY[name], attention="by_hand")
    seq = 1024 if gpu else 16

    def batch_of(device):
        g = torch.Generator(device).manual_seed(1)
        vocab = settings.get("vocab_size", config().vocab_size)
        return tuple(torch.randint(0, vocab, (batch if gpu else 2, seq), device=device, generator=g)
                     for _ in range(2))

    def fuse_head_loss(model):   # the models' config switch (examples/models/loss.py)
        model.config.loss = "fused"

    return TrainTask(name, model=lambda: cls(config(**settings)), batch=batch_of,
                     loss=lambda model, b: model(b[0], targets=b[1])[1], steps=20 if gpu else 6,
                     fuse_head_loss=fuse_head_loss, rungs=(SDPA,))


def gpt2() -> TrainTask:
    return _task("gpt2", GPT2, GPT2Config, batch=8)


def llama() -> TrainTask:
    return _task("llama", Llama, LlamaConfig, batch=4)


def _generate_task(family: str) -> GenerateTask:
    gpu = torch.cuda.is_available()

    def trained(which: int):   # fresh from the cache each time: a rung casts and quantizes its model in place
        return lambda: decoding_pair.load(torch.get_default_device(), family=family)[which]

    return GenerateTask(f"{family} generation", model=trained(0), draft=trained(1),
                        prompt=lambda device: decoding_pair.prompt(device, count=3 if gpu else 2),
                        new_tokens=128 if gpu else 12, **({} if gpu else {"draft_k": (2, 3)}))


def llama_generate() -> GenerateTask:
    return _generate_task("llama")


def gpt2_generate() -> GenerateTask:
    return _generate_task("gpt2")
