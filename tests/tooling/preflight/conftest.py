"""Preflight's tests run against moto, which lacks DescribeCapacityReservations: an account with no reservations
unless a test adds some (tests/support/stub_quotas.py)."""

from __future__ import annotations

import pytest

from tests.support.stub_quotas import no_reservations_by_default


@pytest.fixture(autouse=True)
def _no_capacity_reservations_unless_added():
    with no_reservations_by_default():
        yield
