"""The launch helpers of roofline.ops._common: the host-side arithmetic that replaces Triton's constexpr functions."""

import pytest
import torch
import triton

from roofline.ops._common import cdiv, next_power_of_2, resident_programs


@pytest.mark.parametrize("b", [1, 2, 3, 16, 128, 1000])
def test_cdiv_is_tritons_on_every_size_a_launch_sees(b):
    for a in range(0, 5000):
        assert cdiv(a, b) == triton.cdiv(a, b), (a, b)


def test_next_power_of_2_is_tritons_from_one_up():
    for n in list(range(1, 5000)) + [2**31 - 1, 2**31, 2**31 + 1]:
        assert next_power_of_2(n) == triton.next_power_of_2(n), n


def test_resident_programs_never_exceed_the_rows_and_walk_several_rows_under_the_interpreter():
    cpu = torch.device("cpu")
    assert [resident_programs(rows, cpu) for rows in (1, 2, 3, 10)] == [1, 2, 3, 3]
