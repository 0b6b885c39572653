import os

import pytest
import torch

# Without a GPU, Triton kernels run through Triton's interpreter. It must be on
# before the kernels are defined, so before roofline.ops is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

HAS_CUDA = torch.cuda.is_available()


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Tests never read or write the user's cache of measured ceilings and builds."""
    saved = os.environ.get("ROOFLINE_CACHE_DIR")
    os.environ["ROOFLINE_CACHE_DIR"] = str(tmp_path_factory.mktemp("roofline-cache"))
    yield
    if saved is None:
        os.environ.pop("ROOFLINE_CACHE_DIR", None)
    else:
        os.environ["ROOFLINE_CACHE_DIR"] = saved


@pytest.fixture(autouse=True)
def _fresh_plans():
    """Each test builds its own launch plans: a plan is built from module settings (block sizes, tiles,
    autotuning configs) that tests patch, and must not carry one test's settings into the next."""
    from roofline.ops._launch import clear_plans

    clear_plans()
    yield
    clear_plans()


def pytest_collection_modifyitems(config, items):
    """Without a GPU, GPU tests are deselected (not skipped and not passed): scripts/gpu-check runs them."""
    if HAS_CUDA:
        return
    gpu = [item for item in items if "gpu" in item.keywords]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if "gpu" not in item.keywords]


def pytest_report_header(config):
    return "CUDA: " + (torch.cuda.get_device_name() if HAS_CUDA else "not available; GPU tests deselected")
