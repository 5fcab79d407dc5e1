"""Preflight's capacity checks: a named on-demand capacity reservation or capacity block (exists, active, type,
zone, kind, free instances counting this cluster's own nodes in it) and placement groups (exist, the
reservation's own, a *cluster* group for EFA). Split from :mod:`eks_ddp.tooling.preflight` (a mixin of its checker,
which supplies ``cfg``, ``ec2``, ``cluster_name``, ``attempt``, ``fail`` and ``warn``)."""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from eks_ddp.config import NodeGroupConfig
from eks_ddp.tooling.preflight import live as preflight_live


class CapacityChecks:
    """Reservation and placement-group checks of :class:`eks_ddp.tooling.preflight.checker._Checker`."""

    cfg: Any
    ec2: Any
    cluster_name: str | None
    _reservations: dict[int, dict[str, Any]]

    if TYPE_CHECKING:  # supplied by the checker this is a mixin of
        def attempt(self, service: str, action: str, what: str, fn: Callable[[], Any]) -> Any: ...
        def fail(self, message: str) -> None: ...
        def warn(self, message: str) -> None: ...

    def check_reservations(self) -> None:
        for i, g in enumerate(self.cfg.node_groups):
            if g.capacity_reservation_id is not None:
                self._check_reservation(i, g, g.capacity_reservation_id)

    def _check_reservation(self, i: int, g: NodeGroupConfig, cr_id: str) -> None:
        key = f"nodeGroups[{i}]"
        try:
            found = self.attempt("ec2", "DescribeCapacityReservations", f"capacity reservation {cr_id}",
                                 lambda: self._describe_reservation(cr_id))
        except _ReservationNotFound as err:
            self.fail(f"{key}.capacityReservationId: {cr_id} was not found in {self.cfg.region} ({err}); "
                      f"check the id and aws:region, or remove {key}.capacityReservationId")
            return
        if found is None:
            return
        state = found.get("State", "unknown")
        cr_type, cr_az = found.get("InstanceType"), found.get("AvailabilityZone")
        free, total = int(found.get("AvailableInstanceCount", 0)), int(found.get("TotalInstanceCount", 0))
        is_block = found.get("ReservationType") == "capacity-block"
        if state != "active":
            if is_block and state == "scheduled" and g.desired_size == 0:
                self.warn(f"{key}.capacityReservationId: capacity block {cr_id} starts at {found.get('StartDate')}; "
                          "nodes cannot launch before then")
            else:
                extra = f" (starts {found.get('StartDate')}); set {key}.desiredSize 0 until then" \
                    if state == "scheduled" else ""
                self.fail(f"{key}.capacityReservationId: {cr_id} is {state}, not active{extra}; "
                          f"use an active reservation or remove {key}.capacityReservationId")
        if cr_type != g.instance_type:
            self.fail(f"{key}.instanceType: {g.instance_type}, but capacity reservation {cr_id} reserves {cr_type}; "
                      f"set {key}.instanceType to {cr_type} or use a reservation for {g.instance_type}")
        if cr_az != g.availability_zone:
            self.fail(f"{key}.availabilityZone: {g.availability_zone}, but capacity reservation {cr_id} is in "
                      f"{cr_az}; set {key}.availabilityZone to {cr_az}")
        if is_block != (g.capacity_type == "capacityBlock"):
            want = "capacityBlock" if is_block else "onDemand"
            self.fail(f"{key}.capacityType: {g.capacity_type}, but {cr_id} is "
                      f"{'a capacity block' if is_block else 'an on-demand capacity reservation'}; "
                      f"set {key}.capacityType to {want}")
        if is_block:
            self._check_block_window(key, g, cr_id, found)
        self._check_reservation_placement(key, g, cr_id, found)
        # GPU groups start at zero: what must fit is what the autoscaler will ask for when the job runs.
        # This cluster's own nodes in the reservation are the stack's demand, not someone else's use of it.
        own = self.own_in_reservation(cr_id)
        free += own
        found = {**found, "AvailableInstanceCount": free}
        need, need_key = g.desired_size, f"{key}.desiredSize"
        for r, run in enumerate(self.cfg.runs):  # the largest run on this group must fit at its full size
            if self.cfg.group_of(run).name == g.name and run.nodes > need:
                need, need_key = run.nodes, f"{self.cfg.run_key(r)}.nodes"
        if state == "active" and free < need:  # an inactive reservation failed above; its counts mean nothing
            self.fail(f"{need_key}: {need} nodes, but capacity reservation {cr_id} has only "
                      f"{free} of {total} instances free; lower {need_key} to {free} or free instances")
        elif free < g.max_size:
            self.warn(f"{key}.maxSize: {g.max_size} nodes, but capacity reservation {cr_id} has {free} instances "
                      f"free; nodes beyond {free} will not launch into it")
        self._reservations[i] = found

    def _check_block_window(self, key: str, g: NodeGroupConfig, cr_id: str, found: dict[str, Any]) -> None:
        """The stack's window of a capacity block is the block's (``StartDate``/``EndDate`` of
        DescribeCapacityReservations): the runs are gated and the Auto Scaling group scheduled by it."""
        live = {"Start": found.get("StartDate"), "End": found.get("EndDate")}
        text = {k: v.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if isinstance(v, dt.datetime) else v
                for k, v in live.items()}
        window = g.capacity_block_window
        if window is None:
            self.warn(f"{key}.capacityBlockStart: not set for capacity block {cr_id}; set capacityBlockStart "
                      f"{text['Start']} and capacityBlockEnd {text['End']} so no run asks for nodes before the start "
                      "and the group is scaled to zero before the end")
            return
        for (name, want), got in zip(live.items(), window, strict=True):
            if isinstance(want, dt.datetime) and want.astimezone(dt.UTC) != got:
                self.fail(f"{key}.capacityBlock{name}: got {got.strftime('%Y-%m-%dT%H:%M:%SZ')}, but capacity block "
                          f"{cr_id} {name.lower()}s at {text[name]}; set {key}.capacityBlock{name} {text[name]}")

    def own_in_reservation(self, cr_id: str) -> int:
        """Running instances of this cluster launched into reservation ``cr_id``."""
        if self.cluster_name is None:
            return 0
        def count() -> int:
            pages = self.ec2.get_paginator("describe_instances").paginate(Filters=[
                {"Name": "instance-state-name", "Values": ["pending", "running"]},
                {"Name": f"tag:{preflight_live.OWNER_TAG}", "Values": [self.cluster_name]}])
            return sum(1 for page in pages for res in page["Reservations"] for inst in res["Instances"]
                       if inst.get("CapacityReservationId") == cr_id)
        return self.attempt("ec2", "DescribeInstances", f"this cluster's nodes in {cr_id}", count) or 0

    def _check_reservation_placement(self, key: str, g: NodeGroupConfig, cr_id: str, found: dict[str, Any]) -> None:
        cr_pg = placement_group_of(found.get("PlacementGroupArn"))
        if cr_pg is not None and g.placement_group_name != cr_pg:
            got = f"{g.placement_group_name!r}" if g.placement_group_name else "not set"
            self.fail(f"{key}.placementGroupName: {got}, but capacity reservation {cr_id} was created in placement "
                      f"group {cr_pg!r}; instances that target it must launch there: set {key}.placementGroupName "
                      f"to {cr_pg}")
        elif cr_pg is None and g.placement_group_name is not None:
            self.warn(f"{key}.placementGroupName: {g.placement_group_name!r}, but capacity reservation {cr_id} is not "
                      "in a placement group, so co-location of its instances is not reserved; launches into the "
                      f"group may not find capacity. Remove {key}.placementGroupName or use a reservation created "
                      "in that group")

    def check_placement_groups(self) -> None:
        for i, g in enumerate(self.cfg.node_groups):
            if g.placement_group_name is None:
                continue
            key, name = f"nodeGroups[{i}].placementGroupName", g.placement_group_name
            try:
                found = self.attempt("ec2", "DescribePlacementGroups", f"placement group {name}",
                                     functools.partial(self._describe_placement_group, name))
            except _PlacementGroupNotFound:
                self.fail(f"{key}: placement group {name!r} was not found in {self.cfg.region}; create it (or the "
                          f"reservation in it) first, or remove {key}")
                continue
            if found is None:
                continue
            if found.get("State") not in (None, "available"):
                self.fail(f"{key}: placement group {name!r} is {found.get('State')}, not available")
            if g.efa and found.get("Strategy") != "cluster":
                self.fail(f"{key}: placement group {name!r} has strategy {found.get('Strategy')!r}; EFA needs a "
                          "'cluster' group (all nodes on one low-latency segment)")

    def _describe_placement_group(self, name: str) -> dict[str, Any]:
        try:
            found = self.ec2.describe_placement_groups(GroupNames=[name])["PlacementGroups"]
        except ClientError as err:
            if err.response.get("Error", {}).get("Code", "") == "InvalidPlacementGroup.Unknown":
                raise _PlacementGroupNotFound(name) from None
            raise
        if not found:
            raise _PlacementGroupNotFound(name)
        return found[0]

    def _describe_reservation(self, cr_id: str) -> dict[str, Any]:
        try:
            found = self.ec2.describe_capacity_reservations(CapacityReservationIds=[cr_id])["CapacityReservations"]
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code", "")
            if code.startswith("InvalidCapacityReservationId"):
                raise _ReservationNotFound(code) from None
            raise
        if not found:
            raise _ReservationNotFound("no such reservation")
        return found[0]


class _ReservationNotFound(Exception):
    """The reservation id does not exist for this account and region."""


class _PlacementGroupNotFound(Exception):
    """The placement group does not exist for this account and region."""


def placement_group_of(arn: str | None) -> str | None:
    """The name in ``arn:aws:ec2:<region>:<account>:placement-group/<name>``, None for no ARN."""
    if not arn:
        return None
    return arn.split(":placement-group/", 1)[-1]
