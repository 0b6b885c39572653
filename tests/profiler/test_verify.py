"""roofline profile --verify: findings of synthetic traces whose fixes are rebuilt on the recorded (small) shapes,
checked against float64 and timed on the CPU; the reasons given where nothing can be measured."""

import json

import pytest
from rich.console import Console

from roofline.profiler import verify
from roofline.profiler.html import render as render_html
from roofline.profiler.report import analyze

from .synth import AUTOGRAD, PEAKS, TraceBuilder, at

BF16, F32 = "c10::BFloat16", "float"
QUICK = dict(device="cpu", rounds=6, rep_ms=2.0)


def _report(tmp_path, build, facts=None):
    b = TraceBuilder()
    b.facts.update(facts or {})
    b.op("ProfilerStep#1", 0, 1000.0, cat="user_annotation")
    build(b)
    return analyze(b.write(tmp_path / "t.json"), peaks=PEAKS)


def _finding(report, rule_id):
    found = [f for f in report.findings if f.id == rule_id]
    assert len(found) == 1, [f.id for f in report.findings]
    return found[0]


def _measured_once(v: verify.Verification, us: float):
    """One case measured, its gain the profiled time times (1 - 1/speedup), inside its own interval."""
    assert v.reason is None and len(v.measured) == 1, v.summary()
    case = v.measured[0]
    assert case.check.startswith("relative error") and case.error is None
    assert case.low <= case.speedup <= case.high
    assert v.gain_ms == pytest.approx(us * (1 - 1 / case.speedup) / 1e3)
    low, high = v.interval_ms
    assert low <= v.gain_ms <= high
    assert v.covered_share == pytest.approx(1.0)


def _fp32_matmul(b):
    b.mark(10, at(20))
    b.op("aten::addmm", 11, 5, shapes=[[48], [64, 96], [96, 48]], dtypes=[F32] * 3)
    b.kernel("volta_sgemm_128x64_nn", 20, 600, launch_ts=12)


def test_fp32_matmul_fixes_are_timed_on_the_recorded_shapes(tmp_path):
    r = _report(tmp_path, _fp32_matmul)
    verify.verify(r, **QUICK)
    tf32, bf16 = _finding(r, "fp32-matmul-no-tf32"), _finding(r, "no-autocast")
    _measured_once(tf32.verified, 600.0)
    _measured_once(bf16.verified, 600.0)
    assert "TF32" in tf32.verified.replacement and "bf16" in bf16.verified.replacement
    assert "aten::addmm [48] x [64, 96] x [96, 48]" == tf32.verified.cases[0].label
    # the JSON says it, next to the estimate
    d = json.loads(json.dumps(r.to_dict(), default=str))
    v = next(f["verified"] for f in d["findings"] if f["id"] == "no-autocast")
    assert v["gain_ms"] == pytest.approx(bf16.verified.gain_ms) and v["cases"][0]["speedup"] > 0


def test_a_replacement_that_disagrees_is_not_timed(tmp_path, monkeypatch):
    r = _report(tmp_path, _fp32_matmul)
    f = _finding(r, "fp32-matmul-no-tf32")

    def wrong(finding, report):
        import torch

        def build(device):
            x = torch.randn(8, 8)
            return verify.Built(lambda: x, lambda: x + 1, lambda: verify._agree([(x + 1, x)], 1e-3))
        return "an off-by-one", [verify.Case("x + 1", 600.0, build)]

    monkeypatch.setitem(verify.REPLACEMENTS, f.id, wrong)
    v = verify.verify_finding(f, r, verify.torch.device("cpu"), rounds=6, rep_ms=2.0)
    assert v.gain_ms is None and v.cases[0].speedup is None
    assert "over the tolerance" in v.cases[0].error and v.summary().startswith("not measured")


def _misaligned(b):
    b.mark(10, at(99))
    b.op("aten::mm", 11, 5, shapes=[[64, 63], [63, 64]], dtypes=[BF16, BF16])
    b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 20, 600, launch_ts=12)


def test_misaligned_matmul_is_timed_padded(tmp_path):
    r = _report(tmp_path, _misaligned)
    f = _finding(r, "misaligned-matmul")
    assert f.evidence["pad_to"] == 64
    verify.verify(r, **QUICK)
    _measured_once(f.verified, 600.0)
    assert "multiples of 64" in f.verified.replacement


def _attention(b):
    bh, n, d = 2, 128, 16
    b.mark(10, at(88, "attend"))
    b.op("aten::bmm", 11, 5, shapes=[[bh, n, d], [bh, d, n]], dtypes=[F32, F32])
    b.kernel("volta_sgemm", 20, 100, launch_ts=12)
    b.op("aten::_softmax", 130, 5, shapes=[[1, bh, n, n], [], []], dtypes=[F32, "Scalar", "Scalar"],
         scalars=["", "-1", "False"])
    b.kernel("void at::native::cunn_SoftMaxForward<8, float>", 140, 200, launch_ts=131)
    b.op("aten::bmm", 350, 5, shapes=[[bh, n, n], [bh, n, d]], dtypes=[F32, F32])
    b.kernel("volta_sgemm", 360, 100, launch_ts=351)


def test_manual_attention_is_timed_against_sdpa(tmp_path):
    r = _report(tmp_path, _attention)
    f = _finding(r, "manual-attention")
    assert f.evidence["head_dim"] == 16 and f.evidence["dtype"] == F32 and f.evidence["backward"] is False
    verify.verify(r, **QUICK)
    _measured_once(f.verified, 400.0)
    assert f.verified.replacement == "torch.nn.functional.scaled_dot_product_attention"
    assert "[1, 2, 128, 128] scores, head_dim 16" in f.verified.cases[0].label


@pytest.mark.parametrize("masked", [False, True])
def test_attention_forward_and_backward_check_their_gradients(masked):
    import torch

    finding = verify_finding_stub("manual-attention", {"scores_shape": [1, 2, 32, 32], "head_dim": 8,
                                                       "dtype": F32, "backward": True, "masked": masked})
    replacement, (case,) = verify._attention(finding, None)
    assert ("is_causal=True" in replacement) == masked and ("causal" in case.label) == masked
    built = case.build(torch.device("cpu"))
    assert built.grads is not None and len(built.grads) == 3
    assert built.check().startswith("relative error")
    assert all(g.grad is not None for g in built.grads)


def _optimizer(b):
    params = [[1000, 100], [1000]]
    for s in range(3):
        t = 10 + 300 * s
        b.mark(t, at(70, "step", "optim.py"))
        for j, kind in enumerate(("mul_", "lerp_", "addcdiv_")):
            b.op(f"aten::_foreach_{kind}", t + 1 + 90 * j, 5, shapes=[params, params],
                 dtypes=["TensorList", "TensorList"])
            b.kernel("void at::native::multi_tensor_apply_kernel<...>", t + 10 + 90 * j, 80,
                     launch_ts=t + 2 + 90 * j)


def test_unfused_optimizer_is_timed_against_fused(tmp_path):
    r = _report(tmp_path, _optimizer)
    f = _finding(r, "unfused-optimizer")
    verify.verify(r, **QUICK)
    assert f.verified.replacement == "`fused=True` (AdamW)"
    assert f.verified.cases[0].label == "the optimizer's step over its parameters as recorded"
    # one case stands for every foreach op of the step: its time is theirs
    assert f.verified.gain_ms == pytest.approx(9 * 80 * (1 - 1 / f.verified.cases[0].speedup) / 1e3)
    assert "relative error" in f.verified.cases[0].check


def test_unrecorded_parameters_come_from_the_optimizer_facts(tmp_path):
    def build(b):
        for s in range(3):
            t = 10 + 300 * s
            b.mark(t, at(70, "step", "optim.py"))
            for j, kind in enumerate(("mul_", "lerp_", "addcdiv_")):
                b.op(f"aten::_foreach_{kind}", t + 1 + 90 * j, 5, shapes=[[], []], dtypes=["TensorList"] * 2)
                b.kernel("void at::native::multi_tensor_apply_kernel<...>", t + 10 + 90 * j, 80,
                         launch_ts=t + 2 + 90 * j)

    facts = {"optimizers": [{"tensors": 4, "numel": 40_000, "itemsize": 4}]}
    r = _report(tmp_path, build, facts)
    f = _finding(r, "unfused-optimizer")
    _, (case,) = verify._optimizer(f, r)
    assert case.label.startswith("the optimizer's step over 4 parameters of equal size")


def _norm(b, us=300.0):
    b.mark(10, at(130))
    b.op("aten::native_layer_norm", 11, 5, shapes=[[64, 256], [], [256], [256], []],
         dtypes=[F32, "Scalar", F32, F32, "Scalar"])
    b.kernel("void at::native::vectorized_layer_norm_kernel<float, float>", 20, us, launch_ts=12)


def test_slow_torch_op_is_timed_against_the_roofline_op(tmp_path):
    r = _report(tmp_path, _norm)
    f = _finding(r, "below-roofline")
    verify.verify(r, **QUICK)
    _measured_once(f.verified, 300.0)
    assert f.verified.replacement == "roofline.ops.layer_norm"


def _norm_backward(b):
    b.mark(10, at(130))
    b.op("autograd::engine::evaluate_function: NativeLayerNormBackward0", 11, 400, tid=AUTOGRAD, seq=1,
         backward=True)
    b.op("aten::native_layer_norm_backward", 12, 5, tid=AUTOGRAD,
         shapes=[[64, 256], [64, 256], [], [64, 1], [64, 1], [256], [256], []],
         dtypes=[F32, F32, "Scalar", F32, F32, F32, F32, "Scalar"])
    b.kernel("void at::native::layer_norm_grad_input_kernel<float>", 20, 300, launch_ts=13, tid=AUTOGRAD)


def test_a_slow_backward_op_is_timed_against_the_roofline_op_s_backward(tmp_path):
    r = _report(tmp_path, _norm_backward)
    f = _finding(r, "below-roofline")
    assert f.ops[0].backward
    verify.verify(r, **QUICK)
    _measured_once(f.verified, 300.0)
    assert f.verified.replacement == "roofline.ops.layer_norm (its backward, timed alone)"


@pytest.mark.parametrize("name, scalars", [("aten::_softmax", ["", "0", "False"]),
                                           ("aten::_softmax_backward_data", ["", "", "0", ""])])
def test_a_softmax_over_another_dimension_is_not_replaced(name, scalars):
    x = 1 if name.endswith("data") else 0
    row = type("Row", (), dict(name=name, shapes=[[8, 16]] * (x + 1) + [[], []], dtypes=[F32] * (x + 1) + ["Scalar"] * 2,
                               scalars=scalars, backward=x == 1, us=100.0))()
    f = verify_finding_stub("below-roofline", {}, ops=[row])
    assert "last dimension" in verify.verify_finding(f, None, verify.torch.device("cpu")).reason


def test_what_cannot_be_measured_says_why(tmp_path, monkeypatch):
    assert "not to an op" in verify.verify_finding(verify_finding_stub("launch-bound", {}), None,
                                                   verify.torch.device("cpu")).reason
    # a softmax over another dimension than the last is not what roofline.ops.softmax serves
    row = type("Row", (), dict(name="aten::_softmax", shapes=[[8, 16], [], []], dtypes=[F32, "Scalar", "Scalar"],
                               scalars=["", "0", "False"], backward=False, us=100.0))()
    f = verify_finding_stub("below-roofline", {}, ops=[row])
    assert "last dimension" in verify.verify_finding(f, None, verify.torch.device("cpu")).reason
    # a GPU trace analyzed where there is no GPU
    monkeypatch.setattr(verify.torch.cuda, "is_available", lambda: False)
    r = _report(tmp_path, _norm)
    verify.verify(r)
    assert _finding(r, "below-roofline").verified.reason == "the trace ran on a GPU, and none is here"


def test_measured_gains_are_shown_beside_the_estimates(tmp_path):
    r = _report(tmp_path, _norm)
    verify.verify(r, **QUICK)
    console = Console(record=True, width=200)
    r.print(console)
    text = console.export_text()
    assert "measured ms" in text and "measured " in text and "roofline.ops.layer_norm" in text
    html = render_html(json.loads(json.dumps(r.to_dict(), default=str)))
    assert 'class="verified"' in html and "roofline.ops.layer_norm" in html


def verify_finding_stub(rule_id, evidence, ops=()):
    from roofline.profiler.findings import Finding

    return Finding(rule_id, "t", "m", 1.0, evidence=evidence, ops=list(ops))
