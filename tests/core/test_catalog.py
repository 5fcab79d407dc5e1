"""Instance catalog: current GPU types built in, and types users add (catalog.register, eks-ddp:catalog)."""

from __future__ import annotations

import dataclasses

import pytest

from eks_ddp.config import ConfigError
from eks_ddp.core import catalog
from eks_ddp.infra.gpu_nodegroup import GpuNodeGroupArgs
from eks_ddp.infra.gpu_nodegroup import validate as validate_group
from eks_ddp.tooling import cost
from tests.config.test_config import load, rejects
from tests.infra.test_gpu_nodegroup import BASE, _run
from tests.support.util import set_path, stack_config

# An illustrative type the built-in table does not list (the values only have to be plausible).
NEW = catalog.InstanceType(name="g9x.12xlarge", gpus=4, gpu_model="X100", gpu_memory_gib=96, vcpus=48,
                           memory_gib=512, efa_interfaces=1, network_gbps=400, price_per_hour=9.5,
                           price_source="a test", price_date="2026-11-25")
NEW_YAML = {"name": "g9x.12xlarge", "gpus": 4, "gpuModel": "X100", "gpuMemoryGiB": 96, "vcpus": 48, "memoryGiB": 512,
            "efaInterfaces": 1, "networkGbps": 400, "priceUsdPerHour": 9.5, "priceSource": "my pricing page"}


@pytest.fixture(autouse=True)
def _catalog_restored():
    """Registrations never leak into other tests."""
    before = dict(catalog.CATALOG)
    yield
    catalog.CATALOG.clear()
    catalog.CATALOG.update(before)


@pytest.mark.parametrize(("name", "gpus", "model", "gmem", "vcpus", "mem", "efa"), [
    ("g6e.xlarge", 1, "L40S", 48, 4, 32, 0),
    ("g6e.8xlarge", 1, "L40S", 48, 32, 256, 1),
    ("g6e.12xlarge", 4, "L40S", 48, 48, 384, 1),
    ("g6e.24xlarge", 4, "L40S", 48, 96, 768, 2),
    ("g6e.48xlarge", 8, "L40S", 48, 192, 1536, 4),
    ("p5e.48xlarge", 8, "H200", 141, 192, 2048, 32),
    ("p5en.48xlarge", 8, "H200", 141, 192, 2048, 16),
])
def test_current_types_are_built_in(name, gpus, model, gmem, vcpus, mem, efa):
    it = catalog.lookup(name)
    assert (it.gpus, it.gpu_model, it.gpu_memory_gib, it.vcpus, it.memory_gib, it.efa_interfaces) == \
        (gpus, model, gmem, vcpus, mem, efa)
    assert it.price_per_hour > 0 and it.price_date and it.price_source
    assert (catalog.fabric_floor_gbs(name) is None) == (efa == 0)


def test_h200_types_use_efa_only_secondaries_and_p5e_says_where_its_price_comes_from():
    assert catalog.lookup("p5e.48xlarge").efa_only_secondary and catalog.lookup("p5en.48xlarge").efa_only_secondary
    assert "no on-demand list price" in catalog.lookup("p5e.48xlarge").price_source
    est = cost.estimate(load(set_path(set_path(stack_config("p4de"), "eks-ddp:nodeGroups[0].instanceType",
                                                "p5e.48xlarge"), "eks-ddp:nodeGroups[0].efa", True)))
    assert any("p5e.48xlarge" in a and "no on-demand list price" in a for a in est.assumptions)


def test_the_reviews_types_are_accepted():
    """g6e.12xlarge as a GPU type and m5.large as the system type were refused."""
    raw = set_path(stack_config("dev"), "eks-ddp:nodeGroups[0].instanceType", "g6e.12xlarge")
    raw = set_path(raw, "eks-ddp:cluster.systemInstanceType", "m5.large")
    cfg = load(raw)
    assert cfg.job_group.instance.gpu_model == "L40S"
    assert cost.estimate(cfg).training_per_hour > 0  # L40S has a throughput estimate


def test_unknown_system_types_point_at_the_catalog_key_and_arm64_ones_say_why_not():
    # A Graviton type cannot be added through the catalog (the system nodes run the x86_64 AMI): its message says
    # that instead; an unknown x86_64 type can (the control).
    msg = rejects(set_path(stack_config("dev"), "eks-ddp:cluster.systemInstanceType", "m7g.large"),
                  "cluster.systemInstanceType: got 'm7g.large', a Graviton (arm64) type; expected an x86_64 type")
    assert "eks-ddp:catalog" not in msg
    msg = rejects(set_path(stack_config("dev"), "eks-ddp:cluster.systemInstanceType", "c9z.large"),
                  "cluster.systemInstanceType: got 'c9z.large'")
    assert "eks-ddp:catalog" in msg
    rejects(set_path(stack_config("dev"), "eks-ddp:nodeGroups[0].instanceType", "g9x.12xlarge"),
            "nodeGroups[0].instanceType: got 'g9x.12xlarge'", "eks-ddp:catalog")


def test_register_makes_a_type_usable_by_the_components():
    with pytest.raises(ValueError, match="instance_type: got 'g9x.12xlarge'"):
        validate_group(dataclasses.replace(BASE, instance_type="g9x.12xlarge"))
    assert catalog.register(NEW) is NEW
    catalog.register(NEW)  # the same description again: a no-op
    assert catalog.lookup("g9x.12xlarge") is NEW and "g9x.12xlarge" in catalog.gpu_types()
    assert catalog.fabric_floor_gbs("g9x.12xlarge") == 400 / 8 / 4
    assert "registered with the type" in catalog.fabric_floor_source("g9x.12xlarge")
    assert validate_group(dataclasses.replace(BASE, instance_type="g9x.12xlarge", efa=True)) is NEW
    result, _ = _run(dataclasses.replace(BASE, instance_type="g9x.12xlarge", efa=True,
                                         availability_zone="us-west-2a"))
    lt = next(r for r in result.resources if r.type == "aws:ec2/launchTemplate:LaunchTemplate")
    assert len(lt.inputs["networkInterfaces"]) == 1


def test_register_refuses_a_different_description_unless_replace():
    catalog.register(NEW)
    other = dataclasses.replace(NEW, price_per_hour=10.0)
    with pytest.raises(ValueError, match="InstanceType.name: 'g9x.12xlarge' is already in the catalog"):
        catalog.register(other)
    catalog.register(other, replace=True)
    assert catalog.lookup("g9x.12xlarge").price_per_hour == 10.0
    fixed = dataclasses.replace(catalog.lookup("g6e.xlarge"), price_per_hour=1.5)
    with pytest.raises(ValueError, match="already in the catalog"):
        catalog.register(fixed)
    catalog.register(fixed, replace=True)  # correcting a built-in row is allowed, explicitly
    with pytest.raises(ValueError, match="built-in"):
        catalog.unregister("g6e.xlarge")
    with pytest.raises(TypeError, match="expected an InstanceType"):
        catalog.register({"name": "x1.large"})  # type: ignore[arg-type]


def test_an_efa_type_needs_its_network_bandwidth():
    with pytest.raises(ValueError, match="InstanceType.network_gbps: required for g9x.12xlarge"):
        catalog.register(dataclasses.replace(NEW, network_gbps=None))


@pytest.mark.parametrize(("change", "fragment"), [
    ({"name": "G9X.large"}, "InstanceType.name: got 'G9X.large'; expected an EC2 instance type name"),
    ({"name": "g9x"}, "InstanceType.name: got 'g9x'"),
    ({"name": "g5g.xlarge"}, "a Graviton (arm64) type"),
    ({"name": "p6e-gb200.36xlarge"}, "a Graviton (arm64) type"),
    ({"gpus": -1}, "InstanceType.gpus: got -1"),
    ({"gpus": 4.0}, "InstanceType.gpus: got 4.0"),
    ({"gpu_model": ""}, "InstanceType.gpu_model: got ''"),
    ({"gpu_model": "X 100"}, "InstanceType.gpu_model: got 'X 100'"),
    ({"gpu_memory_gib": 0}, "InstanceType.gpu_memory_gib: got 0"),
    ({"vcpus": 0}, "InstanceType.vcpus: got 0"),
    ({"memory_gib": 0}, "InstanceType.memory_gib: got 0"),
    ({"efa_interfaces": 33}, "InstanceType.efa_interfaces: got 33"),
    ({"price_per_hour": 0}, "InstanceType.price_per_hour: got 0"),
    ({"price_per_hour": float("nan")}, "InstanceType.price_per_hour: got nan"),
    ({"price_per_hour": "9.5"}, "InstanceType.price_per_hour: got '9.5'"),
])
def test_instance_type_checks_name_the_field(change, fragment):
    with pytest.raises(ValueError, match=None) as info:
        dataclasses.replace(NEW, **change)
    assert fragment in str(info.value)


def test_cpu_types_need_no_gpu_model_and_pass_without_one():
    cpu = catalog.InstanceType(name="m5.2xlarge", gpus=0, gpu_model="", gpu_memory_gib=0, vcpus=8, memory_gib=32,
                               efa_interfaces=0, price_per_hour=0.384)
    assert not cpu.has_efa
    with pytest.raises(ValueError, match="gpu_model: got 'T4' with gpus 0"):
        dataclasses.replace(cpu, gpu_model="T4")


def with_catalog(*entries, **paths) -> dict:
    raw = stack_config("dev")
    raw["eks-ddp:catalog"] = list(entries)
    for path, value in paths.items():
        raw = set_path(raw, f"eks-ddp:{path}", value)
    return raw


def test_stack_catalog_entries_are_usable_and_priced_from_their_source():
    cfg = load(with_catalog(NEW_YAML, {"name": "m5.2xlarge", "vcpus": 8, "memoryGiB": 32, "priceUsdPerHour": 0.384},
                            **{"nodeGroups[0].instanceType": "g9x.12xlarge", "cluster.systemInstanceType": "m5.2xlarge",
                               "nodeGroups[0].efa": True, "nodeGroups[0].availabilityZone": "us-west-2a"}))
    assert [t.name for t in cfg.catalog] == ["g9x.12xlarge", "m5.2xlarge"]
    it = catalog.lookup("g9x.12xlarge")
    assert (it.gpus, it.gpu_model, it.efa_interfaces, it.network_gbps, it.price_per_hour) == (4, "X100", 1, 400, 9.5)
    est = cost.estimate(cfg)
    assert any("g9x.12xlarge: $9.5/h from my pricing page" in a for a in est.assumptions)
    assert any("X100 unknown: the slowest GPU's rate" in a for a in est.assumptions)
    load(with_catalog(NEW_YAML))  # loading the same stack again: the same description, no conflict


@pytest.mark.parametrize(("entry", "fragment"), [
    ({**NEW_YAML, "gpuModel": None}, "catalog[0].gpuModel: got None"),
    ({k: v for k, v in NEW_YAML.items() if k != "gpuModel"}, "catalog[0].gpuModel: got ''"),
    ({**NEW_YAML, "vcpus": 0}, "catalog[0].vcpus: got 0"),
    ({**NEW_YAML, "memoryGiB": "lots"}, "catalog[0].memoryGiB: got 'lots'; expected a whole number"),
    ({**NEW_YAML, "priceUsdPerHour": -1}, "catalog[0].priceUsdPerHour: got -1"),
    ({**NEW_YAML, "efaInterfaces": 40}, "catalog[0].efaInterfaces: got 40"),
    ({k: v for k, v in NEW_YAML.items() if k != "networkGbps"}, "catalog[0].networkGbps: required with efaInterfaces"),
    ({"name": "c7g.xlarge", "vcpus": 4, "memoryGiB": 8, "priceUsdPerHour": 0.145},
     "catalog[0].name: got 'c7g.xlarge', a Graviton (arm64) type"),
    ({**NEW_YAML, "name": "g6e.xlarge"}, "catalog[0].name: got 'g6e.xlarge', which the built-in catalog lists"),
    ({**NEW_YAML, "gpu": 4}, "catalog[0].gpu: got 4; expected one of the known keys"),
    ({k: v for k, v in NEW_YAML.items() if k != "vcpus"}, "catalog[0].vcpus: required"),
])
def test_bad_stack_catalog_entries_name_their_key(entry, fragment):
    rejects(with_catalog(entry), fragment)


def test_stack_catalog_must_be_a_list_of_distinct_types():
    rejects(with_catalog(NEW_YAML, NEW_YAML), "catalog[1].name: got 'g9x.12xlarge' twice")
    raw = stack_config("dev")
    raw["eks-ddp:catalog"] = NEW_YAML
    rejects(raw, "catalog: got {'name': 'g9x.12xlarge'", "expected a list of objects with keys name, gpus")


def test_a_refused_stack_leaves_the_catalog_as_it_was():
    with pytest.raises(ConfigError):
        load(with_catalog(NEW_YAML, **{"job.nodes": 99}))
    assert "g9x.12xlarge" not in catalog.CATALOG


def test_a_stack_entry_that_contradicts_a_registered_type_is_refused():
    catalog.register(dataclasses.replace(NEW, price_per_hour=1.0))
    rejects(with_catalog(NEW_YAML), "catalog[0].name: got 'g9x.12xlarge', already registered with other values")


def test_gpu_nodegroup_args_take_a_registered_type_for_spot_alternatives():
    catalog.register(NEW)
    catalog.register(dataclasses.replace(NEW, name="g9x.24xlarge", vcpus=96, memory_gib=1024))
    args = dataclasses.replace(BASE, instance_type="g9x.12xlarge", capacity_type="spot",
                               spot_instance_types=["g9x.24xlarge"])
    assert validate_group(args).name == "g9x.12xlarge"
    assert isinstance(args, GpuNodeGroupArgs)


def test_every_built_in_gpu_type_knows_its_instance_store_and_only_catalog_types_are_listed():
    assert set(catalog.LOCAL_NVME_GB) <= set(catalog.BUILTIN)
    for name in catalog.gpu_types():
        if name in catalog.BUILTIN:
            assert catalog.CATALOG[name].local_nvme_gb == catalog.LOCAL_NVME_GB[name] > 0, name
    assert all(catalog.CATALOG[n].local_nvme_gb == 0 for n in catalog.cpu_types() if n in catalog.BUILTIN)
    assert catalog.CATALOG["p4de.24xlarge"].local_nvme_gb == 8 * 1000  # EC2 User Guide: 8 x 1000 GB NVMe SSD
    bad = dataclasses.replace(catalog.CATALOG["g4dn.xlarge"], local_nvme_gb=0)
    with pytest.raises(ValueError, match="local_nvme_gb: got -1"):
        dataclasses.replace(bad, local_nvme_gb=-1)
