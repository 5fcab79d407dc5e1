"""Platform contracts: cross-resource invariants checked over a recorded plan with the platform's own rules.

Each contract implements one rule that belongs to someone else (the EKS VPC CNI network-policy agent, IAM's
evaluation of identity, bucket and VPC-endpoint policies, EFS's file-system policy as the CSI driver mounts)
and cites the upstream source it implements in its docstring. A contract is a function
``(PlanView) -> list[Violation]``; ``check(result)`` runs them all. ``make test`` runs every contract over the
dev and p4de plans and over stacks built to break each one (the negative controls, one test file per contract module in tests/tooling/contracts/).

The contracts read the plan as ``pulumi up`` would send it: Kubernetes objects as rendered manifests
(``plan.render_manifests``) and AWS resources by their recorded inputs, so what they check is what the
cluster and AWS would receive, not what our components believe they asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eks_ddp.tooling.mocks import ProgramResult, Recorded


@dataclass(frozen=True)
class Violation:
    """One broken invariant: which contract, which object, and what the platform would do."""

    contract: str
    subject: str
    message: str

    def __str__(self) -> str:
        return f"[{self.contract}] {self.subject}: {self.message}"


@dataclass
class PlanView:
    """A recorded plan as the contracts read it: rendered manifests and AWS resources by type."""

    result: ProgramResult
    manifests: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def of(cls, result: ProgramResult) -> PlanView:
        from eks_ddp.tooling.manifests import render_manifests

        return cls(result=result, manifests=render_manifests(result))

    def kind(self, kind: str) -> list[dict[str, Any]]:
        """Rendered Kubernetes objects of one kind (``NetworkPolicy``, ``Service``, ``Job`` ...)."""
        return [m for m in self.manifests if m.get("kind") == kind]

    def aws(self, typ: str) -> list[Recorded]:
        """Recorded resources of one Pulumi type (``aws:iam/rolePolicy:RolePolicy`` ...)."""
        return self.result.of_type(typ)


Contract = Callable[[PlanView], list[Violation]]

CONTRACTS: dict[str, Contract] = {}
"""Every contract by name; each contract module registers its own with ``@contract("name")``."""


def contract(name: str) -> Callable[[Contract], Contract]:
    def register(fn: Contract) -> Contract:
        CONTRACTS[name] = fn
        return fn
    return register


def check(result: ProgramResult, only: tuple[str, ...] = ()) -> list[Violation]:
    """Every registered contract (or those named in ``only``) over one recorded plan."""
    _load_all()
    view = PlanView.of(result)
    out: list[Violation] = []
    for name, fn in sorted(CONTRACTS.items()):
        if not only or name in only:
            out.extend(fn(view))
    return out


def _load_all() -> None:
    """Import the contract modules (each registers itself)."""
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
