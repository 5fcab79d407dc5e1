"""Preflight: every image digest the project pins resolves in its registry (components/eks_ddp/tooling/preflight/pins.py).

No registry is reachable here, so a fake one runs on 127.0.0.1, speaking the OCI distribution API as the real ones
do: ``HEAD /v2/<repo>/manifests/<digest>``, 401 with a Bearer challenge until an anonymous token from the realm is
presented, then 200 with ``Docker-Content-Digest`` or 404; one registry answers with a redirect to a mirror, as
registry.k8s.io does, and one with ECR's Basic challenge. Tags resolve to the digest the fake maps them to.
Negative controls: a digest the registry does not hold fails naming the constant and the digest; a tag it does not
hold fails naming the tag; registries that do not answer are one warning, never a failure.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from eks_ddp.infra import autoscaler
from eks_ddp.tooling.preflight import checker as preflight_checker
from eks_ddp.tooling.preflight import pins as p

ECR_SECRET = "QVdTOmZha2U="  # base64 of AWS:fake
TAG_DIGEST = "sha256:" + "ab" * 32


class FakeRegistry(BaseHTTPRequestHandler):
    held: set[tuple[str, str]] = set()
    """(repository, digest or tag) the registry serves; a tag resolves to TAG_DIGEST."""
    seen: list[str] = []

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path.startswith("/token?"):
            self._send(200, {"Content-Type": "application/json"}, json.dumps({"token": "anonymous"}).encode())
        else:  # a manifest: urllib follows a HEAD's redirect with a GET, which a registry serves the same way
            self.do_HEAD()

    def do_HEAD(self) -> None:
        self.seen.append(self.path)
        if self.path.startswith("/redirect/"):  # registry.k8s.io sends pulls to a mirror
            self._send(307, {"Location": self.path.removeprefix("/redirect")})
            return
        if self.path.startswith("/ecr/"):  # ECR: Basic credentials from GetAuthorizationToken
            if self.headers.get("Authorization") != f"Basic {ECR_SECRET}":
                self._send(401, {"WWW-Authenticate": 'Basic realm="https://ecr/",service="ecr.amazonaws.com"'})
                return
        elif self.headers.get("Authorization") != "Bearer anonymous":
            host = f"http://127.0.0.1:{self.server.server_address[1]}"
            self._send(401, {"WWW-Authenticate": f'Bearer realm="{host}/token",service="fake"'})
            return
        repo, _, ref = self.path.removeprefix("/ecr").removeprefix("/v2/").partition("/manifests/")
        if (repo, ref) in self.held:
            self._send(200, {"Docker-Content-Digest": ref if ref.startswith("sha256:") else TAG_DIGEST,
                             "Content-Type": "application/vnd.oci.image.index.v1+json"})
        else:
            self._send(404, {"Content-Type": "application/json"})


@contextlib.contextmanager
def registry(held: set[tuple[str, str]]) -> Iterator[str]:
    FakeRegistry.held, FakeRegistry.seen = held, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeRegistry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


ALL = [*p.PINS, *p.TAGGED]


def every_pin() -> set[tuple[str, str]]:
    return {(pin.parts["repo"], pin.reference) for pin in ALL}


def bases(url: str) -> dict[str, str]:
    """Every pinned registry at the fake one; registry.k8s.io through a redirect, ECR behind a Basic challenge."""
    def path(host: str) -> str:
        return "/redirect" if host == "registry.k8s.io" else "/ecr" if ".dkr.ecr." in host else ""
    return {pin.parts["registry"]: url + path(pin.parts["registry"]) for pin in ALL}


def ecr_login(host: str) -> str | None:
    return ECR_SECRET if ".dkr.ecr." in host else None


def checker(version: str = "1.35") -> preflight_checker._Checker:
    cfg = SimpleNamespace(queue=SimpleNamespace(enabled=True), observability=SimpleNamespace(gpu_metrics=True),
                          cluster=SimpleNamespace(kubernetes_version=version), uses_efa=True, region="us-west-2")
    return preflight_checker._Checker(cfg, None, None)  # type: ignore[arg-type]  # noqa: SLF001


def test_every_pinned_digest_is_listed_and_cites_where_it_was_read():
    import eks_ddp.infra.kueue as kueue
    import eks_ddp.infra.observability as observability
    import eks_ddp.workloads.etcd as etcd

    assert [pin.constant.rsplit(".", 1)[1] for pin in p.PINS] == ["ETCD_IMAGE", "IMAGE_DIGEST", "DCGM_EXPORTER_TAG",
                                                                  "image_digest", "image_digest"]
    assert {pin.parts["registry"] for pin in p.PINS} == {"quay.io", "registry.k8s.io", "nvcr.io"}
    assert all(pin.parts["digest"] for pin in p.PINS) and not any(pin.parts["digest"] for pin in p.TAGGED)
    sources = {"ETCD_IMAGE": etcd, "IMAGE_DIGEST": kueue, "DCGM_EXPORTER_TAG": observability}
    for name, module in sources.items():
        text = open(module.__file__).read()
        after = text[text.index(f"\n{name} = "):]
        doc = after[after.index('"""') + 3:]
        doc = doc[:doc.index('"""')]  # the constant's own docstring
        assert "Read from" in doc and "preflight resolves it" in doc, name


def test_pinned_digests_that_resolve_pass_through_the_token_and_the_redirect():
    with registry(every_pin()) as url:
        c = checker()
        resolved = p.check_pins(c, p.urllib_fetch, bases(url), ecr_login)
    assert c.report.failures == [] and c.report.warnings == []
    assert any(s.startswith("/redirect/v2/kueue/kueue/manifests/sha256:") for s in FakeRegistry.seen)
    assert "/redirect/v2/autoscaling/cluster-autoscaler/manifests/" + autoscaler.PINS["1.35"].image_digest in \
        FakeRegistry.seen
    # the tags pinned without a digest, resolved to the digest the nodes will pull (ECR's with its Basic login)
    assert resolved == [f"nvcr.io/nvidia/k8s-device-plugin:v0.17.2 -> {TAG_DIGEST}",
                        f"602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin:v0.5.20 -> "
                        f"{TAG_DIGEST}"]
    assert "/ecr/v2/eks/aws-efa-k8s-device-plugin/manifests/v0.5.20" in FakeRegistry.seen


def test_a_kubernetes_version_whose_autoscaler_has_no_digest_resolves_its_tag():
    with registry(every_pin()) as url:
        c = checker("1.33")
        resolved = p.check_pins(c, p.urllib_fetch, bases(url), ecr_login)
    assert c.report.failures == [] and resolved[0] == (
        f"registry.k8s.io/autoscaling/cluster-autoscaler:v1.33.6 -> {TAG_DIGEST}")


def test_a_tag_the_registry_does_not_serve_fails_naming_it():
    with registry(every_pin() - {("nvidia/k8s-device-plugin", "v0.17.2")}) as url:
        c = checker()
        p.check_pins(c, p.urllib_fetch, bases(url), ecr_login)
    assert c.report.failures == [
        "eks_ddp.infra.addons.NVIDIA_DEVICE_PLUGIN_IMAGE_TAG: got 'nvcr.io/nvidia/k8s-device-plugin:v0.17.2'; the "
        "registry nvcr.io serves no image tagged v0.17.2 for nvidia/k8s-device-plugin: expected a tag it serves (the "
        "pods would never pull it)"]


def test_ecr_without_credentials_is_not_reached_not_failed():
    with registry(every_pin()) as url:
        c = checker()
        p.check_pins(c, p.urllib_fetch, bases(url))  # no ECR login
    assert c.report.failures == []
    [warning] = c.report.warnings
    assert "602401143452.dkr.ecr.us-west-2.amazonaws.com (602401143452.dkr.ecr.us-west-2.amazonaws.com asked for " \
           "credentials" in warning and "1 pinned image(s) were not checked" in warning


def test_ecr_credentials_come_from_the_regions_authorization_token():
    asked = []

    class Ecr:
        def get_authorization_token(self):
            return {"authorizationData": [{"authorizationToken": ECR_SECRET}]}

    login = p.ecr_credentials(lambda region: asked.append(region) or Ecr())
    assert login("013241004608.dkr.ecr.us-gov-west-1.amazonaws.com") == ECR_SECRET and asked == ["us-gov-west-1"]
    assert login("nvcr.io") is None and asked == ["us-gov-west-1"]


def test_a_digest_the_registry_does_not_serve_fails_naming_the_constant():
    kueue_pin = next(pin for pin in p.PINS if "kueue" in pin.constant)
    with registry(every_pin() - {(kueue_pin.parts["repo"], kueue_pin.parts["digest"])}) as url:
        c = checker()
        p.check_pins(c, p.urllib_fetch, bases(url), ecr_login)
    [failure] = c.report.failures  # negative control: the digest the fake does not hold is named
    assert failure.startswith(f"eks_ddp.infra.kueue.IMAGE_DIGEST: got {kueue_pin.image!r}; the registry "
                              f"registry.k8s.io does not serve the digest {kueue_pin.parts['digest']} for kueue/kueue")
    assert "crane digest registry.k8s.io/kueue/kueue:v0.16.4" in failure and c.report.warnings == []


def test_unreachable_registries_are_one_warning_not_a_failure():
    with registry(set()) as url:
        pass  # closed again: nothing listens there now
    c = checker()
    assert p.check_pins(c, p.urllib_fetch, bases(url), ecr_login) == []
    assert c.report.failures == []
    [warning] = c.report.warnings  # said once, naming each registry and what was not checked
    assert "could not reach 4 image registries, so 6 pinned image(s) were not checked (skipped, not failed)" in warning
    assert all(pin.image in warning for pin in p.pins(c.cfg) + p.tagged(c.cfg))


def test_preflight_runs_the_pin_check_when_given_a_registry(monkeypatch):
    called = []
    monkeypatch.setattr(p, "check_pins", lambda c, fetch, credentials=None: called.append(fetch) or [])
    monkeypatch.setattr(preflight_checker._Checker, "zones", lambda self: None)  # noqa: SLF001
    for name in ("check_offerings", "check_efa", "check_reservations", "check_placement_groups", "check_quotas",
                 "check_network_quotas"):
        monkeypatch.setattr(preflight_checker._Checker, name, lambda self, *a: None)  # noqa: SLF001
    from tests.support.util import stack_config
    from tests.tooling.preflight.test_preflight import config
    preflight_checker.check(config(stack_config("dev")), ec2=None, quotas=None, registry=p.urllib_fetch)
    assert called == [p.urllib_fetch]
    called.clear()
    preflight_checker.check(config(stack_config("dev")), ec2=None, quotas=None)
    assert called == []


@pytest.mark.parametrize("bad", ["quay.io/coreos/etcd", "etcd@sha256:abc"])
def test_a_pin_that_is_not_a_digest_reference_is_named(bad):
    with pytest.raises(ValueError, match="expected <registry>/<repository>"):
        _ = p.Pin("X.Y", bad).parts


def _release_image(values: dict) -> str | None:
    image = ((values.get("controllerManager") or {}).get("manager") or {}).get("image") or values.get("image")
    return f"{image['repository']}:{image['tag']}" if image else None


@pytest.mark.parametrize("stack", ["dev_result", "p4de_result"])
def test_every_rendered_image_is_pinned_by_digest_or_resolved_by_preflight(stack, request):
    """Every image the plan renders (pod templates, and each Helm release's image, which every release sets in its
    values) is a cited digest pin (PINS), a tag preflight resolves (TAGGED), or the stack's own image by digest from
    ECR (built or named by digest, and scan-gated: infra/image.py, infra/scan_gate.py)."""
    from eks_ddp.tooling.contracts import PlanView
    from eks_ddp.tooling.contracts.identity import containers, pod_specs

    view = PlanView.of(request.getfixturevalue(stack))
    listed = {pin.image for pin in ALL}
    rendered = {(f"{kind} {field}", image) for kind, spec in pod_specs(view) for field, image in containers(spec)}
    for r in view.result.of_type("kubernetes:helm.sh/v3:Release"):
        rendered.add((f"Release {r.name}", _release_image(r.inputs.get("values") or {}) or "<the chart's default>"))
    assert any(what.startswith("Release") for what, _ in rendered) and any("Job" in what for what, _ in rendered)
    unpinned = [(what, image) for what, image in rendered if image not in listed and not (
        "@sha256:" in image and ".dkr.ecr." in image.split("/", 1)[0])]
    assert unpinned == []


def test_the_rendered_image_check_names_an_image_neither_pinned_nor_listed():
    """Negative control: an image by tag that TAGGED does not list, and a chart left at its default image."""
    listed = {pin.image for pin in ALL}
    assert "registry.k8s.io/autoscaling/cluster-autoscaler:v1.35.2" not in listed  # 1.35 renders its digest
    assert _release_image({"image": {"repository": "nvcr.io/nvidia/k8s-device-plugin", "tag": "v0.17.1"}}) \
        not in listed
    assert _release_image({"tolerations": []}) is None


def test_every_autoscaler_digest_cites_where_it_was_read():
    text = open(autoscaler.__file__).read()
    for version, pin in autoscaler.PINS.items():
        if pin.image_digest:
            before = text[:text.index(f'"{version}": AutoscalerPin(')]
            comment = before[before.rindex("\n    # Digest read from"):]
            assert "preflight resolves it" in comment, version
