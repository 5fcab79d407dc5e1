"""The rendezvous store as the stack renders it, on this machine, and what it reports about its load.

:class:`RenderedEtcd` runs etcd with the flags ``components/eks_ddp/workloads/etcd.py`` (``etcd_args``) renders
into the store's pod: only what names the pod's paths, addresses and certificates is mapped to local ones (data dir,
listen/advertise URLs, the TLS files, the metrics URL, ``$(POD_UID)``); every other flag (quota, compaction,
snapshot count, log level, ...) is taken as rendered, and ``quota_div`` may scale the quota down (a soak that fills
in minutes what a run fills in hours). :func:`scrape` reads etcd's Prometheus ``/metrics`` (served over plain HTTP on
the metrics URL, as in the pod) into the counters the benches report. Used by bench/scale.py and bench/store_sim.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import ROOT  # noqa: F401  (puts the repository on sys.path)

from eks_ddp.workloads import etcd as rendered
from eks_ddp_local.etcd_server import EtcdEndpoint, find_etcd, free_port, healthy, make_tls
from eks_ddp_runtime.rendezvous.etcd_client import EtcdV3Client

MAPPED = {"--data-dir", "--listen-client-urls", "--advertise-client-urls", "--listen-peer-urls",
          "--initial-advertise-peer-urls", "--initial-cluster", "--listen-metrics-urls", "--trusted-ca-file",
          "--cert-file", "--key-file", "--initial-cluster-token", "--name"}
"""Flags that name the pod's own paths and addresses: replaced by this machine's; every other flag is kept."""


def rendered_flags() -> list[str]:
    """The store's flags exactly as the stack renders them for its pod."""
    import inspect

    params = inspect.signature(rendered.etcd_args).parameters
    kw: dict[str, Any] = {}
    if "service" in params:
        kw["service"] = "etcd-rdzv"
    if "namespace" in params:
        kw["namespace"] = "training"
    return list(rendered.etcd_args(**kw))


@dataclass
class RenderedEtcd:
    """One etcd with the rendered flags (TLS with client certificates required), on free local ports."""

    data_dir: Path
    quota_div: int = 1
    flags: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.tls = make_tls(self.data_dir / "tls", ["127.0.0.1"])
        self.client_port, self.peer, self.metrics = free_port(), free_port(), free_port()
        self.endpoint = EtcdEndpoint(f"127.0.0.1:{self.client_port}", self.tls)
        local = {
            "--name": "local",
            "--data-dir": str(self.data_dir / "data"),
            "--listen-client-urls": f"https://{self.endpoint}",
            "--advertise-client-urls": f"https://{self.endpoint}",
            "--listen-peer-urls": f"http://127.0.0.1:{self.peer}",
            "--initial-advertise-peer-urls": f"http://127.0.0.1:{self.peer}",
            "--initial-cluster": f"local=http://127.0.0.1:{self.peer}",
            "--listen-metrics-urls": f"http://127.0.0.1:{self.metrics}",
            "--trusted-ca-file": str(self.tls.ca_cert),
            "--cert-file": str(self.tls.server_cert),
            "--key-file": str(self.tls.server_key),
            "--initial-cluster-token": f"bench-{uuid.uuid4().hex[:8]}",
        }
        out = []
        for flag in rendered_flags():
            name, eq, value = flag.partition("=")
            if name in MAPPED:
                out.append(f"{name}={local.pop(name)}")
            elif name == "--quota-backend-bytes":
                out.append(f"{name}={int(value) // self.quota_div}")
            else:
                if "$(" in value:
                    raise ValueError(f"{flag}: a pod-only reference this bench does not map")
                out.append(flag)
        out += [f"{k}={v}" for k, v in local.items() if k in ("--listen-metrics-urls",)]
        self.flags = out

    @property
    def quota_bytes(self) -> int | None:
        return next((int(f.split("=", 1)[1]) for f in self.flags if f.startswith("--quota-backend-bytes=")), None)

    def start(self, timeout_s: float = 30.0) -> None:
        with open(self.data_dir / "etcd.log", "ab") as log:
            self.proc = subprocess.Popen([find_etcd(), *self.flags], stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            if healthy(self.endpoint, self.tls):
                return
            time.sleep(0.1)
        raise RuntimeError(f"etcd did not start: {(self.data_dir / 'etcd.log').read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def client(self) -> EtcdV3Client:
        return EtcdV3Client("127.0.0.1", self.client_port, read_timeout=5, context=self.tls.client_context())

    def alarms(self) -> list[str]:
        """etcd's raised alarms (``NOSPACE``, ``CORRUPT``); [] when none."""
        c = self.client()
        try:
            r = c.call("maintenance/alarm", {"action": "GET"})
        finally:
            c.close()
        return [str(a.get("alarm", "NOSPACE")) for a in r.get("alarms", []) or []]

    def wal_bytes_on_disk(self) -> int:
        wal = self.data_dir / "data" / "member" / "wal"
        return sum(p.stat().st_size for p in wal.glob("*")) if wal.exists() else 0

    def scrape(self) -> dict[str, float]:
        return scrape(f"http://127.0.0.1:{self.metrics}/metrics")


WANTED = {
    "proposals_applied": "etcd_server_proposals_applied_total",
    "grpc_handled": "grpc_server_handled_total",
    "mvcc_put": "etcd_mvcc_put_total",
    "mvcc_txn": "etcd_mvcc_txn_total",
    "mvcc_range": "etcd_mvcc_range_total",
    "mvcc_delete": "etcd_mvcc_delete_total",
    "wal_write_bytes": "etcd_disk_wal_write_bytes_total",
    "wal_fsyncs": "etcd_disk_wal_fsync_duration_seconds_count",
    "db_size": "etcd_mvcc_db_total_size_in_bytes",
    "db_in_use": "etcd_mvcc_db_total_size_in_use_in_bytes",
    "keys": "etcd_debugging_mvcc_keys_total",
    "revision": "etcd_debugging_mvcc_current_revision",
    "compact_revision": "etcd_debugging_mvcc_compact_revision",
    "received_bytes": "etcd_network_client_grpc_received_bytes_total",
    "sent_bytes": "etcd_network_client_grpc_sent_bytes_total",
    "cpu_seconds": "process_cpu_seconds_total",
    "rss_bytes": "process_resident_memory_bytes",
    "lease_expired": "etcd_debugging_server_lease_expired_total",
}
"""What the benches read from /metrics (label sets summed)."""


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    names = {v: k for k, v in WANTED.items()}
    out = dict.fromkeys(WANTED, 0.0)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        metric, _, value = line.rpartition(" ")
        name = metric.split("{", 1)[0]
        if name in names:
            with contextlib.suppress(ValueError):
                out[names[name]] += float(value)
    return out


def rates(a: dict[str, float], b: dict[str, float], seconds: float) -> dict[str, float]:
    """Per-second rates of the counters between two scrapes; gauges (sizes) as their value at ``b`` and change."""
    gauges = {"db_size", "db_in_use", "keys", "revision", "compact_revision", "rss_bytes"}
    out: dict[str, float] = {}
    for k in WANTED:
        if k in gauges:
            out[k] = b[k]
            out[f"{k}_growth_per_s"] = (b[k] - a[k]) / seconds
        else:
            out[f"{k}_per_s"] = (b[k] - a[k]) / seconds
    return out
