"""eks-ddp: reads the stack config, composes the components, exports the outputs.

No logic beyond wiring lives here: every decision is in the library (``eks_ddp``, components/). It reads top to
bottom: config, AWS infrastructure, images, storage, the runs, the outputs (docs/architecture.md).
"""

import os

import pulumi
import pulumi_kubernetes as k8s
from pulumi.runtime.config import CONFIG, get_config_env

import eks_ddp
from eks_ddp.config import (
    OFFLINE_PLAN_ENV,
    PROJECT,
    ConfigError,
    choose_zones,
    cluster_name_for,
    group_zone_problems,
    load_stack_config,
)
from eks_ddp.config.run_rules import job_name_of, stack_image_used, workload_of
from eks_ddp.core.rules import partition
from eks_ddp.core.workload import S3Data, dataset_name
from eks_ddp.infra.efs import EfsLifecycle
from eks_ddp.infra.fsx import FsxLustreStore, FsxLustreStoreArgs
from eks_ddp.infra.network import standard_zones
from eks_ddp.infra.results import run_prefix
from eks_ddp.infra.scan_gate import STACK_SETTING
from eks_ddp.infra.workload_image import workload_image_name
from eks_ddp.tooling import cost, preflight
from eks_ddp.tooling.preflight import certificates as preflight_certificates
from eks_ddp.tooling.preflight.live import owner_id
from eks_ddp.workloads.elastic_job import rdzv_client_labels, trainer_service_account
from eks_ddp.workloads.namespace import label_cluster_namespaces

# --- config: the only place that reads Pulumi config -----------------------------------------
raw = {k: v for k, v in {**get_config_env(), **CONFIG.get()}.items() if k.startswith(PROJECT + ":")}
aws_config, stack = pulumi.Config("aws"), pulumi.get_stack()
profile = aws_config.get("profile")
profile_flag = f" --profile {profile}" if profile else ""
try:
    cfg = load_stack_config(raw, region=aws_config.get("region"), stack=stack,
                            placeholders_ok=os.environ.get(OFFLINE_PLAN_ENV) == "1")
except ConfigError as err:
    raise pulumi.RunError(str(err)) from None
for warning in cfg.warnings:  # deprecated spellings that still read
    pulumi.log.warn(warning)
cluster_name = cluster_name_for(stack, cfg)  # stack_id: unique on every backend (a self-managed one's org: "organization")
stack_id = owner_id(pulumi.get_organization(), pulumi.get_project(), stack, cfg.cluster.owner_id)
if cfg.preflight:  # same account as the provider: a stack that sets aws:profile is checked with that profile
    preflight.run_or_raise(cfg, profile=profile, cluster_name=cluster_name, stack_id=stack_id,
                           organization=pulumi.get_organization())
zones = choose_zones(cfg, [] if cfg.network.availability_zones else standard_zones())  # never a Local Zone
k8s_version, c = cfg.cluster.kubernetes_version, cfg.cluster

# --- AWS infrastructure ------------------------------------------------------------------------
network = eks_ddp.Network("network", eks_ddp.NetworkArgs(
    cluster_name=cluster_name, availability_zones=zones, vpc_cidr=cfg.network.vpc_cidr,
    nat_gateways=cfg.network.nat_gateways, vpc_id=cfg.network.vpc_id,
    public_subnet_ids=cfg.network.public_subnet_ids, private_subnet_ids=cfg.network.private_subnet_ids,
    # The S3 endpoint admits this account's buckets; the runs' data sets and the named extras may be anyone's.
    s3_data_uris=[r.workload.s3_uri for r in cfg.runs if r.workload.s3_uri],
    s3_endpoint_extra_buckets=cfg.network.s3_endpoint_extra_buckets,
))
# A brought VPC's subnet zones are known now (looked up, nothing created): fail before the cluster bills.
if problems := group_zone_problems(cfg, network.private_subnet_by_az):
    raise pulumi.RunError(str(ConfigError(problems)))

cluster = eks_ddp.EksCluster("cluster", eks_ddp.EksClusterArgs(
    cluster_name=cluster_name, vpc_id=network.vpc_id, public_subnet_ids=network.public_subnet_ids,
    private_subnet_ids=network.private_subnet_ids, kubernetes_version=k8s_version,
    ami_release_version=c.ami_release_version, upgrade_policy=c.upgrade_policy,
    public_access_cidrs=c.public_access_cidrs, endpoint_public_access=c.endpoint_public_access,
    system_instance_type=c.system_instance_type, system_node_count=c.system_node_count,
    log_retention_days=c.log_retention_days, aws_profile=profile, admin_principal_arns=c.admin_principal_arns,
    viewer_principal_arns=c.viewer_principal_arns, stack_id=stack_id,
    lustre_client=cfg.storage.backend == "fsxLustre",  # every node that can mount it: the layout Job runs on these
))
irsa = dict(oidc_provider_arn=cluster.oidc_provider_arn, oidc_provider_url=cluster.oidc_provider_url)

gpu_groups = {g.name: eks_ddp.GpuNodeGroup(f"gpu-{g.name}", eks_ddp.GpuNodeGroupArgs(
    group_name=g.name, cluster_name=cluster.cluster_name, node_role_arn=cluster.node_role_arn,
    subnet_ids=network.private_subnet_ids, subnet_by_az=network.private_subnet_by_az,
    node_security_group_id=cluster.node_security_group_id,
    cluster_security_group_id=cluster.cluster_security_group_id, vpc_id=network.vpc_id,
    instance_type=g.instance_type, min_size=g.min_size, desired_size=g.desired_size, max_size=g.max_size,
    capacity_type=g.capacity_type, efa=g.efa, capacity_reservation_id=g.capacity_reservation_id,
    availability_zone=g.availability_zone, placement_group_name=g.placement_group_name,
    root_volume_gib=g.root_volume_gib, spot_instance_types=g.spot_instance_types, kubernetes_version=k8s_version,
    node_repair=cfg.observability.node_repair, release_version=c.ami_release_version,
    local_storage=g.local_storage, capacity_block_window=g.capacity_block_window,
    lustre_client=cfg.storage.backend == "fsxLustre",
), opts=pulumi.ResourceOptions(depends_on=[cluster])) for g in cfg.node_groups}

# skip_update_unreachable: a cluster out of reach keeps its objects, never failing `up` (tooling/preflight/live.py)
k8s_provider = k8s.Provider("k8s", kubeconfig=cluster.kubeconfig, enable_server_side_apply=True, skip_update_unreachable=True)
k8s_opts = pulumi.ResourceOptions(provider=k8s_provider)
on_cluster = pulumi.ResourceOptions(providers={"kubernetes": k8s_provider}, depends_on=[cluster])

addons = eks_ddp.ClusterAddons("addons", eks_ddp.ClusterAddonsArgs(
    cluster_name=cluster.cluster_name, efa=cfg.uses_efa, kubernetes_version=k8s_version,
    gpu_node_groups=list(gpu_groups.values())), opts=on_cluster)
o = cfg.observability  # logs that outlive the nodes (CloudWatch), GPU metrics, the health agent node repair acts on
observability = eks_ddp.Observability("observability", eks_ddp.ObservabilityArgs(
    cluster_name=cluster_name, region=cfg.region, **irsa, kubernetes_version=k8s_version, cloudwatch=o.cloudwatch,
    log_retention_days=o.log_retention_days, gpu_metrics=o.gpu_metrics, node_monitoring=o.node_repair,
    gpu_node_groups=list(gpu_groups.values()), stack_id=stack_id), opts=on_cluster)
# GPU groups idle at zero nodes; the autoscaler brings them up for Pending training pods and removes them after.
autoscaler = eks_ddp.ClusterAutoscaler("autoscaler", eks_ddp.ClusterAutoscalerArgs(
    cluster_name=cluster_name, region=cfg.region, kubernetes_version=k8s_version, **irsa,
    node_selector=cluster.system_node_labels, scale_down_unneeded_time=c.scale_down_unneeded_time,
    provisioning_requests=cfg.queue.provisioning_requests), opts=on_cluster)  # Kueue's all-or-nothing nodes

namespace = eks_ddp.training_namespace(cfg.job.namespace, opts=k8s_opts)
label_cluster_namespaces("pod-security", opts=k8s_opts)
# Kueue (system nodes, after the ProvisioningRequest API): every run waits, suspended, until the groups' quota admits it.
kueue = eks_ddp.Kueue("kueue", eks_ddp.KueueArgs(node_selector=cluster.system_node_labels, vpc_cidrs=network.vpc_cidrs,
    managed_namespaces=[cfg.job.namespace], provisioning_request_crd=autoscaler.provisioning_request_crd),
    opts=on_cluster) if cfg.queue.enabled else None
run_queue = eks_ddp.RunQueue("queue", eks_ddp.RunQueueArgs(
    namespace=namespace.metadata.name, groups=list(gpu_groups.values()), preemption=cfg.queue.preemption,
    all_or_nothing=cfg.queue.all_or_nothing), opts=pulumi.ResourceOptions(provider=k8s_provider, depends_on=[addons, kueue])
) if kueue else None

# --- images: the bundled trainer's only when a run uses the stack's image (else no Docker build) ---------------
image = eks_ddp.TrainerImage("trainer-image", eks_ddp.TrainerImageArgs(
    prebuilt=cfg.image.prebuilt, keep_images=cfg.image.keep_images, retain_repository=cfg.image.retain_repository,
    registry_cache=cfg.image.registry_cache, scan_fail_severity=cfg.image.scan_fail_severity, aws_profile=profile,
    node_role_name=cluster.node_role_name, scan_setting=STACK_SETTING)) if stack_image_used(cfg) else None
# Every distinct runs[i].workload.image: the nodes may pull exactly its ECR repository, and it passes the scan gate.
run_images = {img: eks_ddp.WorkloadImage(f"run-image-{workload_image_name(img)}", eks_ddp.WorkloadImageArgs(
    image=img, node_role_name=cluster.node_role_name, scan_fail_severity=cfg.image.scan_fail_severity,
    scan_setting=STACK_SETTING, aws_profile=profile)).image_ref
    for img in dict.fromkeys(r.workload.image for r in cfg.runs if r.workload.custom and r.workload.image)}
helper_image = image.image_ref if image is not None else next(iter(run_images.values()))  # has a shell: FSx layout, logs


# --- storage: EFS or FSx for Lustre, one claim for the data and one per run ------------------------------------
def shared_storage() -> eks_ddp.EfsStore | FsxLustreStore:
    s, run_ids = cfg.storage, (cfg.job.run_id, tuple(r.run_id for r in cfg.runs[1:]))
    common = dict(cluster_name=cluster.cluster_name, vpc_id=network.vpc_id, **irsa,
                  node_security_group_id=cluster.node_security_group_id, namespace=namespace.metadata.name,
                  run_id=run_ids[0], more_run_ids=run_ids[1], retain_on_destroy=s.retain_on_destroy,
                  kubernetes_version=k8s_version)
    if s.backend == "fsxLustre":
        # One subnet (FSx for Lustre takes one): the zone of the job's GPU nodes, which read and write it most.
        zone = gpu_groups[cfg.job_group.name].zone or next(iter(network.private_subnet_by_az))
        return FsxLustreStore("storage", FsxLustreStoreArgs(
            **common, subnet_id=network.private_subnet_by_az[zone], storage_capacity_gib=s.fsx_storage_capacity_gib,
            throughput_per_tib=s.fsx_throughput_per_tib,
            # Each S3 data set linked where its stage puts it (/shared/data/<name>): read through Lustre from S3.
            data_repositories=tuple({dataset_name(r.workload.s3_uri): r.workload.s3_uri
                                     for r in cfg.runs if r.workload.s3_uri}.items()),
            layout_image=helper_image, system_node_selector=cluster.system_node_labels,
            backup_id=s.fsx_backup_id), opts=on_cluster)  # backup_id: an earlier destroy's final backup
    # EFS allows one mount target per zone; a brought VPC may have several private subnets in one.
    return eks_ddp.EfsStore("storage", eks_ddp.EfsStoreArgs(
        **common, subnet_ids=list(network.private_subnet_by_az.values()), file_system_id=s.file_system_id,
        lifecycle=EfsLifecycle(**s.efs_transitions)), opts=on_cluster)


storage = shared_storage()

# --- the runs ------------------------------------------------------------------------------------
# Rank 0 uploads the results to s3://<bucket>/runs/<runId>/ with a role that may write only there (kept on destroy).
results = eks_ddp.ResultsBucket("results", eks_ddp.ResultsBucketArgs(
    **irsa, namespace=namespace.metadata.name,
    service_account=trainer_service_account(job_name_of(0, cfg.job)),  # the first run's training pods
    run_id=cfg.job.run_id, existing_bucket=cfg.storage.results_bucket,
    existing_kms_key_arn=cfg.storage.results_kms_key_arn,  # its uploaders may use it
    partition=partition(cfg.region)))


def run_url(run_id: str) -> pulumi.Output[str]:
    return pulumi.Output.concat("s3://", results.bucket_name, "/", run_prefix(run_id))


def run_job(i: int) -> eks_ddp.ElasticJob:
    """runs[i]'s rendezvous store, roles and ElasticJob."""
    run, name = cfg.runs[i], job_name_of(i, cfg.runs[i])
    workload = workload_of(run, run_images)
    role_arn = results.role_arn if i == 0 else results.uploader_role(
        f"results-uploader-{run.run_id}", run.run_id, trainer_service_account(name))
    if workload.iam_statements:  # joined to the uploader role: the one role the training pods' ServiceAccount has
        was_under_job = pulumi.Alias(parent=pulumi.create_urn(name, "eks-ddp:elastic_job:ElasticJob"))
        role_arn = eks_ddp.workload_policy(f"{name}-workload", role_arn, workload.iam_statements,
                                           opts=pulumi.ResourceOptions(aliases=[was_under_job]))
    data_role_arn = None
    if isinstance(workload.data, S3Data):  # the stage's own role: list and read exactly that prefix
        data_role_arn = eks_ddp.data_stage_role(f"data-stage-{run.run_id}", workload.data, **irsa, job_name=name,
                                                namespace=namespace.metadata.name, partition=partition(cfg.region))
    # Every etcd run has a store of its own (its own CA and client certificate, Service, NetworkPolicy admitting
    # only its pods): no run's pods hold a certificate, or reach a store, that another run's agents read. The first
    # run's keeps the name one-run stacks always had ("rendezvous"), so their store and Job are not replaced.
    rendezvous: eks_ddp.EtcdStore | eks_ddp.C10d = eks_ddp.C10d()
    if run.rdzv_backend != "c10d":
        client, *more_clients = rdzv_client_labels(name, run.run_id)
        store_name = "rendezvous" if i == 0 else f"rendezvous-{run.run_id}"
        store = eks_ddp.EtcdRendezvous(store_name, eks_ddp.EtcdRendezvousArgs(
            namespace=namespace.metadata.name, replicas=cfg.etcd.replicas, node_selector=cluster.system_node_labels,
            client_labels=client, more_client_labels=more_clients, max_agents=max(g.max_size for g in cfg.node_groups),
        ), opts=pulumi.ResourceOptions(provider=k8s_provider, depends_on=[addons]))
        preflight_certificates.warn_near_expiry(store.certificate_expiries)  # during up: under 30 days left
        rendezvous = eks_ddp.EtcdStore.of(store)
    return eks_ddp.ElasticJob(name, eks_ddp.ElasticJobArgs(
        namespace=namespace.metadata.name, image=image.image_ref if image is not None else None, workload=workload,
        placement=eks_ddp.Placement.on(gpu_groups[cfg.group_of(run).name], system_node_selector=cluster.system_node_labels),
        size=eks_ddp.Size(nodes=run.nodes, min_nodes=run.min_nodes, max_restarts=run.max_restarts,
                  fault_budget=run.fault_budget, active_deadline_hours=run.active_deadline_hours),
        storage=eks_ddp.PerRunClaims(data=storage.data_claim_name, run=storage.run_claim_names[run.run_id],
                             data_read_only=storage.data_read_only_claim_name),  # EFS refuses writes; FSx mounts ro
        rendezvous=rendezvous,
        results=eks_ddp.Results(url=run_url(run.run_id), role_arn=role_arn, kms_key_arn=results.kms_key_arn),
        run_id=run.run_id, state=run.state, data_role_arn=data_role_arn, fabric_check=cfg.fabric_check_of(run),
        queue=run_queue.queued(run.priority) if run_queue else None,  # its Jobs wait in the queue at its priority
    ), opts=pulumi.ResourceOptions(provider=k8s_provider, depends_on=[addons, *gpu_groups.values(), *filter(None, [run_queue])]))


jobs = [run_job(i) for i in range(len(cfg.runs))]

# --- outputs ------------------------------------------------------------------------------------
job, results_url = jobs[0], run_url(cfg.job.run_id)
pulumi.export("clusterName", cluster.cluster_name)
pulumi.export("kubeconfig", pulumi.Output.secret(cluster.kubeconfig))
pulumi.export("nodeGroupNames", [g.node_group_name for g in gpu_groups.values()])
pulumi.export("fsxId" if cfg.storage.backend == "fsxLustre" else "efsId", storage.file_system_id)
pulumi.export("pvcName", storage.run_claim_name)  # the run's directory (checkpoints, model, metrics)
pulumi.export("dataClaimName", storage.data_claim_name)
if image is not None:
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
pulumi.export("runs", {run.run_id: j.commands(run_url(run.run_id), region=cfg.region, profile=profile,
                                               state_key=f"{cfg.run_key(i)}.state")
                       for i, (run, j) in enumerate(zip(cfg.runs, jobs, strict=True))})
# Every pod's output, kept observability.logRetentionDays after its node is gone: eval "$(pulumi stack output containerLogs)"
if observability.log_groups:
    pulumi.export("containerLogs", f"aws logs tail {observability.log_groups['application']} --region {cfg.region}"
                                   f"{profile_flag} --since 1h --follow --filter-pattern "
                                   f"'{{ $.kubernetes.namespace_name = \"{cfg.job.namespace}\" }}'")
pulumi.export("costEstimate", cost.estimate(cfg).as_dict())
