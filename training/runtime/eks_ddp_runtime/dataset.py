"""A staged data set's manifest and its check: what the S3 stage writes once and every reader verifies.

The S3 stage (stage_s3.py) writes ``<data dir>/.eks-ddp-manifest.json`` once, when every object is in place and
verified against S3: the source prefix and, for every object, its key, path under the data directory, size,
ETag and SHA-256. The file is created with a hard link from a fsynced temporary file, so it appears whole or not
at all and is never replaced: a second stage of the same directory (a rerun, another run with the same data set)
finds it and verifies against it instead of writing its own.

The shared volume is writable by every data stage of the stack, so the manifest alone catches corruption and a
change to some files; the **pin** comes from outside the volume, the SHA-256 of the manifest file itself
(``sha256sum <data dir>/.eks-ddp-manifest.json``, which the stage logs), set as the run's
``workload.data.sha256``. The training Job passes the check to its pods in ``EKS_DDP_DATA_VERIFY``:

* ``manifest``: the manifest must exist and every file must match it;
* ``sha256:<64 hex>``: also, the manifest must hash to that pin.

The launcher (launch.py) runs :func:`check_environment` in every training pod before any worker starts, and the
S3 stage verifies the same way on a rerun: a file missing, changed, added or replaced by a link fails with
:class:`DataError` naming it, and the process exits with ``exitcodes.BAD_INPUT`` (5), which fails the Job at once.
A loader that wants the check at the moment it reads can use :meth:`Manifest.read` (bytes returned only after
they matched).

**Verified once per manifest.** Hashing the whole set at every pod start costs its size in reads per pod (1 TB x
128 pods before the first step, and again before a replacement joins). So a full check that passes leaves a
**marker**, ``<data dir>/.eks-ddp-verified.json``: the SHA-256 of the manifest it checked against and a fingerprint
of every file's metadata at that moment (path, size, inode, mtime and ctime, taken before the hashing and
unchanged after it). The marker is written beside the directory and renamed into place (whole or not at all), only
after the full check, by whoever can write the volume: the S3 stage, which hashes every file as it stages it (and
on a rerun), or a reader with a writable mount. A later check (every training pod: they mount the data read-only)
reads the manifest, the marker and the files' metadata, not their bytes, and trusts the marker only if it names this
manifest's SHA-256 (so a changed manifest, or a pin the manifest does not match, is checked in full or refused)
and the fingerprint is unchanged: a file rewritten, replaced, added, removed or touched (any write, rename, chmod
or ``utime`` moves ctime, which no user call can set back) sends it back to the full check.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from .contract import DATA_DIR_ENV  # noqa: F401 (the data directory the Job mounts: API)
from .contract import DATA_VERIFY_ENV as VERIFY_ENV

MANIFEST = ".eks-ddp-manifest.json"
"""The manifest's name inside the data directory (a dot file: a loader listing the directory does not see it)."""
VERIFIED = ".eks-ddp-verified.json"
"""The marker a full check that passed leaves in the data directory (see the module's docstring)."""
FORMAT = 1
_PIN = re.compile(r"^sha256:([0-9a-f]{64})$")
_HEX = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20


class DataError(ValueError):
    """The data set does not match its manifest or pin (or the manifest is unreadable); the message names it."""


def parse_verify(value: str) -> str | None:
    """The pin (64 hex) in an ``EKS_DDP_DATA_VERIFY`` value, None for ``manifest``; a bad value raises DataError."""
    if value == "manifest":
        return None
    if m := _PIN.match(value):
        return m.group(1)
    raise DataError(f"{VERIFY_ENV}: got {value!r}; expected 'manifest' or 'sha256:<64 lowercase hex digits of "
                    f"{MANIFEST}>'")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def manifest_bytes(uri: str, objects: list[dict[str, Any]]) -> bytes:
    """The manifest's canonical bytes (sorted by path, one object per line): the same data set gives the same
    bytes, hence the same pin, whichever stage wrote it."""
    rows = sorted(({"key": o["key"], "path": o["path"], "size": o["size"], "sha256": o["sha256"],
                    "etag": o["etag"]} for o in objects), key=lambda o: o["path"])
    lines = [json.dumps(r, sort_keys=True, separators=(",", ":")) for r in rows]
    head = json.dumps({"format": FORMAT, "uri": uri}, sort_keys=True, separators=(",", ":"))
    return (head[:-1] + ',"objects":[\n' + ",\n".join(lines) + "\n]}\n").encode()


def _relative(path: str) -> PurePosixPath | None:
    rel = PurePosixPath(path)
    if not path or rel.is_absolute() or ".." in rel.parts or str(rel) != path or rel.name in (MANIFEST, VERIFIED):
        return None
    return rel


@dataclass(frozen=True)
class Entry:
    key: str
    size: int
    sha256: str
    etag: str


class Manifest:
    """A data directory's manifest, read once (and checked against the pin); :meth:`verify` checks the files."""

    def __init__(self, root: Path, blob: bytes, pin: str | None = None) -> None:
        self.root, self.blob = root, blob
        self.digest = hashlib.sha256(blob).hexdigest()
        where = root / MANIFEST
        if pin is not None and self.digest != pin:
            raise DataError(f"{where}: sha256 {self.digest} differs from the pinned {pin} ({VERIFY_ENV}, the run's "
                            "workload.data.sha256): the data set was changed after it was pinned")
        try:
            doc = json.loads(blob)
            if doc.get("format") != FORMAT or not isinstance(doc.get("uri"), str):
                raise ValueError(f"format {doc.get('format')!r}, expected {FORMAT}")
            entries: dict[str, Entry] = {}
            for o in doc["objects"]:
                if _relative(o["path"]) is None or not _HEX.match(o["sha256"]) or type(o["size"]) is not int:
                    raise ValueError(f"bad entry {o!r}")
                entries[o["path"]] = Entry(str(o["key"]), o["size"], o["sha256"], str(o["etag"]))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise DataError(f"{where}: not a data set manifest ({err})") from None
        self.uri: str = doc["uri"]
        self.entries: Mapping[str, Entry] = entries

    @classmethod
    def load(cls, root: Path, pin: str | None = None) -> Manifest:
        try:
            blob = (root / MANIFEST).read_bytes()
        except FileNotFoundError:
            raise DataError(f"{root / MANIFEST}: missing; the data set in {root} has no manifest (its S3 stage has "
                            "not finished, or the directory was staged by an older eks-ddp: delete it and run the "
                            "stage again)") from None
        return cls(root, blob, pin)

    def read(self, path: str) -> bytes:
        """The bytes of ``path`` (relative to the data directory), only after they matched the manifest."""
        entry = self.entries.get(path)
        if entry is None:
            raise DataError(f"{self.root / path}: not listed in {self.root / MANIFEST}")
        blob = (self.root / path).read_bytes()
        self._match(path, entry, len(blob), hashlib.sha256(blob).hexdigest())
        return blob

    def _match(self, path: str, entry: Entry, size: int, sha: str | None) -> None:
        where = self.root / path
        if size != entry.size:
            raise DataError(f"{where}: {size} bytes, but {self.root / MANIFEST} lists {entry.size}: the file was "
                            "changed after the data stage wrote it")
        if sha is not None and sha != entry.sha256:
            raise DataError(f"{where}: sha256 {sha} differs from {entry.sha256} in {self.root / MANIFEST}: the file "
                            "was changed after the data stage wrote it")

    def present(self) -> dict[str, os.stat_result]:
        """Every file under the data directory but the manifest, by relative path; a link or special file (which
        could point a loader elsewhere) raises DataError."""
        found: dict[str, os.stat_result] = {}
        for top, dirs, files in os.walk(self.root):
            for name in [*dirs, *files]:
                p = Path(top) / name
                st = p.lstat()
                rel = p.relative_to(self.root).as_posix()
                if stat.S_ISDIR(st.st_mode):
                    continue
                if not stat.S_ISREG(st.st_mode):
                    raise DataError(f"{p}: not a regular file (a link or special file) in a staged data set")
                if rel not in (MANIFEST, VERIFIED):
                    found[rel] = st
        return found

    def verified(self) -> bool:
        """Whether a marker vouches for this manifest and every file is as it was when the marker was written.
        Reads the marker and the files' metadata, never their bytes; raises DataError as :meth:`present` does."""
        try:
            doc = json.loads((self.root / VERIFIED).read_bytes())
        except (OSError, ValueError):
            return False
        if not isinstance(doc, dict) or doc.get("manifest_sha256") != self.digest:
            return False
        return doc.get("files_sha256") == fingerprint(self.present())

    def mark_verified(self, found: Mapping[str, os.stat_result]) -> bool:
        """Leave the marker for this manifest and the files' metadata ``found`` (taken before they were hashed):
        True if written, False where the volume is read-only to this process (a training pod's mount)."""
        blob = json.dumps({"format": FORMAT, "manifest_sha256": self.digest, "files_sha256": fingerprint(found),
                           "files": len(found)}, sort_keys=True).encode()
        tmp = self.root.parent / f".{self.root.name}{VERIFIED}.{os.urandom(6).hex()}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.root / VERIFIED)
        except OSError:  # read-only (EROFS), or not ours to write (EACCES): the next check hashes again
            tmp.unlink(missing_ok=True)
            return False
        return True

    def check(self, workers: int | None = None) -> tuple[int, int, bool]:
        """:meth:`verify`, unless a marker vouches for this manifest and the files are unchanged since it was
        written (then nothing of the data is read). Returns (files, bytes, whether the marker was trusted)."""
        if self.verified():
            return len(self.entries), sum(e.size for e in self.entries.values()), True
        return (*self.verify(workers), False)

    def verify(self, workers: int | None = None) -> tuple[int, int]:
        """Check every file: none missing, none added, each of the listed size and SHA-256 (hashed on up to
        ``workers`` threads: hashlib releases the GIL). Returns (files, bytes); raises DataError naming the
        first file (by path) that fails. When all pass and no file's metadata moved while they were hashed, leaves
        the marker (:meth:`mark_verified`) where the volume is writable."""
        found = self.present()
        if extra := sorted(set(found) - set(self.entries)):
            raise DataError(f"{self.root / extra[0]}: not listed in {self.root / MANIFEST} ({len(extra)} unlisted "
                            "file(s)): something wrote into the data set after it was staged")
        if missing := sorted(set(self.entries) - set(found)):
            raise DataError(f"{self.root / missing[0]}: missing ({len(missing)} listed file(s) missing)")
        for path in sorted(self.entries):
            self._match(path, self.entries[path], found[path].st_size, None)
        paths = sorted(self.entries)
        with ThreadPoolExecutor(max_workers=workers or min(8, os.cpu_count() or 1)) as pool:
            digests = list(pool.map(lambda p: sha256_file(self.root / p), paths))
        for path, sha in zip(paths, digests, strict=True):
            self._match(path, self.entries[path], self.entries[path].size, sha)
        if fingerprint(self.present()) == fingerprint(found):
            self.mark_verified(found)
        return len(paths), sum(e.size for e in self.entries.values())


def fingerprint(found: Mapping[str, os.stat_result]) -> str:
    """SHA-256 over every file's path, size, inode, mtime and ctime (sorted by path): what the marker vouches for."""
    h = hashlib.sha256()
    for path in sorted(found):
        st = found[path]
        h.update(json.dumps([path, st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns]).encode() + b"\n")
    return h.hexdigest()


def write_once(root: Path, blob: bytes) -> bool:
    """Create ``root/MANIFEST`` with ``blob`` unless it exists: True if this call created it. The file appears
    whole (a fsynced temporary file, hard-linked into place: ``link`` fails rather than replace); an existing
    manifest with other bytes raises DataError."""
    # Beside the directory, not in it: a stage killed before the unlink leaves no unlisted file in the data set.
    tmp = root.parent / f".{root.name}{MANIFEST}.{os.urandom(6).hex()}.tmp"
    with open(tmp, "wb") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, root / MANIFEST)
        created = True
    except FileExistsError:
        created = False
    finally:
        tmp.unlink()
    if not created and (have := (root / MANIFEST).read_bytes()) != blob:
        raise DataError(f"{root / MANIFEST}: already written with sha256 {hashlib.sha256(have).hexdigest()}, "
                        f"which differs from this stage's {hashlib.sha256(blob).hexdigest()}: the data set in "
                        f"{root} was staged from other content")
    return created


def check_environment(environ: Mapping[str, str] | None = None, *, log: Any = print) -> Manifest | None:
    """The launcher's check: with ``EKS_DDP_DATA_VERIFY`` set, verify ``EKS_DDP_DATA_DIR`` against its manifest
    (and pin) and return it; None when the Job asks for no check. Raises DataError."""
    env = os.environ if environ is None else environ
    value = env.get(VERIFY_ENV)
    if not value:
        return None
    pin = parse_verify(value)
    if not env.get(DATA_DIR_ENV):
        raise DataError(f"{DATA_DIR_ENV}: not set, but {VERIFY_ENV}={value} asks for the data set to be verified")
    manifest = Manifest.load(Path(env[DATA_DIR_ENV]), pin)
    start = time.monotonic()
    files, size, marked = manifest.check()
    how = (f"by its marker {manifest.root / VERIFIED} (checked in full once for this manifest; no file changed "
           "since, nothing re-read)" if marked else "in full (every file hashed)")
    log(f"data set {manifest.root} verified {how}: {files} files, {size / 1e6:.1f} MB, manifest sha256 "
        f"{manifest.digest}{' (pinned)' if pin else ''}, in {time.monotonic() - start:.1f} s")
    return manifest
