"""Every resource URN and type token of the dev and p4de plans, pinned.

A URN holds the resource's type token and its parents' (``urn:pulumi:<stack>::<project>::<parent types>$<type>::<name>``),
so a renamed token, a moved child or a renamed resource replaces live resources on the next ``pulumi up`` unless the
change carries ``aliases``. Moving modules must not change any of them: the snapshot was taken from the plans before
the library's modules moved into packages, and a change to it is a deliberate, reviewed edit of
tests/fixtures/urns/<stack>.txt (with aliases for what a live stack already has).
"""

from __future__ import annotations

import pytest

from tests.support.util import ROOT


def urn_lines(result) -> list[str]:
    return sorted(f"{r.type}\t{r.urn}" for r in result.resources)


def _diff(expected: list[str], actual: list[str]) -> str:
    gone = sorted(set(expected) - set(actual))
    new = sorted(set(actual) - set(expected))
    return "\n".join([*(f"- {x}" for x in gone[:20]), *(f"+ {x}" for x in new[:20])])


@pytest.mark.parametrize("stack", ["dev", "p4de"])
def test_the_plans_urns_and_type_tokens_are_the_snapshots(stack, request):
    result = request.getfixturevalue(f"{stack}_result")
    expected = (ROOT / "tests" / "fixtures" / "urns" / f"{stack}.txt").read_text().splitlines()
    actual = urn_lines(result)
    assert actual == expected, _diff(expected, actual)


def test_a_renamed_type_token_is_caught(dev_result):
    # Negative control: one component's token renamed (what moving a module and deriving the token from the
    # module's new path would do) changes its URN and every child's.
    expected = (ROOT / "tests" / "fixtures" / "urns" / "dev.txt").read_text().splitlines()
    renamed = [line.replace("eks-ddp:etcd:EtcdRendezvous", "eks-ddp:workloads.etcd:EtcdRendezvous")
               for line in urn_lines(dev_result)]
    changed = _diff(expected, renamed)
    assert changed and "- eks-ddp:etcd:EtcdRendezvous" in changed and "workloads.etcd" in changed
