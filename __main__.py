"""eks-ddp: reads the stack config, composes the components, exports the outputs.

No logic beyond wiring lives here: every decision is in the library (``eks_ddp``, components/).
"""

import os

import pulumi
import pulumi_kubernetes as k8s
from pulumi.runtime.config import CONFIG, get_config_env

from eks_ddp import (
    ClusterAddons,
    ClusterAddonsArgs,
    ClusterAutoscaler,
    ClusterAutoscalerArgs,
    EfsStore,
    EfsStoreArgs,
    EksCluster,
    EksClusterArgs,
    ElasticJob,
    ElasticJobArgs,
    EtcdRendezvous,
    EtcdRendezvousArgs,
    GpuNodeGroup,
    GpuNodeGroupArgs,
    Network,
    NetworkArgs,
    Observability,
    ObservabilityArgs,
    ResultsBucket,
    ResultsBucketArgs,
    TrainerImage,
    TrainerImageArgs,
)
from eks_ddp.config import (
    OFFLINE_PLAN_ENV,
    PROJECT,
    ConfigError,
    RunConfig,
    choose_zones,
    cluster_name_for,
    group_zone_problems,
    load_stack_config,
)
from eks_ddp.core.rules import partition as rules_partition
from eks_ddp.core.workload import Egress, S3Data, Workload, cifar10_workload, dataset_name
from eks_ddp.infra.efs import EfsLifecycle
from eks_ddp.infra.fsx import FsxLustreStore, FsxLustreStoreArgs
from eks_ddp.infra.iam import data_stage_role
from eks_ddp.infra.network import standard_zones
from eks_ddp.infra.results import run_prefix
from eks_ddp.infra.scan_gate import STACK_SETTING
from eks_ddp.infra.workload_image import WorkloadImage, WorkloadImageArgs, workload_image_name
from eks_ddp.tooling import cost, preflight
from eks_ddp.tooling.preflight.live import owner_id
from eks_ddp.workloads.elastic_job import rdzv_client_labels, trainer_service_account
from eks_ddp.workloads.namespace import label_cluster_namespaces, training_namespace


def workload_of(run: RunConfig) -> Workload:
    """The Workload a run's config names: the bundled trainer, or the user's module/script."""
    w = run.workload
    if not w.custom:
        return cifar10_workload(epochs=run.epochs, global_batch_size=run.global_batch_size, model=run.model,
                                learning_rate=run.learning_rate, compile=run.compile)
    data = S3Data(uri=w.s3_uri, name=dataset_name(w.s3_uri), sha256=w.s3_sha256) if w.s3_uri else None
    return Workload(name=run.run_id, image=run_images.get(w.image, w.image), module=w.module, script=w.script,
                    args=w.args, env=w.env, data=data,
                    egress=tuple(Egress.parse("workload.egress", e) for e in w.egress),  # checked in config
                    iam_statements=w.iam_statements)


def run_outputs(j: ElasticJob, run_id: str, key: str) -> pulumi.Output:
    """Shell lines for one run: follow its log, its Job's status, cancel it, fetch its results; where its logs are
    kept after the pods are gone (``eks-ddp status|logs|cancel|fetch <runId>`` reads this entry)."""
    return pulumi.Output.all(j.follow_command, namespace.metadata.name, run_url(run_id), j.logs_location).apply(lambda v: {
        "follow": v[0],
        "logs": v[3],
        "status": f"kubectl -n {v[1]} get job {j.job_name} -o wide",
        # Suspending stops the pods at once (no `up` needed) and the Job ignores spec.suspend, so no `up` resumes
        # it; the key makes it final: the next `up` removes the Job. Checkpoints stay; state run resumes.
        "cancel": f"kubectl -n {v[1]} patch job {j.job_name} --type=merge -p '{{\"spec\":{{\"suspend\":true}}}}' "
                  f"&& pulumi config set --path '{key}.state' cancelled",
        "fetchResults": f"eks-ddp-fetch-results {v[2]} --region {cfg.region} --out results/{run_id}{profile_flag}",
    })


# --- config: the only place that reads Pulumi config -----------------------------------------
raw = {k: v for k, v in {**get_config_env(), **CONFIG.get()}.items() if k.startswith(PROJECT + ":")}
try:
    cfg = load_stack_config(raw, region=pulumi.Config("aws").get("region"), stack=pulumi.get_stack(),
                            placeholders_ok=os.environ.get(OFFLINE_PLAN_ENV) == "1")
except ConfigError as err:
    raise pulumi.RunError(str(err)) from None

stack = pulumi.get_stack()
cluster_name = cluster_name_for(stack, cfg)
# Unique per stack on every backend: a self-managed backend's organization is always "organization".
stack_id = owner_id(pulumi.get_organization(), pulumi.get_project(), stack, cfg.cluster.owner_id)
if cfg.preflight:
    # Same account as the provider: a stack that sets aws:profile must be checked with that profile.
    preflight.run_or_raise(cfg, profile=pulumi.Config("aws").get("profile"), cluster_name=cluster_name,
                           stack_id=stack_id, organization=pulumi.get_organization())
# Regular zones where EKS accepts subnets: never a Local Zone, never an unsupported zone ID.
zones = choose_zones(cfg, [] if cfg.network.availability_zones else standard_zones())

# --- AWS infrastructure ------------------------------------------------------------------------
network = Network("network", NetworkArgs(
    cluster_name=cluster_name,
    availability_zones=zones,
    vpc_cidr=cfg.network.vpc_cidr,
    nat_gateways=cfg.network.nat_gateways,
    vpc_id=cfg.network.vpc_id,
    public_subnet_ids=cfg.network.public_subnet_ids,
    private_subnet_ids=cfg.network.private_subnet_ids,
    # The S3 endpoint admits this account's buckets; the runs' data sets and the named extras may be anyone's.
    s3_data_uris=[r.workload.s3_uri for r in cfg.runs if r.workload.s3_uri],
    s3_endpoint_extra_buckets=cfg.network.s3_endpoint_extra_buckets,
))

# A brought VPC's subnet zones are known now (looked up, nothing created): fail before the cluster bills.
if problems := group_zone_problems(cfg, network.private_subnet_by_az):
    raise pulumi.RunError(str(ConfigError(problems)))

cluster = EksCluster("cluster", EksClusterArgs(
    cluster_name=cluster_name,
    vpc_id=network.vpc_id,
    public_subnet_ids=network.public_subnet_ids,
    private_subnet_ids=network.private_subnet_ids,
    kubernetes_version=cfg.cluster.kubernetes_version,
    ami_release_version=cfg.cluster.ami_release_version,
    upgrade_policy=cfg.cluster.upgrade_policy,
    public_access_cidrs=cfg.cluster.public_access_cidrs,
    endpoint_public_access=cfg.cluster.endpoint_public_access,
    system_instance_type=cfg.cluster.system_instance_type,
    system_node_count=cfg.cluster.system_node_count,
    log_retention_days=cfg.cluster.log_retention_days,
    aws_profile=pulumi.Config("aws").get("profile"),
    admin_principal_arns=cfg.cluster.admin_principal_arns,
    viewer_principal_arns=cfg.cluster.viewer_principal_arns,
    stack_id=stack_id,
))

gpu_groups = [
    GpuNodeGroup(f"gpu-{g.name}", GpuNodeGroupArgs(
        group_name=g.name,
        cluster_name=cluster.cluster_name,
        node_role_arn=cluster.node_role_arn,
        subnet_ids=network.private_subnet_ids,
        subnet_by_az=network.private_subnet_by_az,
        node_security_group_id=cluster.node_security_group_id,
        cluster_security_group_id=cluster.cluster_security_group_id,
        vpc_id=network.vpc_id,
        instance_type=g.instance_type,
        min_size=g.min_size,
        desired_size=g.desired_size,
        max_size=g.max_size,
        capacity_type=g.capacity_type,
        efa=g.efa,
        capacity_reservation_id=g.capacity_reservation_id,
        availability_zone=g.availability_zone,
        placement_group_name=g.placement_group_name,
        root_volume_gib=g.root_volume_gib,
        spot_instance_types=g.spot_instance_types,
        kubernetes_version=cfg.cluster.kubernetes_version,
        node_repair=cfg.observability.node_repair,
        release_version=cfg.cluster.ami_release_version,
        local_storage=g.local_storage,
        capacity_block_window=g.capacity_block_window,
    ), opts=pulumi.ResourceOptions(depends_on=[cluster]))
    for g in cfg.node_groups
]

# skip_update_unreachable: a cluster this machine cannot reach (a new IP outside publicAccessCidrs, no access entry)
# leaves the Kubernetes resources as they are in state, instead of failing the refresh every `up` runs first, and with
# it the update that would fix the endpoint; preflight fails, naming the fix, unless this update applies it
# (components/eks_ddp/tooling/preflight/live.py check_endpoint_access).
k8s_provider = k8s.Provider("k8s", kubeconfig=cluster.kubeconfig, enable_server_side_apply=True,
                            skip_update_unreachable=True)
k8s_opts = pulumi.ResourceOptions(provider=k8s_provider)

addons = ClusterAddons("addons", ClusterAddonsArgs(
    cluster_name=cluster.cluster_name,
    efa=cfg.uses_efa,
    kubernetes_version=cfg.cluster.kubernetes_version,
    gpu_node_groups=gpu_groups,
), opts=pulumi.ResourceOptions(providers={"kubernetes": k8s_provider}, depends_on=[cluster]))

# Logs that outlive the nodes (CloudWatch), GPU metrics and the node health agent node repair acts on.
observability = Observability("observability", ObservabilityArgs(
    cluster_name=cluster_name,
    region=cfg.region,
    oidc_provider_arn=cluster.oidc_provider_arn,
    oidc_provider_url=cluster.oidc_provider_url,
    kubernetes_version=cfg.cluster.kubernetes_version,
    cloudwatch=cfg.observability.cloudwatch,
    log_retention_days=cfg.observability.log_retention_days,
    gpu_metrics=cfg.observability.gpu_metrics,
    node_monitoring=cfg.observability.node_repair,
    gpu_node_groups=gpu_groups,
    stack_id=stack_id,
), opts=pulumi.ResourceOptions(providers={"kubernetes": k8s_provider}, depends_on=[cluster]))

# GPU groups idle at zero nodes; the autoscaler brings them up for Pending training pods and removes them after.
autoscaler = ClusterAutoscaler("autoscaler", ClusterAutoscalerArgs(
    cluster_name=cluster_name,
    region=cfg.region,
    kubernetes_version=cfg.cluster.kubernetes_version,
    oidc_provider_arn=cluster.oidc_provider_arn,
    oidc_provider_url=cluster.oidc_provider_url,
    node_selector=cluster.system_node_labels,
    scale_down_unneeded_time=cfg.cluster.scale_down_unneeded_time,
), opts=pulumi.ResourceOptions(providers={"kubernetes": k8s_provider}, depends_on=[cluster]))

namespace = training_namespace(cfg.job.namespace, opts=k8s_opts)
label_cluster_namespaces("pod-security", opts=k8s_opts)

image = TrainerImage("trainer-image", TrainerImageArgs(
    prebuilt=cfg.image.prebuilt,
    keep_images=cfg.image.keep_images,
    retain_repository=cfg.image.retain_repository,
    registry_cache=cfg.image.registry_cache,
    scan_fail_severity=cfg.image.scan_fail_severity,
    aws_profile=pulumi.Config("aws").get("profile"),
    node_role_name=cluster.node_role_name,
    scan_setting=STACK_SETTING,
))

storage: EfsStore | FsxLustreStore
if cfg.storage.backend == "fsxLustre":
    # One subnet (FSx for Lustre takes one): the zone of the job's GPU nodes, which read and write it most.
    fsx_zone = gpu_groups[cfg.node_groups.index(cfg.job_group)].zone or next(iter(network.private_subnet_by_az))
    storage = FsxLustreStore("storage", FsxLustreStoreArgs(
        cluster_name=cluster.cluster_name,
        vpc_id=network.vpc_id,
        subnet_id=network.private_subnet_by_az[fsx_zone],
        node_security_group_id=cluster.node_security_group_id,
        oidc_provider_arn=cluster.oidc_provider_arn,
        oidc_provider_url=cluster.oidc_provider_url,
        namespace=namespace.metadata.name,
        run_id=cfg.job.run_id,
        more_run_ids=tuple(r.run_id for r in cfg.runs[1:]),
        storage_capacity_gib=cfg.storage.fsx_storage_capacity_gib,
        throughput_per_tib=cfg.storage.fsx_throughput_per_tib,
        # Each S3 data set linked where its stage puts it (/shared/data/<name>): read through Lustre from S3.
        data_repositories=tuple({dataset_name(r.workload.s3_uri): r.workload.s3_uri
                                 for r in cfg.runs if r.workload.s3_uri}.items()),
        layout_image=image.image_ref,
        system_node_selector=cluster.system_node_labels,
        retain_on_destroy=cfg.storage.retain_on_destroy,
        kubernetes_version=cfg.cluster.kubernetes_version,
    ), opts=pulumi.ResourceOptions(providers={"kubernetes": k8s_provider}, depends_on=[cluster]))
else:
    storage = EfsStore("storage", EfsStoreArgs(
        cluster_name=cluster.cluster_name,
        vpc_id=network.vpc_id,
        # EFS allows one mount target per zone; a brought VPC may have several private subnets in one.
        subnet_ids=list(network.private_subnet_by_az.values()),
        node_security_group_id=cluster.node_security_group_id,
        oidc_provider_arn=cluster.oidc_provider_arn,
        oidc_provider_url=cluster.oidc_provider_url,
        namespace=namespace.metadata.name,
        run_id=cfg.job.run_id,  # its own access point and claim: the run's pods never see another run's directory
        more_run_ids=tuple(r.run_id for r in cfg.runs[1:]),
        retain_on_destroy=cfg.storage.retain_on_destroy,
        file_system_id=cfg.storage.file_system_id,
        kubernetes_version=cfg.cluster.kubernetes_version,
        lifecycle=EfsLifecycle(**cfg.storage.efs_transitions),
    ), opts=pulumi.ResourceOptions(providers={"kubernetes": k8s_provider}, depends_on=[cluster]))

# Every distinct runs[i].workload.image: the nodes may pull exactly its ECR repository, and it passes the scan gate.
run_images = {img: WorkloadImage(f"run-image-{workload_image_name(img)}", WorkloadImageArgs(
    image=img, node_role_name=cluster.node_role_name, scan_fail_severity=cfg.image.scan_fail_severity,
    scan_setting=STACK_SETTING, aws_profile=pulumi.Config("aws").get("profile"))).image_ref
    for img in dict.fromkeys(r.workload.image for r in cfg.runs if r.workload.custom and r.workload.image)}

# --- Kubernetes workloads ------------------------------------------------------------------------
# Results leave the cluster: rank 0 uploads them to s3://<bucket>/runs/<runId>/ with a role that may write
# only there. The bucket is retained on destroy.
JOB_NAME = "training"
results = ResultsBucket("results", ResultsBucketArgs(
    oidc_provider_arn=cluster.oidc_provider_arn,
    oidc_provider_url=cluster.oidc_provider_url,
    namespace=namespace.metadata.name,
    service_account=trainer_service_account(JOB_NAME),  # the first run's training pods
    run_id=cfg.job.run_id,
    existing_bucket=cfg.storage.results_bucket,
    existing_kms_key_arn=cfg.storage.results_kms_key_arn,  # its uploaders may use it
    partition=rules_partition(cfg.region),
))
profile = pulumi.Config("aws").get("profile")
profile_flag = f" --profile {profile}" if profile else ""


def run_url(run_id: str) -> pulumi.Output[str]:
    return pulumi.Output.concat("s3://", results.bucket_name, "/", run_prefix(run_id))


jobs = []
staged: dict[str, tuple[str, int]] = {}  # dataset directory -> (S3 prefix, run index)
for i, run in enumerate(cfg.runs):
    # The first run keeps the names the one-run stack always had (its deployed Job is never replaced for a name);
    # every further run is named after its runId.
    job_name = JOB_NAME if i == 0 else f"{JOB_NAME}-{run.run_id}"
    role_arn = results.role_arn if i == 0 else results.uploader_role(
        f"results-uploader-{run.run_id}", run.run_id, trainer_service_account(job_name))
    group = cfg.group_of(run)
    workload = workload_of(run)
    data_role_arn = None
    if isinstance(workload.data, S3Data):  # the stage's own role: list and read exactly that prefix
        if staged.setdefault(workload.data.name, (workload.data.uri, i))[0] != workload.data.uri:
            uri, j = staged[workload.data.name]
            raise pulumi.RunError(
                f"{cfg.run_key(i)}.workload.data.s3: got {workload.data.uri!r}, which would stage into "
                f"/shared/data/{workload.data.name} like {cfg.run_key(j)}'s {uri!r}; expected prefixes whose last "
                "folders differ")
        data_role_arn = data_stage_role(
            f"data-stage-{run.run_id}", workload.data, oidc_provider_arn=cluster.oidc_provider_arn,
            oidc_provider_url=cluster.oidc_provider_url, namespace=namespace.metadata.name,
            job_name=job_name, partition=rules_partition(cfg.region))
    # Every etcd-v2 run has a store of its own (its own CA and client certificate, Service, NetworkPolicy admitting
    # only its pods): no run's pods hold a certificate, or reach a store, that another run's agents read. The first
    # run's keeps the name one-run stacks always had ("rendezvous"), so their store and Job are not replaced.
    rdzv: dict = {}
    if run.rdzv_backend == "etcd-v2":
        client, *more_clients = rdzv_client_labels(job_name, run.run_id)
        store = EtcdRendezvous("rendezvous" if i == 0 else f"rendezvous-{run.run_id}", EtcdRendezvousArgs(
            namespace=namespace.metadata.name,
            replicas=cfg.etcd.replicas,
            node_selector=cluster.system_node_labels,
            client_labels=client,
            more_client_labels=more_clients,
        ), opts=pulumi.ResourceOptions(provider=k8s_provider, depends_on=[addons]))
        rdzv = dict(rdzv_endpoint=store.endpoint, rdzv_tls_secret=store.client_tls_secret,
                    rdzv_server_labels=store.server_selector)
    jobs.append(ElasticJob(job_name, ElasticJobArgs(
        namespace=namespace.metadata.name,
        image=image.image_ref,
        data_claim=storage.data_claim_name,
        data_read_only_claim=storage.data_read_only_claim_name,  # EFS refuses writes through it; FSx mounts it ro
        run_claim=storage.run_claim_names[run.run_id],
        instance_type=group.instance_type,
        efa=group.efa,
        fabric_check=cfg.fabric_check_of(run),
        node_selector=gpu_groups[cfg.node_groups.index(group)].node_labels,
        system_node_selector=cluster.system_node_labels,
        nodes=run.nodes,
        min_nodes=run.min_nodes,
        max_restarts=run.max_restarts,
        fault_budget=run.fault_budget,
        active_deadline_hours=run.active_deadline_hours,
        run_id=run.run_id,
        rdzv_backend=run.rdzv_backend,
        **rdzv,
        workload=workload,
        data_role_arn=data_role_arn,
        results_role_arn=role_arn,
        results_url=run_url(run.run_id),
        results_kms_key_arn=results.kms_key_arn,
        state=run.state,
    ), opts=pulumi.ResourceOptions(provider=k8s_provider, depends_on=[addons, *gpu_groups])))
job = jobs[0]
results_url = run_url(cfg.job.run_id)

# --- outputs ------------------------------------------------------------------------------------
pulumi.export("clusterName", cluster.cluster_name)
pulumi.export("kubeconfig", pulumi.Output.secret(cluster.kubeconfig))
pulumi.export("nodeGroupNames", [g.node_group_name for g in gpu_groups])
pulumi.export("fsxId" if cfg.storage.backend == "fsxLustre" else "efsId", storage.file_system_id)
pulumi.export("pvcName", storage.run_claim_name)  # the run's directory (checkpoints, model, metrics)
pulumi.export("dataClaimName", storage.data_claim_name)
pulumi.export("imageRef", image.image_ref)
pulumi.export("kubectl", cluster.cluster_name.apply(
    lambda n: f"aws eks update-kubeconfig --region {cfg.region} --name {n}{profile_flag} && "
              f"kubectl -n {cfg.job.namespace} get pods"))
pulumi.export("followTraining", job.follow_command)
pulumi.export("trainingJobName", job.job_name)
pulumi.export("evaluateCommand", job.evaluate_command)  # re-runs the test-set evaluation
pulumi.export("results", {"bucket": results.bucket_name, "prefix": results.prefix, "url": results_url,
                          "kmsKeyArn": results.kms_key_arn})  # readers need kms:Decrypt on it
pulumi.export("fetchResults", results_url.apply(  # eval "$(pulumi stack output fetchResults)"
    lambda url: f"eks-ddp-fetch-results {url} --region {cfg.region} --out results/{cfg.job.run_id}{profile_flag}"))
# One entry per run (runId -> shell lines): eval "$(pulumi stack output runs --json | jq -r '.["<runId>"].follow')"
pulumi.export("runs", {run.run_id: run_outputs(j, run.run_id, cfg.run_key(i))
                       for i, (run, j) in enumerate(zip(cfg.runs, jobs, strict=True))})
# Every pod's output, kept observability.logRetentionDays after its node is gone: eval "$(pulumi stack output containerLogs)"
if observability.log_groups:
    pulumi.export("containerLogs", f"aws logs tail {observability.log_groups['application']} --region {cfg.region}"
                                   f"{profile_flag} --since 1h --follow --filter-pattern "
                                   f"'{{ $.kubernetes.namespace_name = \"{cfg.job.namespace}\" }}'")
pulumi.export("costEstimate", cost.estimate(cfg).as_dict())
