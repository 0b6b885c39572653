"""Each finding rule: a synthetic trace that triggers it (at the right line, with the expected gain) and a close
variant that does not."""

import pytest
from rich.console import Console

from roofline.profiler import findings
from roofline.profiler.report import analyze

from .synth import AUTOGRAD, PEAKS, TraceBuilder, at

BF16, F32 = "c10::BFloat16", "float"


def _report(tmp_path, build, wall=1000.0, unprofiled_ms=None, unprofiled_gpu_ms=()):
    b = TraceBuilder()
    if unprofiled_ms is not None:
        b.unprofiled_steps = {"wall_ms": unprofiled_ms, "gpu_ms": list(unprofiled_gpu_ms)}
    b.op("ProfilerStep#1", 0, wall, cat="user_annotation")   # fixes the window, so shares are easy to reason about
    build(b)
    return analyze(b.write(tmp_path / "t.json"), peaks=PEAKS)


def _ids(report):
    return [f.id for f in report.findings]


def _one(report, rule_id):
    found = [f for f in report.findings if f.id == rule_id]
    assert len(found) == 1, _ids(report)
    return found[0]


# --------------------------------------------------------------------------- host syncs

def _syncing_loop(b, syncs):
    for k in range(syncs):
        t0 = 10 + 100 * k
        b.mark(t0, at(30))
        b.op("aten::mul", t0 + 1, 5, shapes=[[4]])
        b.kernel("k", t0 + 10, 20, launch_ts=t0 + 2)            # busy t0+10 .. t0+30
        b.mark(t0 + 8, at(31))
        b.op("aten::item", t0 + 9, 25)
        b.runtime("cudaStreamSynchronize", t0 + 9, 25)          # returns at t0+34, after the GPU went idle


def test_host_sync_in_loop(tmp_path):
    f = _one(_report(tmp_path, lambda b: _syncing_loop(b, 5)), "host-sync-in-loop")
    assert f.location.line == 31 and f.evidence["count"] == 5
    # Each sync leaves the GPU idle until the next iteration's kernel (t0+30 to t0+110, 80 us), but the host was only
    # 25 us ahead (its wait): without the sync it launches the next kernel 25 us earlier, no more.
    assert f.evidence["gpu_idle_ms"] == pytest.approx(5 * 80 / 1e3 - 80 / 1e3)
    assert f.est_gain_ms == pytest.approx(4 * 25 / 1e3)
    assert "host-sync-in-loop" not in _ids(_report(tmp_path, lambda b: _syncing_loop(b, 2)))


def test_host_sync_gain_is_at_most_the_unprofiled_program_s_idle(tmp_path):
    # 100 us of GPU work in the recorded step of 1 ms. Unprofiled steps of 0.9 ms leave 800 us of idle: the
    # sync's own bound (4 x 25 us) stands. Steps of 0.15 ms leave 50 us, all a fix could remove.
    roomy = _one(_report(tmp_path, lambda b: _syncing_loop(b, 5), unprofiled_ms=[0.9] * 3), "host-sync-in-loop")
    assert roomy.est_gain_ms == pytest.approx(4 * 25 / 1e3)
    tight = _one(_report(tmp_path, lambda b: _syncing_loop(b, 5), unprofiled_ms=[0.15] * 3), "host-sync-in-loop")
    assert tight.est_gain_ms == pytest.approx(0.05)


# --------------------------------------------------------------------------- copies

def _copies(memory):
    def build(b):
        for k in range(4):
            b.mark(10 + 200 * k, at(12))
            b.op("aten::copy_", 11 + 200 * k, 150)
            b.memcpy("HtoD", memory, 20 + 200 * k, 100, nbytes=1_000_000, launch_ts=12 + 200 * k)
    return build


def test_pageable_copy(tmp_path):
    f = _one(_report(tmp_path, _copies("Pageable")), "pageable-copy")
    assert f.location.line == 12 and f.evidence["copies"] == 4 and f.evidence["bytes"] == 4_000_000
    # 400 us measured; 4 MB at the assumed 25 GB/s pinned rate is 160 us.
    assert f.est_gain_ms == pytest.approx((400 - 160) / 1e3)
    assert "pageable-copy" not in _ids(_report(tmp_path, _copies("Pinned")))


# --------------------------------------------------------------------------- matmul precision

def _matmuls(kernel, dtype=F32, n=4, m=2048):
    def build(b):
        for k in range(n):
            b.mark(10 + 200 * k, at(20))
            b.op("aten::mm", 11 + 200 * k, 20, shapes=[[m, m], [m, m]], dtypes=[dtype, dtype])
            b.kernel(kernel, 30 + 200 * k, 150, launch_ts=12 + 200 * k)
    return build


def test_fp32_matmul_without_tf32(tmp_path):
    r = _report(tmp_path, _matmuls("volta_sgemm_128x64_nn"))
    f = _one(r, "fp32-matmul-no-tf32")
    flops = 4 * 2 * 2048 ** 3
    assert f.location.line == 20
    assert f.est_gain_ms == pytest.approx((600 - flops / (350 * 1e6)) / 1e3)
    tf32 = _report(tmp_path, _matmuls("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32"))
    assert "fp32-matmul-no-tf32" not in _ids(tf32)


def test_no_autocast(tmp_path):
    r = _report(tmp_path, _matmuls("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32"))
    f = _one(r, "no-autocast")
    assert f.location.line == 20 and f.evidence["share_of_busy"] == pytest.approx(1.0)
    assert f.est_gain_ms == pytest.approx((600 - 4 * 2 * 2048 ** 3 / (700 * 1e6)) / 1e3)
    bf16 = _report(tmp_path, _matmuls("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x128x32", dtype=BF16))
    assert "no-autocast" not in _ids(bf16)


# --------------------------------------------------------------------------- fusion

def _elementwise(kernels, interleave_gemm=False):
    def build(b):
        t = 10
        for k in range(kernels):
            b.mark(t, at(40 + k, "gelu"))
            b.op("aten::mul", t + 1, 5, shapes=[[1 << 20], [1 << 20]])
            b.kernel("void at::native::vectorized_elementwise_kernel<4, MulFunctor<float>>", t + 10, 40, launch_ts=t + 2)
            t += 50
            if interleave_gemm:
                b.op("aten::mm", t + 1, 5, shapes=[[64, 64], [64, 64]])
                b.kernel("sm90_xmma_gemm_bf16", t + 10, 40, launch_ts=t + 2)
                t += 50
    return build


def test_eager_elementwise_chain(tmp_path):
    f = _one(_report(tmp_path, _elementwise(5)), "eager-elementwise-chain")
    # One chain of 5 kernels from gelu(): fused, it would cost about its longest kernel.
    assert f.location.function == "gelu" and f.location.line == 40
    assert f.evidence == {"chains": 1, "kernels": 5, "ms": pytest.approx(0.2)}
    assert f.est_gain_ms == pytest.approx(0.16)
    assert "eager-elementwise-chain" not in _ids(_report(tmp_path, _elementwise(2)))
    assert "eager-elementwise-chain" not in _ids(_report(tmp_path, _elementwise(5, interleave_gemm=True)))


def _optimizer(op_name, steps=3):
    params = [[1000, 1000], [1000]]

    def build(b):
        for s in range(steps):
            t = 10 + 300 * s
            b.mark(t, at(70, "step", "optim.py"))
            for j, kind in enumerate(("mul_", "lerp_", "addcdiv_")):
                name = op_name if j == 0 else f"aten::_foreach_{kind}"
                if op_name.startswith("aten::_fused") and j:
                    continue
                b.op(name, t + 1 + 90 * j, 5, shapes=[params, params], dtypes=["TensorList", "TensorList"])
                b.kernel("void at::native::multi_tensor_apply_kernel<...>", t + 10 + 90 * j, 80, launch_ts=t + 2 + 90 * j)
    return build


def test_unfused_optimizer(tmp_path):
    f = _one(_report(tmp_path, _optimizer("aten::_foreach_mul_")), "unfused-optimizer")
    n = 1_001_000
    fused_us = 3 * 7 * n * 4 / (3000 * 1e3)            # 3 steps, 7 fp32 passes (Adam-like: lerp, addcdiv) at 3000 GB/s
    assert f.evidence["parameters"] == n and f.evidence["steps"] == 3
    assert f.est_gain_ms == pytest.approx((9 * 80 - fused_us) / 1e3)
    assert f.location.file == "optim.py"
    assert "unfused-optimizer" not in _ids(_report(tmp_path, _optimizer("aten::_fused_adamw_")))


# --------------------------------------------------------------------------- launch overhead

def _tiny(kernel_us, gap_us=15.0, n=40):
    def build(b):
        b.mark(5, at(55))
        b.op("aten::add", 6, 990, shapes=[[4]])
        t = 10.0
        for _ in range(n):
            b.kernel("void at::native::vectorized_elementwise_kernel<4, AddFunctor<float>>", t, kernel_us,
                     launch_ts=t - 1)
            t += kernel_us + gap_us
    return build


def test_launch_bound(tmp_path):
    r = _report(tmp_path, _tiny(3.0))
    f = _one(r, "launch-bound")
    assert f.location.line == 55 and f.evidence["median_kernel_us"] == 3.0
    assert f.est_gain_ms == pytest.approx((r.timeline.idle_us["launch"] + r.timeline.idle_us["host"]) / 1e3)
    assert "launch-bound" not in _ids(_report(tmp_path, _tiny(30.0, n=30)))


def test_launch_bound_gain_is_the_unprofiled_program_s_idle(tmp_path):
    # 40 kernels of 3 us: 120 us busy in a recorded step of 1 ms, all the idle the host's. Steps timed outside
    # the window took 0.5 ms (median), so the program idles 380 us a step without the profiler, not 880.
    r = _report(tmp_path, _tiny(3.0), unprofiled_ms=[0.4, 0.5, 0.9])
    o = r.overhead
    assert o.clock == "wall clock"
    assert (o.steps, o.step_ms, o.profiled_step_ms, o.busy_step_ms) == (3, 0.5, 1.0, pytest.approx(0.12))
    assert o.inflation == pytest.approx(2.0) and o.idle_scale == pytest.approx(380 / 880)
    f = _one(r, "launch-bound")
    assert f.est_gain_ms == pytest.approx(0.38) and f.evidence["starved_profiled_ms"] == pytest.approx(0.88)
    assert f.evidence["busy_share"] == pytest.approx(0.12 / 0.5) and "0.50 ms unrecorded" in f.message
    u = r.totals["unprofiled"]
    assert u["wall_ms"] == pytest.approx(0.5) and u["idle_ms"] == pytest.approx(0.38)
    console = Console(record=True, width=300)
    r.print(console)
    r.write_html(tmp_path / "r.html")
    said = ("Without the profiler a step took 0.50 ms (median of 3 steps timed outside the window, wall clock) "
            "against 1.00 ms")
    text = console.export_text()
    assert said in text and "stretched steps 2.00x" in text and said in (tmp_path / "r.html").read_text()
    # Unprofiled, a step of 0.2 ms keeps the GPU busy 60% of the time: not launch-bound.
    assert "launch-bound" not in _ids(_report(tmp_path, _tiny(3.0), unprofiled_ms=[0.2] * 3))
    # Where CUDA events timed the steps, they give the step: a host that runs ahead of its GPU marks steps at
    # its own pace (0.1 ms here), not the program's.
    by_events = _report(tmp_path, _tiny(3.0), unprofiled_ms=[0.1] * 3, unprofiled_gpu_ms=[0.4, 0.5, 0.9]).overhead
    assert (by_events.clock, by_events.step_ms, by_events.wall_step_ms) == ("CUDA events", 0.5, 0.1)
    assert by_events.idle_scale == pytest.approx(380 / 880)
    # A program as slow unprofiled as profiled keeps its idle: the scale never exceeds 1.
    assert _report(tmp_path, _tiny(3.0), unprofiled_ms=[3.0] * 3).idle_scale == 1.0


# --------------------------------------------------------------------------- attention

B_, H, N, D = 4, 8, 1024, 64


def _attention_by_hand(b, dtype, gemm, masked=False, grouped=False):
    """q k^T, (the mask filled in,) softmax, @ v: 100 + (50) + 200 + 100 us of kernels, at line 88; grouped: k
    repeated to q's heads first."""
    b.mark(10, at(88, "attend"))
    if grouped:
        b.op("aten::repeat_interleave", 10.2, 0.5, shapes=[[B_, H // 4, N, D], []], dtypes=[dtype, "Scalar"])
        b.kernel("void at::native::index_elementwise_kernel<128, 4>", 12, 3, launch_ts=10.3)
    b.op("aten::bmm", 11, 5, shapes=[[B_ * H, N, D], [B_ * H, D, N]], dtypes=[dtype, dtype])
    b.kernel(gemm, 20, 100, launch_ts=12)
    if masked:
        b.op("aten::masked_fill", 125, 3, shapes=[[B_, H, N, N], [N, N], []], dtypes=[dtype, "bool", "Scalar"])
        b.kernel("void at::native::elementwise_kernel<masked_fill>", 126, 50, launch_ts=126)
    b.op("aten::_softmax", 180, 5, shapes=[[B_, H, N, N], [], []], dtypes=[dtype, "Scalar", "Scalar"],
         scalars=["", "-1", "False"])
    b.kernel("void at::native::cunn_SoftMaxForward<8, float>", 190, 200, launch_ts=181)
    b.op("aten::bmm", 400, 5, shapes=[[B_ * H, N, N], [B_ * H, N, D]], dtypes=[dtype, dtype])
    b.kernel(gemm, 410, 100, launch_ts=401)


def _sdpa(b):
    b.mark(10, at(88, "attend"))
    b.op("aten::_scaled_dot_product_flash_attention", 11, 5, shapes=[[B_, H, N, D]] * 3 + [[], []],
         dtypes=[BF16] * 3 + ["Scalar"] * 2, scalars=["", "", "", "0.", "False"])
    b.kernel("flash_fwd_kernel", 20, 60, launch_ts=12)


def test_manual_attention(tmp_path):
    f = _one(_report(tmp_path, lambda b: _attention_by_hand(b, BF16, "sm90_xmma_gemm_bf16bf16")), "manual-attention")
    sdpa_us = 4.0 * 32 * 1024 * 1024 * 64 / (700 * 0.45 * 1e6)
    assert f.location.line == 88 and f.evidence["ops"] == 3
    assert f.est_gain_ms == pytest.approx((400 - sdpa_us) / 1e3)
    assert "manual-attention" not in _ids(_report(tmp_path, _sdpa))


@pytest.mark.parametrize("grouped", [False, True])
def test_manual_attention_with_a_mask_in_fp32(tmp_path, grouped):
    # fp32 scores with a mask filled in: SDPA is taken as causal (half the FLOPs) on its 3xTF32 kernel (a third
    # of the TF32 ceiling)
    build = lambda b: _attention_by_hand(b, F32, "volta_sgemm_128x64_nn", masked=True, grouped=grouped)  # noqa: E731
    f = _one(_report(tmp_path, build), "manual-attention")
    assert f.evidence["masked"] is True and f.evidence["ops"] == 4 and "is_causal=True" in f.message
    assert f.evidence["grouped_query"] is grouped
    assert ("without enable_gqa" in f.message) is grouped
    sdpa_us = 4.0 * 32 * N * N * D * 0.5 / (PEAKS.matmul_tflops["tf32"] / 3 * 0.45 * 1e6)
    assert f.evidence["sdpa_estimate_ms"] == pytest.approx(sdpa_us / 1e3)
    assert f.est_gain_ms == pytest.approx((450 - sdpa_us) / 1e3)


# --------------------------------------------------------------------------- shapes and occupancy

def _matmul_shape(k_dim, us=100.0):
    def build(b):
        b.mark(10, at(99))
        b.op("aten::mm", 11, 5, shapes=[[4096, k_dim], [k_dim, 4096]], dtypes=[BF16, BF16])
        b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 20, us, launch_ts=12)
    return build


def test_misaligned_matmul(tmp_path):
    r = _report(tmp_path, _matmul_shape(4095, us=600.0))
    f = _one(r, "misaligned-matmul")
    roofline_us = 2 * 4096 * 4096 * 4095 / (700 * 1e6)
    assert f.location.line == 99 and f.evidence["dims"]["K"] == 4095
    assert f.est_gain_ms == pytest.approx((600 - roofline_us / 0.7) / 1e3)
    # The same work with K = 4096 at the same speed is slow, but not for its shape.
    assert "misaligned-matmul" not in _ids(_report(tmp_path, _matmul_shape(4096, us=600.0)))


def _grid(blocks, kernel="void at::native::reduce_kernel<512, 1>"):
    def build(b):
        b.mark(10, at(120))
        b.op("aten::sum", 11, 5, shapes=[[1 << 24]])
        b.kernel(kernel, 20, 300, launch_ts=12, grid=(blocks, 1, 1))
    return build


def test_small_grid(tmp_path):
    f = _one(_report(tmp_path, _grid(33)), "small-grid")
    assert f.location.line == 120 and f.evidence["blocks"] == 33 and f.evidence["sms"] == 132
    assert f.est_gain_ms == pytest.approx(300 * (1 - 33 / 132) / 1e3)
    assert "small-grid" not in _ids(_report(tmp_path, _grid(264)))
    # NCCL's grid is its channels (24 blocks on two H200s): not a kernel short of parallelism
    nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    assert "small-grid" not in _ids(_report(tmp_path, _grid(24, nccl)))


def test_below_roofline(tmp_path):
    # 64 MB elementwise in 100 us: 671 GB/s, 22% of 3000 GB/s.
    def build(b, us):
        b.mark(10, at(130))
        b.op("aten::add", 11, 5, shapes=[[1 << 23], [1 << 23]])
        b.kernel("void at::native::vectorized_elementwise_kernel<4, AddFunctor<float>>", 20, us, launch_ts=12)

    f = _one(_report(tmp_path, lambda b: build(b, 150.0)), "below-roofline")
    roofline_us = 3 * 4 * (1 << 23) / (3000 * 1e3)
    assert f.location.line == 130 and f.evidence["bound"] == "memory"
    assert f.est_gain_ms == pytest.approx((150 - roofline_us) / 1e3)
    assert "below-roofline" not in _ids(_report(tmp_path, lambda b: build(b, roofline_us * 1.2)))


def test_below_roofline_in_both_passes_says_which_is_which(tmp_path):
    # the same fill in the forward and the backward pass, alike: two findings that must not read as one twice
    def build(b):
        b.mark(10, at(130))
        b.op("aten::masked_fill_", 11, 5, seq=1, shapes=[[1 << 23], [1 << 23], []])
        b.kernel("void at::native::elementwise_kernel<masked_fill_kernel>", 20, 150, launch_ts=12)
        b.op("autograd::engine::evaluate_function: MaskedFillBackward0", 300, 200, tid=AUTOGRAD, seq=1,
             backward=True)
        b.op("aten::masked_fill_", 305, 5, tid=AUTOGRAD, shapes=[[1 << 23], [1 << 23], []])
        b.kernel("void at::native::elementwise_kernel<masked_fill_kernel>", 320, 150, launch_ts=306, tid=AUTOGRAD)

    found = [f for f in _report(tmp_path, build).findings if f.id == "below-roofline"]
    assert sorted(f.title.split(" at ")[0] for f in found) == ["aten::masked_fill_", "aten::masked_fill_ (backward)"]


# --------------------------------------------------------------------------- ranking

def test_findings_are_ranked_by_gain_and_graded_by_share(tmp_path):
    def build(b):
        _copies("Pageable")(b)
        _grid(33)(b)

    r = _report(tmp_path, build)
    gains = [f.est_gain_ms for f in r.findings]
    assert gains == sorted(gains, reverse=True) and len(gains) >= 2
    for f in r.findings:
        share = f.est_gain_ms / (r.timeline.window_us / 1e3)
        assert f.severity == ("high" if share >= 0.10 else "medium" if share >= 0.03 else "low")
    assert all(f.est_gain_ms >= findings.MIN_SHARE * r.timeline.window_us / 1e3 for f in r.findings)


def test_cpu_only_trace_has_no_gpu_findings(tmp_path):
    b = TraceBuilder(gpu=False)
    b.mark(0, at(5))
    b.op("aten::mm", 1, 500, shapes=[[512, 512], [512, 512]])
    r = analyze(b.write(tmp_path / "cpu.json"), peaks=PEAKS)
    assert r.attribution.device == "cpu" and r.findings == []
