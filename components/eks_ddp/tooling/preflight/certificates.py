"""Preflight: warn when a rendezvous store's certificate nears its expiry.

The store's certificates (components/eks_ddp/workloads/etcd_tls.py) are renewed only by a ``pulumi up`` in their last
third (pulumi-tls ``early_renewal_hours``: "the certificate will become ready for renewal this number of hours
before its ``validity_end_time``", and a plan then replaces it). A run that goes on past a certificate's end loses
the store: etcd refuses the expired client certificate (``--client-cert-auth``), and the agents give up after their
read timeout. So every ``pulumi up`` says which certificates end within :data:`WARN_DAYS` days, when they end, and
from when an ``up`` renews them.

The ends are the certificates' ``validity_end_time`` outputs (RFC 3339, as pulumi-tls reports them); they are known
during ``pulumi up`` (the state's, or the renewed certificate's), unknown in a preview of a new certificate.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

import pulumi

WARN_DAYS = 30
"""Warn when a certificate ends within this many days (the security review's threshold)."""


def _parse(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(dt.UTC)


def expiry_warnings(certificates: Mapping[str, tuple[str | None, int]], now: dt.datetime) -> list[str]:
    """One warning per certificate (name -> (validity_end_time, early_renewal_hours)) ending within WARN_DAYS days of
    ``now``; an unknown end (None: a preview) is skipped."""
    out = []
    for name, (end_text, renewal_hours) in sorted(certificates.items()):
        if not end_text:
            continue
        end = _parse(end_text)
        left = end - now
        if left >= dt.timedelta(days=WARN_DAYS):
            continue
        renew = end - dt.timedelta(hours=renewal_hours)
        when = "now" if renew <= now else f"from {renew:%Y-%m-%dT%H:%MZ}"
        if left <= dt.timedelta(0):
            head = f"rendezvous certificate {name} expired at {end:%Y-%m-%dT%H:%MZ}"
        else:
            head = (f"rendezvous certificate {name} expires at {end:%Y-%m-%dT%H:%MZ}, in {left.days} days "
                    f"(under {WARN_DAYS})")
        out.append(f"{head}: a run still going then loses its store (etcd refuses an expired certificate); a "
                   f"'pulumi up' renews it {when}, and restarting the store is ridden out as a wipe")
    return out


def warn_near_expiry(certificates: Mapping[str, tuple[pulumi.Output[str], int]]) -> None:
    """Log :func:`expiry_warnings` once the certificates' ends are known (during ``pulumi up``)."""
    names = sorted(certificates)
    hours = [certificates[n][1] for n in names]

    def report(ends: list[str | None]) -> None:
        now = dt.datetime.now(dt.UTC)
        for message in expiry_warnings(dict(zip(names, zip(ends, hours, strict=True), strict=True)), now):
            pulumi.log.warn(f"preflight: {message}")

    pulumi.Output.all(*(certificates[n][0] for n in names)).apply(report)
