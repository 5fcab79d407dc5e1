"""The S3 data stage (eks_ddp_runtime.stage_s3) against moto's S3: every object copied and verified, the manifest
written once with every key, size and SHA-256, a rerun re-verifies against it and downloads nothing, a changed
prefix, a tampered copy, a wrong pin, a corrupt download or an escaping key fails with BAD_INPUT; the launcher
verifies the data set against the manifest (and pin) before any worker starts."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")

from eks_ddp_runtime import dataset, stage_s3  # noqa: E402
from eks_ddp_runtime.exitcodes import BAD_INPUT, CONFIG_ERROR  # noqa: E402
from tests.support.util import ROOT  # noqa: E402

CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture
def s3(monkeypatch):
    for k, v in CREDS.items():
        monkeypatch.setenv(k, v)
    with moto.mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="data")
        yield client


class Counting:
    """The client, counting downloads (and optionally corrupting them)."""

    def __init__(self, client, corrupt: bool = False):
        self.client, self.corrupt, self.downloads = client, corrupt, []

    def __getattr__(self, name):
        return getattr(self.client, name)

    def download_file(self, bucket, key, path):
        self.downloads.append(key)
        self.client.download_file(bucket, key, path)
        if self.corrupt:
            with open(path, "r+b") as f:
                f.write(b"X")


def put(s3, key: str, body: bytes, **kw) -> None:
    s3.put_object(Bucket="data", Key=key, Body=body, **kw)


def test_every_object_is_copied_verified_and_a_rerun_is_a_no_op(s3, tmp_path):
    put(s3, "wiki/a.txt", b"alpha")
    put(s3, "wiki/sub/b.bin", os.urandom(1000), ChecksumAlgorithm="SHA256")
    put(s3, "wiki/folder/", b"")  # a console "folder": not a file
    put(s3, "other/c.txt", b"not mine")
    c = Counting(s3)
    assert stage_s3.stage(c, "s3://data/wiki/", tmp_path / "wiki", log=lambda *_: None) == 2
    files = sorted(str(p.relative_to(tmp_path / "wiki")) for p in (tmp_path / "wiki").rglob("*") if p.is_file())
    assert files == [dataset.MANIFEST, dataset.VERIFIED, "a.txt", "sub/b.bin"]
    assert (tmp_path / "wiki/a.txt").read_bytes() == b"alpha"
    manifest = json.loads((tmp_path / "wiki" / dataset.MANIFEST).read_text())
    assert manifest["uri"] == "s3://data/wiki/"
    assert {(o["key"], o["path"], o["size"], o["sha256"]) for o in manifest["objects"]} == {
        (f"wiki/{p}", p, (tmp_path / "wiki" / p).stat().st_size,
         hashlib.sha256((tmp_path / "wiki" / p).read_bytes()).hexdigest()) for p in ("a.txt", "sub/b.bin")}
    again = Counting(s3)
    assert stage_s3.stage(again, "s3://data/wiki/", tmp_path / "wiki", log=lambda *_: None) == 0
    assert again.downloads == []
    # A staged data set never changes in place: a changed prefix is refused, naming the object and the way out.
    put(s3, "wiki/new.txt", b"new")
    third = Counting(s3)
    with pytest.raises(stage_s3.BadInput, match=r"s3://data/wiki/: 1 object\(s\) changed since .* \(first: "
                                                r"wiki/new.txt\).*delete .*wiki to stage it again"):
        stage_s3.stage(third, "s3://data/wiki/", tmp_path / "wiki", log=lambda *_: None)
    assert third.downloads == []


def test_a_multipart_object_is_checked_against_its_multipart_etag(s3, tmp_path):
    from boto3.s3.transfer import TransferConfig

    src = tmp_path / "big"
    src.write_bytes(os.urandom(11 * 1024 * 1024))
    s3.upload_file(str(src), "data", "ds/big", Config=TransferConfig(multipart_threshold=5 << 20,
                                                                     multipart_chunksize=5 << 20))
    assert "-" in s3.head_object(Bucket="data", Key="ds/big")["ETag"]
    assert stage_s3.stage(s3, "s3://data/ds/", tmp_path / "out", log=lambda *_: None) == 1
    assert hashlib.sha256((tmp_path / "out/big").read_bytes()).digest() == hashlib.sha256(src.read_bytes()).digest()
    # Negative control: a different file of the same size fails the multipart check.
    (tmp_path / "out/big").write_bytes(os.urandom(11 * 1024 * 1024))
    obj = stage_s3.listing(s3, "data", "ds/")[0]
    assert "multipart ETag" in stage_s3.check(s3, "data", obj, tmp_path / "out/big")


def test_a_corrupt_copy_fails_as_bad_input_and_leaves_nothing(s3, tmp_path):
    put(s3, "ds/a.txt", b"alpha")
    with pytest.raises(stage_s3.BadInput, match=r"s3://data/ds/a.txt: MD5 .* expected ETag .* after two downloads"):
        stage_s3.stage(Counting(s3, corrupt=True), "s3://data/ds/", tmp_path / "out", log=lambda *_: None)
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]


def test_a_key_that_would_leave_the_destination_is_refused(s3, tmp_path):
    put(s3, "ds/../../etc/x", b"x")
    with pytest.raises(stage_s3.BadInput, match="would leave the destination"):
        stage_s3.stage(s3, "s3://data/ds/", tmp_path / "out", log=lambda *_: None)


def _run(code: str, *args: str, block_boto3: bool = False) -> subprocess.CompletedProcess:
    prelude = "import sys\nsys.modules['boto3'] = None\n" if block_boto3 else ""
    env = {**os.environ, **CREDS, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code), *args], capture_output=True,
                          text=True, timeout=120, env=env, cwd=ROOT)


MAIN = """
import sys
from eks_ddp_runtime.stage_s3 import main
sys.exit(main(sys.argv[1:]))
"""
UNDER_MOTO = """
import sys, boto3
from moto import mock_aws
with mock_aws():
    c = boto3.client("s3", region_name="us-east-1")
    c.create_bucket(Bucket="data")
    if sys.argv[1] == "seed":
        c.put_object(Bucket="data", Key="ds/a.txt", Body=b"alpha")
    from eks_ddp_runtime.stage_s3 import main
    first = main(sys.argv[2:])
    second = main(sys.argv[2:])
print("codes", first, second)
sys.exit(first)
"""


def test_exit_codes_as_a_process(tmp_path):
    no_boto = _run(MAIN, "s3://data/ds/", str(tmp_path / "x"), block_boto3=True)
    assert no_boto.returncode == CONFIG_ERROR and "boto3 is not installed" in no_boto.stderr
    bad_uri = _run(MAIN, "s3://data/ds", str(tmp_path / "x"))
    assert bad_uri.returncode == CONFIG_ERROR and "ending with '/'" in bad_uri.stderr
    empty = _run(UNDER_MOTO, "empty", "s3://data/ds/", str(tmp_path / "e"))
    assert empty.returncode == BAD_INPUT and "no objects under this prefix" in empty.stderr
    ok = _run(UNDER_MOTO, "seed", "s3://data/ds/", str(tmp_path / "ok"))
    assert ok.returncode == 0, ok.stderr
    assert "codes 0 0" in ok.stdout and "already staged" in ok.stdout
    assert (tmp_path / "ok/a.txt").read_bytes() == b"alpha"


# --- the manifest: written once, verified on every rerun and read, pinned from outside the volume -----------

def _staged(s3, tmp_path, **kw):
    put(s3, "ds/a.txt", b"alpha")
    put(s3, "ds/sub/b.bin", os.urandom(1000), ChecksumAlgorithm="SHA256")
    logs: list[str] = []
    stage_s3.stage(s3, "s3://data/ds/", tmp_path / "ds", log=logs.append, **kw)
    return tmp_path / "ds", logs


def test_the_stage_logs_the_manifest_digest_a_pin_accepts_it_and_a_wrong_pin_is_refused(s3, tmp_path):
    root, logs = _staged(s3, tmp_path)
    digest = hashlib.sha256((root / dataset.MANIFEST).read_bytes()).hexdigest()
    assert f"sha256 {digest}: pin it with the run's workload.data.sha256" in logs[-1]
    # The same content staged elsewhere gives the same manifest (the pin does not depend on who staged it).
    assert stage_s3.stage(s3, "s3://data/ds/", tmp_path / "again", pin=digest, log=lambda *_: None) == 2
    assert (tmp_path / "again" / dataset.MANIFEST).read_bytes() == (root / dataset.MANIFEST).read_bytes()
    assert stage_s3.stage(s3, "s3://data/ds/", root, pin=digest, log=lambda *_: None) == 0
    wrong = "0" * 64
    with pytest.raises(stage_s3.BadInput, match=f"sha256 {digest} differs from the pinned {wrong}"):
        stage_s3.stage(s3, "s3://data/ds/", root, pin=wrong, log=lambda *_: None)
    with pytest.raises(stage_s3.BadInput, match=f"manifest has sha256 {digest}, not the pinned {wrong}"):
        stage_s3.stage(s3, "s3://data/ds/", tmp_path / "fresh", pin=wrong, log=lambda *_: None)
    assert not (tmp_path / "fresh" / dataset.MANIFEST).exists()


@pytest.mark.parametrize("tamper, says", [
    (lambda r: (r / "a.txt").write_bytes(b"ALPHA"), r"a.txt: sha256 [0-9a-f]{64} differs from"),
    (lambda r: (r / "a.txt").write_bytes(b"alpha!"), r"a.txt: 6 bytes, but .* lists 5"),
    (lambda r: (r / "sub/b.bin").unlink(), r"sub/b.bin: missing"),
    (lambda r: (r / "sub/evil.pt").write_bytes(b"x"), r"sub/evil.pt: not listed in"),
    (lambda r: ((r / "a.txt").unlink(), (r / "a.txt").symlink_to("/etc/hostname")), r"a.txt: not a regular file"),
])
def test_a_rerun_rehashes_and_refuses_a_copy_changed_after_staging(s3, tmp_path, tamper, says):
    # Negative control for the rerun: the old stage trusted its marker and copied nothing, whatever the files held.
    root, _ = _staged(s3, tmp_path)
    tamper(root)
    c = Counting(s3)
    with pytest.raises(stage_s3.BadInput, match=says):
        stage_s3.stage(c, "s3://data/ds/", root, log=lambda *_: None)
    assert c.downloads == []
    with pytest.raises(dataset.DataError, match=says):
        dataset.Manifest.load(root).verify()


def test_a_loader_reads_only_bytes_that_match_the_manifest(s3, tmp_path):
    root, _ = _staged(s3, tmp_path)
    m = dataset.Manifest.load(root)
    assert m.read("a.txt") == b"alpha"
    (root / "a.txt").write_bytes(b"ALPHA")
    with pytest.raises(dataset.DataError, match="a.txt: sha256 .* differs"):
        m.read("a.txt")
    with pytest.raises(dataset.DataError, match="not listed"):
        m.read("../etc/passwd")


def test_a_file_in_place_that_s3_cannot_vouch_for_is_downloaded_again(s3, tmp_path):
    # An SSE-KMS object without an S3 checksum: its ETag is not its MD5, so a same-size file already in place
    # (planted before the first stage) would pass on size alone. It is replaced, and the manifest holds S3's bytes.
    kms = boto3.client("kms", region_name="us-east-1").create_key()["KeyMetadata"]["KeyId"]
    put(s3, "ds/k.bin", b"genuine!", ServerSideEncryption="aws:kms", SSEKMSKeyId=kms)
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds/k.bin").write_bytes(b"planted!")
    c = Counting(s3)
    assert stage_s3.stage(c, "s3://data/ds/", tmp_path / "ds", log=lambda *_: None) == 1
    assert c.downloads == ["ds/k.bin"] and (tmp_path / "ds/k.bin").read_bytes() == b"genuine!"
    dataset.Manifest.load(tmp_path / "ds").verify()


def test_two_stages_of_one_prefix_at_once_both_succeed(s3, tmp_path):
    # Two runs with the same data set start their stage pods together: one stage runs whole (and writes the
    # manifest) while the other is between a download and its rename. Both end staged; neither takes the other's
    # part file for tampering or deletes it (an older layout kept part files inside the directory, so the first
    # to finish deleted the other's, which then downloaded again, and a part file created between the cleanup and
    # the check failed the stage as tampering).
    put(s3, "ds/a.txt", b"alpha")
    put(s3, "ds/b.txt", b"beta")
    inner: list[int] = []

    class Racing(Counting):
        def download_file(self, bucket, key, path):
            super().download_file(bucket, key, path)
            if not inner:
                inner.append(stage_s3.stage(s3, "s3://data/ds/", tmp_path / "ds", log=lambda *_: None))

    outer = Racing(s3)
    assert stage_s3.stage(outer, "s3://data/ds/", tmp_path / "ds", log=lambda *_: None) == 1
    assert inner == [2] and outer.downloads == ["ds/a.txt"]  # b.txt was in place, checked, by then
    dataset.Manifest.load(tmp_path / "ds").verify()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # no part file left anywhere


def test_two_sources_cannot_share_a_data_directory(s3, tmp_path):
    root, _ = _staged(s3, tmp_path)
    put(s3, "other/a.txt", b"alpha")
    with pytest.raises(stage_s3.BadInput, match=r"staged from s3://data/ds/, not s3://data/other/"):
        stage_s3.stage(s3, "s3://data/other/", root, log=lambda *_: None)


def test_the_manifest_is_written_once(tmp_path):
    assert dataset.write_once(tmp_path, b"one") is True
    assert dataset.write_once(tmp_path, b"one") is False
    with pytest.raises(dataset.DataError, match="already written with sha256"):
        dataset.write_once(tmp_path, b"two")
    assert (tmp_path / dataset.MANIFEST).read_bytes() == b"one"
    assert [p.name for p in tmp_path.iterdir()] == [dataset.MANIFEST]  # no temporary file left


def test_the_verify_setting_is_checked():
    assert dataset.parse_verify("manifest") is None
    assert dataset.parse_verify("sha256:" + "a" * 64) == "a" * 64
    with pytest.raises(dataset.DataError, match=r"EKS_DDP_DATA_VERIFY: got 'sha256:ABC'; expected 'manifest' or"):
        dataset.parse_verify("sha256:ABC")


# --- as processes: the stage run twice with the files tampered in between; the launcher in front of workers ----

STAGE_UNDER_MOTO = """
import sys, boto3
from moto import mock_aws
with mock_aws():
    c = boto3.client("s3", region_name="us-east-1")
    c.create_bucket(Bucket="data")
    c.put_object(Bucket="data", Key="ds/a.txt", Body=b"alpha")
    c.put_object(Bucket="data", Key="ds/sub/b.bin", Body=bytes(range(256)) * 4)
    from eks_ddp_runtime.stage_s3 import main
    code = main(sys.argv[1:])
sys.exit(code)
"""


def test_a_tampered_copy_fails_the_next_stage_process_with_bad_input(tmp_path):
    dest = tmp_path / "ds"
    first = _run(STAGE_UNDER_MOTO, "s3://data/ds/", str(dest))
    assert first.returncode == 0, first.stderr
    digest = hashlib.sha256((dest / dataset.MANIFEST).read_bytes()).hexdigest()
    assert f"sha256 {digest}" in first.stdout
    pinned = _run(STAGE_UNDER_MOTO, "s3://data/ds/", str(dest), "--pin", f"sha256:{digest}")
    assert pinned.returncode == 0 and "nothing to do" in pinned.stdout, pinned.stderr
    (dest / "sub/b.bin").write_bytes(b"\0" * 1024)  # same size, other bytes: the old marker let this through
    tampered = _run(STAGE_UNDER_MOTO, "s3://data/ds/", str(dest))
    assert tampered.returncode == BAD_INPUT, tampered.stdout + tampered.stderr
    assert f"{dest}/sub/b.bin: sha256 " in tampered.stderr and "changed after the data stage wrote it" in \
        tampered.stderr
    bad_pin = _run(MAIN, "s3://data/ds/", str(dest), "--pin", "sha256:nope")
    assert bad_pin.returncode == CONFIG_ERROR and "EKS_DDP_DATA_VERIFY: got 'sha256:nope'" in bad_pin.stderr


WORKER = "import pathlib, os; pathlib.Path(os.environ['SENTINEL']).write_text('ran')\n"


def _launch(tmp_path, data: Path, verify: str) -> tuple[subprocess.CompletedProcess, bool]:
    script, sentinel = tmp_path / "worker.py", tmp_path / "ran"
    script.write_text(WORKER)
    sentinel.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "SENTINEL": str(sentinel),
           dataset.VERIFY_ENV: verify, dataset.DATA_DIR_ENV: str(data), "EKS_DDP_FORK_WORKERS": "0"}
    from eks_ddp_local.etcd_server import free_port

    proc = subprocess.run([sys.executable, "-m", "eks_ddp_runtime.launch", "--nnodes=1", "--nproc-per-node=1",
                           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(script)], capture_output=True, text=True, timeout=120,
                          env=env, cwd=ROOT, stdin=subprocess.DEVNULL)
    return proc, sentinel.exists()


def test_the_launcher_verifies_the_data_set_before_any_worker_starts(s3, tmp_path):
    root, _ = _staged(s3, tmp_path)
    digest = hashlib.sha256((root / dataset.MANIFEST).read_bytes()).hexdigest()
    ok, ran = _launch(tmp_path, root, f"sha256:{digest}")
    assert ok.returncode == 0 and ran, ok.stderr[-3000:]
    assert "verified by its marker" in ok.stderr and ": 2 files" in ok.stderr and "(pinned)" in ok.stderr
    # Negative control: one file changed after staging; the worker never starts.
    (root / "a.txt").write_bytes(b"ALPHA")
    changed, ran = _launch(tmp_path, root, "manifest")
    assert changed.returncode == BAD_INPUT and not ran, changed.stderr[-3000:]
    assert f"{root}/a.txt: sha256" in changed.stderr


def test_the_launchers_check_refuses_a_wrong_pin_and_a_missing_manifest(s3, tmp_path):
    # The whole data set and its manifest rewritten consistently: only the pin from outside the volume tells.
    root, _ = _staged(s3, tmp_path)
    env = {dataset.VERIFY_ENV: "sha256:" + "f" * 64, dataset.DATA_DIR_ENV: str(root)}
    with pytest.raises(dataset.DataError, match=f"differs from the pinned {'f' * 64}"):
        dataset.check_environment(env, log=lambda *_: None)
    (root / dataset.MANIFEST).unlink()
    with pytest.raises(dataset.DataError, match="missing; the data set .* has no manifest"):
        dataset.check_environment({**env, dataset.VERIFY_ENV: "manifest"}, log=lambda *_: None)
    assert dataset.check_environment({}, log=lambda *_: None) is None
