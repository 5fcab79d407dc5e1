import importlib.util
import os
import shutil
import sys
import tempfile
import types
from pathlib import Path

import pytest

try:  # the runtime's import name comes from the install (training/runtime/eks_ddp_runtime)
    import eks_ddp_runtime  # noqa: F401
except ImportError as e:
    raise pytest.UsageError("eks_ddp_runtime is not importable: install this checkout again (`make install`, "
                            "or pip install -e '.[dev,trainer]') so the editable install maps it to "
                            "training/runtime/eks_ddp_runtime") from e


_REPO = Path(__file__).resolve().parent.parent
for _name, _folder in (("eks_ddp", "components/eks_ddp"), ("eks_ddp_trainer", "training/eks_ddp_trainer"),
                       ("eks_ddp_local", "training/eks_ddp_local")):
    # A runtime-only interpreter (make test-compat's venv, the GPU machines) has only eks_ddp_runtime installed and
    # no Pulumi; the agents' command line is the runtime's own (eks_ddp_runtime.launch_command), but the tests' helpers
    # use pure modules of the other packages (the local runner's etcd server, the trainer's config), and
    # eks_ddp/__init__ imports every Pulumi component. Each package is registered by its folder without running its
    # __init__, so its pure modules import and a Pulumi module still fails.
    if _name not in sys.modules and (importlib.util.find_spec("pulumi") is None
                                     or importlib.util.find_spec(_name) is None):
        _pkg = types.ModuleType(_name)
        _pkg.__path__ = [str(_REPO / _folder)]
        sys.modules[_name] = _pkg

from eks_ddp_trainer.snapshot import DIR_ENV  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _snapshots_in_a_temp_dir():
    """Trainers started by tests (and their subprocesses) keep node-local snapshots here, not in /dev/shm."""
    d = tempfile.mkdtemp(prefix="eks-ddp-snap-")
    old = os.environ.get(DIR_ENV)
    os.environ[DIR_ENV] = d
    yield
    if old is None:
        os.environ.pop(DIR_ENV, None)
    else:
        os.environ[DIR_ENV] = old
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def in_process_trainer(monkeypatch):
    """eks_ddp_trainer.train.main called in this process: a single process (no torchrun environment), one thread."""
    import torch

    monkeypatch.delenv("MASTER_ADDR", raising=False)
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def dev_result():
    """The dev stack run once under mocks (read-only: do not mutate)."""
    from tests.support.util import (  # Pulumi: imported only where a program runs (GPU machines lack it)
        run,
        stack_config,
    )

    return run(stack_config("dev"))


@pytest.fixture(scope="session")
def p4de_result():
    """The p4de example stack run once under mocks (read-only)."""
    from tests.support.util import run, stack_config

    return run(stack_config("p4de"), stack="p4de")


@pytest.fixture(scope="session")
def byo_result():
    """The dev stack with two runs of other images (two ECR repositories, one in another account) and an S3 data
    set in another account's bucket (tests/support/util.py ``byo_stack_config``), run once under mocks (read-only)."""
    from tests.support.util import byo_stack_config, run

    return run(byo_stack_config())


# The files whose tests run longest (real agents, etcd and fault windows): collected first, so that with
# `pytest -n 2 --dist loadfile` they start at once beside the many short files instead of after them, where one
# process would run them alone at the end.
_LONGEST_FIRST = ("runtime/test_resilience.py", "trainer/test_elastic.py", "local/test_runner.py",
                  "runtime/test_torchrun_corpus.py", "runtime/test_launcher_cuda.py", "runtime/test_exit_codes.py",
                  "runtime/test_user_workload.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
    tests = Path(__file__).resolve().parent
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).resolve().relative_to(tests).as_posix(), len(rank)))  # stable: order within a file kept


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """A small synthetic CIFAR-10 (480 training images) that one test module's jobs share (the fault suites:
    tests/runtime/test_resilience.py, tests/trainer/test_elastic.py, tests/trainer/test_store_hang.py)."""
    from eks_ddp_trainer.data import write_synthetic_cifar

    d = tmp_path_factory.mktemp("cifar")
    write_synthetic_cifar(d, n_train=480, n_test=100, seed=0)
    return d
