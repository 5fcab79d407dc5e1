"""Stage an S3 prefix onto the shared volume once, verified and pinned: ``python -m eks_ddp_runtime.stage_s3 SRC DEST``.

    python -m eks_ddp_runtime.stage_s3 s3://bucket/datasets/wiki/ /shared/data/wiki [--pin sha256:<hex>]

Copies every object under the prefix to ``DEST/<key relative to the prefix>``, each through a temporary file
that is renamed into place only after its size and its checksum match: the object's full SHA-256 where S3 has
one, else its ETag when that is an MD5 (single-part, not SSE-KMS) or the multipart ETag (MD5 of the parts'
MD5s); an SSE-KMS object without an S3 checksum has only its size to check, so a file already in place is
downloaded again rather than trusted. When every object is in place it writes the data set's manifest
``DEST/.eks-ddp-manifest.json`` once (dataset.py: every key, path, size, ETag and SHA-256) and logs its SHA-256,
the pin for the run's ``workload.data.sha256``, then the verified marker (dataset.py ``VERIFIED``): every file was
hashed as it was staged, so the training pods' check reads the marker and the files' metadata, not the data.

A rerun (or another run's stage of the same directory) finds the manifest and verifies against it, downloading
nothing: the prefix must list exactly the manifest's objects (keys, sizes, ETags), every file must still match
its size and SHA-256 (re-hashed only when no marker vouches for this manifest and the files' unchanged metadata),
and no file may have been added. A staged data set is never changed in place: a prefix
whose content changed is refused (stage it under a new name, or delete DEST to stage it again). With a pin
(``--pin`` or ``EKS_DDP_DATA_VERIFY=sha256:<hex>``, which the Job sets) the manifest must also hash to it, before
it is written and on every rerun.

Exit codes (the runtime's contract, eks_ddp_runtime.exitcodes): 0 staged (or already staged and verified); 3 bad
arguments or boto3 missing from the image; 5 bad input (an object that fails its check twice, a key that
would leave DEST, an empty prefix, a staged copy that no longer matches its manifest or pin, a prefix changed
since it was staged); 1 anything else (network, throttling): the Job retries.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import sys
from pathlib import Path, PurePosixPath
from typing import Any

from . import dataset
from .dataset import MANIFEST, DataError
from .exitcodes import BAD_INPUT, CONFIG_ERROR

LEGACY_MARKER = ".eks-ddp-staged.json"
"""What older stages wrote instead of a manifest (a listing fingerprint, no hashes): removed once the manifest is."""
_PART = re.compile(r"^\..+\.part-[0-9a-f]{12}$")
"""Part files older stages left inside the directory when interrupted."""
_S3 = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(?P<prefix>([^/\s]+/)*)$")
_CHUNK = 8 << 20


class BadInput(Exception):
    """The source cannot be staged as it is (no retry helps)."""


def parse_uri(uri: str) -> tuple[str, str]:
    m = _S3.match(uri)
    if not m:
        raise ValueError(f"source: got {uri!r}; expected an S3 prefix such as s3://bucket/datasets/wiki/ (ending "
                         "with '/')")
    return m["bucket"], m["prefix"]


def listing(client: Any, bucket: str, prefix: str) -> list[dict[str, Any]]:
    """Every object under the prefix (folder placeholders ending in '/' left out), sorted by key."""
    out: list[dict[str, Any]] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out += [{"key": o["Key"], "size": o["Size"], "etag": o["ETag"].strip('"')}
                for o in page.get("Contents", []) if not o["Key"].endswith("/")]
    return sorted(out, key=lambda o: o["key"])


def relative(key: str, prefix: str) -> PurePosixPath:
    rel = PurePosixPath(key[len(prefix):])
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise BadInput(f"key {key!r}: its path under the prefix would leave the destination")
    if rel.name == MANIFEST:
        raise BadInput(f"key {key!r}: {MANIFEST} is the name of the data set's manifest; rename the object")
    return rel


def _digests(path: Path, part_size: int | None) -> tuple[bytes, str, str | None]:
    """(sha256 digest, md5 hex, multipart md5 'hex-N' for ``part_size``) of a file in one read."""
    sha, md5 = hashlib.sha256(), hashlib.md5()  # noqa: S324 (S3's ETag is an MD5; not used for security)
    parts: list[bytes] = []
    part = hashlib.md5()  # noqa: S324
    in_part = 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK if part_size is None else min(_CHUNK, part_size - in_part)):
            sha.update(chunk)
            md5.update(chunk)
            if part_size is not None:
                part.update(chunk)
                in_part += len(chunk)
                if in_part == part_size:
                    parts.append(part.digest())
                    part, in_part = hashlib.md5(), 0  # noqa: S324
    if part_size is not None and in_part:
        parts.append(part.digest())
    multi = None if part_size is None else \
        f"{hashlib.md5(b''.join(parts)).hexdigest()}-{len(parts)}"  # noqa: S324
    return sha.digest(), md5.hexdigest(), multi


def verify_object(client: Any, bucket: str, obj: dict[str, Any], path: Path) -> tuple[str | None, str, bool]:
    """(why ``path`` is not the object or None, its SHA-256 hex, whether S3 vouched for the content: False when
    only the size could be compared)."""
    if not path.is_file() or path.stat().st_size != obj["size"]:
        return f"size {path.stat().st_size if path.is_file() else 'missing'}, expected {obj['size']}", "", False
    head = client.head_object(Bucket=bucket, Key=obj["key"], ChecksumMode="ENABLED")
    etag, want_sha = obj["etag"], head.get("ChecksumSHA256")
    full_sha = want_sha if want_sha and "-" not in want_sha else None  # "-N": a composite of the parts' checksums
    part_size = None
    if "-" in etag and not full_sha:
        part_size = client.head_object(Bucket=bucket, Key=obj["key"], PartNumber=1)["ContentLength"]
    raw, md5, multi = _digests(path, part_size)
    sha, hexsha = base64.b64encode(raw).decode(), raw.hex()
    if full_sha:
        return (None if sha == full_sha else f"SHA-256 {sha}, expected {full_sha}"), hexsha, True
    if "-" in etag:
        return (None if multi == etag else f"multipart ETag {multi}, expected {etag}"), hexsha, True
    if head.get("ServerSideEncryption") in ("aws:kms", "aws:kms:dsse") or head.get("SSECustomerAlgorithm"):
        return None, hexsha, False  # The ETag of an SSE-KMS/SSE-C object is not its MD5: size only, and S3's TLS.
    return (None if md5 == etag else f"MD5 {md5}, expected ETag {etag}"), hexsha, True


def check(client: Any, bucket: str, obj: dict[str, Any], path: Path) -> str | None:
    """None if ``path`` is the object (size and checksum), else why not."""
    return verify_object(client, bucket, obj, path)[0]


def _reverify(dest: Path, uri: str, objects: list[dict[str, Any]], pin: str | None, log: Any) -> None:
    """A staged directory: the prefix must still list the manifest's objects, and every file match it."""
    try:
        manifest = dataset.Manifest.load(dest, pin)
        if manifest.uri != uri:
            raise BadInput(f"{dest}: staged from {manifest.uri}, not {uri}; two sources cannot share a data "
                           "directory (give this one another name)")
        have = {(e.key, e.size, e.etag) for e in manifest.entries.values()}
        now = {(o["key"], o["size"], o["etag"]) for o in objects}
        if have != now:
            changed = sorted({k for k, *_ in have ^ now})
            raise BadInput(f"{uri}: {len(changed)} object(s) changed since the data set was staged into {dest} "
                           f"(first: {changed[0]}); a staged data set is never changed in place: stage the new "
                           f"content under another name, or delete {dest} to stage it again")
        files, size, marked = manifest.check()
    except DataError as err:
        raise BadInput(str(err)) from None
    how = "verified earlier for this manifest, unchanged since" if marked else "re-hashed"
    log(f"[stage] {uri}: already staged in {dest} ({files} objects, {size / 1e6:.1f} MB {how}, all match "
        f"the manifest, sha256 {manifest.digest}), nothing to do")


def stage(client: Any, uri: str, dest: Path, *, pin: str | None = None, log: Any = print) -> int:
    """Stage ``uri`` into ``dest``; returns how many objects were downloaded (0: already staged and verified).
    ``pin``: the SHA-256 (hex) the data set's manifest must have."""
    bucket, prefix = parse_uri(uri)
    objects = listing(client, bucket, prefix)
    if not objects:
        raise BadInput(f"{uri}: no objects under this prefix (check the URI and the role's s3:ListBucket)")
    if (dest / MANIFEST).exists():
        _reverify(dest, uri, objects, pin, log)
        return 0
    dest.mkdir(parents=True, exist_ok=True)
    fetched = 0
    rows = []
    for obj in objects:
        rel = relative(obj["key"], prefix)
        path = dest / rel
        why, sha, vouched = verify_object(client, bucket, obj, path)
        if why is not None or not vouched:  # missing, different, or not checkable against S3: download it
            path.parent.mkdir(parents=True, exist_ok=True)
            # Beside the data directory, not in it (the directory only ever holds whole, checked files, so a
            # concurrent stage of the same prefix, which two runs' stage pods may be, never meets a part file
            # there); a random suffix, not the pid (pid 1 in every pod).
            tmp = dest.parent / f".{dest.name}.part-{os.urandom(6).hex()}"
            why = None
            try:
                for _ in range(2):  # one retry: a torn download, then it is the object's problem
                    client.download_file(bucket, obj["key"], str(tmp))
                    if (why := verify_object(client, bucket, obj, tmp)[0]) is None:
                        break
                if why is not None:
                    raise BadInput(f"s3://{bucket}/{obj['key']}: {why} after two downloads")
                # The digest of what is renamed into place, read from the file itself (not the download's check).
                sha = dataset.sha256_file(tmp)
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
            fetched += 1
        rows.append({**obj, "path": rel.as_posix(), "sha256": sha})
    blob = dataset.manifest_bytes(uri, rows)
    digest = hashlib.sha256(blob).hexdigest()
    if pin is not None and digest != pin:
        raise BadInput(f"{uri}: the staged data set's manifest has sha256 {digest}, not the pinned {pin} "
                       "(workload.data.sha256): the prefix's content is not the one pinned; nothing was "
                       "marked staged")
    # An older stage's marker, and the part files it kept inside the directory: the manifest lists every file.
    listed = {dest / r["path"] for r in rows}
    for p in dest.rglob(".*"):
        if p not in listed and p.is_file() and (_PART.match(p.name) or p == dest / LEGACY_MARKER):
            p.unlink(missing_ok=True)
    try:
        manifest = dataset.Manifest(dest, blob)
        found = manifest.present()
        if extra := sorted(set(found) - {r["path"] for r in rows}):
            raise DataError(f"{dest / extra[0]}: in the data directory but not under {uri} ({len(extra)} such "
                            f"file(s)); delete them (or {dest}) and stage again")
        dataset.write_once(dest, blob)
        # Every file was hashed above, as it was staged: the training pods' check reads this marker instead.
        manifest.mark_verified(found)
    except DataError as err:
        raise BadInput(str(err)) from None
    log(f"[stage] {uri}: {len(objects)} objects in {dest} ({fetched} downloaded, all verified); manifest "
        f"{dest / MANIFEST} sha256 {digest}: pin it with the run's workload.data.sha256")
    return fetched


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eks_ddp_runtime.stage_s3", description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="s3://bucket/prefix/ (ending with '/')")
    p.add_argument("dest", type=Path, help="directory on the shared volume, e.g. /shared/data/<name>")
    p.add_argument("--region", help="the bucket's region (default: the environment's)")
    p.add_argument("--pin", default=os.environ.get(dataset.VERIFY_ENV) or None,
                   help="sha256:<hex> the data set's manifest must hash to (default: $EKS_DDP_DATA_VERIFY; "
                        "'manifest' or unset: no pin)")
    a = p.parse_args(argv)
    try:
        parse_uri(a.source)
        pin = None if a.pin is None else dataset.parse_verify(a.pin)
    except ValueError as err:
        print(f"stage_s3: {err}", file=sys.stderr)
        return CONFIG_ERROR
    try:
        import boto3
    except ImportError:
        print("stage_s3: boto3 is not installed in this image; expected it for the S3 data stage "
              "(pip install boto3 in the workload's image)", file=sys.stderr)
        return CONFIG_ERROR
    try:
        stage(boto3.client("s3", region_name=a.region), a.source, a.dest, pin=pin)
    except BadInput as err:
        print(f"stage_s3: {err}", file=sys.stderr)
        return BAD_INPUT
    except Exception as err:  # network, throttling, credentials: the Job's retry may succeed
        print(f"stage_s3: {a.source}: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
