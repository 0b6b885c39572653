"""FLOPs and bytes per aten op against values computed by hand, and the roofline placement of an op."""

import pytest

from roofline.profiler.costs import OpRow, ParameterSet, Peaks, cost, display_name, roofline_cell
from roofline.profiler.report import analyze
from roofline.profiler.trace import Op

from .synth import PEAKS, TraceBuilder

F32, BF16, I64 = "float", "c10::BFloat16", "long int"


def op(name, shapes, dtypes, scalars=None):
    return Op("aten::" + name, 1, 0.0, 1.0, shapes=shapes, dtypes=dtypes, scalars=scalars or [""] * len(shapes))


@pytest.mark.parametrize("name, shapes, dtypes, flops, nbytes, mm", [
    # [64, 128] @ [128, 256] fp32: 2*64*256*128 FLOPs; read 64*128 + 128*256, write 64*256, 4 bytes each
    ("mm", [[64, 128], [128, 256]], [F32, F32], 2 * 64 * 256 * 128, 4 * (64 * 128 + 128 * 256 + 64 * 256), "fp32"),
    # addmm: the bias [256] is read too
    ("addmm", [[256], [64, 128], [128, 256]], [BF16] * 3, 2 * 64 * 256 * 128,
     2 * (64 * 128 + 128 * 256 + 64 * 256 + 256), "bf16"),
    # bmm [8, 32, 16] @ [8, 16, 24]
    ("bmm", [[8, 32, 16], [8, 16, 24]], [BF16] * 2, 2 * 8 * 32 * 24 * 16, 2 * 8 * (32 * 16 + 16 * 24 + 32 * 24), "bf16"),
    # linear: x [4, 10, 32] @ w[48, 32]^T -> M = 40
    ("linear", [[4, 10, 32], [48, 32]], [F32, F32], 2 * 40 * 48 * 32, 4 * (40 * 32 + 32 * 48 + 40 * 48), "fp32"),
    # matmul with a broadcast batch: [2, 1, 8, 4] @ [3, 4, 5] -> batch 2*3
    ("matmul", [[2, 1, 8, 4], [3, 4, 5]], [F32, F32], 2 * 6 * 8 * 5 * 4, 4 * 6 * (8 * 4 + 4 * 5 + 8 * 5), "fp32"),
])
def test_matmul_family(name, shapes, dtypes, flops, nbytes, mm):
    c = cost(op(name, shapes, dtypes))
    assert (c.rule, c.flops, c.bytes, c.matmul_dtype) == ("matmul", flops, nbytes, mm)


def test_attention_forward_backward_and_causal():
    q = [2, 4, 128, 64]
    b, h, n, d = q
    qkv = 3 * b * h * n * d * 2
    out = b * h * n * d * 2
    fwd = cost(op("_scaled_dot_product_flash_attention", [q, q, q, [], []], [BF16] * 3 + ["Scalar"] * 2,
                  ["", "", "", "0.", "False"]))
    assert fwd.rule == "attention" and fwd.matmul_dtype == "bf16"
    assert fwd.flops == 4 * b * h * n * n * d and fwd.bytes == qkv + out
    causal = cost(op("_scaled_dot_product_flash_attention", [q, q, q, [], []], [BF16] * 3 + ["Scalar"] * 2,
                     ["", "", "", "0.", "True"]))
    assert causal.flops == fwd.flops / 2
    # The backward's first argument is dout; q, k, v follow.
    bwd = cost(op("_scaled_dot_product_flash_attention_backward", [q, q, q, q], [BF16] * 4))
    assert bwd.flops == 2.5 * fwd.flops and bwd.bytes == 2 * (qkv + out) + out


def test_convolution():
    # x [2, 3, 32, 32], w [16, 3, 3, 3], stride 1, padding 1: out [2, 16, 32, 32]
    shapes = [[2, 3, 32, 32], [16, 3, 3, 3], [16], [], [], [], [], [], []]
    dtypes = [F32, F32, F32, "GenericList", "GenericList", "GenericList", "Scalar", "GenericList", "Scalar"]
    scalars = ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]
    c = cost(op("convolution", shapes, dtypes, scalars))
    out = 2 * 16 * 32 * 32
    assert c.rule == "conv" and c.flops == 2 * out * 3 * 9
    assert c.bytes == 4 * (2 * 3 * 32 * 32 + 16 * 27 + out + 16)
    strided = cost(op("convolution", shapes, dtypes, ["", "", "", "[2, 2]"] + scalars[4:]))
    assert strided.flops == c.flops / 4   # stride 2 halves both spatial dims of the output


def test_elementwise_broadcast_inplace_and_scalars():
    add = cost(op("add", [[8, 1, 16], [4, 1], []], [F32, F32, "Scalar"], ["", "", "1"]))
    assert add.rule == "elementwise" and add.flops == 8 * 4 * 16
    assert add.bytes == 4 * (8 * 16 + 4) + 4 * 8 * 4 * 16
    inplace = cost(op("mul_", [[1000], [1000]], [F32, F32]))
    assert inplace.bytes == 4 * 2000                   # reads both, writes into the first: no new output
    # A Python scalar arrives as a 0-d double tensor; it must not make a bf16 output 8 bytes wide.
    scaled = cost(op("mul", [[1000], []], [BF16, "double"]))
    assert scaled.bytes == 2 * 1000 + 8 + 2 * 1000


def test_reductions_softmax_normalization():
    s = cost(op("sum", [[64, 32], [], [], []], [F32, "ScalarList", "Scalar", ""], ["", "[1]", "False", ""]))
    assert s.rule == "reduction" and s.flops == 64 * 32 and s.bytes == 4 * (64 * 32 + 64)
    total = cost(op("sum", [[64, 32], []], [F32, ""]))
    assert total.bytes == 4 * (64 * 32 + 1)
    sm = cost(op("_softmax", [[8, 128], [], []], [F32, "Scalar", "Scalar"], ["", "-1", "False"]))
    assert sm.rule == "softmax" and sm.flops == 5 * 1024 and sm.bytes == 2 * 4 * 1024
    half_to_float = cost(op("_softmax", [[8, 128], [], []], [BF16, "Scalar", "Scalar"], ["", "-1", "True"]))
    assert half_to_float.bytes == 1024 * (2 + 4)
    ln = cost(op("native_layer_norm", [[32, 512], [], [512], [512], []], [BF16, "ScalarList", BF16, BF16, "Scalar"]))
    assert ln.rule == "normalization" and ln.bytes == 2 * 32 * 512 * 2 + 2 * 2 * 512


def test_copies_casts_fill_embedding_loss():
    cast = cost(op("_to_copy", [[1024], []], [F32, "Scalar"], ["", "15"]))   # 15 = bfloat16
    assert cast.rule == "copy" and cast.flops == 0 and cast.bytes == 1024 * (4 + 2)
    copy = cost(op("copy_", [[1024], [1024], []], [BF16, F32, "Scalar"]))
    assert copy.bytes == 1024 * (4 + 2)
    cat = cost(op("cat", [[10, 4], [10, 4]], [F32, F32]))
    assert cat.bytes == 2 * 2 * 160
    assert cost(op("zero_", [[300]], [F32])).bytes == 1200
    emb = cost(op("embedding", [[50000, 256], [8, 128]], [BF16, I64]))
    assert emb.rule == "embedding" and emb.bytes == 2 * 8 * 128 * 256 * 2 + 8 * 128 * 8
    nll = cost(op("nll_loss_forward", [[32, 1000], [32], [], [], []], [F32, I64, "", "Scalar", "Scalar"]))
    assert nll.rule == "loss" and nll.bytes == 32 * 4 + 32 * 8


def test_foreach_and_fused_optimizer():
    params = [[100, 10], [10]]
    lerp = cost(op("_foreach_lerp_", [params, params, []], ["TensorList", "TensorList", "Scalar"]))
    assert lerp.rule == "foreach" and lerp.flops == 2 * 1010 and lerp.bytes == (2 * 1010 + 1010) * 4
    fused = cost(op("_fused_adamw_", [params] * 5, ["TensorList"] * 5))
    assert fused.rule == "optimizer" and fused.bytes == (2 * 5 - 1) * 1010 * 4


def test_tensor_lists_the_profiler_left_empty_are_costed_from_the_optimizer_s_parameters():
    # torch.profiler records a tensor list past a few dozen tensors as [] (a GPT-2's 148 parameters): without
    # the optimizer's parameters there is no cost model (not 0 bytes, which made a roofline of 0 ms)
    unrecorded = op("_fused_adamw_", [[]] * 6 + [[]] * 2, ["TensorList"] * 6 + ["Scalar"] * 2)
    assert cost(unrecorded) is None
    params = ParameterSet(tensors=148, numel=124_000_000, itemsize=4)
    fused = cost(unrecorded, params)
    # params, grads, exp_avg, exp_avg_sq read, params and both moments written: 7 passes of fp32
    assert (fused.rule, fused.bytes, fused.flops) == ("optimizer", 7 * 124_000_000 * 4, 15 * 124_000_000)
    assert "148 parameters" in fused.note
    lerp = cost(op("_foreach_lerp_", [[], [], []], ["TensorList", "TensorList", "Scalar"]), params)
    assert lerp.rule == "foreach" and lerp.bytes == 3 * 124_000_000 * 4
    assert cost(op("_foreach_lerp_", [[], [], []], ["TensorList", "TensorList", "Scalar"])) is None
    two = {"optimizers": [{"tensors": 2, "numel": 10, "itemsize": 4}] * 2}
    assert ParameterSet.from_facts(two) is None and ParameterSet.from_facts({}) is None


def test_a_loss_s_backward_and_gather_count_what_they_touch_not_the_whole_matrix():
    # nll_loss_backward writes one element per row (its zero fill is an op of its own); gather reads as many
    # elements of its source as the index holds
    back = cost(op("nll_loss_backward", [[], [8192, 50304], [8192], [], [], [], []],
                   [F32, F32, I64, "", "Scalar", "Scalar", F32]))
    assert (back.flops, back.bytes) == (8192, 8192 * (4 + 8) + 4)
    gather = cost(op("gather", [[8192, 50304], [], [8192, 1], []], [F32, "Scalar", I64, "Scalar"]))
    assert (gather.rule, gather.flops, gather.bytes) == ("gather", 0, 8192 * (2 * 4 + 8))


def test_roofline_ops_are_costed_as_their_benchmarks_count_them():
    forward = Op("roofline::layer_norm", 1, 0.0, 1.0, shapes=[[64, 128], [128], [128]], dtypes=[BF16] * 3,
                 scalars=[""] * 3)
    fwd = cost(forward)
    assert (fwd.rule, fwd.bytes) == ("roofline", 2 * 64 * 128 * 2)      # read x, write y
    backward = Op("roofline::layer_norm_backward", 2, 0.0, 1.0, shapes=[[64, 128]], dtypes=[BF16], scalars=[""])
    assert cost(backward, forward=forward).bytes == 3 * 64 * 128 * 2       # read y (or x) and dy, write dx
    assert cost(backward) is None                                           # no forward linked: no cost model
    rope = Op("roofline::rope", 1, 0.0, 1.0, shapes=[[1, 32, 16, 64], [1, 8, 16, 64], [16, 64], [16, 64]],
              dtypes=[BF16] * 4, scalars=[""] * 4)
    assert cost(rope).bytes == 2 * (32 + 8) * 16 * 64 * 2                   # q and k read and written
    linear = Op("roofline::linear", 1, 0.0, 1.0, shapes=[[8, 256], [512, 256]], dtypes=[BF16] * 2,
                scalars=[""] * 2)
    lin_bwd = Op("roofline::linear_backward", 2, 0.0, 1.0, shapes=[[8, 512]], dtypes=[BF16], scalars=[""])
    assert (cost(linear).flops, cost(linear).matmul_dtype) == (2 * 8 * 512 * 256, "bf16")
    assert cost(lin_bwd, forward=linear).flops == 4 * 8 * 512 * 256
    q = [2, 4, 128, 64]
    attention = Op("roofline::flash_attention", 1, 0.0, 1.0, shapes=[q, q, q, [], []],
                   dtypes=[BF16] * 3 + ["Scalar", "Scalar"], scalars=["", "", "", "True", "0.125"])
    assert cost(attention).flops == 4 * 2 * 4 * 128 * 128 * 64 / 2          # causal: half
    assert cost(Op("roofline::some_new_op", 1, 0.0, 1.0, shapes=[[4]], dtypes=[BF16], scalars=[""])) is None


def test_roofline_ops_under_torch_compile_take_their_public_names_and_costs():
    """Compiled, a roofline op runs as its registered op (roofline::norm_rows, roofline::softmax_rows_backward)
    with its own arguments and no forward linked (the argument lists as a CPU trace records them)."""
    x = [64, 128]

    def registered(name, shapes, dtypes, scalars):
        return Op(f"roofline::{name}", 1, 0.0, 1.0, shapes=shapes, dtypes=dtypes, scalars=scalars)

    # (x, residual, weight, bias, n, eps, rms, stats)
    norm = dict(shapes=[x, [], [128], [128], [], [], [], []], dtypes=[F32, "", F32, F32] + ["Scalar"] * 4)
    layer = registered("norm_rows", **norm, scalars=["", "", "", "", "128", "1e-05", "False", "True"])
    rms = registered("norm_rows", **norm, scalars=["", "", "", "", "128", "1e-05", "True", "True"])
    add = registered("norm_rows", shapes=[x, x, [128], [], [], [], [], []], dtypes=[F32, F32, F32, ""] + ["Scalar"] * 4,
                     scalars=["", "", "", "", "128", "1e-05", "True", "True"])
    # (dy, x, weight, stats, dresidual, rms, bias_dtype)
    layer_back = registered("norm_rows_backward", [x, x, [128], [128], [], [], []],
                            [F32, F32, F32, F32, "", "Scalar", "Scalar"], ["", "", "", "", "", "False", "6"])
    soft_back = registered("softmax_rows_backward", [x, x, []], [F32, F32, "Scalar"], ["", "", "True"])
    gelu_back = registered("gelu_backward", [x, x, []], [F32, F32, "Scalar"], ["", "", "'tanh'"])
    unit = 64 * 128 * 4
    assert [display_name(o) for o in (layer, rms, add, layer_back, soft_back, gelu_back)] == [
        "roofline::layer_norm", "roofline::rms_norm", "roofline::add_rms_norm", "roofline::layer_norm_backward",
        "roofline::log_softmax_backward", "roofline::gelu_backward"]
    assert [cost(o).bytes for o in (layer, add, layer_back, soft_back, gelu_back)] == [
        2 * unit, 4 * unit, 3 * unit, 3 * unit, 3 * unit]
    # an eager backward node keeps its own name and is costed from its forward
    eager = Op("roofline::layer_norm_backward", 2, 0.0, 1.0, shapes=[x], dtypes=[F32], scalars=[""], forward=0)
    assert display_name(eager) == "roofline::layer_norm_backward"


@pytest.mark.parametrize("name, shapes, dtypes", [
    ("view", [[4, 4], []], [F32, "ScalarList"]), ("resolve_conj", [[4096, 4096]], [F32]),
    ("resolve_neg", [[4096, 4096]], [F32]), ("as_strided_", [[64, 64], [], [], []], [F32, "", "", ""]),
    ("alias", [[128]], [F32]), ("_neg_view", [[128]], [F32]), ("unflatten", [[8, 64], [], []], [F32, "", ""])])
def test_views_and_metadata_ops_cost_nothing(name, shapes, dtypes):
    """resolve_conj and as_strided_ were charged bytes as elementwise ops and plotted at 183% of the roofline."""
    found = cost(op(name, shapes, dtypes))
    assert (found.flops, found.bytes, found.rule) == (0.0, 0.0, "view")


def test_a_view_s_row_has_no_place_on_the_roofline(tmp_path):
    b = TraceBuilder()
    b.op("aten::resolve_conj", 0.0, 30.0, shapes=[[4096, 4096]], dtypes=[F32])
    b.kernel("void at::native::vectorized_elementwise_kernel<4, CopyFunctor>(int)", 20.0, 5.0, launch_ts=10.0)
    (row,) = [o for o in analyze(b.write(tmp_path / "t.json"), peaks=PEAKS).ops if o.name == "aten::resolve_conj"]
    assert row.rule == "view" and (row.flops, row.bytes) == (0.0, 0.0)
    assert row.pct_of_roofline is None and row.bound is None and row.headroom_us is None
    assert roofline_cell(row.rule, row.pct_of_roofline, str) == "view"


def test_unknown_ops_get_the_default():
    weird = cost(op("some_custom_op", [[10, 10]], [F32]))
    assert weird.rule == "default" and weird.bytes == 2 * 400


def test_roofline_placement():
    peaks = Peaks(gbps=1000.0, matmul_tflops={"bf16": 500.0, "fp32": 50.0, "tf32": 250.0}, vector_tflops=50.0,
                  source="measured")
    # 1 GFLOP, 10 MB in 100 us: intensity 100 FLOP/B below the bf16 ridge of 500 -> memory-bound;
    # roofline time max(1e9/500e12, 1e7/1e12) = 10 us, so 10% of the roofline and 90 us of headroom.
    row = OpRow("aten::mm", [], [], "matmul", count=1, us=100.0, flops=1e9, bytes=1e7, matmul_dtype="bf16",
                peak_tflops=peaks.compute("bf16", True), peak_gbps=peaks.gbps)
    assert row.intensity == 100 and row.bound == "memory"
    assert row.roofline_us == pytest.approx(10) and row.pct_of_roofline == pytest.approx(0.1)
    assert row.headroom_us == pytest.approx(90) and row.tflops == pytest.approx(10) and row.gbps == pytest.approx(100)
    assert peaks.compute("fp32", tensor_cores=True) == 250 and peaks.compute("fp32", tensor_cores=False) == 50
    assert peaks.compute(None, False) == 50


def test_an_op_faster_than_dram_allows_is_placed_against_l2_when_its_bytes_fit(tmp_path):
    peaks = Peaks(gbps=3000.0, matmul_tflops={"bf16": 700.0}, vector_tflops=50.0, source="measured",
                  l2_gbps=10000.0, l2_bytes=50 << 20)
    b = TraceBuilder()
    b.op("ProfilerStep#1", 0, 1000, cat="user_annotation")
    # 12 MB a call (fits in L2) in 2 us: 6 TB/s, twice the DRAM roof
    b.op("aten::add", 10, 5, shapes=[[1024, 1024], [1024, 1024], []], dtypes=[F32, F32, "Scalar"])
    b.kernel("void at::native::vectorized_elementwise_kernel<4, AddFunctor<float>>", 20, 2.0, launch_ts=12)
    # 805 MB a call (no cache holds it) in 100 us: 8 TB/s, which no ceiling explains
    b.op("aten::mul", 100, 5, shapes=[[8192, 8192], [8192, 8192], []], dtypes=[F32, F32, "Scalar"])
    b.kernel("void at::native::vectorized_elementwise_kernel<4, MulFunctor<float>>", 110, 100.0, launch_ts=102)
    ops = {o.name: o for o in analyze(b.write(tmp_path / "t.json"), peaks=peaks).ops}
    add, mul = ops["aten::add"], ops["aten::mul"]
    assert add.l2_resident and add.bound == "memory (L2)" and add.peak_gbps == 10000.0
    assert add.pct_of_roofline == pytest.approx(12 * 1024 * 1024 / 10000e3 / 2.0)
    assert not mul.l2_resident and mul.bound == "memory" and mul.pct_of_roofline > 1


def test_an_expanded_index_is_counted_as_the_memory_it_holds():
    # idx[..., None].expand(8192, 768): 8192 int64 in memory, not 8192 x 768
    gather = op("gather", [[50304, 768], [], [8192, 768]], [F32, "Scalar", I64])
    gather.strides = [[768, 1], [], [1, 0]]
    assert cost(gather).bytes == 8192 * 768 * 2 * 4 + 8192 * 8


def test_parameter_sizes_that_would_outrun_dram_were_not_the_parameters(tmp_path):
    b = TraceBuilder()
    b.facts = {"optimizers": [{"class": "AdamW", "tensors": 148, "numel": 124_000_000, "itemsize": 4}]}
    b.op("ProfilerStep#1", 0, 5000, cat="user_annotation")
    # fused AdamW over 124 M parameters: 7 x 496 MB at 3 TB/s is 1.16 ms; it took 1.5
    b.op("aten::_fused_adamw_", 10, 5, shapes=[[]] * 6, dtypes=["TensorList"] * 6)
    b.kernel("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", 20, 1500.0, launch_ts=12)
    # its step counts, 148 scalars, incremented in 5 us: as parameters that would be 300 TB/s
    b.op("aten::_foreach_add_", 2000, 5, shapes=[[], []], dtypes=["TensorList", "Scalar"])
    b.kernel("void at::native::multi_tensor_apply_kernel<BinaryOpScalarFunctor>", 2010, 5.0, launch_ts=2002)
    ops = {o.name: o for o in analyze(b.write(tmp_path / "t.json"), peaks=PEAKS).ops}
    fused, steps = ops["aten::_fused_adamw_"], ops["aten::_foreach_add_"]
    assert fused.rule == "optimizer" and fused.pct_of_roofline == pytest.approx(7 * 496e6 / 3000e3 / 1500.0)
    assert steps.rule is None and steps.pct_of_roofline is None and "no cost model" in steps.note
