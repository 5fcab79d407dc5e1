"""Integrity of the data set files on the shared volume (security review S3): a planted pickle never runs.

The trainer and ``eks_ddp_trainer.evaluate`` run as real processes on a data directory an attacker has
written to; each must exit with ``exitcodes.BAD_INPUT``, name the file, and never execute the
payload (the payload would create a marker file).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from eks_ddp_runtime import exitcodes
from eks_ddp_trainer import integrity
from eks_ddp_trainer.data import ALL_FILES, DataError, batches_root, load_cifar, read_class_names, write_synthetic_cifar

ROOT = Path(__file__).resolve().parents[2]


class _Payload:
    """Unpickling this runs code: it creates ``marker`` (the attack the loader must never let through)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('pwned')",)


def _plant(path: Path, marker: Path) -> None:
    path.write_bytes(pickle.dumps({"data": _Payload(marker), "labels": [0]}, protocol=2))


def _process(module: str, *args: str, pin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "RANK", "WORLD_SIZE", integrity.PIN_ENV)}
    if pin is not None:
        env[integrity.PIN_ENV] = pin
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def data(tmp_path) -> Path:
    write_synthetic_cifar(tmp_path / "data", n_train=50, n_test=20, seed=5)
    return tmp_path / "data"


def test_planted_meta_pickle_is_refused_without_running(tmp_path):
    """The reviewer's reproduction: no manifest, no pin (an old local set): the restricted unpickler alone."""
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    marker = tmp_path / "marker"
    (root / "batches.meta").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(DataError, match="batches.meta.*refused global builtins.exec"):
        read_class_names(root)
    assert not marker.exists()


def test_tampered_batch_fails_the_trainer_process_with_bad_input_and_nothing_runs(data, tmp_path):
    marker = tmp_path / "marker"
    victim = batches_root(data) / "data_batch_2"
    _plant(victim, marker)
    done = _process("eks_ddp_trainer.train", f"--data-dir={data}", f"--run-dir={tmp_path / 'run'}")
    assert done.returncode == exitcodes.BAD_INPUT, done.stderr[-2000:]
    assert str(victim) in done.stderr and "sha256" in done.stderr and integrity.MANIFEST in done.stderr
    assert not marker.exists()


def test_data_and_manifest_rewritten_together_fail_the_pin(data, tmp_path):
    """An attacker who can write the directory rewrites the manifest too: the Job's pin (from outside the
    volume) catches it, for the trainer and the evaluation alike."""
    root = batches_root(data)
    pin = "sha256:" + hashlib.sha256((root / integrity.MANIFEST).read_bytes()).hexdigest()
    marker = tmp_path / "marker"
    _plant(root / "test_batch", marker)
    integrity.write_manifest(root, ALL_FILES)  # consistent again, but not what was pinned
    run = tmp_path / "run"
    run.mkdir()
    (run / "model.pt").write_bytes(b"")  # the data set is checked before the model is read
    for module, args in (("eks_ddp_trainer.train", [f"--data-dir={data}", f"--run-dir={run}"]),
                         ("eks_ddp_trainer.evaluate", [f"--data-dir={data}", f"--run-dir={run}"])):
        done = _process(module, *args, pin=pin)
        assert done.returncode == exitcodes.BAD_INPUT, (module, done.stderr[-2000:])
        assert f"{root / integrity.MANIFEST}: sha256" in done.stderr and "pinned" in done.stderr, module
        assert not marker.exists(), module


def test_pinned_manifest_and_untouched_data_load(data):
    """Negative control for the pin: the right pin loads; a wrong one, or a bad pin value, is refused."""
    root = batches_root(data)
    good = "sha256:" + hashlib.sha256((root / integrity.MANIFEST).read_bytes()).hexdigest()
    assert len(load_cifar(data, torch.device("cpu"), pin=good).train) == 50
    with pytest.raises(DataError, match="differs from the pinned"):
        load_cifar(data, torch.device("cpu"), pin="sha256:" + "0" * 64)
    with pytest.raises(DataError, match=f"{integrity.PIN_ENV}: got 'yes'; expected 'cifar-10'"):
        integrity.pin_from_env({integrity.PIN_ENV: "yes"})


def test_cifar10_pin_accepts_only_the_official_files(data):
    """With the Job's pin the files must be the official CIFAR-10 ones (md5 table in the image), even when the
    manifest on the volume agrees with them: a generated set is refused, naming the file."""
    with pytest.raises(DataError, match=r"data_batch_1: md5 \w+ differs from the official CIFAR-10"):
        load_cifar(data, torch.device("cpu"), pin=integrity.CIFAR10_PIN)


def test_pinned_set_without_manifest_is_refused(data):
    (batches_root(data) / integrity.MANIFEST).unlink()
    assert len(load_cifar(data, torch.device("cpu")).test) == 20  # unpinned local set: the safe unpickler only
    with pytest.raises(DataError, match=f"{integrity.MANIFEST}: missing, and the data set is pinned"):
        load_cifar(data, torch.device("cpu"), pin=integrity.CIFAR10_PIN)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_safe_unpickler_reads_arrays_at_every_protocol_and_the_official_numpy_names(tmp_path, protocol):
    a = np.arange(3072 * 2, dtype=np.uint8).reshape(2, 3072)
    blob = pickle.dumps({b"data": a, b"labels": [1, 2], b"batch_label": b"x"}, protocol=protocol)
    if protocol == 2:  # the official batches name numpy 1's module path
        assert b"numpy._core.multiarray\n" in blob
        blob = blob.replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n")
    (tmp_path / "b").write_bytes(blob)
    d = integrity.safe_load(tmp_path / "b")
    assert np.array_equal(d[b"data"], a) and d[b"labels"] == [1, 2]
    # Control: the same unpickler refuses any other global at that protocol.
    (tmp_path / "p").write_bytes(pickle.dumps(_Payload(tmp_path / "m"), protocol=protocol))
    with pytest.raises(pickle.UnpicklingError, match=r"refused global (builtins|__builtin__)\.exec"):
        integrity.safe_load(tmp_path / "p")
    assert not (tmp_path / "m").exists()


def test_official_md5_table_matches_torchvision():
    from torchvision.datasets import CIFAR10

    table = dict(CIFAR10.train_list + CIFAR10.test_list)
    table[CIFAR10.meta["filename"]] = CIFAR10.meta["md5"]
    assert table == integrity.CIFAR10_MD5
