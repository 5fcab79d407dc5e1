"""Preflight against what this stack already runs in the account: its EKS cluster, its node groups, its nodes.

:mod:`components.preflight` checks the stack's config against the region; these checks read the live state that
config meets on a later ``pulumi up``:

- **the cluster name** (A8): a cluster of that name that belongs to another stack (its ``eks-ddp/stack`` tag)
  fails preflight before anything bills; without the tag (made before the tag existed, or by hand) it is a warning;
- **the version step** (A3): EKS upgrades one minor at a time and never downgrades; a stack asking for more than
  the next minor, or for an older one (EKS may have upgraded a STANDARD cluster itself), is told the exact step;
- **a resize** (A2): a GPU group's desired size belongs to the autoscaler; a ``minSize`` above it would be refused
  by EKS, and a ``maxSize`` below it would scale in running (training) nodes: both fail with the
  ``aws eks update-nodegroup-config`` to run first;
- **own nodes** (A5): instances tagged ``eks:cluster-name=<cluster>`` (EKS tags every managed node group instance)
  are this stack's demand already counted at ``maxSize``, not extra load on the quota or the reservation.

IAM actions (read-only): eks:DescribeCluster, eks:ListNodegroups, eks:DescribeNodegroup, ec2:DescribeInstances.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from .config_schema import StackConfig

OWNER_TAG = "eks:cluster-name"
"""EKS tags each managed node group instance with its cluster's name."""
STACK_TAG = "eks-ddp/stack"
"""Tag on the EKS cluster naming the stack that owns it (``<organization>/<project>/<stack>``); set by
``components/cluster.py`` (its ``STACK_TAG``)."""
GROUP_LABEL = "eks-ddp/node-group"


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
    if owner is not None and stack_id is not None and owner != stack_id:
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


def check_live(c: Any, eks: Any, cluster_name: str, stack_id: str | None) -> None:
    """Every live-state check; API errors become warnings through the checker."""
    found = c.attempt("eks", "DescribeCluster", f"whether cluster {cluster_name} exists",
                      lambda: describe_cluster(eks, cluster_name))
    if found is None:
        return
    check_cluster_name(c, found, cluster_name, stack_id)
    owner = (found.get("tags") or {}).get(STACK_TAG) if found else None
    if owner is not None and stack_id is not None and owner != stack_id:
        return  # another stack's cluster: its version and groups are not this stack's to judge
    check_version_step(c, found, c.cfg)
    if found and c.cfg.node_groups:
        groups = c.attempt("eks", "DescribeNodegroup", f"the node groups of {cluster_name}",
                           lambda: node_groups_by_label(eks, cluster_name))
        if groups:
            check_resize(c, groups, c.cfg, cluster_name)
