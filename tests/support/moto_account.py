"""A moto account with fake credentials, for the tests of what asks AWS (preflight, destroy-check)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from moto import mock_aws


@contextlib.contextmanager
def fake_account(monkeypatch) -> Iterator[None]:
    """Fake credentials, no named profile (one from the environment would win), and moto answering every AWS call
    made inside the block."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SECURITY_TOKEN", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(var, "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        yield
