"""GpuNodeGroup's AMI release pin and a capacity block's window on its Auto Scaling group (under mocks)."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from eks_ddp.core import k8s_versions
from eks_ddp.infra.gpu_nodegroup import BLOCK_HOLD_CRON, BLOCK_HOLD_LEAD, BLOCK_SCALE_DOWN_BEFORE_END
from tests.infra.test_gpu_nodegroup import BASE, NG, _run

SCHEDULE = "aws:autoscaling/schedule:Schedule"
CB = dataclasses.replace(BASE, group_name="h100", instance_type="p5.48xlarge", capacity_type="capacityBlock",
                         capacity_reservation_id="cr-0123456789abcdef0", availability_zone="us-west-2a",
                         desired_size=0, kubernetes_version="1.35")


def _window(start_in: dt.timedelta, days: int = 7) -> tuple[dt.datetime, dt.datetime]:
    start = (dt.datetime.now(dt.UTC) + start_in).replace(microsecond=0)
    return start, start + dt.timedelta(days=days)


def test_node_groups_pin_their_ami_release():
    # Review B16: without release_version a group kept the AMI it was created with until the next minor upgrade.
    result, _ = _run(dataclasses.replace(BASE, kubernetes_version="1.35"))
    assert result.one(NG).inputs["releaseVersion"] == k8s_versions.AMI_RELEASE_VERSIONS["1.35"]
    result, _ = _run(dataclasses.replace(BASE, kubernetes_version="1.35", release_version="1.35.5-20260601"))
    assert result.one(NG).inputs["releaseVersion"] == "1.35.5-20260601"
    with pytest.raises(ValueError, match=r"release_version: got '1.34.9-20260714'; expected an EKS AMI release "
                                         r"version of Kubernetes 1.35"):
        _run(dataclasses.replace(BASE, kubernetes_version="1.35", release_version="1.34.9-20260714"))


def test_a_future_block_opens_at_its_start_and_closes_an_hour_before_its_end():
    # Review B18: the autoscaler knew nothing of the window; EC2 reclaims the instances 30 minutes before the end.
    start, end = _window(dt.timedelta(days=2))
    result, _ = _run(dataclasses.replace(CB, capacity_block_window=(start, end)))
    actions = {s.inputs["scheduledActionName"]: s.inputs for s in result.of_type(SCHEDULE)}
    opened = actions["eks-ddp-cr-0123456789abcdef0-open"]
    closed = actions["eks-ddp-cr-0123456789abcdef0-close"]
    assert opened["startTime"] == start.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert (int(opened["minSize"]), int(opened["maxSize"]), int(opened["desiredCapacity"])) == (0, CB.max_size, -1)
    assert closed["startTime"] == (end - BLOCK_SCALE_DOWN_BEFORE_END).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert (int(closed["minSize"]), int(closed["maxSize"]), int(closed["desiredCapacity"])) == (0, 0, 0)
    assert BLOCK_SCALE_DOWN_BEFORE_END > dt.timedelta(minutes=40)  # before EKS's own scale-down and EC2's reclaim


def test_a_future_block_is_held_at_zero_until_its_start():
    """W6: EKS makes the Auto Scaling group with max maxSize, so "open" alone changed nothing and the autoscaler
    could launch into the block before it starts; a recurring hold keeps max 0 until just before "open"."""
    start, end = _window(dt.timedelta(days=2))
    result, _ = _run(dataclasses.replace(CB, capacity_block_window=(start, end)))
    actions = {s.inputs["scheduledActionName"]: s.inputs for s in result.of_type(SCHEDULE)}
    hold = actions["eks-ddp-cr-0123456789abcdef0-hold"]
    assert (int(hold["minSize"]), int(hold["maxSize"]), int(hold["desiredCapacity"])) == (0, 0, 0)
    assert hold["recurrence"] == BLOCK_HOLD_CRON and "startTime" not in hold  # from now on
    assert hold["endTime"] == (start - BLOCK_HOLD_LEAD).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert hold["endTime"] < actions["eks-ddp-cr-0123456789abcdef0-open"]["startTime"]
    # Negative control: a block that starts within the lead, or has started, is not held.
    soon, _ = _window(dt.timedelta(minutes=3))
    result, _ = _run(dataclasses.replace(CB, capacity_block_window=(soon, soon + dt.timedelta(days=7))))
    assert "eks-ddp-cr-0123456789abcdef0-hold" not in {s.inputs["scheduledActionName"] for s in result.of_type(SCHEDULE)}


def test_a_started_block_gets_only_its_close_and_no_window_no_schedule():
    start, end = _window(-dt.timedelta(days=1))
    result, _ = _run(dataclasses.replace(CB, capacity_block_window=(start, end)))
    assert [s.inputs["scheduledActionName"] for s in result.of_type(SCHEDULE)] == ["eks-ddp-cr-0123456789abcdef0-close"]
    result, _ = _run(CB)
    assert result.of_type(SCHEDULE) == []


def test_a_window_needs_a_capacity_block_and_an_end_after_its_start():
    start, end = _window(dt.timedelta(days=2))
    with pytest.raises(ValueError, match="capacity_block_window: set with capacity_type 'onDemand'"):
        _run(dataclasses.replace(CB, capacity_type="onDemand", capacity_block_window=(start, end)))
    with pytest.raises(ValueError, match="expected .start, end. in UTC with end after start"):
        _run(dataclasses.replace(CB, capacity_block_window=(end, start)))
