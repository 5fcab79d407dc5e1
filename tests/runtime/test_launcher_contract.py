"""The launcher's contract at its edges: store-client settings, one store call's length, torch's graceful exit.

* A store-client setting no retry can fix (``read_timeout`` <= 0, a protocol other than http/https, certificate
  paths missing or unreadable, files that do not load) is a usage error at start: the agent exits 2 (the pod
  failure policy fails the Job) instead of retrying an outage for ``store_retry_timeout`` (600 s) per pod.
* One store call sends one request: python-etcd's urllib3 ``PoolManager`` retried a timed-out request 3 more times
  (urllib3's default ``Retry(total=3)``), so one "impatient" call could take 4 x ``read_timeout``; the v3 client
  (eks_ddp_runtime/rendezvous/etcd_client.py) sends one and waits ``read_timeout`` at most.
* torch's ``agent.run()`` returns None when the rendezvous closes while the agent waits in its redundancy list
  (``RendezvousGracefulExitError``, agent/server/api.py ``run``): the run finished without it, exit 0.
"""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from eks_ddp_local.etcd_server import start_etcd
from eks_ddp_runtime.launch_command import CLUSTER_TIMEOUTS, AgentOptions, RdzvTls, script_command
from eks_ddp_runtime.rendezvous import handler as rendezvous
from tests.support.etcd_server import ROOT, client_tls, trainer_env

SCRIPTS = ROOT / "tests" / "fixtures" / "corpus" / "scripts"


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    with start_etcd(tmp_path_factory.mktemp("etcd")) as endpoint:
        yield endpoint


def _params(endpoint: str = "127.0.0.1:2379", **conf):
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    return RendezvousParameters(backend=rendezvous.BACKEND, endpoint=endpoint, run_id="contract", min_nodes=1,
                                max_nodes=1, local_addr="127.0.0.1", **conf)


def _tls_conf(tls: RdzvTls) -> dict[str, str]:
    return {"protocol": "https", "ca_cert": tls.ca_cert, "ssl_cert": tls.cert, "ssl_cert_key": tls.key}


@pytest.mark.parametrize("conf,says", [
    ({"read_timeout": "0"}, "rdzv-conf read_timeout: got '0'; expected seconds > 0"),
    ({"read_timeout": "-10"}, "rdzv-conf read_timeout: got '-10'; expected seconds > 0"),
    ({"read_timeout": "soon"}, "rdzv-conf read_timeout: got 'soon'; expected seconds > 0"),
    ({"protocol": "ftp"}, "rdzv-conf protocol: got 'ftp'; expected 'https'"),
    ({"protocol": "https"}, "rdzv-conf ca_cert, ssl_cert, ssl_cert_key: missing"),
])
def test_bad_store_client_settings_are_refused_when_the_handler_is_built(conf, says, etcd):
    tls = {} if conf.get("protocol") == "https" else _tls_conf(client_tls(etcd))
    with pytest.raises(ValueError) as err:
        rendezvous._create(_params(**{**tls, **conf}))
    assert says in str(err.value)


def test_certificate_files_are_checked_when_the_handler_is_built(etcd, tmp_path):
    good = client_tls(etcd)
    missing = {**_tls_conf(good), "ssl_cert_key": str(tmp_path / "absent.key")}
    with pytest.raises(ValueError, match="rdzv-conf ssl_cert_key: got .*absent.key'; expected a readable file"):
        rendezvous._create(_params(**missing))
    garbage = tmp_path / "garbage.crt"
    garbage.write_text("not a certificate\n")
    with pytest.raises(ValueError, match="which do not load"):
        rendezvous._create(_params(**{**_tls_conf(good), "ssl_cert": str(garbage)}))
    # Negative control: the store's own files build a handler (nothing is contacted).
    rendezvous._create(_params(etcd, **_tls_conf(good), read_timeout="2.5"))


def _agent_command(etcd: str, tls: RdzvTls, script: str, *args: str, max_nodes: int = 1,
                   rdzv_id: str | None = None) -> list[str]:
    agent = AgentOptions(min_nodes=1, max_nodes=max_nodes, nproc_per_node=1, rdzv_backend="etcd",
                         rdzv_endpoint=etcd, rdzv_id=rdzv_id or f"contract-{time.time_ns()}", local_addr="127.0.0.1",
                         timeouts=CLUSTER_TIMEOUTS, tls=tls)
    return script_command(agent, script, list(args), python=sys.executable)


@pytest.mark.slow
def test_an_agent_with_an_unreadable_certificate_exits_2_at_once(etcd, tmp_path):
    """A real agent process with the Job's flags and a certificate path that is not there (an unmounted Secret)."""
    good = client_tls(etcd)
    tls = RdzvTls(ca_cert=good.ca_cert, cert=str(tmp_path / "absent.crt"), key=good.key)
    proc = subprocess.run(_agent_command(etcd, tls, str(SCRIPTS / "exit_with.py"), "0"), cwd=ROOT,
                          env=trainer_env(), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "rdzv-conf ssl_cert: got" in proc.stderr and "[user]" not in proc.stdout


class _SilentServer:
    """Accepts TCP connections and never answers: a hung store. Counts the connections."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.accepted: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted.append(conn)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for c in self.accepted:
            c.close()
        self.sock.close()


def test_one_store_call_sends_one_request():
    """A read that times out is not re-sent underneath the Retrier (which decides about retries), and takes
    ``read_timeout``, not a multiple of it."""
    from eks_ddp_runtime.rendezvous.etcd_backend import make_client
    from eks_ddp_runtime.rendezvous.etcd_client import EtcdConnectionError

    server = _SilentServer()
    try:
        client = make_client(_params(server.endpoint, protocol="http", read_timeout="1"))
        t0 = time.monotonic()
        with pytest.raises(EtcdConnectionError):
            client.get(b"/eks-ddp/x")
        took = time.monotonic() - t0
        time.sleep(0.3)  # a connection being accepted right now is counted
        assert len(server.accepted) == 1, f"{len(server.accepted)} requests for one call"
        assert took < 4, f"one call took {took:.1f} s with read_timeout=1"
    finally:
        server.close()


def _state(etcd: str, tls: RdzvTls, run_id: str):
    """The rendezvous state as every agent reads it: the core merged with the agents' claims (rendezvous/claims.py)."""
    import pickle

    from torch.distributed.elastic.rendezvous import RendezvousParameters

    from eks_ddp_runtime.rendezvous.etcd_backend import EtcdV3Backend, Retrier

    params = RendezvousParameters(backend=rendezvous.BACKEND, endpoint=etcd, run_id=run_id, min_nodes=1, max_nodes=1,
                                  protocol="https", ca_cert=str(tls.ca_cert), ssl_cert=str(tls.cert),
                                  ssl_cert_key=str(tls.key), read_timeout="5")
    retry = Retrier(params, 10.0)
    try:
        got = EtcdV3Backend(retry, run_id, rendezvous.BACKEND).get_state()
    finally:
        retry.client().close()
    return None if got is None else pickle.loads(got[0])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_spare_agent_exits_0_when_the_run_finishes_without_it(etcd, tmp_path):
    """More agents than ``max_nodes``: the spare waits in the redundancy list; when the run finishes the
    rendezvous closes, torch's ``run()`` returns None, and the spare must exit 0 (it crashed with exit 1)."""
    tls = client_tls(etcd)
    run_id = f"spare-{os.getpid()}-{time.time_ns()}"
    cmd = _agent_command(etcd, tls, str(SCRIPTS / "wait_for.py"), str(tmp_path), rdzv_id=run_id)
    env = trainer_env()
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    procs: list[subprocess.Popen] = []
    try:
        with open(logs[0], "wb") as out:
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
        deadline = time.monotonic() + 120
        while not (tmp_path / "started").exists() and time.monotonic() < deadline and procs[0].poll() is None:
            time.sleep(0.1)
        assert (tmp_path / "started").exists(), logs[0].read_text()[-3000:]
        with open(logs[1], "wb") as out:
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and procs[1].poll() is None:
            state = _state(etcd, tls, run_id)
            if state is not None and state.redundancy_list:
                break
            time.sleep(0.2)
        state = _state(etcd, tls, run_id)
        assert state is not None and len(state.redundancy_list) == 1, logs[1].read_text()[-3000:]
        (tmp_path / "finish").touch()
        codes = [p.wait(timeout=90) for p in procs]
        text = "\n".join(f"----- {p.name}\n{p.read_text()[-2500:]}" for p in logs)
        assert codes == [0, 0], text
        assert "closed while this agent waited as a spare" in logs[1].read_text(), text
    finally:
        (tmp_path / "finish").touch()
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait(10)


def test_the_fixture_scripts_exist():
    assert all((SCRIPTS / n).is_file() for n in ("exit_with.py", "wait_for.py")), list(Path(SCRIPTS).iterdir())


def _expired_client_cert(good: RdzvTls, out: Path) -> str:
    """A client certificate signed by the store's own CA (so only its dates are wrong), expired a day ago."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    ca_key = serialization.load_pem_private_key(Path(good.ca_cert).with_suffix(".key").read_bytes(), None) \
        if Path(good.ca_cert).with_suffix(".key").exists() else None
    key = serialization.load_pem_private_key(Path(good.key).read_bytes(), None)
    ca = x509.load_pem_x509_certificate(Path(good.ca_cert).read_bytes())
    now = dt.datetime.now(dt.timezone.utc)  # noqa: UP017
    cert = (x509.CertificateBuilder().subject_name(x509.Name.from_rfc4514_string("CN=agent"))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=30)).not_valid_after(now - dt.timedelta(days=1))
            .sign(ca_key or key, hashes.SHA256()))
    path = out / "expired.crt"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(path)


@pytest.mark.slow
def test_an_agent_with_an_expired_certificate_exits_2_at_once_naming_it(etcd, tmp_path):
    """A real agent process with the Job's flags and a client certificate that expired yesterday: exit 2 at start,
    one line naming the file and its expiry, instead of 600 s of retries."""
    good = client_tls(etcd)
    expired = _expired_client_cert(good, tmp_path)
    tls = RdzvTls(ca_cert=good.ca_cert, cert=expired, key=good.key)
    started = time.monotonic()
    proc = subprocess.run(_agent_command(etcd, tls, str(SCRIPTS / "exit_with.py"), "0"), cwd=ROOT,
                          env=trainer_env(), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"rdzv-conf ssl_cert: got {expired!r}, a certificate that expired" in proc.stderr, proc.stderr[-3000:]
    assert "[user]" not in proc.stdout and time.monotonic() - started < 100
    # Negative control: the store's own certificate passes the check.
    from eks_ddp_runtime.rendezvous.cert_check import certificate_problem

    assert certificate_problem("ssl_cert", good.cert) is None


def test_a_certificate_about_to_expire_is_named_once_not_at_every_reconnect(etcd, caplog):
    """The check runs whenever the store's client is set up again; with a certificate near its end every agent
    logged the warning every 5 s. Once per certificate now; a second certificate is named too (the control)."""

    from eks_ddp_runtime.rendezvous import cert_check

    good = client_tls(etcd)
    not_after = ssl.cert_time_to_seconds(ssl._ssl._test_decode_cert(good.cert)["notAfter"])  # type: ignore[attr-defined]
    with caplog.at_level("WARNING", logger=cert_check.__name__):
        for _ in range(3):
            assert cert_check.certificate_problem("ssl_cert", good.cert, now=not_after - 3600) is None
        assert cert_check.certificate_problem("ca_cert", good.ca_cert, now=not_after - 3600) is None
    said = [r.getMessage() for r in caplog.records if "expires" in r.getMessage()]
    assert len(said) == 2 and "ssl_cert" in said[0] and "ca_cert" in said[1], said


def test_a_node_clock_3_s_off_is_refused_and_an_exact_one_is_not(etcd):
    """R3: the clock check against the real store's Date header; a 3 s skew either way is named and refused."""
    from eks_ddp_runtime.clock_check import ClockSkewError, check_clock
    from eks_ddp_runtime.rendezvous.etcd_backend import client_settings

    s = client_settings(_params(etcd, **_tls_conf(client_tls(etcd))))
    kw = {"context": s["context"], "timeout_s": 5.0, "limit_s": 1.0}
    for shift, says in ((-3.0, "behind"), (3.0, "ahead of")):
        with pytest.raises(ClockSkewError, match=f"node clock: got .* s or more {says} the rendezvous store's"):
            check_clock(s["host"], s["port"], clock=lambda shift=shift: time.time() + shift, **kw)
    check_clock(s["host"], s["port"], **kw)  # negative control: this machine's own clock passes
