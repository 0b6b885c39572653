"""quantize_int8_weight_only(prefetch=True): the order of a model's int8 matmuls, learned from its first forward
(roofline.nn.CallOrder), and the weight each one-row matmul hands int8_linear to pull into L2 (the next matmul's:
a fused run's one matrix, the first layer's after the head); results unchanged; and the kernel's prefetch compiled
for sm_90 without a GPU."""

import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import roofline
from roofline import nn as rnn

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _llama(layers=2):
    from examples.models.llama import Llama, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, max_seq=32, n_layer=layers, n_head=4, n_kv_head=2, d_model=64,
                         intermediate_size=96)
    return Llama(config).to(DEVICE, torch.bfloat16)


@pytest.fixture
def launches(monkeypatch):
    """The int8 matmuls run: (the weight streamed, the tensor handed over to prefetch)."""
    seen = []
    run = rnn._int8_linear

    def recorded(x, weight_int8, scale, bias, prefetch=None):
        seen.append((weight_int8, prefetch))
        return run(x, weight_int8, scale, bias, prefetch)

    monkeypatch.setattr(rnn, "_int8_linear", recorded)
    return seen


def _decode(model, steps, batch=1, start=6):
    outputs = []
    for step in range(start, start + steps):
        token = torch.randint(0, 96, (batch, 1), device=DEVICE)
        outputs.append(model(token, input_pos=torch.tensor([step], device=DEVICE)))
    return outputs


@pytest.mark.parametrize("fuse", [True, False])
@torch.no_grad()
def test_each_one_row_matmul_prefetches_the_next_ones_weight(launches, fuse):
    model = _llama()
    roofline.quantize_int8_weight_only(model, fuse_shared_input=fuse, prefetch=True)
    model.setup_cache(1, 32, torch.bfloat16)
    model(torch.randint(0, 96, (1, 6), device=DEVICE), input_pos=torch.arange(6, device=DEVICE))
    assert all(prefetch is None for _, prefetch in launches)   # the prefill: learning, and not one row
    _decode(model, 1)   # the runs are fused during this step, after some layers before them chose what to prefetch
    for _ in range(2):
        del launches[:]
        _decode(model, 1)
        per_layer = 4 if fuse else 7
        assert len(launches) == 2 * per_layer + 1
        weights = [weight for weight, _ in launches]
        for i, (_, prefetch) in enumerate(launches):   # the head's is the first layer's: the next step's
            assert prefetch is weights[(i + 1) % len(weights)], i
        if fuse:   # the runs' one matrices, as their first layers stream them
            attention = model.layers[0].self_attn
            assert weights[0] is attention.q_proj.shared.weight and weights[1] is attention.o_proj.weight_int8
    order = model.layers[0].self_attn.q_proj.order
    assert not order.learning and len(order.layers) == 2 * 7 + 1


@torch.no_grad()
def test_calls_of_several_rows_prefetch_nothing_and_results_stay_the_same(launches):
    model = _llama()
    plain = copy.deepcopy(model)
    roofline.quantize_int8_weight_only(model, prefetch=True)
    roofline.quantize_int8_weight_only(plain)
    for m in (model, plain):
        m.setup_cache(3, 32, torch.bfloat16)
    prompt, positions = torch.randint(0, 96, (3, 6), device=DEVICE), torch.arange(6, device=DEVICE)
    torch.testing.assert_close(model(prompt, input_pos=positions), plain(prompt, input_pos=positions), rtol=0,
                               atol=0)
    torch.manual_seed(1)
    ours = _decode(model, 2, batch=3)
    torch.manual_seed(1)
    theirs = _decode(plain, 2, batch=3)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert all(prefetch is None for _, prefetch in launches)


def test_without_prefetch_no_order_is_kept():
    model = _llama(layers=1)
    roofline.quantize_int8_weight_only(model)
    assert all(m.order is None for m in model.modules() if isinstance(m, rnn.Int8Linear))


@torch.no_grad()
def test_an_order_cut_short_by_a_layer_called_twice_still_prefetches_within_it(launches):
    """A model that calls one layer twice in a forward: learning ends at the second call, and the layers seen
    until then prefetch one another in that order."""
    layers = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(3)).to(DEVICE, torch.bfloat16)

    def forward(x):
        return layers[2](layers[0](layers[1](layers[0](x))))

    roofline.quantize_int8_weight_only(layers, fuse_shared_input=False, prefetch=True)
    order = layers[0].order
    forward(torch.randn(1, 64, device=DEVICE, dtype=torch.bfloat16))
    assert not order.learning and order.layers == [layers[0], layers[1]]
    del launches[:]
    forward(torch.randn(1, 64, device=DEVICE, dtype=torch.bfloat16))
    expected = [layers[1].weight_int8, layers[0].weight_int8, layers[1].weight_int8, None]
    assert len(launches) == 4 and all(p is e for (_, p), e in zip(launches, expected))


def test_the_prefetching_kernel_compiles_for_sm90():
    """Triton compiles for sm_90 without a GPU (and ships ptxas): the prefetch is the copy engine's bulk prefetch
    to L2 (UBLKPF in SASS), in the PREFETCH variant only. Run in a process of its own, away from the
    interpreter the CPU tests run the kernels in."""
    script = textwrap.dedent("""
        import importlib, os, subprocess, tempfile
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        linear = importlib.import_module("roofline.ops.linear")
        signature = dict(x_ptr="*bf16", w_ptr="*i8", scale_ptr="*fp32", bias_ptr="constexpr", y_ptr="*bf16",
                         next_ptr="*i8", N="i32", K="i32", stride_w="i32", next_bytes="i32", HAS_BIAS="constexpr",
                         UPCAST="constexpr", PREFETCH="constexpr", EVEN_K="constexpr", BLOCK_N="constexpr",
                         BLOCK_K="constexpr")
        tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
        for prefetch in (False, True):
            constexprs = dict(bias_ptr=None, HAS_BIAS=False, UPCAST=False, PREFETCH=prefetch, EVEN_K=True, BLOCK_N=4,
                              BLOCK_K=1024)
            kernel = triton.compile(ASTSource(fn=linear.int8_gemv_kernel.fn.fn, signature=signature,
                                              constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                                    options=dict(num_warps=4))
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(kernel.asm["cubin"])
                f.flush()
                sass = subprocess.run([os.path.join(tools, "nvdisasm"), "-c", f.name], capture_output=True,
                                      text=True, check=True).stdout
            print(prefetch, "cp.async.bulk.prefetch.L2.global" in kernel.asm["ptx"], sass.count("UBLKPF.L2"))
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "False", "0", "True", "True", "1"], done.stdout


@pytest.mark.gpu
@torch.no_grad()
def test_gpu_a_captured_decode_step_with_prefetch_replays_the_same_logits():
    from roofline.bench.steps import capture

    model = _llama()
    plain = copy.deepcopy(model)
    roofline.quantize_int8_weight_only(model, prefetch=True)
    roofline.quantize_int8_weight_only(plain)
    prompt = torch.randint(0, 96, (1, 6), device="cuda")
    for m in (model, plain):
        m.setup_cache(1, 32, torch.bfloat16)
        m(prompt, input_pos=torch.arange(6, device="cuda"))
    token, position = prompt[:, -1:].clone(), torch.tensor([6], device="cuda")
    replays = [capture(lambda m=m: m(token, input_pos=position)) for m in (model, plain)]
    assert not model.layers[0].mlp.down_proj.order.learning
    for step in range(6, 20):
        token.random_(0, 96)
        position.fill_(step)
        ours, theirs = (replay().clone() for replay in replays)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
