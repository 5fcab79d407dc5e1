"""RendezvousTls: the certificates that make the rendezvous store answer only the job's own pods.

Whoever can write the rendezvous state steers every agent of the job (the agents no
longer unpickle it: eks_ddp_runtime/rendezvous/state.py reads it as checked JSON). A NetworkPolicy does not
hold against host-network processes on etcd's node or the first seconds after a reschedule; a client
certificate does. The stack makes a CA of its own (pulumi-tls, so keys are created by the provider and
kept in the stack's state as secrets, never in the program's output) and signs:

* a server certificate for the client Service's DNS names, mounted into etcd (``--cert-file``,
  ``--key-file``, ``--trusted-ca-file``, ``--client-cert-auth=true``). It allows client authentication too: etcd's
  v3 JSON gateway, which the agents speak, dials etcd's own gRPC port with the server certificate as its client
  certificate (etcd server/embed/serve.go ``serveCtx.serve``: ``dtls := tlscfg.Clone()``; etcd-io/etcd#16590), and
  with ``--client-cert-auth`` etcd refuses it otherwise ("tls: bad certificate", HTTP 503 on every ``/v3/`` call);
* one client certificate (``CN=eks-ddp-trainer``), mounted read-only into the training and fabric-check
  pods at ``eks_ddp_runtime.launch_command.RDZV_TLS_DIR``.

Both are Kubernetes Secrets of type ``kubernetes.io/tls`` with ``ca.crt``. The CA's private key never
enters the cluster.

**Rotation, staggered.** Nothing expires together, and a ``pulumi up`` rotates what is due:

* the leaf keys are re-made on a schedule (``replacement_trigger`` = the current period: the server's every
  quarter, the client's every two months), and with a new key comes a new certificate;
* the leaf certificates last ``validity_hours`` (server, default 90 days) and two thirds of that (client), and are
  renewed on any ``pulumi up`` in their last third (``early_renewal_hours``): a stack deployed at least once a month
  never runs on an expiring certificate;
* the CA lasts three years and is renewed (re-keyed, with every leaf) on an ``up`` in its last year.

etcd reads its certificates at start, so the etcd pod template carries a checksum of the server certificate and
CA (components/eks_ddp/workloads/etcd.py): a rotation restarts the store, which the agents ride out as a wipe. The agents'
client Secret is refreshed in place by the kubelet; the runtime loads the files for each new connection.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s
import pulumi_tls as tls

VALIDITY_HOURS = 90 * 24
"""The server certificate's lifetime (the client's is two thirds of it); renewed in its last third."""
CA_VALIDITY_HOURS = 3 * 365 * 24
"""The CA's lifetime; renewed (re-keyed, and every leaf with it) on an ``up`` in its last year."""
CA_EARLY_RENEWAL_HOURS = 365 * 24


def rotation_period(months: int, today: dt.date | None = None) -> str:
    """The current re-keying period of ``months`` months (``2026-p6`` for July-September 2026 with 3): a key's
    ``replacement_trigger``, so the first ``pulumi up`` of each period makes a new key."""
    today = today or dt.date.today()
    return f"{today.year}-p{(today.month - 1) // months * months + 1}"
KEY_ALGORITHM = "ECDSA"
KEY_CURVE = "P256"
CLIENT_COMMON_NAME = "eks-ddp-trainer"


@dataclass(frozen=True, kw_only=True)
class RendezvousTlsArgs:
    """Inputs of :class:`RendezvousTls`."""

    namespace: pulumi.Input[str]
    """Namespace of the Secrets (etcd's and the training pods')."""
    server_names: Sequence[pulumi.Input[str]]
    """DNS names the server certificate is valid for (the client Service's names)."""
    labels: dict[str, str]
    """Labels of both Secrets."""
    validity_hours: int = VALIDITY_HOURS
    """Lifetime of the server certificate; the client's is two thirds of it (their expiries never coincide)."""

    def __post_init__(self) -> None:
        if not self.server_names:
            raise ValueError("server_names: got []; expected the etcd client Service's DNS names")
        if not 24 * 7 <= self.validity_hours <= 397 * 24:
            raise ValueError(f"validity_hours: got {self.validity_hours}; expected 168 to 9528 (one week to 397 days, "
                             "the CA/Browser Forum's ceiling for a leaf certificate)")


class RendezvousTls(pulumi.ComponentResource):
    """A CA, etcd's server certificate and the trainers' client certificate, as two TLS Secrets."""

    server_secret: pulumi.Output[str]
    """Name of the Secret etcd mounts (tls.crt, tls.key, ca.crt)."""
    client_secret: pulumi.Output[str]
    """Name of the Secret the training pods mount read-only (tls.crt, tls.key, ca.crt)."""
    server_fingerprint: pulumi.Output[str]

    def __init__(self, name: str, args: RendezvousTlsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("eks-ddp:etcd_tls:RendezvousTls", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        ca_key = self._key(f"{name}-ca-key", child)
        ca = tls.SelfSignedCert(
            f"{name}-ca", private_key_pem=ca_key.private_key_pem, is_ca_certificate=True,
            subject=tls.SelfSignedCertSubjectArgs(common_name=f"eks-ddp rendezvous CA ({name})"),
            allowed_uses=["cert_signing", "crl_signing", "digital_signature"],
            validity_period_hours=CA_VALIDITY_HOURS, early_renewal_hours=CA_EARLY_RENEWAL_HOURS, opts=child)
        # The server certificate also allows client_auth: etcd's v3 JSON gateway dials etcd's own gRPC port with it.
        server_key, server = self._leaf(f"{name}-server", ca_key, ca, child, dns_names=list(args.server_names),
                                        common_name="eks-ddp rendezvous etcd", uses=["server_auth", "client_auth"],
                                        hours=args.validity_hours, rekey_months=3)
        client_key, client = self._leaf(f"{name}-client", ca_key, ca, child, dns_names=None,
                                        common_name=CLIENT_COMMON_NAME, uses=["client_auth"],
                                        hours=args.validity_hours * 2 // 3, rekey_months=2)
        self.server_fingerprint = pulumi.Output.all(server.cert_pem, ca.cert_pem).apply(
            lambda pems: hashlib.sha256("".join(pems).encode()).hexdigest())
        """sha256 of the server certificate and the CA: changes with every rotation (etcd's pod template carries it)."""
        self.expiries = {f"{name}-ca": (ca.validity_end_time, CA_EARLY_RENEWAL_HOURS),
                         f"{name}-server": (server.validity_end_time, args.validity_hours // 3),
                         f"{name}-client": (client.validity_end_time, args.validity_hours * 2 // 3 // 3)}
        """Each certificate's end (pulumi-tls ``validity_end_time``) and its ``early_renewal_hours``: preflight warns
        near the end (eks_ddp.tooling.preflight.certificates)."""
        self.server_secret = self._secret(f"{name}-server", f"{name}-server-tls", server, server_key, ca, args, child)
        self.client_secret = self._secret(f"{name}-client", f"{name}-client-tls", client, client_key, ca, args, child)
        self.register_outputs({"server_secret": self.server_secret, "client_secret": self.client_secret})

    @staticmethod
    def _key(name: str, child: pulumi.ResourceOptions, rekey_months: int | None = None) -> tls.PrivateKey:
        opts = child if rekey_months is None else pulumi.ResourceOptions.merge(
            child, pulumi.ResourceOptions(replacement_trigger=rotation_period(rekey_months)))
        return tls.PrivateKey(name, algorithm=KEY_ALGORITHM, ecdsa_curve=KEY_CURVE, opts=opts)

    def _leaf(self, name: str, ca_key: tls.PrivateKey, ca: tls.SelfSignedCert, child: pulumi.ResourceOptions, *,
              dns_names: list[pulumi.Input[str]] | None, common_name: str, uses: list[str], hours: int,
              rekey_months: int) -> tuple[tls.PrivateKey, tls.LocallySignedCert]:
        key = self._key(f"{name}-key", child, rekey_months)
        csr = tls.CertRequest(f"{name}-csr", private_key_pem=key.private_key_pem, dns_names=dns_names,
                              subject=tls.CertRequestSubjectArgs(common_name=common_name), opts=child)
        cert = tls.LocallySignedCert(
            f"{name}-cert", cert_request_pem=csr.cert_request_pem, ca_private_key_pem=ca_key.private_key_pem,
            ca_cert_pem=ca.cert_pem, allowed_uses=["digital_signature", "key_encipherment", *uses],
            validity_period_hours=hours, early_renewal_hours=hours // 3, opts=child)
        return key, cert

    @staticmethod
    def _secret(name: str, secret_name: str, cert: tls.LocallySignedCert, key: tls.PrivateKey,
                ca: tls.SelfSignedCert, args: RendezvousTlsArgs, child: pulumi.ResourceOptions) -> pulumi.Output[str]:
        secret = k8s.core.v1.Secret(
            name, metadata=k8s.meta.v1.ObjectMetaArgs(name=secret_name, namespace=args.namespace, labels=args.labels),
            type="kubernetes.io/tls", immutable=False,
            # pulumi-tls marks private_key_pem secret, and pulumi-kubernetes a Secret's stringData.
            string_data={"tls.crt": cert.cert_pem, "tls.key": key.private_key_pem_pkcs8, "ca.crt": ca.cert_pem},
            opts=child)
        return secret.metadata.name
