"""Preflight: every image the project pins resolves in its registry, before anything bills.

The stack's own add-on images are pinned as named constants. Where a digest could be read from a public record
(:data:`PINS`: Kueue's controller, the rendezvous store's etcd, NVIDIA's DCGM exporter, the cluster autoscaler for
1.35 and 1.36), it is rendered as ``<tag>@<digest>`` and the constant says where it was read. Where none could
(:data:`TAGGED`: the autoscaler for 1.32-1.34, the NVIDIA and EFA device plugins), the tag alone is rendered and
none is invented: preflight resolves the tag to the digest the nodes will pull, logs it, and fails when the tag does
not resolve. A digest its registry does not serve fails the Helm release or leaves pods in ImagePullBackOff after
``up`` has started creating things (a failed Kueue release rolls back, and every queued Job with it). So preflight
asks each registry for the manifest, as a container runtime does, through the OCI distribution API
(opencontainers/distribution-spec ``spec.md``, "Pulling manifests": ``HEAD /v2/<name>/manifests/<reference>``, a
tag or a digest, 200 with ``Docker-Content-Digest`` when it exists, 404 ``MANIFEST_UNKNOWN`` when not), with the
anonymous token a public registry hands out on a 401 (``WWW-Authenticate: Bearer realm=...,service=...,scope=...``:
the token authentication specification of the distribution/distribution registry, "Docker Registry v2
authentication via central service"). registry.k8s.io answers with a redirect to a regional mirror, which is
followed. ECR answers a ``Basic`` challenge instead; preflight then presents the caller's ECR authorization token
(ECR API reference, ``GetAuthorizationToken``: "a base64-encoded string that contains authorization credentials
... to access any Amazon ECR registry that your IAM principal has access to", used as HTTP Basic ``AWS:<password>``).

A reference that does not resolve fails preflight, naming the constant, the image and the digest or tag. Registries
that do not answer (no network, a proxy, a rate limit, no ECR credentials) are one warning naming them and the
images left unchecked: the check is skipped, nothing is known to be wrong.
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

from eks_ddp.infra import addons, autoscaler, kueue, observability
from eks_ddp.workloads import etcd

if TYPE_CHECKING:
    from eks_ddp.config import StackConfig

ACCEPT = ", ".join((
    "application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json"))
"""What a runtime accepts: an image index (multi-arch) or a single manifest, OCI or Docker."""
TIMEOUT_S = 10.0
_REF = re.compile(r"^(?P<registry>[^/]+)/(?P<repo>[^:@]+)(?::(?P<tag>[^@]+))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class Pin:
    constant: str
    """Where the pin lives (module and name), as the failure names it."""
    image: str
    """``<registry>/<repository>[:tag]@sha256:<digest>``, or ``<registry>/<repository>:<tag>`` for a tag that
    preflight resolves (:data:`TAGGED`)."""

    @property
    def parts(self) -> dict[str, str]:
        m = _REF.match(self.image)
        if m is None or not (m["tag"] or m["digest"]):
            raise ValueError(f"{self.constant}: got {self.image!r}; expected <registry>/<repository>[:tag]@sha256:<64 "
                             "hex digits> or <registry>/<repository>:<tag>")
        return {k: v or "" for k, v in m.groupdict().items()}

    @property
    def reference(self) -> str:
        """What the registry is asked for: the digest where one is pinned, else the tag."""
        p = self.parts
        return p["digest"] or p["tag"]


def _versions(cfg: StackConfig | None) -> list[str]:
    return list(autoscaler.PINS) if cfg is None else [cfg.cluster.kubernetes_version]


def pins(cfg: StackConfig | None = None) -> list[Pin]:
    """The pinned digests (all of them, or those ``cfg``'s stack renders)."""
    out = [Pin("eks_ddp.workloads.etcd.ETCD_IMAGE", etcd.ETCD_IMAGE)]
    if cfg is None or cfg.queue.enabled:
        out.append(Pin("eks_ddp.infra.kueue.IMAGE_DIGEST", f"{kueue.IMAGE_REPOSITORY}:{kueue.IMAGE_TAG}"))
    if cfg is None or cfg.observability.gpu_metrics:
        out.append(Pin("eks_ddp.infra.observability.DCGM_EXPORTER_TAG",
                       f"{observability.DCGM_EXPORTER_IMAGE}:{observability.DCGM_EXPORTER_TAG}"))
    out += [Pin(f"eks_ddp.infra.autoscaler.PINS[{v!r}].image_digest",
                f"{autoscaler.IMAGE_REPOSITORY}:{autoscaler.PINS[v].image_reference}")
            for v in _versions(cfg) if v in autoscaler.PINS and autoscaler.PINS[v].image_digest]
    return out


def tagged(cfg: StackConfig | None = None) -> list[Pin]:
    """The images pinned by tag only (all of them, or those ``cfg``'s stack renders): preflight resolves each tag."""
    out = [Pin(f"eks_ddp.infra.autoscaler.PINS[{v!r}].image_tag",
               f"{autoscaler.IMAGE_REPOSITORY}:{autoscaler.PINS[v].image_tag}")
           for v in _versions(cfg) if v in autoscaler.PINS and not autoscaler.PINS[v].image_digest]
    out.append(Pin("eks_ddp.infra.addons.NVIDIA_DEVICE_PLUGIN_IMAGE_TAG",
                   f"{addons.NVIDIA_DEVICE_PLUGIN_IMAGE_REPOSITORY}:{addons.NVIDIA_DEVICE_PLUGIN_IMAGE_TAG}"))
    if cfg is None or cfg.uses_efa:
        out.append(Pin("eks_ddp.infra.addons.EFA_PLUGIN_IMAGE_TAG",
                       addons.efa_plugin_image("us-west-2" if cfg is None else cfg.region)))
    return out


PINS = pins()
"""Every image digest the project pins."""
TAGGED = tagged()
"""Every image the project pins by tag only (the EFA plugin's as a commercial-partition stack renders it)."""

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


Credentials = Callable[[str], "str | None"]
"""Registry host -> an HTTP Basic credential for it (base64 ``user:password``), or None: for registries that
answer with a ``Basic`` challenge (ECR)."""


_ECR_HOST = re.compile(r"^\d{12}\.dkr\.ecr(?:-fips)?\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?$")


def ecr_credentials(ecr: Callable[[str], Any]) -> Credentials:
    """Basic credentials for ECR registry hosts from ``ecr(region)``'s ``GetAuthorizationToken`` (None for any other
    host, or when the call fails: the registry is then reported as not reached)."""
    def credentials(host: str) -> str | None:
        m = _ECR_HOST.match(host)
        if m is None:
            return None
        try:
            data = ecr(m["region"]).get_authorization_token()["authorizationData"]
        except Exception:  # noqa: BLE001 (no credentials, a denied call, no network: the image stays unchecked)
            return None
        return data[0]["authorizationToken"] if data else None
    return credentials


def served(pin: Pin, fetch: Fetch = urllib_fetch, base: Mapping[str, str] | None = None,
           credentials: Credentials | None = None) -> str | None:
    """The digest the registry serves for ``pin``'s reference (its digest, or its tag), None when it serves none.
    Raises OSError when the registry cannot be asked. ``base`` maps a registry host to the URL to reach it at
    (tests)."""
    p = pin.parts
    root = (base or {}).get(p["registry"], f"https://{p['registry']}")
    url = f"{root}/v2/{p['repo']}/manifests/{pin.reference}"
    headers = {"Accept": ACCEPT}
    status, answer, _ = fetch("HEAD", url, headers)
    if status == 401:
        challenge = next((v for k, v in answer.items() if k.lower() == "www-authenticate"), "")
        if challenge.lower().startswith("basic"):
            secret = credentials(p["registry"]) if credentials else None
            auth = f"Basic {secret}" if secret else None
        else:
            token = _token(fetch, challenge, p["repo"])
            auth = f"Bearer {token}" if token else None
        if auth is None:
            raise OSError(f"{p['registry']} asked for credentials ({challenge or 'no challenge'})")
        status, answer, _ = fetch("HEAD", url, {**headers, "Authorization": auth})
    if status == 200:
        return next((v for k, v in answer.items() if k.lower() == "docker-content-digest"), p["digest"] or None)
    if status == 404:
        return None
    raise OSError(f"{url}: HTTP {status}")


def resolve(pin: Pin, fetch: Fetch = urllib_fetch, base: Mapping[str, str] | None = None,
            credentials: Credentials | None = None) -> bool:
    """Whether the registry serves ``pin``'s digest (or, for a tag pin, any manifest for its tag)."""
    got = served(pin, fetch, base, credentials)
    return got is not None and (not pin.parts["digest"] or got == pin.parts["digest"])


def check_pins(c: Any, fetch: Fetch = urllib_fetch, base: Mapping[str, str] | None = None,
               credentials: Credentials | None = None) -> list[str]:
    """Fail (through the checker ``c``) for each pinned digest its registry does not serve and each pinned tag it
    does not resolve; warn once for the registries that could not be asked. Returns one line per resolved tag
    (``<image> -> <digest>``: what the nodes will pull)."""
    unreachable: dict[str, list[str]] = {}
    why: dict[str, str] = {}
    resolved: list[str] = []
    for pin in [*pins(c.cfg), *tagged(c.cfg)]:
        p = pin.parts
        try:
            got = served(pin, fetch, base, credentials)
        except (OSError, ValueError) as err:  # URLError, timeouts and refused connections are OSErrors
            unreachable.setdefault(p["registry"], []).append(pin.image)
            why.setdefault(p["registry"], str(err))
            continue
        if p["digest"] and got != p["digest"]:
            c.fail(f"{pin.constant}: got {pin.image!r}; the registry {p['registry']} does not serve the digest "
                   f"{p['digest']} for {p['repo']}: expected the digest `crane digest "
                   f"{p['registry']}/{p['repo']}:{p['tag'] or '<tag>'}` gives (the pods would never pull it)")
        elif got is None:
            c.fail(f"{pin.constant}: got {pin.image!r}; the registry {p['registry']} serves no image tagged "
                   f"{p['tag']} for {p['repo']}: expected a tag it serves (the pods would never pull it)")
        elif not p["digest"]:
            resolved.append(f"{pin.image} -> {got}")
    if unreachable:
        names = "; ".join(f"{host} ({why[host]}): {', '.join(images)}" for host, images in unreachable.items())
        c.warn(f"preflight: could not reach {len(unreachable)} image registr{'y' if len(unreachable) == 1 else 'ies'}"
               f", so {sum(map(len, unreachable.values()))} pinned image(s) were not checked (skipped, not failed): "
               f"{names}; check them with `crane digest <image>`")
    return resolved
