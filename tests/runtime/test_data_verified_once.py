"""A staged data set is verified once per manifest (eks_ddp_runtime/dataset.py ``VERIFIED``): the first full check
leaves a marker, and a later pod start (the launcher's ``check_environment``) reads the manifest, the marker and the
files' metadata, not the data. Bytes read are counted by the kernel (``rchar`` of ``/proc/self/io``: every byte a
read call returned, page cache included) in a fresh process per pod start, around the check only.

The set is 1 GiB (16 sparse files of 64 MiB: the same code path as real data, hashed in full on the first start,
without writing 1 GiB to this machine's disk). Negative controls: the first start (no marker) reads the whole set;
a marker for another manifest, a file touched after the marker, or an unreadable marker are not trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eks_ddp_runtime import dataset

MIB = 1 << 20
FILES, FILE_SIZE = 16, 64 * MIB

POD_START = """
import json, sys
from eks_ddp_runtime import dataset

def rchar():
    with open("/proc/self/io") as f:
        return int(dict(line.split(": ") for line in f.read().splitlines())["rchar"])

env = {dataset.VERIFY_ENV: sys.argv[2], dataset.DATA_DIR_ENV: sys.argv[1]}
before = rchar()
dataset.check_environment(env, log=lambda line: print(line, file=sys.stderr))
print(json.dumps({"read": rchar() - before}))
"""


def staged(root: Path, files: int = FILES, size: int = FILE_SIZE) -> str:
    """A staged set of sparse files (zeros) with its manifest; returns the pin (the manifest's SHA-256)."""
    root.mkdir(parents=True)
    zeros = hashlib.sha256()
    for _ in range(size // MIB):
        zeros.update(bytes(MIB))
    rows = []
    for i in range(files):
        path = root / f"shard-{i:03d}.bin"
        with open(path, "wb") as f:
            f.truncate(size)
        rows.append({"key": f"ds/{path.name}", "path": path.name, "size": size, "sha256": zeros.hexdigest(),
                     "etag": "0" * 32})
    blob = dataset.manifest_bytes("s3://data/ds/", rows)
    dataset.write_once(root, blob)
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def pod_start(root: Path, verify: str) -> tuple[int, str]:
    """(bytes read by the launcher's check, its log line) in a fresh process, as a pod start runs it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", POD_START, str(root), verify], capture_output=True, text=True,
                          timeout=120, env=env, check=True)
    return json.loads(proc.stdout)["read"], proc.stderr


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="the kernel's per-process I/O counters")
def test_a_second_pod_start_reads_only_the_marker_of_a_1_gib_set(tmp_path):
    root = tmp_path / "ds"
    pin = staged(root)
    size = FILES * FILE_SIZE
    # Negative control: no marker yet, so the first start reads (and hashes) the whole set, then leaves the marker.
    first, said = pod_start(root, pin)
    assert first >= size and "in full (every file hashed)" in said, said
    assert (root / dataset.VERIFIED).is_file()
    second, said = pod_start(root, pin)
    assert "by its marker" in said and f"{FILES} files, {size / 1e6:.1f} MB" in said, said
    manifest_and_marker = (root / dataset.MANIFEST).stat().st_size + (root / dataset.VERIFIED).stat().st_size
    assert second < manifest_and_marker + 64 * 1024, (first, second)  # the two small files, /proc reads: no data
    print(f"bytes read by the launcher's data check: first start {first}, second start {second} "
          f"(set {size}, manifest + marker {manifest_and_marker})")


def small(tmp_path: Path) -> dataset.Manifest:
    staged(tmp_path / "ds", files=3, size=MIB)
    manifest = dataset.Manifest.load(tmp_path / "ds")
    assert manifest.check() == (3, 3 * MIB, False)  # the first check: in full, and it leaves the marker
    assert manifest.check() == (3, 3 * MIB, True)
    return manifest


def test_the_marker_is_not_trusted_for_another_manifest(tmp_path):
    manifest = small(tmp_path)
    other = dataset.Manifest(manifest.root, manifest.blob.replace(b'"uri":"s3://data/ds/"', b'"uri":"s3://x/ds/"'))
    assert other.digest != manifest.digest and not other.verified()
    assert other.check()[2] is False  # checked in full (and now marked for that manifest instead)
    assert not manifest.verified()


@pytest.mark.parametrize("change", [
    lambda r: os.utime(r / "shard-001.bin", ns=(0, 0)),                     # metadata only: still not trusted
    lambda r: (r / "shard-002.bin").write_bytes(bytes(MIB)),                # same bytes, rewritten
    lambda r: (r / dataset.VERIFIED).write_text("{not json"),                # a marker that does not parse
])
def test_a_file_touched_after_the_marker_sends_the_check_back_to_full(tmp_path, change):
    manifest = small(tmp_path)
    change(manifest.root)
    assert not manifest.verified()
    assert manifest.check()[2] is False


def test_a_changed_file_is_refused_despite_the_marker(tmp_path):
    manifest = small(tmp_path)
    with open(manifest.root / "shard-000.bin", "r+b") as f:
        f.write(b"X")
    with pytest.raises(dataset.DataError, match="shard-000.bin: sha256 [0-9a-f]{64} differs"):
        manifest.check()


def test_a_read_only_volume_checks_in_full_and_writes_nothing(tmp_path, monkeypatch):
    staged(tmp_path / "ds", files=2, size=MIB)
    manifest = dataset.Manifest.load(tmp_path / "ds")

    def read_only(*_a, **_k):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(dataset.os, "replace", read_only)
    assert manifest.check() == (2, 2 * MIB, False)
    assert not (manifest.root / dataset.VERIFIED).exists()
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]  # no temporary file left beside it
