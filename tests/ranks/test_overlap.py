"""roofline.distributed.overlap on two gloo ranks: the optimizer stepped bucket by bucket trains as the plain step
does, and bad input is refused before anything runs."""

import pytest
import torch

from roofline.distributed import spawn
from roofline.distributed.overlap import overlap_optimizer

from .workers import overlap_refusals, overlapped_against_plain


def test_stepping_each_bucket_as_it_is_reduced_trains_as_the_step_after_the_backward():
    for error, every_bucket_first, outside_later, (plain_states, states) in spawn(overlapped_against_plain, 2, 4):
        assert error < 1e-6
        assert every_bucket_first   # stepped in the backward, not by step()
        assert outside_later        # the parameter DDP does not reduce: by step()
        assert states == plain_states == 7   # three Linears' weights and biases, and the parameter outside


def test_bad_input_is_refused_with_the_argument_named():
    with pytest.raises(TypeError, match="ddp must be a DistributedDataParallel module, got Linear"):
        overlap_optimizer(torch.nn.Linear(2, 2), torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1))
    bucket_views, other_parameters, closure = spawn(overlap_refusals, 1)[0]
    assert bucket_views.startswith("ValueError: ddp: build it with gradient_as_bucket_view=True")
    assert other_parameters.startswith("ValueError: optimizer: none of its parameters")
    assert closure.startswith("ValueError: closure: the buckets step without one")
