"""Cost estimate: the math, and that every figure follows from the catalog and the stack config."""

from __future__ import annotations

import dataclasses
import json

import pytest

from eks_ddp.config import StackConfig, load_stack_config
from eks_ddp.core import catalog
from eks_ddp.tooling import cost
from tests.support.util import set_path, stack_config

GIB_HOUR = cost.price("ebs_gp3_gb_month") / cost.HOURS_PER_MONTH


def config(raw: dict) -> StackConfig:
    return load_stack_config({k: v for k, v in raw.items() if k.startswith("eks-ddp:")}, region=raw["aws:region"])


def dev(**paths) -> StackConfig:
    raw = stack_config("dev")
    for path, value in paths.items():
        raw = set_path(raw, f"eks-ddp:{path}", value)
    return config(raw)


def gpu_items(est: cost.Estimate) -> list[cost.LineItem]:
    return [i for i in est.items if i.name.startswith("GPU nodes")]


def test_idle_is_cheaper_than_training():
    est = cost.estimate(dev())
    assert 0 < est.idle_per_hour < est.training_per_hour


def test_idle_excludes_gpu_instances_when_groups_scale_to_zero():
    est = cost.estimate(dev())
    g4dn = catalog.CATALOG["g4dn.xlarge"].price_per_hour
    assert [i.idle_per_hour for i in gpu_items(est)] == [0]
    assert est.training_per_hour - est.idle_per_hour == pytest.approx(2 * g4dn + 2 * 200 * GIB_HOUR)


def test_idle_counts_min_size_gpu_nodes():
    base, warm = cost.estimate(dev()), cost.estimate(dev(**{"nodeGroups[0].minSize": 1, "nodeGroups[0].desiredSize": 1}))
    g4dn = catalog.CATALOG["g4dn.xlarge"].price_per_hour
    assert warm.idle_per_hour - base.idle_per_hour == pytest.approx(g4dn + 200 * GIB_HOUR)
    assert warm.training_per_hour == pytest.approx(base.training_per_hour)


def test_per_run_is_the_gpu_nodes_for_their_billed_time():
    est = cost.estimate(dev())
    assert est.per_run == pytest.approx((est.training_per_hour - est.idle_per_hour) * est.run_hours)
    d = est.as_dict()
    assert d["per_run"] == pytest.approx((d["training_per_hour"] - d["idle_per_hour"]) * d["run_hours"], rel=1e-3)


def test_run_hours_follow_epochs_and_the_throughput_table():
    est = cost.estimate(dev())
    # 2 x g4dn.xlarge, no EFA, the default model
    rate = cost.IMAGES_PER_SECOND["T4"] * cost.MODEL_SPEED["airnet"] * 2 * cost.SCALING_TCP
    assert est.images_per_second == pytest.approx(rate)
    assert est.run_images == 10 * 50_000
    assert est.train_hours == pytest.approx(500_000 / rate / 3600)
    longer = cost.estimate(dev(**{"job.epochs": 20}))
    assert longer.run_hours - est.run_hours == pytest.approx(500_000 / rate / 3600)
    slower = cost.estimate(dev(**{"job.model": "resnet18"}))
    assert slower.images_per_second == pytest.approx(rate / cost.MODEL_SPEED["airnet"] * cost.MODEL_SPEED["resnet18"])


def test_a_run_pays_for_start_up_image_pull_and_the_scale_down_tail():
    est = cost.estimate(dev())
    phases = dict(est.timeline)
    assert phases["node start-up"] == cost.NODE_START_MINUTES
    assert phases["image pull"] == cost.IMAGE_PULL_MINUTES
    assert phases["scale-down tail"] == 10 + cost.SCALE_DOWN_TERMINATE_MINUTES == est.back_to_idle_minutes
    assert est.run_hours * 60 == pytest.approx(est.train_hours * 60 + cost.NODE_START_MINUTES
                                               + cost.IMAGE_PULL_MINUTES + cost.RUN_OVERHEAD_MINUTES + 11)
    # A longer idle wait before scale-down is paid on every run, at the GPU nodes' rate.
    warm = cost.estimate(dev(**{"cluster.scaleDownUnneededTime": "1h"}))
    g4dn = catalog.CATALOG["g4dn.xlarge"].price_per_hour
    assert warm.per_run - est.per_run == pytest.approx(50 / 60 * 2 * (g4dn + 200 * GIB_HOUR))
    assert warm.back_to_idle_minutes == 61
    p4de = cost.estimate(config(stack_config("p4de")))
    assert dict(p4de.timeline)["node start-up"] == cost.NODE_START_MINUTES_8GPU
    text = est.render()
    assert "after a run:    back to idle in ~11 min" in text and "scale-down tail 11.0" in text


def test_dev_idles_under_a_quarter_an_hour_with_standard_support():
    est = cost.estimate(dev())
    assert est.idle_per_hour <= 0.25
    assert "EKS control plane (standard support)" in {i.name for i in est.items}


def test_control_plane_priced_by_support_type():
    """Review M1: extended support bills $0.60/h, not $0.10/h."""
    import datetime as dt

    def plane(est):
        return next(i for i in est.items if i.name.startswith("EKS control plane"))
    import dataclasses

    old = {"cluster.kubernetesVersion": "1.33"}  # standard support ended 2026-07-29
    day = dt.date(2026, 11, 23)
    extended = cost.estimate(dev(**old, **{"cluster.upgradePolicy": "EXTENDED"}), day=day)
    # The stack config refuses STANDARD past standard support; a library caller's config can still say it.
    cfg = dev()
    standard = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, kubernetes_version="1.33"))
    assert plane(cost.estimate(standard, day=day)).idle_per_hour == 0.10  # STANDARD: upgraded, never extended
    assert plane(extended).idle_per_hour == 0.60 and "extended" in plane(extended).name
    assert extended.idle_per_hour - cost.estimate(standard, day=day).idle_per_hour == pytest.approx(0.50)
    # EXTENDED on a version still in standard support costs the standard rate until then, and says when.
    early = plane(cost.estimate(dev(**{"cluster.upgradePolicy": "EXTENDED"}), day=day))
    assert early.idle_per_hour == 0.10 and "$0.60/h from" in early.note


def test_every_gpu_model_in_the_catalog_has_a_throughput_estimate():
    assert {catalog.CATALOG[n].gpu_model for n in catalog.gpu_types()} <= set(cost.IMAGES_PER_SECOND)


def test_figures_derive_from_the_catalog(monkeypatch):
    before = cost.estimate(dev()).training_per_hour
    monkeypatch.setitem(catalog.CATALOG, "g4dn.xlarge",
                        catalog.InstanceType(**{**vars(catalog.CATALOG["g4dn.xlarge"]), "price_per_hour": 1.526}))
    assert cost.estimate(dev()).training_per_hour - before == pytest.approx(2 * 1.0)


def test_job_nodes_and_desired_counts_change_the_figure():
    base = cost.estimate(dev())
    one = cost.estimate(dev(**{"job.nodes": 1}))
    g4dn = catalog.CATALOG["g4dn.xlarge"].price_per_hour
    assert base.training_per_hour - one.training_per_hour == pytest.approx(g4dn + 200 * GIB_HOUR)
    t3 = catalog.CATALOG["t3.medium"].price_per_hour
    three = cost.estimate(dev(**{"cluster.systemNodeCount": 3}))
    sys_volume = cost.SYSTEM_ROOT_VOLUME_GIB * GIB_HOUR
    assert three.idle_per_hour - base.idle_per_hour == pytest.approx(2 * (t3 + sys_volume))  # dev has 1


def test_a_second_gpu_group_counts_at_desired_size_while_training():
    raw = stack_config("dev")
    extra = {"name": "spare", "instanceType": "g5.xlarge", "minSize": 0, "desiredSize": 1, "maxSize": 1}
    raw = set_path(raw, "eks-ddp:nodeGroups", [*raw["eks-ddp:nodeGroups"], extra])
    two, one = cost.estimate(config(raw)), cost.estimate(dev())
    g5 = catalog.CATALOG["g5.xlarge"].price_per_hour
    assert two.training_per_hour - one.training_per_hour == pytest.approx(g5 + 200 * GIB_HOUR)
    assert two.idle_per_hour == pytest.approx(one.idle_per_hour)


def test_nat_gateways_follow_the_network_config():
    def nat(est):
        return sum(i.idle_per_hour for i in est.items if "NAT" in i.name)
    single = cost.estimate(dev())
    per_az = cost.estimate(dev(**{"network.natGateways": "perAz", "network.azCount": 3}))
    assert nat(single) == pytest.approx(cost.price("nat_gateway_hour") + cost.price("public_ipv4_hour"))
    assert nat(per_az) == pytest.approx(3 * nat(single))
    byo = cost.estimate(dev(**{"network": {"vpcId": "vpc-0123456789abcdef0",
                                           "privateSubnetIds": ["subnet-a", "subnet-b"]}}))
    assert nat(byo) == 0


def test_control_plane_and_storage_are_priced_as_stated():
    names = {i.name: i for i in cost.estimate(dev()).items}
    assert names["EKS control plane (standard support)"].idle_per_hour == 0.10
    efs = next(i for n, i in names.items() if n.startswith("EFS"))
    assert f"assumed {cost.EFS_ASSUMED_GB} GB" in efs.name
    assert efs.idle_per_hour == pytest.approx(cost.EFS_ASSUMED_GB * 0.30 / 730)


def test_system_root_volume_matches_the_cluster_component():
    from eks_ddp.infra.cluster import SYSTEM_ROOT_VOLUME_GIB

    assert cost.SYSTEM_ROOT_VOLUME_GIB == SYSTEM_ROOT_VOLUME_GIB


def test_regions_other_than_us_east_1_say_prices_are_us_east_1():
    west = cost.estimate(dev())
    assert west.region == "us-west-2"
    assert "us-east-1 list prices" in west.assumptions[0] and "us-west-2 prices may differ" in west.assumptions[0]
    assert "stack region us-west-2 may differ" in west.render()
    east = cost.estimate(config(stack_config("p4de")))
    assert "may differ" not in east.assumptions[0]


def test_reservation_billing_is_called_out():
    est = cost.estimate(config(stack_config("p4de")))
    # Review B13: the reservation was listed under "not included" while idle read $0.38/hour.
    assert not any("cr-0123456789abcdef0" in n for n in est.not_included)
    assert any("bills its instances whether a run uses them or not" in a for a in est.assumptions)
    assert not any("whether a run" in a for a in cost.estimate(dev()).assumptions)


def test_as_dict_is_json_and_render_shows_the_totals():
    est = cost.estimate(dev())
    d = json.loads(json.dumps(est.as_dict()))
    for key in ("training_per_hour", "idle_per_hour", "per_run", "run_hours", "assumptions", "price_date",
                "line_items"):
        assert key in d
    assert d["price_date"] == cost.PRICE_DATE and d["instance_price_date"] == catalog.PRICE_DATE
    assert sum(i["training_per_hour"] for i in d["line_items"]) == pytest.approx(d["training_per_hour"], abs=1e-3)
    text = est.render()
    assert f"${d['training_per_hour']:.2f}/hour" in text and f"${d['idle_per_hour']:.2f}/hour" in text
    assert f"${d['per_run']:.2f}" in text and "estimated" in text


def test_stack_exports_the_estimate(dev_result):
    exported = dev_result.outputs["costEstimate"]
    expected = cost.estimate(dev()).as_dict()
    assert exported["training_per_hour"] == pytest.approx(expected["training_per_hour"])
    assert exported["idle_per_hour"] == pytest.approx(expected["idle_per_hour"])
    # What the offline plan prints renders from the exported (mock-round-tripped) value.
    assert cost.render(exported).splitlines()[1] == cost.render(expected).splitlines()[1]


def test_container_logs_in_cloudwatch_are_priced_and_follow_the_key():
    """observability.cloudwatch ships every pod's output: its ingestion is a line of the estimate, idle too (the system
    pods log while no run does); turning the key off removes exactly that line."""
    on, off = cost.estimate(dev()), cost.estimate(dev(**{"observability.cloudwatch": False}))
    [line] = [i for i in on.items if "container logs" in i.name]
    per_hour = cost.CONTAINER_LOGS_ASSUMED_GB_PER_DAY * cost.price("logs_ingest_gb") / 24
    assert line.idle_per_hour == line.training_per_hour == pytest.approx(per_hour)
    assert "kept 30 days" in line.note
    assert on.idle_per_hour - off.idle_per_hour == pytest.approx(per_hour)
    assert not [i for i in off.items if "container logs" in i.name]
    assert any("Container Insights" in n for n in on.not_included)
    assert not any("Container Insights" in n for n in off.not_included)
    assert on.idle_per_hour <= 0.25  # still the dev stack's idle budget


def test_a_custom_workload_has_no_per_run_figure_from_the_bundled_trainer():
    """The bundled trainer's throughput says nothing of a user's workload: the estimate says the per-run figure is
    unknown instead of printing one."""
    from eks_ddp.config import load_stack_config
    from eks_ddp.tooling.cost import estimate
    from tests.support.util import BYO_OWN_ACCOUNT_IMAGE, stack_config

    raw = {k: v for k, v in stack_config("dev").items() if k.startswith("eks-ddp:") and k != "eks-ddp:job"}
    raw["eks-ddp:runs"] = [{"runId": "mine", "nodes": 1, "workload": {"image": BYO_OWN_ACCOUNT_IMAGE,
                                                                          "module": "m.train"}}]
    est = estimate(load_stack_config(raw, region="us-west-2", placeholders_ok=True))
    assert est.as_dict()["per_run_known"] is False
    assert "per run:        unknown" in est.render() and "images/s, estimated" not in est.render()
    assert any("your own workload" in a for a in est.assumptions)
    # Negative control: the bundled trainer's stack keeps its figure.
    dev = {k: v for k, v in stack_config("dev").items() if k.startswith("eks-ddp:")}
    assert estimate(load_stack_config(dev, region="us-west-2", placeholders_ok=True)).as_dict()["per_run_known"]



def test_an_own_image_stack_lists_neither_the_trainers_phases_nor_an_ecr_repository_it_does_not_make():
    """Review MINOR 7: a stack whose runs all name their own image makes no ECR repository (__main__.py builds the
    trainer's only when a run uses it) and does not run the trainer's evaluation: its estimate bills neither."""
    from eks_ddp.config import load_stack_config
    from eks_ddp.tooling.cost import estimate
    from tests.support.util import BYO_OWN_ACCOUNT_IMAGE, stack_config

    raw = {k: v for k, v in stack_config("dev").items() if k.startswith("eks-ddp:") and k != "eks-ddp:job"}
    raw["eks-ddp:runs"] = [{"runId": "mine", "nodes": 1, "workload": {"image": BYO_OWN_ACCOUNT_IMAGE,
                                                                          "module": "m.train"}}]
    est = estimate(load_stack_config(raw, region="us-west-2", placeholders_ok=True))
    names = [i.name for i in est.items]
    assert not [n for n in names if "ECR" in n], names
    [phases] = [a for a in est.assumptions if a.startswith("a run's GPU-node time: ")]
    assert "training" not in phases.split(" (the tail")[0] and "start-up and evaluation" not in phases, phases
    assert "node start-up" in phases and "plus your workload's own time" in phases, phases
    assert not [a for a in est.assumptions if "ECR 5 GB" in a]
    # Control: the bundled trainer's stack builds its image, so its repository is billed and its phases listed.
    dev = {k: v for k, v in stack_config("dev").items() if k.startswith("eks-ddp:")}
    bundled = estimate(load_stack_config(dev, region="us-west-2", placeholders_ok=True))
    assert [i.name for i in bundled.items if "ECR" in i.name] == ["ECR image storage (assumed 5 GB)"]
    assert any("start-up and evaluation" in a for a in bundled.assumptions)


# --- the queue (Kueue) ----------------------------------------------------------------------------------------
def _system_pods(stack: str) -> dict[str, dict[str, float]]:
    """The stack's own pods on the system nodes, from its rendered plan (as tests/infra/test_autoscaler.py does)."""
    from eks_ddp.core import scheduling
    from tests.infra.test_autoscaler import pods

    return {n: scheduling.pod_requests(spec) for n, spec in pods(stack).items()
            if spec.get("nodeSelector") == {"eks-ddp/pool": "system"}}


def _queue_off(cfg):
    """The same config with ``queue.enabled: false``."""
    return dataclasses.replace(cfg, queue=dataclasses.replace(cfg.queue, enabled=False))


def _kueue(est: cost.Estimate) -> list[cost.LineItem]:
    return [i for i in est.items if i.name.startswith("Kueue controller")]


def test_the_queue_controllers_share_is_computed_from_its_requests():
    """The stack's requests for the controller (infra/kueue.py RESOURCES: 100m, 256Mi): 8 % of dev's t3.medium."""
    from eks_ddp.core import scheduling

    est = cost.estimate(dev())
    [item] = _kueue(est)
    room = scheduling.eks_allocatable("t3.medium")
    share = max(0.1 / room["cpu"], 256 * 2**20 / room["memory"])
    assert f"{share:.0%} of one t3.medium's allocatable" in item.note and f"{share:.0%}" == "8%"
    assert item.idle_per_hour == 0  # from the config alone nothing is added; the plan settles it (below)
    assert any(a.startswith("a queued run costs nothing until Kueue admits it") for a in est.assumptions)
    off = cost.estimate(_queue_off(dev()))
    assert _kueue(off) == [] and not any("queued run" in a for a in off.assumptions)


def test_the_queue_controller_fits_the_system_nodes_of_p4de_and_dev_and_the_charts_requests_would_not():
    """Computed over the rendered plans: p4de's two m6i.large and dev's single t3.medium hold the controller beside
    everything else (no extra node). The control: at the chart's own requests (500m, 512Mi) dev's t3.medium does not
    (CPU 2.33 of 1.93 cores), and the estimate adds one t3.medium, idle and training."""
    from eks_ddp.infra import kueue

    p4de = config(stack_config("p4de"))
    [item] = _kueue(cost.estimate(p4de, system_pods=_system_pods("p4de")))
    assert item.idle_per_hour == 0 and "hold it: no extra node" in item.note
    assert cost.system_nodes_needed(p4de, _system_pods("p4de")) == p4de.cluster.system_node_count
    cfg = dev()
    pods = _system_pods("dev")
    assert cost.system_nodes_needed(cfg, pods) == cfg.cluster.system_node_count == 1
    [item] = _kueue(cost.estimate(cfg, system_pods=pods))
    assert item.idle_per_hour == 0 and "hold it: no extra node" in item.note
    chart = {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"cpu": "2", "memory": "512Mi"}}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kueue, "RESOURCES", chart)
        assert cost.system_nodes_needed(_queue_off(cfg), pods) == 1  # fits without the queue
        [item] = _kueue(cost.estimate(cfg, system_pods=pods))
    t3m = catalog.CATALOG["t3.medium"].price_per_hour
    assert (item.idle_units, item.idle_per_hour) == (1, pytest.approx(t3m))
    assert "1 system node(s) cannot hold it beside the rest: 1 more t3.medium" in item.note
