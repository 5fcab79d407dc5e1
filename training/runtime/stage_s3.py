"""Stage an S3 prefix onto the shared volume once, verified: ``python -m eks_ddp_runtime.stage_s3 SRC DEST``.

    python -m eks_ddp_runtime.stage_s3 s3://bucket/datasets/wiki/ /shared/data/wiki

Copies every object under the prefix to ``DEST/<key relative to the prefix>``, each through a temporary file
that is renamed into place only after its size and its checksum match: the object's full SHA-256 where S3 has
one, else its ETag when that is an MD5 (single-part, not SSE-KMS) or the multipart ETag (MD5 of the parts'
MD5s). When every object is in place it writes ``DEST/.eks-ddp-staged.json`` keyed on the listing (keys, sizes,
ETags): a rerun over an unchanged prefix lists, finds the marker and copies nothing; a changed prefix is
staged again. Files already in place with a matching checksum are not downloaded again.

Exit codes (the runtime's contract, eks_ddp_runtime.exitcodes): 0 staged (or already staged); 3 bad
arguments or boto3 missing from the image; 5 bad input (an object that fails its check twice, a key that
would leave DEST, an empty prefix); 1 anything else (network, throttling): the Job retries.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import sys
from pathlib import Path, PurePosixPath
from typing import Any

from .exitcodes import BAD_INPUT, CONFIG_ERROR

MARKER = ".eks-ddp-staged.json"
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


def fingerprint(objects: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(objects, sort_keys=True).encode()).hexdigest()


def relative(key: str, prefix: str) -> PurePosixPath:
    rel = PurePosixPath(key[len(prefix):])
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise BadInput(f"key {key!r}: its path under the prefix would leave the destination")
    return rel


def _digests(path: Path, part_size: int | None) -> tuple[str, str, str | None]:
    """(sha256 base64, md5 hex, multipart md5 'hex-N' for ``part_size``) of a file in one read."""
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
    return base64.b64encode(sha.digest()).decode(), md5.hexdigest(), multi


def check(client: Any, bucket: str, obj: dict[str, Any], path: Path) -> str | None:
    """None if ``path`` is the object (size and checksum), else why not."""
    if not path.is_file() or path.stat().st_size != obj["size"]:
        return f"size {path.stat().st_size if path.is_file() else 'missing'}, expected {obj['size']}"
    head = client.head_object(Bucket=bucket, Key=obj["key"], ChecksumMode="ENABLED")
    etag, want_sha = obj["etag"], head.get("ChecksumSHA256")
    full_sha = want_sha if want_sha and "-" not in want_sha else None  # "-N": a composite of the parts' checksums
    part_size = None
    if "-" in etag and not full_sha:
        part_size = client.head_object(Bucket=bucket, Key=obj["key"], PartNumber=1)["ContentLength"]
    sha, md5, multi = _digests(path, part_size)
    if full_sha:
        return None if sha == full_sha else f"SHA-256 {sha}, expected {full_sha}"
    if "-" in etag:
        return None if multi == etag else f"multipart ETag {multi}, expected {etag}"
    if head.get("ServerSideEncryption") in ("aws:kms", "aws:kms:dsse") or head.get("SSECustomerAlgorithm"):
        return None  # The ETag of an SSE-KMS/SSE-C object is not its MD5: size only, and S3's own TLS + integrity.
    return None if md5 == etag else f"MD5 {md5}, expected ETag {etag}"


def stage(client: Any, uri: str, dest: Path, *, log: Any = print) -> int:
    """Stage ``uri`` into ``dest``; returns how many objects were downloaded (0: already staged)."""
    bucket, prefix = parse_uri(uri)
    objects = listing(client, bucket, prefix)
    if not objects:
        raise BadInput(f"{uri}: no objects under this prefix (check the URI and the role's s3:ListBucket)")
    key = fingerprint(objects)
    marker = dest / MARKER
    try:
        if json.loads(marker.read_text()).get("listing") == key:
            log(f"[stage] {uri}: already staged in {dest} ({len(objects)} objects), nothing to do")
            return 0
    except (OSError, ValueError):
        pass
    dest.mkdir(parents=True, exist_ok=True)
    fetched = 0
    for obj in objects:
        path = dest / relative(obj["key"], prefix)
        if check(client, bucket, obj, path) is None:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        # A random suffix, not the pid: two runs' stage pods (pid 1 each) may stage the same prefix at once.
        tmp = path.with_name(f".{path.name}.part-{os.urandom(6).hex()}")
        why = None
        for _ in range(2):  # one retry: a torn download, then it is the object's problem
            client.download_file(bucket, obj["key"], str(tmp))
            if (why := check(client, bucket, obj, tmp)) is None:
                break
        if why is not None:
            tmp.unlink(missing_ok=True)
            raise BadInput(f"s3://{bucket}/{obj['key']}: {why} after two downloads")
        os.replace(tmp, path)
        fetched += 1
    tmp_marker = marker.with_name(f"{MARKER}.{os.urandom(6).hex()}")
    tmp_marker.write_text(json.dumps({"uri": uri, "listing": key, "objects": len(objects),
                                      "bytes": sum(o["size"] for o in objects)}))
    os.replace(tmp_marker, marker)
    log(f"[stage] {uri}: {len(objects)} objects in {dest} ({fetched} downloaded, all verified)")
    return fetched


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eks_ddp_runtime.stage_s3", description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="s3://bucket/prefix/ (ending with '/')")
    p.add_argument("dest", type=Path, help="directory on the shared volume, e.g. /shared/data/<name>")
    p.add_argument("--region", help="the bucket's region (default: the environment's)")
    a = p.parse_args(argv)
    try:
        parse_uri(a.source)
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
        stage(boto3.client("s3", region_name=a.region), a.source, a.dest)
    except BadInput as err:
        print(f"stage_s3: {err}", file=sys.stderr)
        return BAD_INPUT
    except Exception as err:  # network, throttling, credentials: the Job's retry may succeed
        print(f"stage_s3: {a.source}: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
