"""Integrity of the data set files a job reads from the shared volume: content hashes, pins and a safe unpickler.

The shared volume is writable by every pod of the namespace that mounts it, and it outlives the
cluster, so a loader must not trust what it finds there. Before anything is unpickled:

1. **Manifest.** The data stage (``eks_ddp_trainer.prepare_data``, or the local generators) writes
   ``SHA256SUMS`` next to the batches (``sha256sum -c`` format): the SHA-256 of every file it wrote.
   Every file the loader reads must be listed there and match.
2. **Pin.** Whoever can write the batches can rewrite the manifest too, so the manifest alone only
   catches corruption. The pin comes from outside the volume, in ``EKS_DDP_DATA_PIN`` (the training
   and evaluation Jobs set it; ``components/eks_ddp/workloads/elastic_job/__init__.py``):

   * ``cifar-10``: every file must also match the official CIFAR-10 digests compiled into the image
     (``CIFAR10_MD5``, the table torchvision checks downloads with). A planted file would need an md5
     *second preimage* of a fixed, published file, which no known attack comes close to (collision
     attacks need to craft both files); the SHA-256 manifest adds the modern hash on top.
   * ``sha256:<64 hex>``: the manifest itself must hash to this value (a user's own data set: pin the
     manifest its data stage wrote, ``sha256sum SHA256SUMS``).
   * unset (a local run on the user's own disk): the manifest is checked when present.
3. **Restricted unpickler.** Whatever the checks above decide, the batches are read with an unpickler
   that resolves only the few numpy globals an array needs (``SAFE_GLOBALS``): a pickle that names any
   other callable (``os.system``, ``builtins.eval``, ...) is refused before it runs. It is not enough
   alone (a crafted array is still bad training data), hence the hashes.

Any failure raises :class:`DataError` naming the file; the trainer and ``eks_ddp_trainer.evaluate`` exit with
``exitcodes.BAD_INPUT`` (5), which fails the Job at once.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from eks_ddp_runtime.contract import CIFAR10_PIN
from eks_ddp_runtime.contract import DATA_PIN_ENV as PIN_ENV

MANIFEST = "SHA256SUMS"
"""The data stage's manifest, inside the batches directory: ``<sha256>  <name>`` per line."""
_SHA256_PIN = re.compile(r"^sha256:([0-9a-f]{64})$")
_LINE = re.compile(r"^([0-9a-f]{64}) [ *]([A-Za-z0-9._-]+)$")

CIFAR10_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
    "batches.meta": "5ff9c542aee3614f3951f8cda6e48888",
}
"""md5 of each file of the official python archive (torchvision's ``CIFAR10`` table; a test keeps them equal)."""

SAFE_GLOBALS = frozenset({
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy._core.multiarray", "_reconstruct"),  # protocols 2-4 (numpy 2)
    ("numpy.core.multiarray", "_reconstruct"),   # the official batches (numpy 1, Python 2)
    ("numpy._core.numeric", "_frombuffer"),      # protocol 5
    ("numpy.core.numeric", "_frombuffer"),
    ("_codecs", "encode"),                       # bytes pickled by Python 3 at protocol 2
})
"""The only globals a data set pickle may name: they build arrays, dtypes and bytes, and call nothing else."""


class DataError(ValueError):
    """A data set file is unreadable or fails its integrity check; the message names it."""


def _digest(path: Path, algorithm: str) -> str:
    h = hashlib.new(algorithm, usedforsecurity=algorithm != "md5")
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sha256(path: Path) -> str:
    return _digest(path, "sha256")


def md5(path: Path) -> str:
    return _digest(path, "md5")


def manifest_text(root: Path, names: Iterable[str]) -> str:
    """``sha256sum`` lines for ``names`` under ``root``, sorted by name."""
    return "".join(f"{sha256(root / n)}  {n}\n" for n in sorted(names))


def write_manifest(root: Path, names: Iterable[str]) -> str:
    """Write ``root/SHA256SUMS`` for ``names`` (atomically); returns the manifest's own SHA-256 (its pin)."""
    text = manifest_text(root, names).encode()
    tmp = root / f".{MANIFEST}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / MANIFEST)
    return hashlib.sha256(text).hexdigest()


def read_manifest(path: Path) -> dict[str, str]:
    return _parse_manifest(path, path.read_bytes())


def _parse_manifest(path: Path, text: bytes) -> dict[str, str]:
    entries = {}
    for i, line in enumerate(text.decode("ascii", errors="replace").splitlines(), 1):
        m = _LINE.match(line)
        if not m:
            raise DataError(f"{path}:{i}: not a '<sha256>  <file>' line: {line[:80]!r}")
        entries[m.group(2)] = m.group(1)
    return entries


def pin_from_env(environ: dict[str, str] | None = None) -> str | None:
    pin = (os.environ if environ is None else environ).get(PIN_ENV) or None
    if pin is not None and pin != CIFAR10_PIN and not _SHA256_PIN.match(pin):
        raise DataError(f"{PIN_ENV}: got {pin!r}; expected {CIFAR10_PIN!r} or 'sha256:<64 lowercase hex digits "
                        f"of {MANIFEST}>' (or unset for an unpinned local data set)")
    return pin


class Checker:
    """The checks for one data directory under one pin: the manifest is read (and checked against the pin) once;
    :meth:`read` returns a file's bytes only after they passed, so what is checked is what gets unpickled
    (no second read a writer could swap the file under)."""

    def __init__(self, root: Path, pin: str | None) -> None:
        self.root, self.pin = root, pin
        manifest = root / MANIFEST
        self.listed: dict[str, str] | None = None
        if not manifest.is_file():
            if pin is not None:
                raise DataError(f"{manifest}: missing, and the data set is pinned ({PIN_ENV}={pin}); "
                                "re-run python -m eks_ddp_trainer.prepare_data to write it")
            return  # an unpinned local set written before manifests existed: the safe unpickler still applies
        text = manifest.read_bytes()
        if pin is not None and pin != CIFAR10_PIN:
            want, got = pin.removeprefix("sha256:"), hashlib.sha256(text).hexdigest()
            if got != want:
                raise DataError(f"{manifest}: sha256 {got} differs from the pinned {want} ({PIN_ENV}): "
                                "the data set was changed after it was pinned")
        self.listed = _parse_manifest(manifest, text)

    def read(self, name: str) -> bytes:
        path = self.root / name
        blob = path.read_bytes()
        if self.listed is None:
            return blob
        if name not in self.listed:
            raise DataError(f"{path}: not listed in {self.root / MANIFEST}")
        got = hashlib.sha256(blob).hexdigest()
        if got != self.listed[name]:
            raise DataError(f"{path}: sha256 {got} differs from {self.listed[name]} in {self.root / MANIFEST}: "
                            "the file was changed after the data stage wrote it")
        if self.pin == CIFAR10_PIN:
            want = CIFAR10_MD5.get(name)
            if want is None:
                raise DataError(f"{path}: not a file of the official CIFAR-10 set ({PIN_ENV}={self.pin})")
            got = hashlib.md5(blob, usedforsecurity=False).hexdigest()
            if got != want:
                raise DataError(f"{path}: md5 {got} differs from the official CIFAR-10 file's {want}")
        return blob


def verify(root: Path, names: Iterable[str], pin: str | None) -> None:
    """Check every file in ``names`` under ``root`` against the manifest and the pin; raise DataError naming
    the first file that fails. Reads the files' bytes only: nothing is unpickled here."""
    checker = Checker(root, pin)
    for name in names:
        checker.read(name)


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in SAFE_GLOBALS:
            raise pickle.UnpicklingError(f"refused global {module}.{name}: a data set pickle may name only "
                                         "numpy array globals")
        return super().find_class(module, name)


def safe_loads(blob: bytes) -> Any:
    """Unpickle ``blob`` with the restricted unpickler (``encoding='bytes'``, as the official batches need)."""
    return _SafeUnpickler(io.BytesIO(blob), encoding="bytes").load()


def safe_load(path: Path) -> Any:
    return safe_loads(path.read_bytes())
