"""Kernel names, categories, and the kernel and memory tables."""

import pytest

from roofline.profiler import kernels
from roofline.profiler.trace import load

from .synth import TraceBuilder

GELU = ("void at::native::vectorized_elementwise_kernel<8, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
        "at::native::GeluType)::{lambda()#1}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >"
        "(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#1}, std::array<char*, 2ul>)")
MEAN = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, "
        "float>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, "
        "unsigned int, float, 4, 4>)")
COPY = ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda"
        "(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&)>(int)")
SOFTMAX = "void (anonymous namespace)::softmax_warp_forward<float, float, float, 4, true, false>(float*, float const*, int)"
MASKED_FILL = ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::(anonymous "
               "namespace)::masked_fill_kernel(at::TensorIterator&, c10::Scalar const&)::{lambda()#1}::operator()() "
               "const::{lambda(float, bool)#1}>(at::TensorIteratorBase&)::{lambda(int)#1}>(int)")
CUTLASS = "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>(cutlass_80_simt_sgemm_128x256_8x4_nt_align1::Params)"


@pytest.mark.parametrize("name, short, category", [
    (GELU, "vectorized_elementwise_kernel<GeluCUDAKernelImpl>", "elementwise"),
    (MEAN, "reduce_kernel<MeanOps>", "reduction"),
    (COPY, "elementwise_kernel<direct_copy_kernel_cuda>", "copy"),
    (SOFTMAX, "softmax_warp_forward", "softmax"),
    (MASKED_FILL, "elementwise_kernel<masked_fill_kernel>", "elementwise"),   # was filed under memset
    (CUTLASS, "Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>", "gemm"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NTT", "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NTT", "gemm"),
    ("triton_poi_fused_add_mul_tanh_0", "triton_poi_fused_add_mul_tanh_0", "triton"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4> >(Flash_fwd_params)",
     "flash_fwd_kernel", "attention"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>(int)",
     "vectorized_layer_norm_kernel", "normalization"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
     "communication"),
    ("mystery", "mystery", "other"),
])
def test_names_and_categories(name, short, category):
    assert kernels.short_name(name) == short
    assert kernels.category(name) == category


def test_short_names_are_bounded():
    assert len(kernels.short_name("k" * 500)) <= 90


def test_tables(tmp_path):
    b = TraceBuilder()
    b.kernel(GELU, 100, 10)
    b.kernel(GELU, 200, 30)
    b.kernel(MEAN, 300, 60)
    b.memcpy("HtoD", "Pageable", 400, 100, 1_000_000, launch_ts=390)
    b.memcpy("HtoD", "Pinned", 600, 50, 2_000_000, launch_ts=590)
    b.memcpy("DtoH", "Pinned", 700, 10, 4, launch_ts=690)
    t = load(b.write(tmp_path / "t.json"))
    rows = kernels.kernel_table(t)
    assert [r.name for r in rows] == ["reduce_kernel<MeanOps>", "vectorized_elementwise_kernel<GeluCUDAKernelImpl>"]
    gelu = rows[1]
    assert (gelu.count, gelu.total_us, gelu.min_us, gelu.max_us, gelu.avg_us) == (2, 40, 10, 30, 20)
    assert gelu.share == pytest.approx(40 / 260)            # of all GPU time, copies included
    mem = kernels.memory_table(t)
    pageable = next(m for m in mem if m.source == "Pageable")
    assert (pageable.kind, pageable.pageable, pageable.bytes, pageable.gbps) == ("HtoD", True, 1_000_000, 10.0)
    pinned = next(m for m in mem if m.source == "Pinned")
    assert not pinned.pageable and pinned.gbps == pytest.approx(40.0)
    cats = kernels.category_table(rows, mem)
    assert cats == pytest.approx({"elementwise": 40, "reduction": 60, "copy": 160})
