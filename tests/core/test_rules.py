"""The shared value rules (components/eks_ddp/core/rules.py) on their own; the stack config and the components' Args
apply them (tests/config, tests/core/test_args_rules.py)."""

from __future__ import annotations

from eks_ddp.core import rules
from tests.support.util import TEST_PUBLIC_CIDR


def test_test_cidr_is_a_real_public_address():
    assert rules.public_access_cidrs("k", [TEST_PUBLIC_CIDR]) == []
