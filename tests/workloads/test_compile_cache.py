"""The bundled trainer's compile cache outlives its pod (core/workload.py ``compile_cache_env``): with ``--compile``
the training container's Inductor and Triton caches are on the run's volume, keyed by torch version and model, not
in the pod's ``/tmp`` (an emptyDir that dies with the pod). Negative control: without ``--compile`` (and so today
for every pod before this) they stay pod-local."""

from __future__ import annotations

import re

import pytest

from eks_ddp.core.workload import TRAINER_TORCH_VERSION, cifar10_workload, compile_cache_env
from tests.support.util import ROOT
from tests.workloads.test_elastic_job import env_of, run_job, train_job, trainer


def _volume_of(result, path: str) -> tuple[dict, dict]:
    """(the mount holding ``path``, its volume) in the training pod."""
    pod = train_job(result).inputs["spec"]["template"]["spec"]
    mounts = [m for m in trainer(result)["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")]
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    return mount, next(v for v in pod["volumes"] if v["name"] == mount["name"])


@pytest.mark.parametrize("storage", [{"pvc_name": "shared"}, {"pvc_name": None, "data_claim": "d", "run_claim": "r"}])
def test_the_compile_cache_is_on_the_runs_volume_keyed_by_torch_and_model(storage):
    result = run_job(run_id="exp-7", workload=cifar10_workload(compile=True, model="resnet18"), **storage)
    env = env_of(trainer(result))
    root = f"/shared/runs/exp-7/compile-cache/torch-{TRAINER_TORCH_VERSION}/resnet18"
    assert env["TORCHINDUCTOR_CACHE_DIR"]["value"] == root
    assert env["TRITON_CACHE_DIR"]["value"] == f"{root}/triton"
    mount, volume = _volume_of(result, root)
    assert "persistentVolumeClaim" in volume and not mount.get("readOnly"), (mount, volume)


def test_without_compile_the_caches_stay_in_the_pod():
    result = run_job(run_id="exp-7", workload=cifar10_workload(compile=False))
    env = env_of(trainer(result))
    assert env["TORCHINDUCTOR_CACHE_DIR"]["value"] == "/tmp/torchinductor"
    _, volume = _volume_of(result, "/tmp/torchinductor")
    assert "emptyDir" in volume  # dies with the pod: what a compiling run had before


def test_the_key_follows_the_model():
    w = cifar10_workload(compile=True)
    assert compile_cache_env(w, "/r")["TORCHINDUCTOR_CACHE_DIR"] == f"/r/compile-cache/torch-{TRAINER_TORCH_VERSION}/airnet"
    assert compile_cache_env(cifar10_workload(compile=False), "/r") == {}


def test_the_key_names_the_torch_the_image_is_built_with():
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert re.search(r"^ARG TORCH_VERSION=(\S+)$", dockerfile, re.M)[1] == TRAINER_TORCH_VERSION  # type: ignore[index]
