"""Preflight against what this stack already runs in the account: its EKS cluster, its node groups, its nodes.

:mod:`eks_ddp.tooling.preflight` checks the stack's config against the region; these checks read the live state that
config meets on a later ``pulumi up``:

- **the cluster name**: a cluster of that name that belongs to another stack (its ``eks-ddp/stack`` tag)
  fails preflight before anything bills; without the tag (made before the tag existed, or by hand) it is a warning;
- **the version step**: EKS upgrades one minor at a time and never downgrades; a stack asking for more than
  the next minor, or for an older one (EKS may have upgraded a STANDARD cluster itself), is told the exact step;
- **a resize**: a GPU group's desired size belongs to the autoscaler; a ``minSize`` above it would be refused
  by EKS, and a ``maxSize`` below it would scale in running (training) nodes: both fail with the
  ``aws eks update-nodegroup-config`` to run first;
- **the owner id**: on a self-managed backend ``pulumi.get_organization()`` is the constant
  ``"organization"`` (pulumi/pulumi ``pkg/backend/diy/backend.go``: "DIY backend always uses "organization" as
  the fixed organization name"), so ``<organization>/<project>/<stack>`` is the same for two teams' ``dev``
  stacks; there the owner id takes ``cluster.ownerId``, a value the stack keeps in its config, and preflight
  refuses to go on without one (:func:`owner_id`, :func:`check_owner_id`);
- **the log group**: ``/aws/eks/<cluster>/cluster`` whose owner tag names another stack is never adopted
  (``components/eks_ddp/infra/cluster.py`` imports an existing group only when its tag is absent or this stack's);
- **own nodes**: instances tagged ``eks:cluster-name=<cluster>`` (EKS tags every managed node group instance)
  are this stack's demand already counted at ``maxSize``, not extra load on the quota or the reservation;
- **the API endpoint from here**: this machine's public IP within the live cluster's ``publicAccessCidrs`` and the
  caller's principal holding an access entry, else the Kubernetes provider cannot reach the cluster
  (:func:`check_endpoint_access`).

IAM actions (read-only): eks:DescribeCluster, eks:ListNodegroups, eks:DescribeNodegroup, eks:ListAccessEntries,
ec2:DescribeInstances, logs:DescribeLogGroups, logs:ListTagsForResource, sts:GetCallerIdentity.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.request
from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

from eks_ddp.config import StackConfig
from eks_ddp.core import k8s_versions
from eks_ddp.core.ownership import DIY_ORGANIZATION, STACK_TAG, legacy_owner, owner_id  # noqa: F401 (API)

OWNER_TAG = "eks:cluster-name"
"""EKS tags each managed node group instance with its cluster's name."""
GROUP_LABEL = "eks-ddp/node-group"
CHECKIP_URL = "https://checkip.amazonaws.com"
"""Answers the caller's public IPv4 address, as AWS sees it (the address ``publicAccessCidrs`` is matched with)."""
OWNER_ID_KEY = "cluster.ownerId"
OWNER_ID_COMMAND = ("pulumi config set --path cluster.ownerId "
                    "$(python3 -c 'import uuid; print(uuid.uuid4().hex)')")


def check_owner_id(c: Any, organization: str | None) -> None:
    """A self-managed backend without ``cluster.ownerId``: two stacks of one name would share one owner."""
    if organization == DIY_ORGANIZATION and c.cfg.cluster.owner_id is None:
        c.fail(f"{OWNER_ID_KEY}: required on a self-managed backend (S3, GCS, Azure Blob, --local), where every "
               f"stack's organization is {DIY_ORGANIZATION!r}: another project's stack of this name in the account "
               f"would look like this one and its cluster and log group like this stack's; set it once and keep "
               f"it: {OWNER_ID_COMMAND}")


def log_group_owner(logs: Any, name: str) -> tuple[bool, str | None]:
    """(whether the log group exists, its ``eks-ddp/stack`` tag or None)."""
    groups = [g for page in logs.get_paginator("describe_log_groups").paginate(logGroupNamePrefix=name)
              for g in page.get("logGroups", []) if g.get("logGroupName") == name]
    if not groups:
        return False, None
    arn = groups[0]["arn"].removesuffix(":*")
    return True, (logs.list_tags_for_resource(resourceArn=arn).get("tags") or {}).get(STACK_TAG)


def check_log_group(c: Any, logs: Any, cluster_name: str, stack_id: str | None) -> None:
    """The control-plane log group of this cluster name, tagged by another stack, is never this stack's."""
    name = f"/aws/eks/{cluster_name}/cluster"
    found = c.attempt("logs", "DescribeLogGroups", f"the owner of log group {name}", lambda: log_group_owner(logs, name))
    if not found:
        return
    exists, owner = found
    if exists and owner is not None and stack_id is not None and owner not in (stack_id, legacy_owner(stack_id)):
        c.fail(f"cluster.name: the log group {name} belongs to stack {owner!r}, not to this stack ({stack_id}); "
               "it is never adopted: set another name: pulumi config set --path cluster.name <name> (a name no "
               "cluster or log group in this account and region has)")


def minor(version: str) -> tuple[int, int]:
    major, mnr = version.split(".")[:2]
    return int(major), int(mnr)


def describe_cluster(eks: Any, name: str) -> dict[str, Any]:
    """The cluster, or {} when there is none of that name."""
    try:
        return eks.describe_cluster(name=name)["cluster"]
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
            return {}
        raise


def node_groups_by_label(eks: Any, cluster_name: str) -> dict[str, dict[str, Any]]:
    """The cluster's managed node groups, by their ``eks-ddp/node-group`` label (GPU groups carry it)."""
    out: dict[str, dict[str, Any]] = {}
    for page in eks.get_paginator("list_nodegroups").paginate(clusterName=cluster_name):
        for name in page.get("nodegroups", []):
            group = eks.describe_nodegroup(clusterName=cluster_name, nodegroupName=name)["nodegroup"]
            label = (group.get("labels") or {}).get(GROUP_LABEL)
            if label:
                out[label] = group
    return out


def is_own(instance: dict[str, Any], cluster_name: str | None) -> bool:
    """Whether an instance is one of this cluster's nodes."""
    return cluster_name is not None and any(
        t.get("Key") == OWNER_TAG and t.get("Value") == cluster_name for t in instance.get("Tags") or [])


def check_cluster_name(c: Any, found: dict[str, Any], cluster_name: str, stack_id: str | None) -> None:
    if not found:
        return
    owner = (found.get("tags") or {}).get(STACK_TAG)
    fix = ("set another name: pulumi config set --path cluster.name <name> (a name no cluster in this account "
           "and region has)")
    if owner is not None and owner == legacy_owner(stack_id):
        c.warn(f"cluster.name: the EKS cluster {cluster_name!r} carries the owner tag {owner!r}, which any stack "
               f"named like this one on a self-managed backend wrote before {OWNER_ID_KEY}; if it is this stack's, "
               f"`pulumi up` retags it {stack_id!r}; if not, `pulumi up` fails at CreateCluster: {fix}")
    elif owner is not None and stack_id is not None and owner != stack_id:
        c.fail(f"cluster.name: an EKS cluster named {cluster_name!r} already exists in {c.cfg.region} and belongs to "
               f"stack {owner!r}, not to this stack ({stack_id}); {fix}")
    elif owner is None:
        c.warn(f"cluster.name: an EKS cluster named {cluster_name!r} already exists in {c.cfg.region} without the "
               f"{STACK_TAG} tag; if it is not this stack's cluster, `pulumi up` fails at CreateCluster: {fix}")


def check_version_step(c: Any, found: dict[str, Any], cfg: StackConfig) -> None:
    live = found.get("version") if found else None
    if not live:
        return
    want = cfg.cluster.kubernetes_version
    key = "cluster.kubernetesVersion"
    if minor(want) < minor(live):
        c.fail(f"{key}: got {want!r}, but the cluster runs Kubernetes {live} (EKS never downgrades; with "
               f"upgradePolicy STANDARD it upgrades a cluster itself when standard support ends); set {key} {live}: "
               f"pulumi config set --path {key} {live}")
    elif minor(want) > (minor(live)[0], minor(live)[1] + 1):
        step = f"{minor(live)[0]}.{minor(live)[1] + 1}"
        c.fail(f"{key}: got {want!r}, but the cluster runs Kubernetes {live} and EKS upgrades one minor version at "
               f"a time; set {key} {step}, pulumi up, then the next minor")


def check_resize(c: Any, live: dict[str, dict[str, Any]], cfg: StackConfig, cluster_name: str) -> None:
    for i, g in enumerate(cfg.node_groups):
        group = live.get(g.name)
        if group is None:
            continue
        desired = int((group.get("scalingConfig") or {}).get("desiredSize", 0))
        command = (f"aws eks update-nodegroup-config --region {cfg.region} --cluster-name {cluster_name} "
                   f"--nodegroup-name {group.get('nodegroupName')} --scaling-config ")
        if g.min_size > desired:
            c.fail(f"nodeGroups[{i}].minSize: got {g.min_size}, but the group runs {desired} node(s) now and EKS "
                   f"refuses a minimum above the desired size; raise it first: {command}"
                   f"minSize={g.min_size},maxSize={max(g.max_size, g.min_size)},desiredSize={g.min_size} "
                   "then pulumi up")
        if g.max_size < desired:
            c.fail(f"nodeGroups[{i}].maxSize: got {g.max_size}, but the group runs {desired} node(s) now; lowering "
                   f"it would terminate running nodes (a training run's). Wait until the run has ended and the "
                   f"autoscaler has removed the idle nodes, or scale in deliberately: {command}"
                   f"minSize={min(g.min_size, g.max_size)},maxSize={g.max_size},desiredSize={g.max_size} "
                   "then pulumi up")


def check_block_versions(c: Any, live: dict[str, dict[str, Any]], cfg: StackConfig, cluster_name: str) -> None:
    """No version or AMI release change of a capacity-block group while it has nodes: EKS user guide, "Create a
    managed node group with Capacity Blocks for ML": "When upgrading managed node groups with Capacity Blocks, make
    sure that the desired size of the node group is set to 0" (awsdocs/amazon-eks-user-guide
    latest/ug/ml/capacity-blocks-mng.adoc)."""
    want_version = cfg.cluster.kubernetes_version
    want_release = k8s_versions.ami_release_version(want_version, cfg.cluster.ami_release_version) \
        if want_version in k8s_versions.AMI_RELEASE_VERSIONS or cfg.cluster.ami_release_version else None
    for i, g in enumerate(cfg.node_groups):
        group = live.get(g.name)
        if group is None or g.capacity_type != "capacityBlock":
            continue
        desired = int((group.get("scalingConfig") or {}).get("desiredSize", 0))
        changes = [f"{what} {have} -> {want}" for what, have, want in (
            ("Kubernetes", group.get("version"), want_version), ("AMI release", group.get("releaseVersion"), want_release))
            if have and want and have != want]
        if desired and changes:
            c.fail(f"nodeGroups[{i}]: capacity-block group {group.get('nodegroupName')} runs {desired} node(s), and "
                   f"this update changes its {', '.join(changes)}; EKS updates a capacity-block group only at desired "
                   "size 0. Wait until its run has ended and the autoscaler has removed the nodes, or scale it in "
                   f"first: aws eks update-nodegroup-config --region {cfg.region} --cluster-name {cluster_name} "
                   f"--nodegroup-name {group.get('nodegroupName')} --scaling-config desiredSize=0,minSize=0 "
                   "then pulumi up")


def check_live(c: Any, eks: Any, cluster_name: str, stack_id: str | None, logs: Any = None,
               organization: str | None = None, *, sts: Any = None,
               egress_ip: Callable[[], str | None] | None = None) -> None:
    """Every live-state check; API errors become warnings through the checker."""
    check_owner_id(c, organization)
    if logs is not None:
        check_log_group(c, logs, cluster_name, stack_id)
    found = c.attempt("eks", "DescribeCluster", f"whether cluster {cluster_name} exists",
                      lambda: describe_cluster(eks, cluster_name))
    if found is None:
        return
    check_cluster_name(c, found, cluster_name, stack_id)
    owner = (found.get("tags") or {}).get(STACK_TAG) if found else None
    if owner is not None and stack_id is not None and owner not in (stack_id, legacy_owner(stack_id)):
        return  # another stack's cluster: its version and groups are not this stack's to judge
    check_version_step(c, found, c.cfg)
    if found:
        check_endpoint_access(c, eks, found, cluster_name, sts=sts, egress_ip=egress_ip)
    if found and c.cfg.node_groups:
        groups = c.attempt("eks", "DescribeNodegroup", f"the node groups of {cluster_name}",
                           lambda: node_groups_by_label(eks, cluster_name))
        if groups:
            check_resize(c, groups, c.cfg, cluster_name)
            check_block_versions(c, groups, c.cfg, cluster_name)


def checkip(timeout_s: float = 3.0) -> str | None:
    """This machine's public IP address (``CHECKIP_URL``), or None when it cannot be learnt."""
    try:
        with urllib.request.urlopen(CHECKIP_URL, timeout=timeout_s) as r:
            return str(ipaddress.ip_address(r.read().decode().strip()))
    except (OSError, ValueError):
        return None


def _in_any(ip: str, cidrs: Any) -> bool:
    addr = ipaddress.ip_address(ip)
    for cidr in cidrs if isinstance(cidrs, list | tuple) else []:
        try:
            if addr in ipaddress.ip_network(str(cidr), strict=False):
                return True
        except ValueError:
            continue
    return False


_ASSUMED = re.compile(r"^arn:(?P<part>[^:]+):sts::(?P<acct>\d{12}):assumed-role/(?P<role>[^/]+)/.+$")


def caller_principal(arn: str) -> tuple[str, str | None]:
    """(IAM principal ARN, role name or None) of ``sts:GetCallerIdentity``'s ARN: an assumed-role session stands for
    its role, whose IAM ARN may carry a path the session ARN drops (SSO roles: /aws-reserved/sso.amazonaws.com/)."""
    m = _ASSUMED.match(arn)
    if m is None:
        return arn, None
    return f"arn:{m['part']}:iam::{m['acct']}:role/{m['role']}", m["role"]


def _is_principal(entry: str, principal: str, role: str | None) -> bool:
    if entry == principal:
        return True
    if role is None:
        return False
    # The same role under any path: arn:<part>:iam::<acct>:role[/<path>]/<name>
    head = principal.rsplit(":role/", 1)[0]
    return entry.startswith(f"{head}:role/") and entry.rsplit("/", 1)[-1] == role


def list_access_entries(eks: Any, cluster_name: str) -> list[str]:
    out: list[str] = []
    for page in eks.get_paginator("list_access_entries").paginate(clusterName=cluster_name):
        out += page.get("accessEntries", [])
    return out


def check_endpoint_access(c: Any, eks: Any, found: dict[str, Any], cluster_name: str, *, sts: Any = None,
                          egress_ip: Callable[[], str | None] | None = None) -> None:
    """Fail early, with the commands that fix it, when the Kubernetes provider cannot reach the live cluster from here.

    Refreshing then updating the Kubernetes resources needs the API endpoint: EKS admits the public endpoint only
    from ``publicAccessCidrs`` (EKS User Guide, "Cluster API server endpoint": "Communication to the endpoint from
    addresses outside of the CIDR blocks that you specify is denied"; the EKS API's ``VpcConfigRequest``), and a
    principal without an access entry is refused (EKS User Guide, "Grant IAM users access to Kubernetes with EKS
    access entries"). Unreachable, pulumi-kubernetes' Read fails each resource ("failed to read resource state due
    to unreachable cluster", provider/pkg/provider/provider.go ``Read``) unless the provider sets
    ``skipUpdateUnreachable``, which __main__.py does: then Read returns the state as it was and Check returns the old
    inputs (``Check``: "Cluster is unreachable but skipUpdateUnreachable flag is set to true, skipping..."), so the
    refresh passes, this program runs, and an update that fixes the endpoint goes through, while every Kubernetes
    change of that update is silently skipped. Hence: a failure naming the fix when nothing in this update fixes
    access, and a warning (run ``pulumi up`` once more) when the stack's config already does.

    ``egress_ip`` answers this machine's public IP (``checkip``; tests inject it), ``sts`` the caller.
    """
    cfg = c.cfg
    vpc = found.get("resourcesVpcConfig") or {}
    rerun = ("Kubernetes changes of this update are skipped while the cluster is unreachable (skipUpdateUnreachable):"
             " run pulumi up again after it")
    if egress_ip is not None:
        ip = egress_ip()
        live = list(vpc.get("publicAccessCidrs") or [])
        if ip is None:
            c.warn(f"preflight: could not learn this machine's public IP ({CHECKIP_URL}); the API endpoint's "
                   f"publicAccessCidrs of {cluster_name} were not checked against it")
        elif vpc.get("endpointPublicAccess") is False:
            c.warn(f"cluster.endpointPublicAccess: the API endpoint of {cluster_name} is private: pulumi reaches it "
                   "only from inside its VPC (or a network peered with it); from elsewhere every Kubernetes change is "
                   "skipped (skipUpdateUnreachable) and pulumi destroy fails")
        elif "publicAccessCidrs" in vpc and not _in_any(ip, live):
            cidrs = ",".join(f'"{x}"' for x in [*live, f"{ip}/32"])
            if _in_any(ip, list(cfg.cluster.public_access_cidrs)):
                c.warn(f"cluster.publicAccessCidrs: this machine's public IP {ip} is in the stack's CIDRs but not yet in "
                       f"the live endpoint's ({', '.join(live) or 'none'}): this update changes them; {rerun}")
            else:
                c.fail(f"cluster.publicAccessCidrs: this machine's public IP {ip} is not in the API endpoint's "
                       f"publicAccessCidrs ({', '.join(live) or 'none'}), so the Kubernetes provider cannot reach "
                       f"{cluster_name}. Add it to the stack: pulumi config set --path "
                       f"'cluster.publicAccessCidrs[{len(cfg.cluster.public_access_cidrs)}]' {ip}/32 && pulumi up "
                       f"(then pulumi up once more); or at once: aws eks update-cluster-config --region {cfg.region} "
                       f"--name {cluster_name} --resources-vpc-config "
                       f"endpointPublicAccess=true,endpointPrivateAccess=true,publicAccessCidrs={cidrs}")
    if sts is None:
        return
    ident = c.attempt("sts", "GetCallerIdentity", "who runs this update", sts.get_caller_identity)
    entries = c.attempt("eks", "ListAccessEntries", f"the access entries of {cluster_name}",
                        lambda: list_access_entries(eks, cluster_name))
    if not ident or entries is None:
        return
    principal, role = caller_principal(ident["Arn"])
    if any(_is_principal(e, principal, role) for e in entries):
        return
    if any(_is_principal(a, principal, role) for a in cfg.cluster.admin_principal_arns):
        c.warn(f"cluster.adminPrincipalArns: {principal} has no access entry on {cluster_name} yet; this update adds "
               f"it; {rerun}")
        return
    part = principal.split(":")[1]
    policy = f"arn:{part}:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
    c.fail(f"cluster.adminPrincipalArns: the caller {ident['Arn']} ({principal}) has no access entry on {cluster_name},"
           f" so the Kubernetes provider is refused. Add it to the stack: pulumi config set --path "
           f"'cluster.adminPrincipalArns[{len(cfg.cluster.admin_principal_arns)}]' {principal} && pulumi up "
           f"(then pulumi up once more); or at once: aws eks create-access-entry --region {cfg.region} --cluster-name "
           f"{cluster_name} --principal-arn {principal} && aws eks associate-access-policy --region {cfg.region} "
           f"--cluster-name {cluster_name} --principal-arn {principal} --policy-arn {policy} "
           "--access-scope type=cluster" + (f" (a role with a path: its ARN from aws iam get-role --role-name {role})"
                                            if role else ""))
