"""Preflight: every image digest the project pins resolves in its registry, before anything bills.

The stack's own add-on images are pinned by digest as named constants (:data:`PINS`: Kueue's controller, the
rendezvous store's etcd, NVIDIA's DCGM exporter); each constant's docstring says where its digest was read. A digest
its registry does not serve fails the Helm release or leaves pods in ImagePullBackOff after ``up`` has started
creating things (a failed Kueue release rolls back, and every queued Job with it). So preflight asks each registry
for the manifest by digest, as a container runtime does, through the OCI distribution API
(opencontainers/distribution-spec ``spec.md``, "Pulling manifests": ``HEAD /v2/<name>/manifests/<digest>``, 200
when it exists, 404 ``MANIFEST_UNKNOWN`` when not), with the anonymous token a public registry hands out on a 401
(``WWW-Authenticate: Bearer realm=...,service=...,scope=...``: the token authentication specification of the
distribution/distribution registry, "Docker Registry v2 authentication via central service"). registry.k8s.io answers with a redirect to a regional mirror, which is followed.

A digest that does not resolve fails preflight, naming the constant, the image and the digest. A registry that does
not answer (no network, a proxy, a rate limit) is a warning: the pin could not be checked, nothing is known to be
wrong.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eks_ddp.infra import kueue, observability
from eks_ddp.workloads import etcd

if TYPE_CHECKING:
    from eks_ddp.config import StackConfig

ACCEPT = ", ".join((
    "application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json"))
"""What a runtime accepts: an image index (multi-arch) or a single manifest, OCI or Docker."""
TIMEOUT_S = 10.0
_REF = re.compile(r"^(?P<registry>[^/]+)/(?P<repo>[^:@]+)(?::(?P<tag>[^@]+))?@(?P<digest>sha256:[0-9a-f]{64})$")
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class Pin:
    constant: str
    """Where the pin lives (module and name), as the failure names it."""
    image: str
    """``<registry>/<repository>[:tag]@sha256:<digest>``."""

    @property
    def parts(self) -> dict[str, str]:
        m = _REF.match(self.image)
        if m is None:
            raise ValueError(f"{self.constant}: got {self.image!r}; expected <registry>/<repository>[:tag]@sha256:<64 "
                             "hex digits>")
        return {k: v or "" for k, v in m.groupdict().items()}


def pins(cfg: StackConfig | None = None) -> list[Pin]:
    """The pinned digests (all of them, or those ``cfg``'s stack runs)."""
    out = [Pin("eks_ddp.workloads.etcd.ETCD_IMAGE", etcd.ETCD_IMAGE)]
    if cfg is None or cfg.queue.enabled:
        out.append(Pin("eks_ddp.infra.kueue.IMAGE_DIGEST", f"{kueue.IMAGE_REPOSITORY}:{kueue.IMAGE_TAG}"))
    if cfg is None or cfg.observability.gpu_metrics:
        out.append(Pin("eks_ddp.infra.observability.DCGM_EXPORTER_TAG",
                       f"{observability.DCGM_EXPORTER_IMAGE}:{observability.DCGM_EXPORTER_TAG}"))
    return out


PINS = pins()
"""Every image digest the project pins."""

Fetch = Callable[[str, str, Mapping[str, str]], tuple[int, Mapping[str, str], bytes]]
"""(method, url, headers) -> (status, response headers, body): one HTTP exchange, redirects followed."""


def urllib_fetch(method: str, url: str, headers: Mapping[str, str]) -> tuple[int, Mapping[str, str], bytes]:
    request = urllib.request.Request(url, method=method, headers=dict(headers))
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:  # noqa: S310 (https URLs we build)
            return resp.status, dict(resp.headers), resp.read() if method == "GET" else b""
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers or {}), b""


def _token(fetch: Fetch, challenge: str, repo: str) -> str | None:
    """An anonymous pull token from a ``WWW-Authenticate: Bearer`` challenge (None: not a bearer challenge)."""
    if not challenge.lower().startswith("bearer"):
        return None
    params = dict(_CHALLENGE.findall(challenge))
    realm = params.pop("realm", "")
    if not realm:
        return None
    params.setdefault("scope", f"repository:{repo}:pull")
    query = "&".join(f"{k}={urllib.parse.quote(v, safe=':/,')}" for k, v in params.items())
    status, _, body = fetch("GET", f"{realm}?{query}", {})
    if status != 200:
        return None
    doc = json.loads(body or b"{}")
    return doc.get("token") or doc.get("access_token")


def resolve(pin: Pin, fetch: Fetch = urllib_fetch, base: Mapping[str, str] | None = None) -> bool:
    """Whether the registry serves ``pin``'s digest. Raises OSError when the registry cannot be asked.
    ``base`` maps a registry host to the URL to reach it at (tests)."""
    p = pin.parts
    root = (base or {}).get(p["registry"], f"https://{p['registry']}")
    url = f"{root}/v2/{p['repo']}/manifests/{p['digest']}"
    headers = {"Accept": ACCEPT}
    status, answer, _ = fetch("HEAD", url, headers)
    if status == 401:
        challenge = next((v for k, v in answer.items() if k.lower() == "www-authenticate"), "")
        token = _token(fetch, challenge, p["repo"])
        if token is None:
            raise OSError(f"{p['registry']} asked for credentials ({challenge or 'no challenge'})")
        status, answer, _ = fetch("HEAD", url, {**headers, "Authorization": f"Bearer {token}"})
    if status == 200:
        served = next((v for k, v in answer.items() if k.lower() == "docker-content-digest"), p["digest"])
        return served == p["digest"]
    if status == 404:
        return False
    raise OSError(f"{url}: HTTP {status}")


def check_pins(c: Any, fetch: Fetch = urllib_fetch, base: Mapping[str, str] | None = None) -> None:
    """Fail (through the checker ``c``) for each pinned digest its registry does not serve; warn for each registry
    that could not be asked."""
    for pin in pins(c.cfg):
        try:
            ok = resolve(pin, fetch, base)
        except (OSError, ValueError) as err:  # URLError, timeouts and refused connections are OSErrors
            c.warn(f"preflight: could not check the pinned image {pin.image} ({pin.constant}) against its registry "
                   f"({err}); check it with `crane digest {pin.image.split('@')[0]}`")
            continue
        if not ok:
            p = pin.parts
            c.fail(f"{pin.constant}: got {pin.image!r}; the registry {p['registry']} does not serve the digest "
                   f"{p['digest']} for {p['repo']}: expected the digest `crane digest "
                   f"{p['registry']}/{p['repo']}:{p['tag'] or '<tag>'}` gives (the pods would never pull it)")
