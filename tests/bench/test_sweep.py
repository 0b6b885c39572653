"""Sweeps: the correctness guard catches failing and cheating providers, and the sweep goes on."""

import re
import time as systime

import pytest
import torch

from roofline import bench
from roofline.bench import Provider, Skip, Sweep


def double(x):
    return x * 2


def unwritten(x):
    y = torch.empty_like(x)
    y[: x.numel() // 2] = x[: x.numel() // 2] * 2  # forgets the second half
    return y


def make_cached():
    memo = {}

    def cached(x):
        if "out" not in memo:
            memo["out"] = x * 2
        return memo["out"]
    return cached


def raises(x):
    raise ZeroDivisionError("provider bug")


def out_of_memory(x):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")


def hangs(x):
    systime.sleep(3600)


def wrong_shape(x):
    return (x * 2)[:-1]


def wrong_dtype(x):
    return (x * 2).double()


def skips(x):
    raise Skip("needs a feature this machine lacks")


def make_sweep(providers, **kw):
    return Sweep(
        name="double",
        x_name="n",
        x_values=[257, 1024],
        inputs=lambda n, dev: (torch.randn(n, device=dev),),
        providers=[Provider("torch", double), *providers],
        bytes=lambda n, x: 2 * x.numel() * x.element_size(),
        flops=lambda n, x: x.numel(),
        **kw,
    )


def run(sweep, **kw):
    return sweep.run(device="cpu", flush=False, rep_ms=5, progress=False, timeout_s=2, **kw)


def test_good_providers_are_timed_with_throughput_and_speedup():
    result = run(make_sweep([Provider("also good", lambda x: x + x)]))
    assert [(r.x, r.provider) for r in result.rows] == [
        (257, "torch"), (257, "also good"), (1024, "torch"), (1024, "also good")]
    for r in result.rows:
        assert r.status == "ok", r.reason
        assert r.measurement.n >= 10
        assert r.bytes == 2 * r.x * 4 and r.flops == r.x
        assert r.gbps == pytest.approx(r.bytes / (r.median_ms * 1e-3) / 1e9)
        assert r.tflops == pytest.approx(r.flops / (r.median_ms * 1e-3) / 1e12)
        assert r.dtype == "float32"
        assert r.speedup_low <= r.speedup <= r.speedup_high
    assert result.row(257, "torch").speedup == 1.0


@pytest.mark.parametrize("fn, reason", [
    (unwritten, "elements differ from the baseline"),
    (raises, r"raised ZeroDivisionError: provider bug \(test_sweep.py:\d+\)"),
    (out_of_memory, "out of memory: CUDA out of memory"),
    (hangs, "timed out"),
    (lambda x: None, r"returned nothing \(None\)"),
    (lambda x: "text", "returned str"),
    (wrong_shape, r"shape \((256|1023),\), expected \((257|1024),\)"),
    (wrong_dtype, r"dtype torch.float64, expected torch.float32"),
    (lambda x: x * 2 + 1e-3, "elements differ"),
])
def test_a_failing_provider_is_marked_with_its_reason_and_the_sweep_goes_on(fn, reason):
    result = run(make_sweep([Provider("bad", fn), Provider("good", double)]))
    for x in (257, 1024):
        bad = result.row(x, "bad")
        assert bad.status == "failed" and re.search(reason, bad.reason), bad.reason
        assert bad.measurement is None
        assert result.row(x, "good").status == "ok"


def test_a_cached_result_is_caught():
    result = run(make_sweep([Provider("cached", make_cached())]))
    # It matches on the first input set, so only the second catches it.
    assert result.row(257, "cached").status == "failed"
    assert "differ from the baseline" in result.row(257, "cached").reason


def test_the_same_object_returned_twice_is_caught_even_when_values_match():
    cache = {}

    def same_object(x):
        out = cache.setdefault("out", torch.empty_like(x))
        return out.copy_(x * 2)  # right values, but the same object for every input

    result = run(make_sweep([Provider("same", same_object)]))
    assert "same object for different inputs" in result.row(257, "same").reason


def test_skipped_providers_carry_their_reason():
    result = run(make_sweep([Provider("gpu only", double, skip="needs a CUDA GPU"), Provider("runtime", skips)]))
    assert result.row(257, "gpu only").status == "skipped"
    assert result.row(257, "gpu only").reason == "needs a CUDA GPU"
    assert result.row(1024, "runtime").status == "skipped"
    assert result.row(1024, "runtime").reason == "needs a feature this machine lacks"


def test_a_failing_baseline_fails_the_size_not_the_sweep():
    sweep = Sweep(name="s", x_name="n", x_values=[3, 4],
                  inputs=lambda n, dev: (torch.randn(n),),
                  providers=[Provider("base", lambda x: x if x.numel() == 4 else 1 / 0), Provider("other", lambda x: x)])
    result = run(sweep)
    assert {r.status for r in result.rows if r.x == 3} == {"failed"}
    assert "baseline 'base'" in result.row(3, "other").reason
    assert {r.status for r in result.rows if r.x == 4} == {"ok"}


def test_tolerances_follow_the_dtype_and_can_be_overridden():
    slightly_off = lambda x: x * 2 * (1 + 1e-3)  # noqa: E731
    make = lambda dtype, **kw: Sweep(  # noqa: E731
        name="s", x_name="n", x_values=[100], inputs=lambda n, dev: (torch.randn(n, dtype=dtype),),
        providers=[Provider("base", double), Provider("off", slightly_off)], **kw)
    assert run(make(torch.float32)).row(100, "off").status == "failed"
    assert run(make(torch.bfloat16)).row(100, "off").status == "ok"
    assert run(make(torch.float32, rtol=1e-2, atol=1e-2)).row(100, "off").status == "ok"


def test_a_float64_reference_checks_every_provider_the_baseline_too():
    sweep = Sweep(name="s", x_name="n", x_values=[100],
                  inputs=lambda n, dev: (torch.randn(n, dtype=torch.bfloat16),),
                  providers={"base": lambda x: x * 2 + 0.5, "good": double,
                             "in fp32": lambda x: (x.float() * 2 * (1 + 1e-3)).to(torch.bfloat16),
                             "wrong dtype": wrong_dtype},
                  reference=lambda x: x.double() * 2)
    result = run(sweep)
    assert result.row(100, "base").status == "failed"
    assert "differ from the reference" in result.row(100, "base").reason
    assert result.row(100, "good").status == result.row(100, "in fp32").status == "ok"
    # a float64 output is compared by value against a float64 reference: it passes
    assert result.row(100, "wrong dtype").status == "ok"


def test_atol_can_count_in_units_of_the_expected_outputs_size():
    big = lambda n, dev: (torch.randn(n) * 1000,)  # noqa: E731
    make = lambda **kw: Sweep(  # noqa: E731
        name="s", x_name="n", x_values=[100], inputs=big, rtol=0.0, atol=0.01, **kw,
        providers={"base": double, "off by 1": lambda x: x * 2 + 1})
    assert run(make()).row(100, "off by 1").status == "failed"
    assert run(make(atol_per_rms=True)).row(100, "off by 1").status == "ok"   # 1 against 0.01 * ~2000


def test_nan_where_the_baseline_has_nan_is_accepted():
    sweep = Sweep(name="s", x_name="n", x_values=[64],
                  inputs=lambda n, dev: (torch.where(torch.rand(n) < 0.5, torch.randn(n), float("nan")),),
                  providers={"base": double, "same": lambda x: x + x})
    assert run(sweep).row(64, "same").status == "ok"


def test_providers_may_be_given_as_a_dict_and_validation_names_the_problem():
    s = Sweep(name="s", x_name="n", x_values=[1], inputs=lambda n, d: (), providers={"a": double, "b": double})
    assert [p.name for p in s.providers] == ["a", "b"] and s.baseline == "a"
    with pytest.raises(ValueError, match="baseline='c'"):
        Sweep(name="s", x_name="n", x_values=[1], inputs=lambda n, d: (), providers={"a": double}, baseline="c")
    with pytest.raises(ValueError, match="unique"):
        Sweep(name="s", x_name="n", x_values=[1], inputs=lambda n, d: (), providers=[Provider("a", double)] * 2)
    with pytest.raises(ValueError, match="x_values"):
        Sweep(name="s", x_name="n", x_values=[], inputs=lambda n, d: (), providers={"a": double})


def test_interleaved_sampling_alternates_providers():
    order = []
    providers = [Provider(name, (lambda name: lambda x: (order.append(name), x * 2)[1])(name)) for name in "ab"]
    sweep = Sweep(name="s", x_name="n", x_values=[8], inputs=lambda n, d: (torch.randn(n),), providers=providers)
    run(sweep, rounds=4, min_reps=40, max_reps=40)
    timed = order[-80:]  # the timed calls come last
    switches = sum(1 for a, b in zip(timed, timed[1:]) if a != b)
    assert timed.count("a") == timed.count("b") == 40
    assert switches >= 4  # in several turns, not all of a then all of b


def test_geometric_sizes():
    assert bench.geometric_sizes(2**10, 2**14) == [1024, 2048, 4096, 8192, 16384]
    assert bench.geometric_sizes(1, 64, 4) == [1, 4, 16, 64]
    with pytest.raises(ValueError):
        bench.geometric_sizes(8, 4)
