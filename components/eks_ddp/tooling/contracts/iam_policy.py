"""IAM policy evaluation for the subset of the policy language the stack's policies use, with unknowns kept.

Implements AWS's rules as the IAM user guide states them:

- "Policy evaluation logic" (reference_policies_evaluation-logic.html): an explicit Deny in any applicable
  policy wins; otherwise an explicit Allow is needed; otherwise the request is implicitly denied. Within one
  account an Allow in the identity policy *or* in the resource policy (naming the principal) suffices; across
  accounts both must allow ("Cross-account policy evaluation logic"). Policies that only limit (VPC endpoint
  policies, like permissions boundaries and SCPs) must allow too, and never grant by themselves.
- "IAM JSON policy elements: Action / NotAction / Resource / NotResource / Principal": ``*`` and ``?`` wildcards,
  actions case-insensitive, resources case-sensitive; a statement applies when every element matches.
- "IAM JSON policy elements: Condition operators" and "Conditions with multiple context keys or values": the
  operators of one statement, and the keys of one operator, are ANDed; the values of one key are ORed (NORed
  for a negated operator). A key absent from the request makes a condition false, and a negated one
  (``StringNotEquals``, ``ArnNotLike``...) true; ``...IfExists`` makes an absent key true; ``Null`` tests
  presence itself.

What cannot be decided statically stays *unknown* instead of being guessed: a condition key the caller does not
put in the request context (missing from :attr:`Request.context`; ``None`` there means "known to be absent"), an
operator outside the subset (dates, IP addresses, binary, the ``ForAnyValue:``/``ForAllValues:`` set operators),
``NotPrincipal``. A decision that rests on an unknown says which one (:attr:`Decision.unknown`). How an unknown
weighs is the caller's choice (``unknowns=`` of :func:`evaluate`): kept as UNKNOWN where it could change the
outcome (the S3 and EFS contracts; the EFS one first reports any unknown of a statement that covers the
request), or taken against the request (the image-pull contract: an Allow that may apply grants nothing, a Deny
that may apply denies).

This module is the one implementation of statement matching and condition evaluation for the contracts:
:mod:`.s3`, :mod:`.identity` (ECR pulls) and :mod:`.storage` (EFS mounts) keep only their service's rules.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

ALLOW = "allow"
DENY = "deny"
"""An explicit Deny applies."""
IMPLICIT_DENY = "implicit-deny"
"""No statement allows (nor explicitly denies)."""
UNKNOWN = "unknown"
"""The outcome rests on something that cannot be evaluated from the plan (see :attr:`Decision.unknown`)."""

UNKNOWNS_KEPT = "kept"
"""A statement that may apply makes the decision UNKNOWN only where it could change it (an explicit Deny wins, no
Allow at all is an implicit deny)."""
UNKNOWNS_AGAINST = "against"
"""What cannot be evaluated is taken against the request: an Allow that may apply grants nothing (the request
context is unknown), a Deny that may apply denies."""
_UNKNOWNS = (UNKNOWNS_KEPT, UNKNOWNS_AGAINST)

_NEGATED = {"StringNotEquals", "StringNotEqualsIgnoreCase", "StringNotLike", "ArnNotEquals", "ArnNotLike",
            "NumericNotEquals"}
_NUMERIC = {"NumericEquals": float.__eq__, "NumericLessThan": float.__lt__, "NumericLessThanEquals": float.__le__,
            "NumericGreaterThan": float.__gt__, "NumericGreaterThanEquals": float.__ge__}
_SUPPORTED = {"StringEquals", "StringEqualsIgnoreCase", "StringLike", "ArnLike", "ArnEquals", "Bool", *_NUMERIC}
"""The positive forms of the operators evaluated here (``Null`` aside); their ``Not`` forms are in ``_NEGATED``."""


@dataclass(frozen=True)
class Request:
    """One request as IAM sees it: who, what, on which resource, with which context keys."""

    principal: str
    """The caller's ARN (an IAM role's ARN for an IRSA session, an OIDC provider's for AssumeRoleWithWebIdentity)."""
    action: str
    """``service:Action``, e.g. ``s3:GetObject``."""
    resource: str
    """The resource's ARN."""
    context: Mapping[str, str | tuple[str, ...] | None] = field(default_factory=dict)
    """Known condition keys: a value, several, or None (known absent). A key not here is unknown."""

    @property
    def account(self) -> str:
        parts = self.principal.split(":")
        return parts[4] if len(parts) > 4 else ""


@dataclass(frozen=True)
class Decision:
    effect: str
    """ALLOW, DENY, IMPLICIT_DENY or UNKNOWN."""
    statements: tuple[str, ...] = ()
    """The Sids (or indexes) of the statements that decided it."""
    unknown: tuple[str, ...] = ()
    """What could not be evaluated (condition keys, operators, elements)."""
    via_account: bool = False
    """The allowing statement names the caller's account (``arn:aws:iam::<acct>:root``), not the caller: in a
    resource policy that delegates to the account's identity policies (AWS KMS "Default key policy")."""

    @property
    def allowed(self) -> bool:
        return self.effect == ALLOW

    def __str__(self) -> str:
        why = f" by {', '.join(self.statements)}" if self.statements else ""
        unk = f" (cannot evaluate: {', '.join(self.unknown)})" if self.unknown else ""
        return f"{self.effect}{why}{unk}"


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _glob(pattern: str, value: str, *, fold: bool = False) -> bool:
    """IAM wildcards: ``*`` any run of characters, ``?`` one character; nothing else is special."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, re.IGNORECASE | re.DOTALL if fold else re.DOTALL) is not None


def _arn_like(pattern: str, arn: str) -> bool:
    """ArnLike/ArnEquals: each of the six colon-delimited parts matched on its own, with wildcards."""
    want, got = pattern.split(":", 5), arn.split(":", 5)
    return len(want) == len(got) == 6 and all(_glob(w, g) for w, g in zip(want, got, strict=True))


class _Unknown(Exception):
    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


def _and(results: Iterable[bool | None]) -> bool | None:
    out: bool | None = True
    for r in results:
        if r is False:
            return False
        if r is None:
            out = None
    return out


def _principal_matches(stmt: dict[str, Any], req: Request) -> tuple[bool | None, bool, str | None]:
    """(matches, via the account root, what is unknown) for a resource policy's Principal."""
    if "NotPrincipal" in stmt:
        return None, False, "NotPrincipal"
    principal = stmt.get("Principal")
    if principal == "*":
        return True, False, None
    if not isinstance(principal, dict):
        return False, False, None
    for kind, ids in principal.items():
        for p in _as_list(ids):
            if p == "*" and kind == "AWS":
                return True, False, None
            if p == req.principal:
                return True, False, None
            # The account (its id, or its root in the caller's partition: a request never crosses partitions).
            if kind == "AWS" and req.account and (p == req.account or re.fullmatch(
                    rf"arn:aws[a-z-]*:iam::{req.account}:root", str(p))):
                return True, True, None
    return False, False, None


def evaluate_condition(block: Mapping[str, Any], ctx: Mapping[str, Any]) -> tuple[bool | None, list[str]]:
    """A statement's Condition block against the request context: True, False, or None with what was unknown.

    IAM user guide, "IAM JSON policy elements: Condition operators" and "Conditions with multiple context keys or
    values": every operator and every key must hold, any value of a key may match (none may, for a negated
    operator). A key absent from the request (None in ``ctx``): a positive operator is false, a negated one
    (``StringNotEquals``...) true, ``...IfExists`` true, ``Null: true`` true. Condition key names are not case
    sensitive ("IAM JSON policy elements: Condition"). A key not in ``ctx`` at all, an operator outside the
    subset, a set operator: unknown (None), named in the list; a definite False among the conjuncts still wins.
    """
    folded = {str(k).lower(): v for k, v in ctx.items()}
    results: list[bool | None] = []
    unknown: list[str] = []
    for op, keys in block.items():
        for key, values in keys.items():
            try:
                results.append(_operator(op, key, [str(v).lower() if isinstance(v, bool) else str(v)
                                                   for v in _as_list(values)], folded))
            except _Unknown as u:
                results.append(None)
                unknown.append(u.what)
    return _and(results), unknown


def _operator(op: str, key: str, values: list[str], ctx: Mapping[str, Any]) -> bool:
    """One operator on one key; ``ctx`` keyed by lower-cased key names."""
    if ":" in op:  # ForAnyValue: / ForAllValues: set operators
        raise _Unknown(f"{op} on {key}")
    if_exists = op.endswith("IfExists")
    base = op.removesuffix("IfExists")
    negated = base in _NEGATED
    positive = base.replace("Not", "", 1) if negated else base
    if base != "Null" and positive not in _SUPPORTED:  # before the key: a negated one is true on an absent key
        raise _Unknown(f"operator {op}")
    if key.lower() not in ctx:
        raise _Unknown(key)
    got = ctx[key.lower()]
    if base == "Null":
        absent = got is None
        return any((v.lower() == "true") == absent for v in values)
    if got is None:  # known absent
        return True if if_exists else negated
    actual = list(got) if isinstance(got, tuple) else [got]
    if len(actual) != 1:
        raise _Unknown(f"{key} (several values under {op})")
    a = str(actual[0])
    if positive == "StringEquals":
        hit = any(a == v for v in values)
    elif positive == "StringEqualsIgnoreCase":
        hit = any(a.lower() == v.lower() for v in values)
    elif positive == "StringLike":
        hit = any(_glob(v, a) for v in values)
    elif positive in ("ArnLike", "ArnEquals"):
        hit = any(_arn_like(v, a) for v in values)
    elif positive == "Bool":
        hit = any(a.lower() == v.lower() for v in values)
    else:
        try:
            hit = any(_NUMERIC[positive](float(a), float(v)) for v in values)
        except ValueError:
            raise _Unknown(f"{key} (not a number under {op})") from None
    return not hit if negated else hit


def covers(stmt: Mapping[str, Any], action: str, resource: str, *, resource_policy: bool = False) -> bool:
    """Whether a statement's Action/NotAction and Resource/NotResource cover the request (IAM JSON policy element
    reference, "Action", "NotAction", "Resource", "NotResource"): actions case-insensitive, resources case
    sensitive, ``*``/``?`` wildcards; a resource policy may leave Resource out (its own resource)."""
    if "Action" in stmt:
        action_ok = any(_glob(a, action, fold=True) for a in _as_list(stmt["Action"]))
    else:
        action_ok = not any(_glob(a, action, fold=True) for a in _as_list(stmt.get("NotAction", [])))
    if not action_ok:
        return False
    if "Resource" in stmt:
        return any(_glob(r, resource) for r in _as_list(stmt["Resource"]))
    if "NotResource" in stmt:
        return not any(_glob(r, resource) for r in _as_list(stmt["NotResource"]))
    return resource_policy


def _statement_applies(stmt: dict[str, Any], req: Request, resource_policy: bool
                       ) -> tuple[bool | None, bool, list[str]]:
    unknown: list[str] = []
    via_account = False
    if resource_policy:
        match, via_account, what = _principal_matches(stmt, req)
        if what:
            unknown.append(what)
        if match is False:
            return False, False, []
    else:
        match = True
    if not covers(stmt, req.action, req.resource, resource_policy=resource_policy):
        return False, False, []
    cond, what_c = evaluate_condition(stmt.get("Condition") or {}, req.context)
    unknown += what_c
    return _and([match, cond]), via_account, unknown


def _sid(index: int, stmt: Mapping[str, Any]) -> str:
    return str(stmt.get("Sid") or f"Statement[{index}]")


def evaluate(policy: str | Mapping[str, Any], req: Request, *, resource_policy: bool = False,
             unknowns: str = UNKNOWNS_KEPT, label: Callable[[int, Mapping[str, Any]], str] = _sid) -> Decision:
    """One policy document against one request (``resource_policy``: match the Principal element too).

    ``unknowns``: how a statement that may apply weighs (UNKNOWNS_KEPT, UNKNOWNS_AGAINST).
    ``label``: how :attr:`Decision.statements` names a statement (its Sid, else ``Statement[i]``), in the
    policy's order.
    """
    if unknowns not in _UNKNOWNS:
        raise ValueError(f"unknowns: got {unknowns!r}; expected one of {_UNKNOWNS}")
    doc = json.loads(policy) if isinstance(policy, str) else policy
    deny: list[str] = []
    deny_maybe: list[str] = []
    allow: list[str] = []
    allow_maybe: list[str] = []
    unknown: list[str] = []
    via_account = True
    for i, stmt in enumerate(_as_list(doc.get("Statement", []))):
        deny_side = stmt.get("Effect") == "Deny"
        if not deny_side and stmt.get("Effect") != "Allow":
            continue  # "Effect": Allow or Deny, nothing else (IAM JSON policy element reference, "Effect")
        applies, via, what = _statement_applies(stmt, req, resource_policy)
        if applies is False:
            continue
        if applies is None and unknowns == UNKNOWNS_AGAINST:
            if not deny_side:
                continue  # a conditional Allow grants nothing
            applies = True  # a conditional Deny denies
        sid = label(i, stmt)
        if applies:
            (deny if deny_side else allow).append(sid)
            if not deny_side:
                via_account = via_account and via
        else:
            (deny_maybe if deny_side else allow_maybe).append(sid)
            unknown += what
    if deny:
        return Decision(DENY, tuple(deny))
    if not allow and not allow_maybe:
        return Decision(IMPLICIT_DENY)
    if deny_maybe:
        return Decision(UNKNOWN, tuple(deny_maybe), tuple(dict.fromkeys(unknown)))
    if allow:
        return Decision(ALLOW, tuple(allow), via_account=via_account)
    return Decision(UNKNOWN, tuple(allow_maybe), tuple(dict.fromkeys(unknown)))


def evaluate_all(policies: Iterable[str | Mapping[str, Any]], req: Request) -> Decision:
    """Several identity policies of one principal (inline and attached) act as one: their statements pooled."""
    pooled: list[Any] = []
    for p in policies:
        doc = json.loads(p) if isinstance(p, str) else p
        pooled += _as_list(doc.get("Statement", []))
    return evaluate({"Statement": pooled}, req)


def glob_match(pattern: str, value: str, *, fold: bool = False) -> bool:
    """IAM's wildcard match (for callers matching resource names; ``fold``: case-insensitive, as for actions)."""
    return _glob(pattern, value, fold=fold)
