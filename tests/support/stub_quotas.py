"""The AWS answers moto 5.2.5 lacks, in one place.

- Service Quotas: moto knows only the "vpc" service's quotas, not EC2's vCPU quotas.
- EC2 capacity reservations: moto implements neither create_ nor describe_capacity_reservations
  (:func:`no_reservations_by_default` answers "none" for every client; :func:`add_reservations` gives one some).
- EC2 placement groups: moto implements neither create_ nor describe_placement_groups.

:class:`StubQuotas` stands in for the ``service-quotas`` client. :func:`add_reservations`
answers ``DescribeCapacityReservations`` on a (moto) EC2 client from a list of dicts
shaped like the real response, raising the real error code for unknown ids; every
other EC2 call still goes to moto.
"""

from __future__ import annotations

import contextlib
from typing import Any

from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError

from eks_ddp.tooling.preflight import QUOTAS
from eks_ddp.tooling.preflight.network_quotas import EIP_QUOTA, VPC_QUOTA

# Generous default so only the quota a test lowers can fail.
DEFAULT_VCPUS = 10_000.0
#: The service each quota code belongs to: asking for a code under another service is a test failure.
SERVICE_OF = {code: "ec2" for code, _ in QUOTAS.values()} | {VPC_QUOTA[1]: VPC_QUOTA[0], EIP_QUOTA[1]: EIP_QUOTA[0]}


def client_error(code: str, operation: str, message: str = "") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message or code}}, operation)


class StubQuotas:
    """``service-quotas`` client: applied EC2 quota values by code; records the codes asked for."""

    def __init__(self, values: dict[str, float] | None = None, *, error: ClientError | None = None,
                 default_only: bool = False):
        self.values = {code: DEFAULT_VCPUS for code in SERVICE_OF} | (values or {})
        self.error = error
        self.default_only = default_only
        self.asked: list[str] = []

    def _answer(self, code: str) -> dict[str, Any]:
        if code not in self.values:
            raise client_error("NoSuchResourceException", "GetServiceQuota", f"quota {code} not found")
        return {"Quota": {"ServiceCode": SERVICE_OF.get(code, "ec2"), "QuotaCode": code, "Value": self.values[code],
                          "Unit": "None"}}

    def get_service_quota(self, *, ServiceCode: str, QuotaCode: str) -> dict[str, Any]:  # noqa: N803 (boto3 names)
        assert ServiceCode == SERVICE_OF.get(QuotaCode, "ec2"), (ServiceCode, QuotaCode)
        self.asked.append(QuotaCode)
        if self.error is not None:
            raise self.error
        if self.default_only:
            raise client_error("NoSuchResourceException", "GetServiceQuota")
        return self._answer(QuotaCode)

    def get_aws_default_service_quota(self, *, ServiceCode: str, QuotaCode: str) -> dict[str, Any]:  # noqa: N803
        assert ServiceCode == SERVICE_OF.get(QuotaCode, "ec2"), (ServiceCode, QuotaCode)
        return self._answer(QuotaCode)


def reservation(cr_id: str, instance_type: str, zone: str, *, total: int = 2, available: int | None = None,
                state: str = "active", reservation_type: str = "default",
                placement_group: str | None = None) -> dict[str, Any]:
    """One entry of DescribeCapacityReservations' ``CapacityReservations`` (``placement_group``: the
    cluster placement group it was created in, returned as ``PlacementGroupArn``)."""
    extra = {"PlacementGroupArn": f"arn:aws:ec2:{zone[:-1]}:123456789012:placement-group/{placement_group}"} \
        if placement_group else {}
    return extra | {
        "CapacityReservationId": cr_id,
        "InstanceType": instance_type,
        "InstancePlatform": "Linux/UNIX",
        "AvailabilityZone": zone,
        "Tenancy": "default",
        "TotalInstanceCount": total,
        "AvailableInstanceCount": total if available is None else available,
        "State": state,
        "InstanceMatchCriteria": "targeted",
        "ReservationType": reservation_type,
    }


def add_reservations(ec2: Any, reservations: list[dict[str, Any]]) -> None:
    """Answer DescribeCapacityReservations on ``ec2`` from ``reservations`` (short-circuits before moto)."""
    by_id = {r["CapacityReservationId"]: r for r in reservations}

    def answer(params: dict[str, Any], **_: Any) -> tuple[Any, dict[str, Any]]:
        # ``params`` is the serialized EC2 query request: CapacityReservationId.1, .2, ...
        body = params.get("body") or {}
        ids = [v for k, v in sorted(body.items()) if k.startswith("CapacityReservationId.")] or list(by_id)
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise client_error("InvalidCapacityReservationId.NotFound", "DescribeCapacityReservations",
                               f"The capacity reservation ID '{missing[0]}' does not exist")
        return AWSResponse("https://ec2.amazonaws.com/", 200, {}, None), {
            "CapacityReservations": [by_id[i] for i in ids], "ResponseMetadata": {"HTTPStatusCode": 200}}

    # A before-call handler that returns (http, parsed) stands in for the HTTP request; first, ahead of the
    # account-wide default of :func:`no_reservations_by_default`.
    ec2.meta.events.register_first("before-call.ec2.DescribeCapacityReservations", answer)


def _no_reservations(params: dict[str, Any], **_: Any) -> tuple[Any, dict[str, Any]]:
    return AWSResponse("https://ec2.amazonaws.com/", 200, {}, None), {
        "CapacityReservations": [], "ResponseMetadata": {"HTTPStatusCode": 200}}


_DEFAULT_HANDLER = ("before-call.ec2.DescribeCapacityReservations", _no_reservations)


@contextlib.contextmanager
def no_reservations_by_default():
    """Every EC2 client made meanwhile answers DescribeCapacityReservations with an account that has none (moto
    does not implement it), unless :func:`add_reservations` gave it some: as moto does, through botocore's
    ``BUILTIN_HANDLERS``, which every new session registers."""
    from botocore.handlers import BUILTIN_HANDLERS

    BUILTIN_HANDLERS.append(_DEFAULT_HANDLER)
    try:
        yield
    finally:
        BUILTIN_HANDLERS.remove(_DEFAULT_HANDLER)


def add_placement_groups(ec2: Any, groups: dict[str, str]) -> None:
    """Answer DescribePlacementGroups on ``ec2`` from ``{name: strategy}`` (real error code for unknown names)."""

    def answer(params: dict[str, Any], **_: Any) -> tuple[Any, dict[str, Any]]:
        body = params.get("body") or {}
        names = [v for k, v in sorted(body.items()) if k.startswith("GroupName.")] or list(groups)
        missing = [n for n in names if n not in groups]
        if missing:
            raise client_error("InvalidPlacementGroup.Unknown", "DescribePlacementGroups",
                               f"The Placement Group '{missing[0]}' is unknown.")
        return AWSResponse("https://ec2.amazonaws.com/", 200, {}, None), {
            "PlacementGroups": [{"GroupName": n, "State": "available", "Strategy": groups[n],
                                 "GroupId": f"pg-{i:017x}"} for i, n in enumerate(names)],
            "ResponseMetadata": {"HTTPStatusCode": 200}}

    ec2.meta.events.register("before-call.ec2.DescribePlacementGroups", answer)


def deny(ec2: Any, operation: str, code: str = "UnauthorizedOperation") -> None:
    """Make one EC2 operation fail the way IAM denies it."""

    def refuse(**_: Any) -> None:
        raise client_error(code, operation, "You are not authorized to perform this operation.")

    ec2.meta.events.register(f"before-call.ec2.{operation}", refuse)
