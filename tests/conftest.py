import os
import shutil

import pytest
import torch

# Without a GPU, Triton kernels run through Triton's interpreter. It must be on
# before the kernels are defined, so before roofline.ops is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # The C++ autograd node serves eager GPU calls, and is not built without a GPU; the tests build it here to
    # check it through the interpreter (where no compiler or ninja is found, its tests are skipped, saying so).
    os.environ.setdefault("ROOFLINE_EAGER_NODE", "1")

HAS_CUDA = torch.cuda.is_available()
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
HAS_BROWSER = any(shutil.which(name) for name in BROWSERS)
# .ci/run sets it: there the browser tests must run (a failed install of Chromium fails them, never deselects them)
REQUIRE_BROWSER = os.environ.get("ROOFLINE_REQUIRE_BROWSER") == "1"
# .ci/run sets it too: the long interpreter sweeps (marked `sweep`) run; a plain `pytest` leaves them out
ALL_TESTS = os.environ.get("ROOFLINE_ALL_TESTS") == "1"


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Tests never read or write the user's measured ceilings: the workers of one run (pytest -n) share a cache of
    their own. Builds are the exception: the C++ node's folder is the user's, where scripts/setup built it (a build
    is named by its source and torch version, the same wherever it is made); built there once otherwise, torch's
    build lock making the other workers wait."""
    from roofline.device import cache_dir

    saved = os.environ.get("ROOFLINE_CACHE_DIR")
    builds = cache_dir() / "eager_node"
    builds.mkdir(parents=True, exist_ok=True)
    base = tmp_path_factory.getbasetemp()
    cache = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "roofline-cache"
    cache.mkdir(exist_ok=True)
    if not (cache / "eager_node").exists():
        try:
            (cache / "eager_node").symlink_to(builds, target_is_directory=True)
        except FileExistsError:   # another worker made it first
            pass
    os.environ["ROOFLINE_CACHE_DIR"] = str(cache)
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
    """Without a GPU, GPU tests are deselected (not skipped and not passed): scripts/gpu-check runs them. Without
    Chromium (scripts/setup installs it where apt can), the browser tests are deselected alike, except under
    .ci/run. The long interpreter sweeps are deselected unless ROOFLINE_ALL_TESTS=1 (.ci/run) or -m sweep."""
    unavailable = set()
    if not HAS_CUDA:
        unavailable.add("gpu")
    if not ALL_TESTS and "sweep" not in (config.option.markexpr or ""):
        unavailable.add("sweep")
    if not HAS_BROWSER and not REQUIRE_BROWSER:
        unavailable.add("browser")
    from roofline.ops._eager_node import unavailable_reason

    no_node = unavailable_reason()
    if no_node is not None:
        skip = pytest.mark.skip(reason=f"the C++ autograd node is not built here: {no_node}")
        for item in items:
            if "eager_node" in item.keywords:
                item.add_marker(skip)
    deselected = [item for item in items if unavailable & set(item.keywords)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if not unavailable & set(item.keywords)]
    # the longest tests first, then the sweeps: spread over pytest -n's workers from the start, not left to one of
    # them at the end while the other idles
    items.sort(key=lambda item: 0 if "long" in item.keywords else 1 if "sweep" in item.keywords else 2)


def pytest_report_header(config):
    lines = ["CUDA: " + (torch.cuda.get_device_name() if HAS_CUDA else "not available; GPU tests deselected")]
    if not HAS_BROWSER:
        lines.append("Chromium: not found; " + ("the browser tests will fail (ROOFLINE_REQUIRE_BROWSER=1)"
                                                if REQUIRE_BROWSER else "browser tests deselected (scripts/setup "
                                                "installs it where apt can)"))
    if not ALL_TESTS and "sweep" not in (config.option.markexpr or ""):
        lines.append("long interpreter sweeps (marked sweep) deselected: ROOFLINE_ALL_TESTS=1 runs them, as CI does")
    return lines
