"""The S3 data stage (eks_ddp_runtime.stage_s3) against moto's S3: every object copied and verified, a rerun is
a no-op, a changed prefix is staged again, a corrupt copy or an escaping key fails with BAD_INPUT."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")

from eks_ddp_runtime import stage_s3  # noqa: E402
from eks_ddp_runtime.exitcodes import BAD_INPUT, CONFIG_ERROR  # noqa: E402

from tests.util import ROOT  # noqa: E402

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
    assert files == [stage_s3.MARKER, "a.txt", "sub/b.bin"]
    assert (tmp_path / "wiki/a.txt").read_bytes() == b"alpha"
    marker = json.loads((tmp_path / "wiki" / stage_s3.MARKER).read_text())
    assert marker["objects"] == 2 and marker["uri"] == "s3://data/wiki/"
    again = Counting(s3)
    assert stage_s3.stage(again, "s3://data/wiki/", tmp_path / "wiki", log=lambda *_: None) == 0
    assert again.downloads == []
    # A changed prefix is staged again, downloading only what is not already in place.
    put(s3, "wiki/new.txt", b"new")
    third = Counting(s3)
    assert stage_s3.stage(third, "s3://data/wiki/", tmp_path / "wiki", log=lambda *_: None) == 1
    assert third.downloads == ["wiki/new.txt"]


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
