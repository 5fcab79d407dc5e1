"""training/eks_ddp_trainer/prepare_data.py: verification, idempotency and the lock, with no network (downloader replaced)."""

from __future__ import annotations

import json
import shutil
import threading
import time

import pytest

from eks_ddp_trainer import prepare_data as prep
from eks_ddp_trainer.data import BATCHES_DIR, write_synthetic_cifar


@pytest.fixture(scope="module")
def synthetic_source(tmp_path_factory):
    """A synthetic CIFAR-format set standing in for the official archive, and its md5 table."""
    src = tmp_path_factory.mktemp("src")
    root = write_synthetic_cifar(src, n_train=50, n_test=20, seed=3)
    return root, {name: prep.md5(root / name) for name in prep.CIFAR10_MD5}


class FakeDownloader:
    """Copies the synthetic set into staging, slowly, and counts calls."""

    def __init__(self, root, delay_s: float = 0.0, corrupt: bool = False) -> None:
        self.root, self.delay_s, self.corrupt, self.calls = root, delay_s, corrupt, 0
        self._lock = threading.Lock()

    def __call__(self, staging) -> None:
        with self._lock:
            self.calls += 1
        time.sleep(self.delay_s)
        shutil.copytree(self.root, staging / BATCHES_DIR)
        if self.corrupt:
            (staging / BATCHES_DIR / "data_batch_3").write_bytes(b"truncated")


def test_official_md5_table_matches_torchvision():
    from torchvision.datasets import CIFAR10

    table = dict(CIFAR10.train_list + CIFAR10.test_list)
    table[CIFAR10.meta["filename"]] = CIFAR10.meta["md5"]
    assert table == prep.CIFAR10_MD5 and CIFAR10.tgz_md5 == prep.ARCHIVE_MD5


def test_prepare_then_present_without_download(tmp_path, synthetic_source):
    root, table = synthetic_source
    dl = FakeDownloader(root)
    assert prep.prepare(tmp_path, download=dl, expected=table) == "prepared"
    assert prep.prepare(tmp_path, download=dl, expected=table) == "present"
    assert dl.calls == 1
    assert not prep.mismatches(tmp_path / BATCHES_DIR, table)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith((".staging", ".old"))] == []


def test_preseeded_dir_with_marker_is_fast_and_untouched(tmp_path, synthetic_source):
    root, table = synthetic_source
    shutil.copytree(root, tmp_path / BATCHES_DIR)
    (tmp_path / prep.DONE_FILE).write_text("{}")

    def no_network(_staging):
        raise AssertionError("must not download when the data is present")

    t0 = time.monotonic()
    assert prep.prepare(tmp_path, download=no_network, expected=table) == "present"
    assert time.monotonic() - t0 < 2.0


def test_prepared_set_carries_a_sha256_manifest_the_pinned_loader_accepts(tmp_path, synthetic_source):
    """S3: the data stage writes the SHA-256 of every file; a loader with a pin on that manifest loads the set."""
    import hashlib

    import torch

    from eks_ddp_trainer import integrity
    from eks_ddp_trainer.data import load_cifar

    root, table = synthetic_source
    assert prep.prepare(tmp_path, download=FakeDownloader(root), expected=table) == "prepared"
    batches = tmp_path / BATCHES_DIR
    listed = integrity.read_manifest(batches / integrity.MANIFEST)
    assert listed == {name: integrity.sha256(batches / name) for name in table}
    assert json.loads((tmp_path / prep.DONE_FILE).read_text())["sha256"] == listed
    pin = "sha256:" + hashlib.sha256((batches / integrity.MANIFEST).read_bytes()).hexdigest()
    assert len(load_cifar(tmp_path, torch.device("cpu"), pin=pin).test) == 20


@pytest.mark.parametrize("damage", ["missing", "stale"])
def test_verified_files_without_a_good_manifest_get_one_without_a_download(tmp_path, synthetic_source, damage):
    """A set prepared before manifests existed (or whose manifest was rewritten): the files still match the
    official table, so the manifest is (re)written from them and nothing is downloaded."""
    from eks_ddp_trainer import integrity

    root, table = synthetic_source
    prep.prepare(tmp_path, download=FakeDownloader(root), expected=table)
    manifest = tmp_path / BATCHES_DIR / integrity.MANIFEST
    good = manifest.read_text()
    if damage == "missing":
        manifest.unlink()
    else:
        manifest.write_text(good.replace(good[:64], "0" * 64, 1))

    def no_network(_staging):
        raise AssertionError("verified files must not be downloaded again")

    assert prep.prepare(tmp_path, download=no_network, expected=table) == "present"
    assert manifest.read_text() == good


def test_corrupt_file_is_fetched_again(tmp_path, synthetic_source):
    root, table = synthetic_source
    dl = FakeDownloader(root)
    prep.prepare(tmp_path, download=dl, expected=table)
    (tmp_path / BATCHES_DIR / "test_batch").write_bytes(b"bad")
    assert prep.prepare(tmp_path, download=dl, expected=table) == "prepared"
    assert dl.calls == 2 and not prep.mismatches(tmp_path / BATCHES_DIR, table)


def test_failed_verification_leaves_no_data_and_no_marker(tmp_path, synthetic_source):
    root, table = synthetic_source
    with pytest.raises(RuntimeError, match="data_batch_3"):
        prep.prepare(tmp_path, download=FakeDownloader(root, corrupt=True), expected=table)
    assert not (tmp_path / BATCHES_DIR).exists() and not (tmp_path / prep.DONE_FILE).exists()


def test_two_at_once_download_once(tmp_path, synthetic_source):
    root, table = synthetic_source
    dl = FakeDownloader(root, delay_s=0.5)
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(prep.prepare(tmp_path, download=dl, expected=table)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(results) == ["prepared", "present"]
    assert dl.calls == 1


def test_lock_wait_is_bounded(tmp_path, synthetic_source):
    root, table = synthetic_source
    with prep.exclusive_lock(tmp_path / prep.LOCK_FILE, 1.0), pytest.raises(TimeoutError, match="locked"):
        prep.prepare(tmp_path, download=FakeDownloader(root), expected=table, lock_timeout_s=0.5)


def test_cli_exit_codes(tmp_path, synthetic_source, monkeypatch, capsys):
    root, table = synthetic_source
    monkeypatch.setattr(prep, "torchvision_download", FakeDownloader(root))
    monkeypatch.setattr(prep, "CIFAR10_MD5", table)
    monkeypatch.setattr(prep.prepare, "__kwdefaults__",
                        {**prep.prepare.__kwdefaults__, "download": prep.torchvision_download, "expected": table})
    assert prep.main(["--data-dir", str(tmp_path)]) == 0
    assert prep.main(["--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[prepare] prepared" in out and "[prepare] present" in out
    (tmp_path / BATCHES_DIR / "test_batch").write_bytes(b"bad")
    monkeypatch.setattr(prep.prepare, "__kwdefaults__",
                        {**prep.prepare.__kwdefaults__, "download": FakeDownloader(root, corrupt=True)})
    assert prep.main(["--data-dir", str(tmp_path)]) == 1
