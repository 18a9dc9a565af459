import os
import sys

import pytest

# The repository's root conftest: it serves both test trees, tests/ (the library's tests) and studies/ (each
# study's findings tests). `lora_moe_lab` and `studies` import from this checkout; tests/ holds shared helpers.
ROOT = os.path.abspath(os.path.dirname(__file__))
sys.path.insert(0, ROOT)
sys.path.insert(1, os.path.join(ROOT, "tests"))
# Notebook kernels started by papermill/JupyterLab in tests import the package from this checkout.
os.environ["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                    if p])
import lora_moe_lab  # noqa: E402,F401  (sets TRITON_INTERPRET before any kernel module is imported)

from lora_moe_lab import runtime  # noqa: E402

# Under the interpreter: triton.language patched once per launch, not again at every nested jit call (a quarter of
# the suite's interpreter time; tests/triton_interp.py says why the kernels run the same code).
import triton_interp  # noqa: E402

triton_interp.install()

# (tests/triton_interp.py: imported from tests/, the path above)

# Under pytest-xdist (`make test` runs one worker per core) each worker keeps to one thread, and so do the notebook
# kernels it starts (they inherit the environment): two workers on two cores, each with torch's default of one
# thread per core, would oversubscribe.
if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch  # noqa: E402

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)


FIRST = ("browser", "notebook", "slow")  # markers of the tests that take seconds each (a browser, a kernel, more)


def pytest_collection_modifyitems(config, items):
    """The long tests first, the rest in their order. `--dist worksteal` hands each worker a contiguous half of this
    list and an idle worker steals the tail of the other's: with the long ones at the front, what is left at the
    end is short tests on both workers, not a browser or a notebook on one worker while the other waits."""
    items.sort(key=lambda item: not any(item.get_closest_marker(m) for m in FIRST))  # stable


# A skip for want of a required dependency fails under CI=true (tests/ci_skips.py: imported from tests/).
from ci_skips import fail_required_skip  # noqa: E402


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    fail_required_skip(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield  # a module-level importorskip skips the whole module here
    fail_required_skip(report)
    return report


@pytest.fixture
def device():
    return runtime.default_device()


@pytest.fixture
def sync_check():
    """`with sync_check(allow=["file.py:LINE", "file.py:function"]): ...` fails on every host-device
    sync outside the allowlist, and on an allow entry that matched nothing (instruments/recorders/sync_check.py)."""
    from lora_moe_lab.instruments.recorders.sync_check import sync_check as check
    return check
