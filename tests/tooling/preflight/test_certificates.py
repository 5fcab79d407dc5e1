"""Preflight's warning when a rendezvous store's certificate nears its end: under 30 days, expired, unknown (a
preview), and the renewal window it names matching the certificates the plan makes."""

from __future__ import annotations

import datetime as dt

from eks_ddp.tooling.preflight.certificates import WARN_DAYS, expiry_warnings
from eks_ddp.workloads import etcd_tls

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
CLIENT_RENEWAL = etcd_tls.VALIDITY_HOURS * 2 // 3 // 3  # 20 days


def test_a_certificate_ending_within_30_days_is_named_with_its_end_and_when_an_up_renews_it():
    [w] = expiry_warnings({"rendezvous-etcd-tls-client": ("2026-12-20T12:00:00Z", CLIENT_RENEWAL)}, NOW)
    assert w.startswith("rendezvous certificate rendezvous-etcd-tls-client expires at 2026-12-20T12:00Z, in 21 days "
                        "(under 30): a run still going then loses its store"), w
    assert "a 'pulumi up' renews it from 2026-11-30T12:00Z" in w  # 20 days before its end


def test_an_expired_or_renewable_certificate_says_so():
    [gone] = expiry_warnings({"c": ("2026-11-28T00:00:00+00:00", CLIENT_RENEWAL)}, NOW)
    assert gone.startswith("rendezvous certificate c expired at 2026-11-28T00:00Z") and "renews it now" in gone
    [due] = expiry_warnings({"c": ("2026-12-09T12:00:00Z", CLIENT_RENEWAL)}, NOW)
    assert "in 10 days" in due and "renews it now" in due


def test_negative_controls_far_ends_and_unknown_ends_are_silent():
    far = (NOW + dt.timedelta(days=WARN_DAYS, minutes=1)).isoformat()
    assert expiry_warnings({"ca": (far, etcd_tls.CA_EARLY_RENEWAL_HOURS), "preview": (None, CLIENT_RENEWAL)}, NOW) == []


def test_the_renewal_windows_are_the_plans_early_renewal_hours(dev_result):
    """What the warning says about renewal is what pulumi-tls is told (the certificates' earlyRenewalHours)."""
    certs = {r.name: int(r.inputs["earlyRenewalHours"]) for r in dev_result.resources
             if r.type in ("tls:index/locallySignedCert:LocallySignedCert", "tls:index/selfSignedCert:SelfSignedCert")}
    assert certs == {"rendezvous-etcd-tls-ca": etcd_tls.CA_EARLY_RENEWAL_HOURS,
                     "rendezvous-etcd-tls-server-cert": etcd_tls.VALIDITY_HOURS // 3,
                     "rendezvous-etcd-tls-client-cert": CLIENT_RENEWAL}
