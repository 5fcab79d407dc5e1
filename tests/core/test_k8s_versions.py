"""Kubernetes version calendar, upgrade policy and add-on builds per version."""

from __future__ import annotations

import datetime as dt

import pulumi
import pytest

from eks_ddp.config import DEFAULT_KUBERNETES_VERSION, SUPPORTED_KUBERNETES_VERSIONS
from eks_ddp.core import k8s_versions
from eks_ddp.infra.addons import ClusterAddons, ClusterAddonsArgs
from eks_ddp.tooling.mocks import run_program
from tests.support.util import at_version, run, set_path, stack_config

REVIEW_DAY = dt.date(2026, 11, 22)


def test_default_version_is_in_standard_support_on_the_review_day_and_for_a_month_after_today():
    assert k8s_versions.support_on(DEFAULT_KUBERNETES_VERSION, REVIEW_DAY) == "standard"
    # Fails when the calendar needs its next review: the default must not drift into extended support.
    end = k8s_versions.KUBERNETES_SUPPORT_CALENDAR[DEFAULT_KUBERNETES_VERSION].end_of_standard
    assert (end - dt.date.today()).days > 30, f"default {DEFAULT_KUBERNETES_VERSION} leaves standard support on {end}"


def test_calendar_dates_as_published():
    cal = k8s_versions.KUBERNETES_SUPPORT_CALENDAR
    assert cal["1.33"].end_of_standard == dt.date(2026, 7, 29)
    assert cal["1.34"].end_of_standard == dt.date(2026, 12, 2)
    assert cal["1.35"].released == dt.date(2026, 1, 28)
    for r in cal.values():
        assert r.released < r.end_of_standard < r.end_of_extended and r.source
    assert k8s_versions.support_on("1.33", REVIEW_DAY) == "extended"
    assert k8s_versions.support_on("1.31", dt.date(2026, 11, 27)) == "ended"


def test_every_supported_version_is_in_the_calendar_and_not_past_extended_support():
    for v in SUPPORTED_KUBERNETES_VERSIONS:
        assert k8s_versions.support_on(v, REVIEW_DAY) in ("standard", "extended"), v


def test_support_notice_says_the_price_and_the_fix():
    text = k8s_versions.support_notice("1.33", "EXTENDED", REVIEW_DAY)
    assert "eks-ddp:cluster.kubernetesVersion" in text and "$0.60/h" in text and "1.35" in text
    assert "STANDARD only for a version in standard support" in k8s_versions.support_notice("1.32", "STANDARD",
                                                                                           REVIEW_DAY)
    assert k8s_versions.support_notice("1.35", "STANDARD", REVIEW_DAY) is None
    assert "2026-12-02" in k8s_versions.support_notice("1.34", "STANDARD", REVIEW_DAY)  # 10 days left


def test_program_sets_standard_upgrade_policy_and_the_default_version():
    result = run(stack_config("dev"))
    eks = result.one("eks:index:Cluster").inputs
    # EKS defaults an unset policy to EXTENDED ($0.60/h once standard support ends).
    assert eks["upgradePolicy"] == {"supportType": "STANDARD"}
    assert eks["version"] == DEFAULT_KUBERNETES_VERSION


def test_upgrade_policy_is_a_config_key():
    result = run(set_path(stack_config("dev"), "eks-ddp:cluster.upgradePolicy", "EXTENDED"))
    assert result.one("eks:index:Cluster").inputs["upgradePolicy"] == {"supportType": "EXTENDED"}


def _addon_versions(version: str) -> tuple[dict[str, str], list]:
    result = run(at_version(stack_config("dev"), version))
    addons = {a.inputs["addonName"]: a.inputs["addonVersion"] for a in result.of_type("aws:eks/addon:Addon")
              if a.inputs["addonName"] in k8s_versions.EKS_ADDONS}
    lookups = [a for t, a in result.calls if t == "aws:eks/getAddonVersion:getAddonVersion"]
    return addons, lookups


@pytest.mark.parametrize("version", SUPPORTED_KUBERNETES_VERSIONS)
def test_every_allowed_version_gets_addon_builds_made_for_it(version):
    addons, lookups = _addon_versions(version)
    assert set(addons) == set(k8s_versions.EKS_ADDONS)
    for name, build in addons.items():
        pinned = k8s_versions.ADDON_VERSIONS[version][name]
        if pinned is not None:
            assert build == pinned
        else:  # EKS's default build for exactly this cluster version
            assert build == f"v0.0.0-eksbuild.default-{version}"
            assert {"addonName": name, "kubernetesVersion": version, "mostRecent": False} in lookups


def test_metrics_server_follows_the_components_version_argument():
    def program() -> None:
        ClusterAddons("a", ClusterAddonsArgs(cluster_name="c", kubernetes_version="1.33"),
                      opts=pulumi.ResourceOptions())

    result = run_program({}, program=program)
    addon = result.one("aws:eks/addon:Addon").inputs
    assert addon["addonVersion"] == k8s_versions.METRICS_SERVER_ADDON_VERSION_1_33


def test_plan_warns_when_the_stack_version_is_in_extended_support(tmp_path):
    from eks_ddp.tooling import plan

    text = (plan.PROJECT_ROOT / "Pulumi.dev.yaml").read_text()
    (tmp_path / "Pulumi.old.yaml").write_text(text.replace(f'kubernetesVersion: "{DEFAULT_KUBERNETES_VERSION}"',
                                                           'kubernetesVersion: "1.33"')
                                              .replace("upgradePolicy: STANDARD", "upgradePolicy: EXTENDED"))
    (tmp_path / "Pulumi.dev.yaml").write_text(text)
    assert plan.version_warnings("dev", tmp_path, today=REVIEW_DAY) == []
    [notice] = plan.version_warnings("old", tmp_path, today=REVIEW_DAY)
    assert "Kubernetes 1.33 left EKS standard support on 2026-07-29" in notice
