"""The store client's certificate checked for its validity dates when the client is set up.

An expired (or not yet valid) client certificate is an answer that never changes: the TLS handshake fails, the
client counts it as an outage and retries for ``store_retry_timeout`` (600 s), then every agent exits together
(all the job's pods share one certificate). So it is refused at start, naming the file and its dates (the
caller turns that into a usage error, exit 2), and a certificate that ends within :data:`SOON_S` is logged once.
The dates are read with the standard library's own PEM decoder (``ssl._ssl._test_decode_cert``, what
``ssl.SSLSocket.getpeercert`` returns: ``notBefore``/``notAfter`` as ``ssl.cert_time_to_seconds`` parses them).
Renewal: docs/day-two.md "The store's certificates".
"""

from __future__ import annotations

import logging
import ssl
import time

__all__ = ["SOON_S", "certificate_problem"]

SOON_S = 7 * 24 * 3600.0
"""A certificate that ends within a week is logged at start (a ``pulumi up`` renews it)."""

log = logging.getLogger(__name__)
_warned: set[tuple[str, str, str]] = set()


def certificate_problem(key: str, path: str, now: float | None = None) -> str | None:
    """Why the certificate in ``path`` (rdzv-conf ``key``) cannot be used now, or None. Logs a warning when it
    ends within :data:`SOON_S`. A file the decoder cannot read is left to the TLS context's own load."""
    decode = getattr(getattr(ssl, "_ssl", None), "_test_decode_cert", None)
    if decode is None:
        return None
    try:
        cert = decode(path)
        not_before = ssl.cert_time_to_seconds(cert["notBefore"])
        not_after = ssl.cert_time_to_seconds(cert["notAfter"])
    except (ssl.SSLError, OSError, ValueError, KeyError):
        return None
    now = time.time() if now is None else now
    if now >= not_after:
        return (f"rdzv-conf {key}: got {path!r}, a certificate that expired {cert['notAfter']} "
                f"({(now - not_after) / 3600:.1f} h ago); expected a valid client certificate for the rendezvous "
                "store: renew it (docs/day-two.md, \"The store's certificates\")")
    if now < not_before:
        return (f"rdzv-conf {key}: got {path!r}, a certificate not valid before {cert['notBefore']}; expected one "
                "valid now (is this node's clock right?)")
    if not_after - now < SOON_S and (key, path, cert["notAfter"]) not in _warned:
        # Once per certificate: the check runs whenever the client is set up again (every reconnect).
        _warned.add((key, path, cert["notAfter"]))
        log.warning("rdzv-conf %s: %s expires %s (in %.1f h): renew it (docs/day-two.md, \"The store's "
                    "certificates\")", key, path, cert["notAfter"], (not_after - now) / 3600)
    return None
