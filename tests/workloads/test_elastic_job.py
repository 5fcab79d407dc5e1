"""ElasticJob alone under mocks: the torchrun agent, failure policy, EFA wiring, ordering, hardening."""

from __future__ import annotations

import dataclasses
import shlex

import pulumi
import pytest

from eks_ddp.core import catalog
from eks_ddp.core.workload import cifar10_workload
from eks_ddp.tooling.mocks import ProgramResult, Recorded, run_program
from eks_ddp.workloads.elastic_job import (
    DEFAULT_FAULT_BUDGET,
    EFA_RESOURCE,
    GPU_RESOURCE,
    TRAINER_LABELS,
    ElasticJob,
    Placement,
    nccl_env,
    pod_resources,
)
from eks_ddp.workloads.etcd import DEFAULT_CLIENT_LABELS, store_selector
from eks_ddp_runtime.launch_command import AGENT_ENV, CLUSTER_TIMEOUTS, CLUSTER_TLS
from tests.support.job_args import job_args

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/eks-ddp-trainer@sha256:" + "ab" * 32
GPU_NODES = {"eks-ddp/node-group": "gpu"}
ETCD = "rendezvous-etcd.training.svc.cluster.local:2379"
JOB = "kubernetes:batch/v1:Job"
NETPOL = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
RDZV_TLS_SECRET = "rendezvous-etcd-tls-client-tls"


def run_job(**overrides) -> ProgramResult:
    def program() -> None:
        args = {"namespace": "training", "image": IMAGE, "pvc_name": "shared", "instance_type": "g4dn.xlarge",
                "node_selector": GPU_NODES, "nodes": 2, "min_nodes": 1, "rdzv_endpoint": ETCD,
                "rdzv_tls_secret": RDZV_TLS_SECRET, **overrides}
        job = ElasticJob("training", job_args(**args))
        pulumi.export("follow", job.follow_command)
        pulumi.export("evaluate", job.evaluate_command)

    return run_program({}, program=program)


def train_job(result: ProgramResult) -> Recorded:
    return result.one(JOB, "training-train")


def prepare_job(result: ProgramResult) -> Recorded:
    return result.one(JOB, "training-prepare-data")


def pod_templates(result: ProgramResult) -> dict[str, dict]:
    cron = result.one("kubernetes:batch/v1:CronJob").inputs["spec"]["jobTemplate"]["spec"]["template"]
    return {"train": train_job(result).inputs["spec"]["template"],
            "prepare": prepare_job(result).inputs["spec"]["template"], "evaluate": cron}


def trainer(result: ProgramResult) -> dict:
    return train_job(result).inputs["spec"]["template"]["spec"]["containers"][0]


def flags(command: list[str]) -> dict[str, str]:
    assert command[:3] == ["python", "-m", "eks_ddp_runtime.launch"]
    agent = command[3:command.index("-m", 3)]
    return dict(a.removeprefix("--").split("=", 1) for a in agent)


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def test_agent_command_is_the_shared_torchrun_builder():
    result = run_job(nodes=3, min_nodes=2, max_restarts=5, run_id="exp-7",
                     workload=cifar10_workload(epochs=4, global_batch_size=256, learning_rate=0.1, compile=True))
    cmd = trainer(result)["command"]
    assert cmd[:3] == ["python", "-m", "eks_ddp_runtime.launch"] and cmd[cmd.index("-m", 3) + 1] == "eks_ddp_trainer.train"
    f = flags(cmd)
    assert f["nnodes"] == "2:3"
    assert f["nproc-per-node"] == "1"  # g4dn.xlarge: one T4
    # etcd as the agent runs it: the same rendezvous with etcd calls retried (training/runtime/eks_ddp_runtime/rendezvous/handler.py)
    assert f["rdzv-backend"] == "eks-etcd" and f["rdzv-endpoint"] == ETCD
    assert f["rdzv-id"] == "$(JOB_UID)" and f["local-addr"] == "$(POD_IP)"
    assert f["rdzv-conf"] == f"{CLUSTER_TIMEOUTS.conf()},{CLUSTER_TLS.conf()}"
    assert f["max-restarts"] == "5"
    trainer_args = cmd[cmd.index("-m", 3) + 2:]
    for expected in ("--data-dir=/shared/data", "--run-dir=/shared/runs/exp-7", "--epochs=4", "--global-batch-size=256",
                     "--model=airnet", "--lr=0.1", "--compile"):
        assert expected in trainer_args


@pytest.mark.parametrize("fabric", [False, True])
def test_agents_reach_the_store_with_the_client_certificate_mounted_read_only(fabric):
    # Review S1: the store requires a client certificate; the agents find it where their rdzv-conf says.
    result = run_job(instance_type="p4de.24xlarge", efa=True, fabric_check=True) if fabric else run_job()
    job = result.one(JOB, "training-train")
    pod = job.inputs["spec"]["template"]["spec"]
    c = pod["initContainers"][0] if fabric else pod["containers"][0]
    conf = dict(kv.split("=", 1) for kv in flags(check_command(c) if fabric else c["command"])["rdzv-conf"].split(","))
    assert conf["protocol"] == "https"
    [vol] = [v for v in pod["volumes"] if "secret" in v]
    assert vol["secret"]["secretName"] == RDZV_TLS_SECRET and int(vol["secret"]["defaultMode"]) == 0o440
    [mount] = [m for m in c["volumeMounts"] if m["name"] == vol["name"]]
    assert mount["readOnly"] is True
    for key, file in (("ca_cert", "ca.crt"), ("ssl_cert", "tls.crt"), ("ssl_cert_key", "tls.key")):
        assert conf[key] == f"{mount['mountPath']}/{file}"
    # Pods that never reach the store do not get the certificate.
    prepare = result.one(JOB, "training-prepare-data").inputs["spec"]["template"]["spec"]
    assert not [v for v in prepare["volumes"] if "secret" in v]


def test_rendezvous_id_and_address_come_from_the_downward_api():
    container = trainer(run_job())
    env = env_of(container)
    assert len(env) == len(container["env"]), "duplicate env names"
    assert env["JOB_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.labels['batch.kubernetes.io/controller-uid']"
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    for name, value in AGENT_ENV.items():
        assert env[name]["value"] == value
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"]["value"] == "1"


def test_c10d_uses_index_zero_and_no_etcd():
    result = run_job(rdzv_backend="c10d", rdzv_endpoint=None)
    cmd = trainer(result)["command"]
    f = flags(cmd)
    svc = result.one("kubernetes:core/v1:Service").inputs
    assert f["rdzv-backend"] == "c10d"
    # Finding B-11: the FQDN, which kubelet puts in the pod's /etc/hosts (no DNS race for index 0).
    assert f["rdzv-endpoint"] == f"training-run-1-0.{svc['metadata']['name']}.training.svc.cluster.local:29400"
    assert not any("etcd" in a or "2379" in a for a in cmd)
    pod = train_job(result).inputs["spec"]["template"]
    assert pod["spec"]["subdomain"] == svc["metadata"]["name"]
    assert svc["spec"]["clusterIP"] == "None"
    assert all(pod["metadata"]["labels"].get(k) == v for k, v in svc["spec"]["selector"].items())
    policy = result.one(NETPOL, "training-train-netpol").inputs["spec"]
    assert not any(p.get("port") == 2379 for r in policy["egress"] for p in r.get("ports", []))


def test_etcd_mode_has_no_rendezvous_service():
    result = run_job()
    assert not result.of_type("kubernetes:core/v1:Service")
    assert "subdomain" not in train_job(result).inputs["spec"]["template"]["spec"]


def test_efa_resources_and_environment_only_with_efa():
    with_efa = trainer(run_job(instance_type="p4de.24xlarge", efa=True))
    assert with_efa["resources"]["limits"][EFA_RESOURCE] == "4"
    assert with_efa["resources"]["limits"][GPU_RESOURCE] == "8"
    env = env_of(with_efa)
    assert env["FI_PROVIDER"]["value"] == "efa"
    assert env["FI_EFA_USE_DEVICE_RDMA"]["value"] == "1"
    assert "NCCL_SOCKET_IFNAME" in env
    assert env["NCCL_NET_PLUGIN"]["value"] == "ofi"  # libnccl-net-ofi.so, the image's aws-ofi-nccl
    assert flags(with_efa["command"])["nproc-per-node"] == "8"

    for overrides in ({"instance_type": "p4de.24xlarge", "efa": False}, {"instance_type": "g4dn.xlarge"}):
        plain = trainer(run_job(**overrides))
        assert EFA_RESOURCE not in plain["resources"]["limits"]
        assert not {"FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA"} & set(env_of(plain))


def test_gpudirect_rdma_only_on_families_that_support_it():
    assert nccl_env(catalog.lookup("p5.48xlarge"), True)["FI_EFA_USE_DEVICE_RDMA"] == "1"
    g5 = nccl_env(catalog.lookup("g5.8xlarge"), True)
    assert g5["FI_PROVIDER"] == "efa" and "FI_EFA_USE_DEVICE_RDMA" not in g5


def test_resources_come_from_the_catalog_with_headroom():
    for instance_type in ("g4dn.xlarge", "p4de.24xlarge"):
        it = catalog.lookup(instance_type)
        c = trainer(run_job(instance_type=instance_type))
        assert c["resources"]["requests"] == c["resources"]["limits"]  # Guaranteed QoS
        cpu, memory, shm = pod_resources(it)
        assert c["resources"]["limits"]["cpu"] == str(cpu) and 1 <= cpu < it.vcpus
        assert c["resources"]["limits"]["memory"] == f"{memory}Gi" and memory < it.memory_gib
        assert c["resources"]["limits"][GPU_RESOURCE] == str(it.gpus)
        assert shm < memory


def test_dev_shm_is_sized_from_the_instances_memory_inside_the_pods_request():
    """/dev/shm holds the node's one snapshot (twice the state while it is replaced): a quarter of the pod's memory
    request, which it counts against, so a p4de node snapshots up to 108 GiB of state (docs/capacity-and-cost.md)."""
    _, memory, shm = pod_resources(catalog.lookup("p4de.24xlarge"))
    assert (memory, shm, shm // 2) == (864, 216, 108)
    assert pod_resources(catalog.lookup("g4dn.xlarge"))[1:] == (12, 3)
    result = run_job(instance_type="p4de.24xlarge")
    c, spec = trainer(result), train_job(result).inputs["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory", "sizeLimit": "216Gi"}
    assert c["resources"]["requests"]["memory"] == "864Gi"  # the shm is inside it, not on top


def test_only_the_training_job_skips_await_and_it_waits_for_data():
    result = run_job()
    train, prepare = train_job(result), prepare_job(result)
    assert train.inputs["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"
    assert "pulumi.com/skipAwait" not in (prepare.inputs["metadata"].get("annotations") or {})
    assert prepare.urn in train.dependencies
    prepare_cmd = prepare.inputs["spec"]["template"]["spec"]["containers"][0]["command"]
    assert prepare_cmd == ["python", "-m", "eks_ddp_trainer.prepare_data", "--data-dir=/shared/data"]


def test_failure_policy_ignores_node_loss_and_fails_fast_on_bugs():
    spec = train_job(run_job(nodes=4, min_nodes=2)).inputs["spec"]
    assert spec["completionMode"] == "Indexed"
    assert int(spec["completions"]) == int(spec["parallelism"]) == 4
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    fail, ignore = spec["podFailurePolicy"]["rules"]
    assert ignore == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert fail["action"] == "FailJob" and fail["onExitCodes"]["containerName"] == "trainer"
    assert fail["onExitCodes"]["operator"] == "In"
    assert 1 not in fail["onExitCodes"]["values"]  # a crashed launcher is retried
    assert spec["podReplacementPolicy"] == "Failed"
    assert "ttlSecondsAfterFinished" not in spec  # a removed Job would be created again by the next `up`


def test_fail_job_on_the_trainer_exit_codes_and_nothing_that_cannot_occur():
    # Finding B-14: 126/127 never reach an exec-form container (a missing binary is a StartError), while
    # the trainer's own fatal codes (config error 3, divergence 4, bad input 5) must fail the Job at once.
    from eks_ddp_runtime import exitcodes

    spec = train_job(run_job()).inputs["spec"]
    [fail] = [r for r in spec["podFailurePolicy"]["rules"] if r["action"] == "FailJob"]
    codes = {int(v) for v in fail["onExitCodes"]["values"]}
    assert set(exitcodes.FATAL) <= codes
    assert exitcodes.CONFIG_ERROR in codes
    assert not {126, 127} & codes
    assert codes == {2, *exitcodes.FATAL}


def test_fault_budget_is_one_budget_for_the_run():
    # Finding B-3: at least 20 pod failures per run by default, configurable; per-index limits are gone
    # because a failed index turns a finished run into Failed (FailedIndexes is checked before success).
    spec = train_job(run_job()).inputs["spec"]
    assert int(spec["backoffLimit"]) == DEFAULT_FAULT_BUDGET >= 20
    assert "backoffLimitPerIndex" not in spec and "maxFailedIndexes" not in spec
    assert int(train_job(run_job(fault_budget=55)).inputs["spec"]["backoffLimit"]) == 55


def test_first_agent_to_finish_completes_the_job():
    # Finding B-4: a late or replacement agent never turns a finished run into Failed.
    spec = train_job(run_job(nodes=3)).inputs["spec"]
    assert spec["completionMode"] == "Indexed"  # successPolicy needs it
    [rule] = spec["successPolicy"]["rules"]
    assert int(rule["succeededCount"]) == 1 and "succeededIndexes" not in rule


def test_active_deadline_bounds_a_job_that_never_gets_nodes():
    spec = train_job(run_job()).inputs["spec"]
    assert int(spec["activeDeadlineSeconds"]) == 48 * 3600
    assert int(train_job(run_job(active_deadline_hours=2)).inputs["spec"]["activeDeadlineSeconds"]) == 7200
    assert "activeDeadlineSeconds" not in train_job(run_job(active_deadline_hours=None)).inputs["spec"]


def test_training_job_replace_deletes_in_the_background():
    # Finding B-2: a replace under the same name must not race a foreground delete (409 AlreadyExists).
    annotations = train_job(run_job()).inputs["metadata"]["annotations"]
    assert annotations["pulumi.com/deletionPropagationPolicy"] == "background"


def test_a_failed_prepare_job_is_replaced_on_the_next_up():
    # Finding B-8: an awaited Job left Failed would fail every later `pulumi up`.
    prepare = prepare_job(run_job()).inputs
    assert prepare["metadata"]["annotations"]["pulumi.com/replaceUnready"] == "true"


def test_one_agent_per_gpu_node():
    pod = train_job(run_job()).inputs["spec"]["template"]
    [term] = pod["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert all(pod["metadata"]["labels"][k] == v for k, v in term["labelSelector"]["matchLabels"].items())
    assert pod["spec"]["nodeSelector"] == GPU_NODES
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]


def test_training_pods_carry_the_labels_etcd_admits():
    labels = train_job(run_job()).inputs["spec"]["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in DEFAULT_CLIENT_LABELS.items())
    assert all(labels[k] == v for k, v in TRAINER_LABELS.items())


def test_every_pod_is_hardened():
    result = run_job()
    sas = {r.inputs["metadata"]["name"]: r.inputs for r in result.of_type("kubernetes:core/v1:ServiceAccount")}
    assert sas and all(sa["automountServiceAccountToken"] is False for sa in sas.values())
    for name, template in pod_templates(result).items():
        spec = template["spec"]
        [c] = spec["containers"]
        assert spec["serviceAccountName"] in sas, name
        assert spec["automountServiceAccountToken"] is False, name
        psc, csc = spec["securityContext"], c["securityContext"]
        assert psc["runAsNonRoot"] is True and int(psc["runAsUser"]) == int(psc["fsGroup"]) == 1000, name
        assert psc["seccompProfile"]["type"] == "RuntimeDefault", name
        assert csc["readOnlyRootFilesystem"] is True and csc["allowPrivilegeEscalation"] is False, name
        assert csc["capabilities"]["drop"] == ["ALL"], name
        assert c["image"] == IMAGE and c["imagePullPolicy"] == "IfNotPresent", name
        assert {"cpu", "memory"} <= set(c["resources"]["requests"]) and {"cpu", "memory"} <= set(
            c["resources"]["limits"]), name
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes[mounts["/shared"]]["persistentVolumeClaim"]["claimName"] == "shared", name
        assert "emptyDir" in volumes[mounts["/tmp"]], name
        if "/dev/shm" in mounts:
            assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory", name
            assert volumes[mounts["/dev/shm"]]["emptyDir"]["sizeLimit"], name
    assert "/dev/shm" in {m["mountPath"] for m in trainer(result)["volumeMounts"]}


def test_every_pod_has_a_network_policy():
    result = run_job()
    policies = [r.inputs["spec"] for r in result.of_type(NETPOL)]
    for name, template in pod_templates(result).items():
        labels = template["metadata"]["labels"]
        selecting = [p for p in policies
                     if all(labels.get(k) == v for k, v in p["podSelector"]["matchLabels"].items())]
        assert len(selecting) == 1, name
        assert set(selecting[0]["policyTypes"]) == {"Ingress", "Egress"}, name
    train = result.one(NETPOL, "training-train-netpol").inputs["spec"]
    [ingress] = train["ingress"]
    assert ingress["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "training-run-1"}}}]
    prepare = result.one(NETPOL, "training-prepare-data-netpol").inputs["spec"]
    assert prepare["ingress"] == [] and any(
        p.get("port") == 443 for r in prepare["egress"] for p in r.get("ports", []))


@pytest.mark.parametrize("overrides", [{}, {"rdzv_backend": "c10d", "rdzv_endpoint": None}])
def test_every_egress_rule_names_its_destination(overrides):
    # Finding B-18: the 2379 rule had no `to`, i.e. port 2379 anywhere, the internet included.
    result = run_job(**overrides)
    for policy in result.of_type(NETPOL):
        for rule in policy.inputs["spec"]["egress"]:
            assert rule.get("to"), f"{policy.name}: egress rule without a destination: {rule}"
    train = result.one(NETPOL, "training-train-netpol").inputs["spec"]
    etcd_rules = [r for r in train["egress"] if any(p.get("port") == 2379 for p in r.get("ports", []))]
    if overrides:
        assert not etcd_rules
    else:
        [rule] = etcd_rules
        assert rule["to"] == [{"podSelector": {"matchLabels": store_selector("rendezvous-etcd")}}]


@pytest.mark.parametrize("labels", [{}, {"app.kubernetes.io/name": 1}, "etcd"])
def test_store_labels_must_be_a_selector(labels):
    with pytest.raises(ValueError, match=r"rendezvous.server_labels: got .*; expected None"):
        run_job(rdzv_server_labels=labels)


def test_a_store_of_your_own_is_selected_by_the_labels_given():
    result = run_job(rdzv_server_labels={"app": "my-etcd"})
    train = result.one(NETPOL, "training-train-netpol").inputs["spec"]
    assert {"podSelector": {"matchLabels": {"app": "my-etcd"}}} in [t for r in train["egress"] for t in r["to"]]


def test_evaluation_runs_on_demand_from_a_suspended_cronjob():
    result = run_job(run_id="exp-7")
    cron = result.one("kubernetes:batch/v1:CronJob").inputs
    assert cron["spec"]["suspend"] is True
    c = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    # Finding B-13: the run directory comes from RUN_DIR (this run by default), so a Job created from the
    # CronJob can evaluate another run.
    assert c["command"] == ["python", "-m", "eks_ddp_trainer.evaluate", "--data-dir=/shared/data", "--run-dir=$(RUN_DIR)"]
    assert env_of(c)["RUN_DIR"]["value"] == "/shared/runs/exp-7"
    assert c["resources"]["limits"][GPU_RESOURCE] == "1"
    name = cron["metadata"]["name"]
    assert result.outputs["evaluate"].startswith(f"kubectl -n training create job --from=cronjob/{name} ")


def test_follow_command_selects_the_job_pods():
    result = run_job()
    labels = train_job(result).inputs["spec"]["template"]["metadata"]["labels"]
    follow = result.outputs["follow"]
    assert follow.startswith("kubectl -n training logs -f ")
    selector = follow.split(" -l ", 1)[1]
    key, value = selector.split("=")
    assert labels[key] == value


def test_children_are_parented_to_the_component():
    result = run_job()
    assert all(r.parent_type == "eks-ddp:elastic_job:ElasticJob" for r in result.resources if r.custom)


@pytest.mark.parametrize("overrides, field", [
    ({"rdzv_endpoint": None}, "rendezvous.endpoint"),
    ({"rdzv_tls_secret": None}, "rendezvous.tls_secret"),
    ({"efa": True}, "placement.efa"),
    ({"instance_type": "t3.large"}, "placement.instance_type"),
    ({"instance_type": "x9.huge"}, "placement.instance_type"),
    ({"min_nodes": 3}, "size.min_nodes"),
    ({"image": "trainer:latest"}, "image"),
    ({"run_id": "r" * 60}, "run_id"),
    ({"run_id": "Run_1"}, "run_id"),
    ({"max_restarts": -1}, "size.max_restarts"),
    ({"fault_budget": -1}, "size.fault_budget"),
    ({"active_deadline_hours": 0}, "size.active_deadline_hours"),
])
def test_rejects_bad_args(overrides, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        run_job(**overrides)


# --- the fabric-check gate -------------------------------------------------------------------------------


def gate_of(result) -> dict:
    """The training pods' fabric-check init container."""
    [init] = train_job(result).inputs["spec"]["template"]["spec"]["initContainers"]
    assert init["name"] == "fabric-check"
    return init


def check_command(init: dict) -> list[str]:
    """The job-wide check's launcher command inside the gate's ``sh -c`` (after the node-only branch)."""
    assert init["command"][:2] == ["sh", "-c"]
    return shlex.split(init["command"][2].split("fi; exec ", 1)[1])


def node_only_command(init: dict) -> list[str]:
    script = init["command"][2]
    return shlex.split(script[script.index("then exec ") + len("then exec "):script.index("; fi;")])


def test_fabric_check_is_the_training_pods_first_phase_and_nothing_waits_for_it():
    """The check runs in the cluster, in the training Job's own pods: no Job of its own that Pulumi awaits (a queued
    one made `pulumi up` wait in the queue), so the run is one Workload that keeps its place."""
    result = run_job(instance_type="p4de.24xlarge", efa=True, fabric_check=True, run_id="r1")
    assert [j.name for j in result.of_type(JOB) if "fabric" in j.name] == []
    train = train_job(result)
    assert train.inputs["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"
    assert not [u for u in train.dependencies if "fabric" in u]
    init = gate_of(result)
    cmd = check_command(init)
    assert cmd[cmd.index("-m", 3) + 1] == "eks_ddp_runtime.fabric_check"
    f = flags(cmd)
    # The nodes the run is admitted with (partial admission included), its own rendezvous, a failure is final.
    assert f["nnodes"] == "1:2" and f["nproc-per-node"] == "8" and f["max-restarts"] == "0"
    assert f["rdzv-id"] == "$(JOB_UID)-fabric" and f["rdzv-endpoint"] == ETCD
    check_args = cmd[cmd.index("-m", 3) + 2:]
    assert check_args == ["--run-dir=/shared/runs/r1", "--require-efa", "--min-busbw-gbs=46.07",
                          "--instance-type=p4de.24xlarge", "--pass-marker=/shared/runs/r1/.fabric-passed-$(JOB_UID)"]
    from eks_ddp_runtime.fabric_check import _parse

    assert _parse(check_args).min_busbw_gbs == catalog.fabric_floor_gbs("p4de.24xlarge")
    # A pod that starts once the check passed checks only its node (no peer to measure against).
    assert init["command"][2].startswith("if [ -e '/shared/runs/r1/.fabric-passed-$(JOB_UID)' ]; then exec ")
    node = node_only_command(init)
    assert node[:3] == ["python", "-m", "eks_ddp_runtime.fabric_check"] and "--node-only" in node
    assert not any(a.startswith("--pass-marker") for a in node)
    # Shaped like the trainer: all GPUs and EFA devices, the same NCCL/EFA environment and mounts, its node's name.
    [trainer_c] = train.inputs["spec"]["template"]["spec"]["containers"]
    assert init["resources"] == trainer_c["resources"] and init["resources"]["limits"][GPU_RESOURCE] == "8"
    assert init["resources"]["limits"][EFA_RESOURCE] == "4"
    assert init["volumeMounts"] == trainer_c["volumeMounts"] and init["image"] == trainer_c["image"]
    env = env_of(init)
    assert env["NCCL_NET_PLUGIN"]["value"] == "ofi"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["JOB_UID"] == env_of(trainer_c)["JOB_UID"]  # what $(JOB_UID) expands from


def test_under_the_queue_the_pass_marker_is_keyed_to_the_admission():
    """A Kueue eviction and readmission keeps the Job's UID but moves the run to new nodes: the marker names the
    admission's ProvisioningRequest (the pod's consume-provisioning-request annotation, through the downward API),
    and a pod without one runs the full check. The control: outside the queue the marker stays the Job's."""
    from eks_ddp.workloads.elastic_job.args import Queued

    queued = run_job(instance_type="p4de.24xlarge", efa=True, fabric_check=True, run_id="r1",
                     queue=Queued(local_queue="training", priority_class="eks-ddp-normal"))
    init = gate_of(queued)
    marker = "/shared/runs/r1/.fabric-passed-$(JOB_UID)-$(FABRIC_ADMISSION)"
    assert env_of(init)["FABRIC_ADMISSION"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['autoscaling.x-k8s.io/consume-provisioning-request']"
    assert init["command"][2].startswith(f"if [ -n \"$FABRIC_ADMISSION\" ] && [ -e '{marker}' ]; then exec ")
    assert f"--pass-marker={marker}" in check_command(init)
    plain = gate_of(run_job(instance_type="p4de.24xlarge", efa=True, fabric_check=True, run_id="r1"))
    assert "FABRIC_ADMISSION" not in env_of(plain)
    assert plain["command"][2].startswith("if [ -e '/shared/runs/r1/.fabric-passed-$(JOB_UID)' ]; then exec ")


def test_a_failed_fabric_check_fails_the_training_job_before_training():
    from eks_ddp_runtime.exitcodes import FABRIC_FAILED

    result = run_job(instance_type="p4de.24xlarge", efa=True, fabric_check=True)
    rules = train_job(result).inputs["spec"]["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "FailJob", "onExitCodes": {"containerName": "fabric-check", "operator": "In",
                                                             "values": [FABRIC_FAILED]}}
    # Control: without the check the policy has no such rule and the pods no init container.
    plain = train_job(run_job(instance_type="p4de.24xlarge", efa=True))
    assert not [r for r in plain.inputs["spec"]["podFailurePolicy"]["rules"]
                if (r.get("onExitCodes") or {}).get("containerName") == "fabric-check"]
    assert "initContainers" not in plain.inputs["spec"]["template"]["spec"]


def test_fabric_check_with_c10d_uses_the_training_jobs_rendezvous_host():
    result = run_job(instance_type="p4de.24xlarge", efa=True, fabric_check=True, rdzv_backend="c10d",
                     rdzv_endpoint=None)
    name = train_job(result).inputs["metadata"]["name"]
    assert flags(check_command(gate_of(result)))["rdzv-endpoint"].startswith(f"{name}-0.")


def test_no_fabric_check_unless_asked():
    result = run_job(instance_type="p4de.24xlarge", efa=True)
    assert "initContainers" not in train_job(result).inputs["spec"]["template"]["spec"]
    # Without EFA the check measures but requires neither EFA nor a floor.
    args = check_command(gate_of(run_job(fabric_check=True)))
    assert "--require-efa" not in args and not any(a.startswith("--min-busbw-gbs") for a in args)


def test_data_prep_runs_on_the_system_nodes_not_the_gpu_nodes():
    """Review B-9: prep pinned to the GPU group hung `pulumi up` for 30 min with the group at zero."""
    system = {"eks-ddp/pool": "system"}
    prep = pod_templates(run_job(system_node_selector=system))["prepare"]["spec"]
    assert prep["nodeSelector"] == system
    assert not prep.get("tolerations"), "prep must not tolerate the GPU taint: it would then land on GPU nodes"
    assert not any("nvidia.com/gpu" in (c["resources"].get("requests") or {}) for c in prep["containers"])
    # Without a selector it still stays off GPU nodes (no toleration), and the training pods keep theirs.
    templates = pod_templates(run_job())
    assert "nodeSelector" not in templates["prepare"]["spec"] and not templates["prepare"]["spec"].get("tolerations")
    assert templates["train"]["spec"]["nodeSelector"] == GPU_NODES


def test_component_default_fault_budget_fits_spot_capacity():
    """A program that imports ElasticJob without setting max_restarts gets the same >= 20-fault budget as
    the stack config, not torchrun's 3 (the 4th spot interruption would end the run)."""
    from eks_ddp_runtime.launch_command import DEFAULT_MAX_RESTARTS

    assert DEFAULT_MAX_RESTARTS >= 20
    assert flags(trainer(run_job())["command"])["max-restarts"] == str(DEFAULT_MAX_RESTARTS)


def test_immutable_job_fields_replace_the_job():
    """K8: Kubernetes refuses a change to a Job's completionMode, podFailurePolicy, successPolicy,
    backoffLimitPerIndex or managedBy (422 "field is immutable"), and the provider replaces a Job only for template,
    completions, parallelism and selector changes: both awaited Jobs of a run list those fields for replacement."""
    result = run_job(instance_type="p4de.24xlarge", efa=True, fabric_check=True, run_id="r1")
    immutable = {"spec.completionMode", "spec.podFailurePolicy", "spec.successPolicy", "spec.backoffLimitPerIndex"}
    for job in (train_job(result),):
        assert immutable <= set(job.replace_on_changes), (job.name, job.replace_on_changes)
        # and each listed field is one the Job really sets or Kubernetes defaults (paths in the provider's casing)
        assert {"completionMode", "podFailurePolicy"} <= set(job.inputs["spec"])


# --- U6, U7: library use is checked like the stack config ------------------------------------------------------

def _library_program(*jobs: dict, max_size: int = 2):
    """A program that makes one GPU node group (max_size) and ElasticJobs on it the way docs/library.md shows."""
    from eks_ddp.infra.gpu_nodegroup import GpuNodeGroup
    from tests.infra.test_gpu_nodegroup import BASE

    def program() -> None:
        group = GpuNodeGroup("gpu", dataclasses.replace(BASE, max_size=max_size, desired_size=0))
        for i, overrides in enumerate(jobs):
            placement = Placement.on(group)
            if overrides.pop("placement", None) == "mismatch":
                placement = Placement(instance_type="g5.12xlarge", node_selector=group.node_labels)
            ElasticJob(overrides.pop("name", f"job{i}"), dataclasses.replace(job_args(**{
                "namespace": "training", "image": IMAGE, "pvc_name": "shared", "instance_type": "g4dn.xlarge",
                "nodes": 2, "rdzv_endpoint": ETCD, "rdzv_tls_secret": RDZV_TLS_SECRET, **overrides}),
                placement=placement))

    return run_program({}, program=program)


def test_nodes_above_the_node_groups_max_size_fail_naming_both():
    """U6: nodes=3 on a max-2 group rendered parallelism 3; the third pod would stay Pending (the autoscaler never
    grows a group past max_size) and the first round would wait for it."""
    with pytest.raises(ValueError, match=r"^size.nodes: got 3; expected at most 2, the max_size of node group 'gpu'"):
        _library_program({"nodes": 3})
    _library_program({"nodes": 4}, max_size=4)


def test_an_instance_type_the_group_does_not_have_fails_naming_both():
    """g5.12xlarge Args on a g4dn.xlarge group asked for 4 GPUs on 1-GPU nodes: Pending until the deadline."""
    from tests.infra.test_gpu_nodegroup import BASE

    labels = {"eks-ddp/node-group": "gpu", "eks-ddp/instance-type": BASE.instance_type}
    with pytest.raises(ValueError, match=rf"^placement.instance_type: got 'g5.12xlarge', but placement.node_selector "
                                         rf"selects nodes of '{BASE.instance_type}'"):
        Placement(instance_type="g5.12xlarge", node_selector=labels)
    # Stated once: from the group, or from its labels.
    assert Placement(node_selector=labels).instance_type == BASE.instance_type
    _library_program({"nodes": 2})
    with pytest.raises(ValueError, match=r"placement.instance_type: got 'g5.12xlarge', but"):
        _library_program({"placement": "mismatch"})


def test_two_jobs_with_one_run_id_on_one_claim_fail_naming_both():
    """U7: two ElasticJobs with run_id exp-7 on the claim `shared` both wrote /shared/runs/exp-7."""
    with pytest.raises(ValueError, match=r"^run_id: got 'exp-7' for ElasticJob 'b', but ElasticJob 'a' already "
                                         r"writes /shared/runs/exp-7 on claim 'shared'"):
        _library_program({"name": "a", "run_id": "exp-7"}, {"name": "b", "run_id": "exp-7"})
    # Another run id, or another claim, is another directory.
    _library_program({"name": "a", "run_id": "exp-7"}, {"name": "b", "run_id": "exp-8"},
                     {"name": "c", "run_id": "exp-7", "pvc_name": "other"})
