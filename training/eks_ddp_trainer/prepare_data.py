"""Fetch and verify CIFAR-10 into ``<data-dir>/cifar-10-batches-py``.

    python -m eks_ddp_trainer.prepare_data --data-dir /shared/data

Idempotent: once the batches are in place and verified against the official md5 table, the
SHA-256 manifest the loaders check (``SHA256SUMS``, ``training/eks_ddp_trainer/integrity.py``) and a done-marker
are written; later runs only re-check both and exit 0 (a missing or stale manifest over verified
files is rewritten, nothing downloaded). Safe to start twice at once (every
pod of a job may run it): an exclusive ``flock`` on a lock file in the data directory
serializes them, and the second one finds the work done. The download goes to a staging
directory that is renamed into place only after verification, so a half-downloaded set
is never seen under the final name.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from eks_ddp_trainer import integrity
from eks_ddp_trainer.checkpoint import atomic_write_bytes, fsync_dir
from eks_ddp_trainer.data import BATCHES_DIR

URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
ARCHIVE = "cifar-10-python.tar.gz"
ARCHIVE_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR10_MD5 = integrity.CIFAR10_MD5
"""md5 of each file of the official python archive (as torchvision lists them)."""
LOCK_FILE = ".cifar-10.lock"
DONE_FILE = ".cifar-10.done.json"

Downloader = Callable[[Path], None]
"""Puts ``cifar-10-batches-py`` (extracted) inside the given empty staging directory."""


md5 = integrity.md5


def mismatches(root: Path, expected: dict[str, str]) -> list[str]:
    """Files under ``root`` that are missing or whose md5 differs from ``expected``."""
    return [name for name, digest in expected.items() if not (root / name).is_file() or md5(root / name) != digest]


def is_ready(data_dir: Path, expected: dict[str, str]) -> bool:
    """Done, every file matches ``expected``, and the SHA-256 manifest the loaders check lists them all."""
    if not (data_dir / DONE_FILE).is_file() or mismatches(data_dir / BATCHES_DIR, expected):
        return False
    try:
        integrity.verify(data_dir / BATCHES_DIR, expected, pin=None)
        return (data_dir / BATCHES_DIR / integrity.MANIFEST).is_file()
    except (OSError, integrity.DataError):
        return False


def torchvision_download(staging: Path) -> None:
    """Download the official archive (torchvision checks its md5) and extract it into ``staging``."""
    from torchvision.datasets.utils import download_and_extract_archive

    download_and_extract_archive(URL, download_root=str(staging), filename=ARCHIVE, md5=ARCHIVE_MD5)
    (staging / ARCHIVE).unlink(missing_ok=True)


@contextlib.contextmanager
def exclusive_lock(path: Path, timeout_s: float) -> Iterator[None]:
    """An exclusive flock on ``path``, waiting at most ``timeout_s``; the kernel drops it if we die."""
    with open(path, "a+") as f:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{path}: still locked by another prepare after {timeout_s:.0f} s") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def prepare(data_dir: str | os.PathLike, *, download: Downloader = torchvision_download,
            expected: dict[str, str] = CIFAR10_MD5, lock_timeout_s: float = 1800.0) -> str:
    """Make ``<data_dir>/cifar-10-batches-py`` hold verified batches; returns "present" or "prepared"."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    if is_ready(data_dir, expected):
        return "present"
    with exclusive_lock(data_dir / LOCK_FILE, lock_timeout_s):
        if is_ready(data_dir, expected):  # another process finished while we waited
            return "present"
        (data_dir / DONE_FILE).unlink(missing_ok=True)
        target = data_dir / BATCHES_DIR
        if not mismatches(target, expected):
            # Verified files from before manifests existed: add the manifest, download nothing.
            return _finish(data_dir, expected, "present", rewrite_manifest=True)
        staging = data_dir / f".staging-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        try:
            download(staging)
            bad = mismatches(staging / BATCHES_DIR, expected)
            if bad:
                raise RuntimeError(f"downloaded CIFAR-10 failed verification (md5): {', '.join(bad)}")
            # The manifest goes in before the rename: the directory never appears without it.
            integrity.write_manifest(staging / BATCHES_DIR, expected)
            if target.exists():
                # A partial or corrupt earlier copy: move it aside first so the rename below is atomic.
                aside = data_dir / f".old-{os.getpid()}"
                os.replace(target, aside)
                shutil.rmtree(aside, ignore_errors=True)
            os.replace(staging / BATCHES_DIR, target)
            fsync_dir(data_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return _finish(data_dir, expected, "prepared")


def _finish(data_dir: Path, expected: dict[str, str], outcome: str, *, rewrite_manifest: bool = False) -> str:
    """The done-marker over verified files (after (re)writing their SHA-256 manifest when asked)."""
    root = data_dir / BATCHES_DIR
    if rewrite_manifest:
        integrity.write_manifest(root, expected)
    marker = {"files": expected, "sha256": integrity.read_manifest(root / integrity.MANIFEST), "source": URL,
              "prepared_at": time.time()}
    atomic_write_bytes(data_dir / DONE_FILE, json.dumps(marker, indent=2).encode())
    return outcome


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eks_ddp_trainer.prepare_data", description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", required=True, help="cifar-10-batches-py is created inside it")
    p.add_argument("--lock-timeout", type=float, default=1800.0, help="seconds to wait for another prepare")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    try:
        outcome = prepare(args.data_dir, lock_timeout_s=args.lock_timeout)
    except Exception as e:
        print(f"[prepare] failed: {e}", file=sys.stderr, flush=True)
        return 1
    print(f"[prepare] {outcome} {Path(args.data_dir) / BATCHES_DIR} ({time.monotonic() - t0:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
