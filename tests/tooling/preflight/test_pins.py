"""Preflight: every image digest the project pins resolves in its registry (components/eks_ddp/tooling/preflight/pins.py).

No registry is reachable here, so a fake one runs on 127.0.0.1, speaking the OCI distribution API as the real ones
do: ``HEAD /v2/<repo>/manifests/<digest>``, 401 with a Bearer challenge until an anonymous token from the realm is
presented, then 200 with ``Docker-Content-Digest`` or 404; one registry answers with a redirect to a mirror, as
registry.k8s.io does. Negative controls: a digest the registry does not hold fails naming the constant; a registry
that does not answer is a warning, never a failure.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from eks_ddp.tooling.preflight import checker as preflight_checker
from eks_ddp.tooling.preflight import pins as p


class FakeRegistry(BaseHTTPRequestHandler):
    held: set[tuple[str, str]] = set()
    """(repository, digest) the registry serves."""
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
        if self.headers.get("Authorization") != "Bearer anonymous":
            host = f"http://127.0.0.1:{self.server.server_address[1]}"
            self._send(401, {"WWW-Authenticate": f'Bearer realm="{host}/token",service="fake"'})
            return
        repo, _, digest = self.path.removeprefix("/v2/").partition("/manifests/")
        if (repo, digest) in self.held:
            self._send(200, {"Docker-Content-Digest": digest,
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


def every_pin() -> set[tuple[str, str]]:
    return {(pin.parts["repo"], pin.parts["digest"]) for pin in p.PINS}


def bases(url: str) -> dict[str, str]:
    """Every pinned registry at the fake one; registry.k8s.io through a redirect."""
    return {pin.parts["registry"]: url + ("/redirect" if pin.parts["registry"] == "registry.k8s.io" else "")
            for pin in p.PINS}


def checker() -> preflight_checker._Checker:
    cfg = SimpleNamespace(queue=SimpleNamespace(enabled=True), observability=SimpleNamespace(gpu_metrics=True))
    return preflight_checker._Checker(cfg, None, None)  # type: ignore[arg-type]  # noqa: SLF001


def test_every_pinned_digest_is_listed_and_cites_where_it_was_read():
    import eks_ddp.infra.kueue as kueue
    import eks_ddp.infra.observability as observability
    import eks_ddp.workloads.etcd as etcd

    assert [pin.constant.rsplit(".", 1)[1] for pin in p.PINS] == ["ETCD_IMAGE", "IMAGE_DIGEST", "DCGM_EXPORTER_TAG"]
    assert {pin.parts["registry"] for pin in p.PINS} == {"quay.io", "registry.k8s.io", "nvcr.io"}
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
        p.check_pins(c, p.urllib_fetch, bases(url))
    assert c.report.failures == [] and c.report.warnings == []
    assert any(s.startswith("/redirect/v2/kueue/kueue/manifests/sha256:") for s in FakeRegistry.seen)


def test_a_digest_the_registry_does_not_serve_fails_naming_the_constant():
    kueue_pin = next(pin for pin in p.PINS if "kueue" in pin.constant)
    with registry(every_pin() - {(kueue_pin.parts["repo"], kueue_pin.parts["digest"])}) as url:
        c = checker()
        p.check_pins(c, p.urllib_fetch, bases(url))
    [failure] = c.report.failures
    assert failure.startswith(f"eks_ddp.infra.kueue.IMAGE_DIGEST: got {kueue_pin.image!r}; the registry "
                              f"registry.k8s.io does not serve the digest {kueue_pin.parts['digest']} for kueue/kueue")
    assert "crane digest registry.k8s.io/kueue/kueue:v0.16.4" in failure and c.report.warnings == []


def test_an_unreachable_registry_is_a_warning_not_a_failure():
    with registry(set()) as url:
        pass  # closed again: nothing listens there now
    c = checker()
    p.check_pins(c, p.urllib_fetch, bases(url))
    assert c.report.failures == []
    assert len(c.report.warnings) == 3 and all("could not check the pinned image" in w for w in c.report.warnings)


def test_preflight_runs_the_pin_check_when_given_a_registry(monkeypatch):
    called = []
    monkeypatch.setattr(p, "check_pins", lambda c, fetch: called.append(fetch))
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


@pytest.mark.parametrize("bad", ["quay.io/coreos/etcd:v3.5.18", "etcd@sha256:abc"])
def test_a_pin_that_is_not_a_digest_reference_is_named(bad):
    with pytest.raises(ValueError, match="expected <registry>/<repository>"):
        _ = p.Pin("X.Y", bad).parts
