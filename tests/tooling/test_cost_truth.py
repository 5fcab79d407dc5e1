"""The cost estimate tells the truth about reservations, what a destroy leaves billing, and the storage backend."""

from __future__ import annotations

import pytest

from eks_ddp.core import catalog
from eks_ddp.tooling import cost
from tests.support.util import drop_path, set_path, stack_config
from tests.tooling.test_cost import config, dev

P4DE = catalog.CATALOG["p4de.24xlarge"].price_per_hour
CR = "cr-0123456789abcdef0"


def p4de(**paths):
    raw = stack_config("p4de")
    for path, value in paths.items():
        raw = set_path(raw, f"eks-ddp:{path}", value)
    return config(raw)


def test_the_p4de_idle_figure_includes_the_reservation():
    # Review B13: 2 x p4de in an ODCR bill $54.9/h whether nodes run or not; idle said $0.38/h.
    est = cost.estimate(p4de())
    [item] = [i for i in est.items if CR in i.name]
    assert (item.idle_units, item.training_units) == (2, 0)  # the job's 2 nodes use both instances while training
    assert est.idle_per_hour == pytest.approx(2 * P4DE, abs=1.0) and est.idle_per_hour > 2 * P4DE
    text = est.render()
    assert f"while idle:     ${est.idle_per_hour:.2f}/hour" in text and est.idle_per_hour > 55
    assert est.per_run < 1  # a run adds only its root volumes: the instances are paid for either way
    # Negative control: without the reservation the idle GPU figure is zero again.
    free = cost.estimate(config(drop_path(set_path(stack_config("p4de"), "eks-ddp:nodeGroups[0].availabilityZone",
                                                   "us-east-1a"), "eks-ddp:nodeGroups.0.capacityReservationId")))
    assert free.idle_per_hour < 1 and not any(CR in i.name for i in free.items)


def test_a_smaller_run_leaves_the_rest_of_the_reservation_billed_while_training():
    est = cost.estimate(p4de(**{"job.nodes": 1, "job.minNodes": 1}))
    [item] = [i for i in est.items if CR in i.name]
    assert (item.training_units, item.idle_units) == (1, 2)
    assert est.training_per_hour - est.idle_per_hour == pytest.approx(500 * cost.price("ebs_gp3_gb_month") / 730)


def test_after_destroy_the_reservation_keeps_billing_with_the_command_that_cancels_it():
    est = cost.estimate(p4de())
    d = est.as_dict()
    [res] = [i for i in d["after_destroy"] if CR in i["name"]]
    assert res["per_hour"] == pytest.approx(2 * P4DE)
    assert f"aws ec2 cancel-capacity-reservation --capacity-reservation-id {CR}" in res["note"]
    assert d["after_destroy_per_hour"] == pytest.approx(est.after_destroy_per_hour)
    assert est.after_destroy_per_hour > 2 * P4DE
    assert "after destroy:  $" in est.render() and "cancel-capacity-reservation" in est.render()
    # dev keeps only its file system, keys and results: a few dollars a month.
    small = cost.estimate(dev()).as_dict()
    assert 0 < small["after_destroy_per_month"] < 10
    assert {i["name"].split(" (")[0] for i in small["after_destroy"]} == {"kept EFS file system", "kept KMS keys",
                                                                        "kept results bucket"}
    gone = cost.estimate(dev(**{"storage.retainOnDestroy": False})).as_dict()
    assert not any("EFS" in i["name"] for i in gone["after_destroy"])


def test_a_capacity_block_is_in_the_idle_figure_too():
    est = cost.estimate(p4de(**{"nodeGroups[0].capacityType": "capacityBlock"}))
    [item] = [i for i in est.items if CR in i.name]
    assert item.name.startswith("capacity block") and "paid at purchase" in item.note and item.idle_units == 2


@pytest.mark.parametrize("tier,price", [(125, 0.145), (250, 0.210), (500, 0.340), (1000, 0.600)])
def test_the_fsx_backend_is_priced_by_capacity_and_throughput(tier, price):
    est = cost.estimate(p4de(**{"storage.backend": "fsxLustre", "storage.fsxStorageCapacityGiB": 2400,
                                "storage.fsxThroughputPerTiB": tier}))
    [fsx] = [i for i in est.items if i.name.startswith("FSx for Lustre")]
    assert fsx.idle_per_hour == pytest.approx(2400 * price / 730)
    assert not any(i.name.startswith("EFS") for i in est.items)
    assert not any("EFS Elastic" in n for n in est.not_included)
    assert any(i.name.startswith("kept FSx for Lustre") for i in est.after_destroy)
    efs = cost.estimate(p4de())
    assert any(i.name.startswith("EFS Standard") for i in efs.items) and "IA" in next(
        i.note for i in efs.items if i.name.startswith("EFS Standard"))


def test_the_kms_keys_counted_are_the_keys_the_plan_creates(dev_result, p4de_result):
    """W8: every stack makes 3 keys (EKS secrets, the file system's, the results bucket's); 2 were counted."""
    for raw, result in ((stack_config("dev"), dev_result), (stack_config("p4de"), p4de_result)):
        [item] = [i for i in cost.estimate(config(raw)).items if i.name.startswith("KMS keys")]
        assert item.idle_units == item.training_units == len(result.of_type("aws:kms/key:Key")) == 3, item
    adopted = config(set_path(set_path(stack_config("dev"), "eks-ddp:storage.resultsBucket", "my-results-bucket"),
                              "eks-ddp:storage.fileSystemId", "fs-0123456789abcdef0"))
    [item] = [i for i in cost.estimate(adopted).items if i.name.startswith("KMS keys")]
    assert (item.idle_units, item.name) == (1, "KMS keys (EKS secrets)")
