"""RendezvousTls: the certificates that make the rendezvous store answer only the job's own pods.

Whoever can write the rendezvous state steers every agent of the job (review 2026-11-24, S1; the agents no
longer unpickle it: eks_ddp_runtime/rdzv_state.py reads it as checked JSON). A NetworkPolicy does not
hold against host-network processes on etcd's node or the first seconds after a reschedule; a client
certificate does. The stack makes a CA of its own (pulumi-tls, so keys are created by the provider and
kept in the stack's state as secrets, never in the program's output) and signs:

* a server certificate for the client Service's DNS names, mounted into etcd (``--cert-file``,
  ``--key-file``, ``--trusted-ca-file``, ``--client-cert-auth=true``). It allows client authentication too: etcd's
  v3 JSON gateway, which the agents speak, dials etcd's own gRPC port with the server certificate as its client
  certificate (etcd server/embed/serve.go ``serveCtx.serve``: ``dtls := tlscfg.Clone()``; etcd-io/etcd#16590), and
  with ``--client-cert-auth`` etcd refuses it otherwise ("tls: bad certificate", HTTP 503 on every ``/v3/`` call);
* one client certificate (``CN=eks-ddp-trainer``), mounted read-only into the training and fabric-check
  pods at ``components.torchrun.RDZV_TLS_DIR``.

Both are Kubernetes Secrets of type ``kubernetes.io/tls`` with ``ca.crt``. The CA's private key never
enters the cluster. Replacing the component (or ``pulumi up --replace`` of its CA) rotates everything;
validity is ``validity_hours`` (default 2 years), renewed ``early_renewal_hours`` before expiry on the
next ``pulumi up``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s
import pulumi_tls as tls

VALIDITY_HOURS = 2 * 365 * 24
"""Certificates last two years; a ``pulumi up`` within ``EARLY_RENEWAL_HOURS`` of the end renews them."""
EARLY_RENEWAL_HOURS = 30 * 24
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
    """Lifetime of the CA and both certificates."""

    def __post_init__(self) -> None:
        if not self.server_names:
            raise ValueError("server_names: got []; expected the etcd client Service's DNS names")
        if self.validity_hours < 24 * 7:
            raise ValueError(f"validity_hours: got {self.validity_hours}; expected at least 168 (one week)")


class RendezvousTls(pulumi.ComponentResource):
    """A CA, etcd's server certificate and the trainers' client certificate, as two TLS Secrets."""

    server_secret: pulumi.Output[str]
    """Name of the Secret etcd mounts (tls.crt, tls.key, ca.crt)."""
    client_secret: pulumi.Output[str]
    """Name of the Secret the training pods mount read-only (tls.crt, tls.key, ca.crt)."""

    def __init__(self, name: str, args: RendezvousTlsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("eks-ddp:etcd_tls:RendezvousTls", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        life = dict(validity_period_hours=args.validity_hours, early_renewal_hours=EARLY_RENEWAL_HOURS)
        ca_key = self._key(f"{name}-ca-key", child)
        ca = tls.SelfSignedCert(
            f"{name}-ca", private_key_pem=ca_key.private_key_pem, is_ca_certificate=True,
            subject=tls.SelfSignedCertSubjectArgs(common_name=f"eks-ddp rendezvous CA ({name})"),
            allowed_uses=["cert_signing", "crl_signing", "digital_signature"], **life, opts=child)
        server_key, server = self._leaf(f"{name}-server", ca_key, ca, args, child, dns_names=list(args.server_names),
                                        common_name="eks-ddp rendezvous etcd", uses=["server_auth", "client_auth"])
        client_key, client = self._leaf(f"{name}-client", ca_key, ca, args, child, dns_names=None,
                                        common_name=CLIENT_COMMON_NAME, uses=["client_auth"])
        self.server_secret = self._secret(f"{name}-server", f"{name}-server-tls", server, server_key, ca, args, child)
        self.client_secret = self._secret(f"{name}-client", f"{name}-client-tls", client, client_key, ca, args, child)
        self.register_outputs({"server_secret": self.server_secret, "client_secret": self.client_secret})

    @staticmethod
    def _key(name: str, child: pulumi.ResourceOptions) -> tls.PrivateKey:
        return tls.PrivateKey(name, algorithm=KEY_ALGORITHM, ecdsa_curve=KEY_CURVE, opts=child)

    def _leaf(self, name: str, ca_key: tls.PrivateKey, ca: tls.SelfSignedCert, args: RendezvousTlsArgs,
              child: pulumi.ResourceOptions, *, dns_names: list[pulumi.Input[str]] | None, common_name: str,
              uses: list[str]) -> tuple[tls.PrivateKey, tls.LocallySignedCert]:
        key = self._key(f"{name}-key", child)
        csr = tls.CertRequest(f"{name}-csr", private_key_pem=key.private_key_pem, dns_names=dns_names,
                              subject=tls.CertRequestSubjectArgs(common_name=common_name), opts=child)
        cert = tls.LocallySignedCert(
            f"{name}-cert", cert_request_pem=csr.cert_request_pem, ca_private_key_pem=ca_key.private_key_pem,
            ca_cert_pem=ca.cert_pem, allowed_uses=["digital_signature", "key_encipherment", *uses],
            validity_period_hours=args.validity_hours, early_renewal_hours=EARLY_RENEWAL_HOURS, opts=child)
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
