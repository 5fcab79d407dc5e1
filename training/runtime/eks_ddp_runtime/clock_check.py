"""A node whose wall clock is off refuses to start (review R3).

The lease (fence.py) ends ``margin`` before peers drop the node, and peers judge its heartbeat by *their* wall
clocks: a node whose clock is off by more than the margin holds a lease after its peers may have formed a world
without it. Nothing else on a node without a time service measures that, so the agent measures its clock against
the rendezvous store's at start: etcd's HTTP gateway (Go's net/http) stamps every answer with a ``Date`` header
(RFC 9110 section 6.6.1: one-second resolution, generated while the answer is made). If the server made it at local
time ``t`` in ``[t0, t1]`` (the request's send and receive times), the skew ``server - local`` lies in
``[D - t1, D + 1 - t0]``. The agent refuses to start only when that whole interval lies beyond ``limit_s``: a
provable skew, named with its bounds, never a guess from a slow answer. A node within the limit may still be off
by up to ``limit_s + 1 s + the round trip`` undetected (the header's resolution).
"""

from __future__ import annotations

import email.utils
import http.client
import logging
import ssl
import time
from collections.abc import Callable

__all__ = ["ClockSkewError", "check_clock", "skew_bounds"]

log = logging.getLogger(__name__)


class ClockSkewError(ValueError):
    """This node's clock is provably off from the store's by more than the limit."""


def skew_bounds(host: str, port: int, *, context: ssl.SSLContext | None, timeout_s: float,
                clock: Callable[[], float] = time.time) -> tuple[float, float]:
    """(low, high) bounds of the store's clock minus this node's, in seconds, from one request."""
    conn: http.client.HTTPConnection
    if context is not None:
        conn = http.client.HTTPSConnection(host, port, timeout=timeout_s, context=context)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.connect()
        t0 = clock()
        conn.request("POST", "/v3/maintenance/status", body=b"{}", headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        t1 = clock()
        response.read()
        date = response.getheader("Date")
    finally:
        conn.close()
    if not date:
        raise ValueError("the store's answer has no Date header")
    server = email.utils.parsedate_to_datetime(date).timestamp()
    return server - t1, server + 1.0 - t0


def check_clock(host: str, port: int, *, context: ssl.SSLContext | None, timeout_s: float, limit_s: float,
                clock: Callable[[], float] = time.time) -> None:
    """Raise ClockSkewError when this node's clock is provably off by more than ``limit_s``; a store that does not
    answer is left to the rendezvous (an outage at start must not be a usage error)."""
    try:
        low, high = skew_bounds(host, port, context=context, timeout_s=timeout_s, clock=clock)
    except (OSError, ValueError, http.client.HTTPException) as e:
        log.warning("clock check skipped: the rendezvous store at %s:%s did not answer (%s)", host, port, e)
        return
    if low > limit_s or high < -limit_s:
        ahead = "behind" if low > 0 else "ahead of"
        skew = low if low > 0 else -high
        raise ClockSkewError(f"node clock: got {skew:.1f} s or more {ahead} the rendezvous store's ({host}:{port}); "
                             f"expected within {limit_s:g} s (the lease's margin): sync this node's clock (chrony, "
                             "the Amazon Time Sync Service) and start again")
