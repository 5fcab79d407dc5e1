"""Every platform contract over the plans the issue names: dev, p4de, and a stack with two runs of other images
and an S3 data set in another account (``byo_result``). Each contract's negative controls (the broken case it
must report) live in the test file named like its module (tests/tooling/contracts/test_s3.py for s3.py); here, the registry itself is checked not to be empty or
short of a contract, so a contract module that stops registering cannot pass silently."""

from __future__ import annotations

import pytest

from eks_ddp.tooling import contracts

EXPECTED = {"network", "image-pull", "image-digest", "rendezvous", "s3", "storage", "fsx", "destroy", "provisioning",
            "queue", "replacements"}


def test_every_contract_is_registered():
    contracts._load_all()
    assert EXPECTED <= set(contracts.CONTRACTS), sorted(contracts.CONTRACTS)


@pytest.mark.parametrize("plan", ["dev_result", "p4de_result", "byo_result"])
def test_the_plans_meet_every_platform_contract(plan, request):
    result = request.getfixturevalue(plan)
    assert [str(v) for v in contracts.check(result)] == []


def test_check_reports_what_a_contract_finds(dev_result, monkeypatch):
    """Negative control for the runner: a registered contract's violations reach the caller, and ``only`` selects."""
    contracts._load_all()
    planted = contracts.Violation("planted", "everything", "always broken")
    monkeypatch.setitem(contracts.CONTRACTS, "planted", lambda view: [planted])
    assert contracts.check(dev_result) == [planted]
    assert contracts.check(dev_result, only=("storage",)) == []
