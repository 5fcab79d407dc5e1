"""What the mocked cloud answers: outputs AWS (and the other providers) assign to a new resource, and the
invokes a program makes (zones, caller identity, policy documents, ...). components/eks_ddp/tooling/mocks.py records the
program's registrations and dispatches to these tables."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from typing import Any, Protocol

from eks_ddp.core import rules


class FakeAccount(Protocol):
    """The account the fake cloud answers for (:class:`~eks_ddp.tooling.mocks.RecordingMocks` is one): what the
    tables below read, so this module never imports the mocks back."""

    region: str
    zones: list[str]
    zone_ids: list[str]
    log_groups: list[str]
    log_group_tags: dict[str, dict[str, str]]
    subnet_zones: dict[str, str]
    """Zone of each existing subnet looked up so far (filled in lookup order)."""
    lock: threading.Lock

ACCOUNT = "123456789012"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _service(typ: str) -> str:
    pkg, mod, _ = (typ.split(":") + ["", ""])[:3]
    return mod.split("/")[0] if pkg == "aws" else pkg


def _fake_kubeconfig(name: str) -> dict[str, Any]:
    endpoint = f"https://{_digest(name)[:32].upper()}.gr7.us-west-2.eks.amazonaws.com"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": endpoint,
                                                "certificate-authority-data": "bW9jaw=="}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
        "users": [{"name": name, "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "aws",
            "args": ["eks", "get-token", "--cluster-name", name]}}}],
    }


def _profile_kubeconfig(args: dict[str, Any]) -> dict[str, Any]:
    """pulumi-eks's ``getKubeconfig``: the exec user runs ``aws eks get-token`` with the given profile."""
    cfg = _fake_kubeconfig("mock-cluster")
    user = cfg["users"][0]["user"]["exec"]
    if args.get("profileName"):
        user["env"] = [{"name": "AWS_PROFILE", "value": args["profileName"]}]
    if args.get("roleArn"):
        user["args"] += ["--role", args["roleArn"]]
    return cfg


# Type-specific outputs: type token -> (mocks, name, inputs) -> (id, extra outputs).
def _eks_cluster(m: FakeAccount, name: str, inputs: dict) -> tuple[str, dict]:
    kube = _fake_kubeconfig(name)
    issuer = f"https://oidc.eks.{m.region}.amazonaws.com/id/{_digest(name)[:32].upper()}"
    return f"{name}-eksCluster", {
        "kubeconfig": kube,
        "kubeconfigJson": json.dumps(kube),
        "clusterSecurityGroupId": f"sg-{_digest(name + 'cluster')[:17]}",
        "nodeSecurityGroupId": f"sg-{_digest(name + 'node')[:17]}",
        "oidcProviderArn": f"arn:aws:iam::{ACCOUNT}:oidc-provider/{issuer[8:]}",
        "oidcProviderUrl": issuer,
        "oidcIssuer": issuer[8:],
    }


def _aws_eks_cluster(m: FakeAccount, name: str, inputs: dict) -> tuple[str, dict]:
    issuer = f"https://oidc.eks.{m.region}.amazonaws.com/id/{_digest(name)[:32].upper()}"
    return name, {
        "name": inputs.get("name", name),
        "endpoint": f"https://{_digest(name)[:32].upper()}.gr7.{m.region}.eks.amazonaws.com",
        "certificateAuthority": {"data": "bW9jaw=="},
        "identities": [{"oidcs": [{"issuer": issuer}]}],
        "vpcConfig": {**inputs.get("vpcConfig", {}),
                      "clusterSecurityGroupId": f"sg-{_digest(name + 'cluster')[:17]}"},
    }


def _with_prefix(prefix: str):
    def fill(m: FakeAccount, name: str, inputs: dict) -> tuple[str, dict]:
        return f"{prefix}-{_digest(name)[:17]}", {}
    return fill


def _docker_image(m: FakeAccount, name: str, inputs: dict) -> tuple[str, dict]:
    digest = "sha256:" + _digest(json.dumps(inputs, sort_keys=True, default=str))
    tags = inputs.get("tags") or [f"{name}:latest"]
    repo = str(tags[0]).rsplit(":", 1)[0]
    return f"{name}-image", {"digest": digest, "ref": f"{repo}@{digest}"}


def _ecr_repository(m: FakeAccount, name: str, inputs: dict) -> tuple[str, dict]:
    repo_name = inputs.get("name", name)
    return repo_name, {"repositoryUrl": f"{ACCOUNT}.dkr.ecr.{m.region}.amazonaws.com/{repo_name}",
                       "registryId": ACCOUNT, "name": repo_name}


def _efs(m: FakeAccount, name: str, inputs: dict) -> tuple[str, dict]:
    fs_id = f"fs-{_digest(name)[:17]}"
    return fs_id, {"dnsName": f"{fs_id}.efs.{m.region}.amazonaws.com",
                   "arn": f"arn:aws:elasticfilesystem:{m.region}:{ACCOUNT}:file-system/{fs_id}"}


def _fsx_lustre(m: FakeAccount, name: str, inputs: dict) -> tuple[str, dict]:
    """FSx's id, DNS name and mount name forms (fs-<17 hex>, <id>.fsx.<region>.amazonaws.com, 8 lowercase)."""
    fs_id = f"fs-{_digest(name)[:17]}"
    mount = "".join(chr(ord("a") + int(c, 16) % 26) for c in _digest(name + "mount")[:8])
    return fs_id, {"dnsName": f"{fs_id}.fsx.{m.region}.amazonaws.com", "mountName": mount,
                   "arn": f"arn:aws:fsx:{m.region}:{ACCOUNT}:file-system/{fs_id}"}


def _efs_access_point(m: FakeAccount, name: str, inputs: dict) -> tuple[str, dict]:
    """EFS's ARN form (the storage contract matches policies against it)."""
    ap_id = f"fsap-{_digest(name)[:17]}"
    return ap_id, {"arn": f"arn:aws:elasticfilesystem:{m.region}:{ACCOUNT}:access-point/{ap_id}"}


def _node_group(m: FakeAccount, name: str, inputs: dict) -> tuple[str, dict]:
    """A managed node group: autonamed like the provider does when nodeGroupName is unset."""
    group = inputs.get("nodeGroupName") or f"{name}-{_digest(name)[:8]}"
    cluster = inputs.get("clusterName", "cluster")
    # EKS names the group's Auto Scaling group eks-<group>-<uuid>.
    asg = f"eks-{group}-{_digest(group + 'asg')[:8]}"
    return f"{cluster}:{group}", {"nodeGroupName": group, "status": "ACTIVE",
                                  "resources": [{"autoscalingGroups": [{"name": asg}]}]}


def _s3_bucket(m: FakeAccount, name: str, inputs: dict) -> tuple[str, dict]:
    n = inputs.get("bucket") or f"{inputs.get('bucketPrefix', '')}{_digest(name)[:12]}"
    return n, {"bucket": n, "arn": f"arn:{rules.partition(m.region)}:s3:::{n}"}


def _named(m: FakeAccount, name: str, inputs: dict) -> tuple[str, dict]:
    """Resources whose id is their (possibly generated) name."""
    n = inputs.get("name") or inputs.get("clusterName") or name
    return n, {"name": n}


def _pem(kind: str, *fields: str):
    """pulumi-tls resources: placeholder PEM blocks (the provider makes the real keys and certificates)."""
    def fill(m: FakeAccount, name: str, inputs: dict) -> tuple[str, dict]:
        # One body per resource, as the provider's are: a certificate names its own CA (contracts compare them).
        body = base64.b64encode(f"mock {name}".encode()).decode()
        pem = f"-----BEGIN {kind}-----\n{body}\n-----END {kind}-----\n"
        return f"{name}-id", {f: pem for f in fields}
    return fill


_OUTPUTS = {
    "tls:index/privateKey:PrivateKey": _pem("PRIVATE KEY", "privateKeyPem", "privateKeyPemPkcs8", "publicKeyPem"),
    "tls:index/selfSignedCert:SelfSignedCert": _pem("CERTIFICATE", "certPem"),
    "tls:index/certRequest:CertRequest": _pem("CERTIFICATE REQUEST", "certRequestPem"),
    "tls:index/locallySignedCert:LocallySignedCert": _pem("CERTIFICATE", "certPem"),
    "eks:index:Cluster": _eks_cluster,
    "aws:eks/cluster:Cluster": _aws_eks_cluster,
    "aws:ec2/vpc:Vpc": _with_prefix("vpc"),
    "aws:ec2/subnet:Subnet": _with_prefix("subnet"),
    "aws:ec2/securityGroup:SecurityGroup": _with_prefix("sg"),
    "aws:ec2/launchTemplate:LaunchTemplate": _with_prefix("lt"),
    "aws:ec2/natGateway:NatGateway": _with_prefix("nat"),
    "aws:ec2/internetGateway:InternetGateway": _with_prefix("igw"),
    "aws:ec2/routeTable:RouteTable": _with_prefix("rtb"),
    "aws:ec2/eip:Eip": _with_prefix("eipalloc"),
    "aws:ec2/placementGroup:PlacementGroup": _named,
    "aws:efs/fileSystem:FileSystem": _efs,
    "aws:efs/accessPoint:AccessPoint": _efs_access_point,
    "aws:fsx/lustreFileSystem:LustreFileSystem": _fsx_lustre,
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation": _with_prefix("dra"),
    "aws:ecr/repository:Repository": _ecr_repository,
    "aws:iam/role:Role": _named,
    "aws:s3/bucket:Bucket": _s3_bucket,
    "aws:eks/nodeGroup:NodeGroup": _node_group,
    "docker-build:index:Image": _docker_image,
}


def _subnet(m: FakeAccount, args: dict) -> dict:
    """An existing subnet: zones handed out in order of first lookup, so two ids land in two zones."""
    subnet_id = args.get("id", "subnet-unknown")
    with m.lock:
        zone = m.subnet_zones.setdefault(subnet_id, m.zones[len(m.subnet_zones) % len(m.zones)])
    return {"id": subnet_id, "availabilityZone": zone, "vpcId": "vpc-existing", "cidrBlock": "10.0.0.0/20",
            "availableIpAddressCount": 4000, "mapPublicIpOnLaunch": False}


def _policy_document(m: FakeAccount, args: dict) -> dict:
    statements = []
    for s in args.get("statements", []):
        stmt: dict[str, Any] = {"Effect": s.get("effect", "Allow")}
        if s.get("actions"):
            stmt["Action"] = s["actions"]
        if s.get("resources"):
            stmt["Resource"] = s["resources"]
        for p in s.get("principals", []):
            stmt.setdefault("Principal", {})[p["type"]] = p["identifiers"]
        for c in s.get("conditions", []):
            stmt.setdefault("Condition", {}).setdefault(c["test"], {})[c["variable"]] = c["values"]
        statements.append(stmt)
    doc = json.dumps({"Version": "2012-10-17", "Statement": statements})
    return {"json": doc, "minifiedJson": doc, "id": _digest(doc)[:16]}


def _availability_zones(m: FakeAccount, a: dict) -> dict:
    """Zones as EC2 lists them, honouring ``excludeZoneIds`` (as the provider does) so tests see it work."""
    excluded = set(a.get("excludeZoneIds") or [])
    pairs = [(n, i) for n, i in zip(m.zones, m.zone_ids, strict=True) if i not in excluded]
    return {"names": [n for n, _ in pairs], "zoneIds": [i for _, i in pairs], "state": "available", "id": m.region}


_INVOKES = {
    "aws:index/getAvailabilityZones:getAvailabilityZones": _availability_zones,
    "aws:index/getRegion:getRegion": lambda m, a: {"name": m.region, "region": m.region, "id": m.region},
    "aws:index/getCallerIdentity:getCallerIdentity": lambda m, a: {
        "accountId": ACCOUNT, "arn": f"arn:aws:iam::{ACCOUNT}:user/mock", "userId": "AIDMOCK", "id": ACCOUNT},
    # EKS's default build of an add-on for a Kubernetes version; recognisable, so tests can tell it from a pin.
    "aws:eks/getAddonVersion:getAddonVersion": lambda m, a: {
        "addonName": a.get("addonName"), "kubernetesVersion": a.get("kubernetesVersion"),
        "version": f"v0.0.0-eksbuild.default-{a.get('kubernetesVersion')}", "id": a.get("addonName")},
    "aws:index/getPartition:getPartition": lambda m, a: {
        "partition": rules.partition(m.region),
        "dnsSuffix": "amazonaws.com.cn" if m.region.startswith("cn-") else "amazonaws.com",
        "id": rules.partition(m.region)},
    "aws:iam/getPolicyDocument:getPolicyDocument": _policy_document,
    "aws:ec2/getSubnet:getSubnet": _subnet,
    # An existing VPC: a primary block and a secondary one, as a VPC that grew looks.
    "aws:ec2/getVpc:getVpc": lambda m, a: {
        "id": a.get("id"), "cidrBlock": "10.0.0.0/16", "cidrBlockAssociations": [
            {"associationId": "vpc-cidr-assoc-1", "cidrBlock": "10.0.0.0/16", "state": "associated"},
            {"associationId": "vpc-cidr-assoc-2", "cidrBlock": "100.64.0.0/16", "state": "associated"}]},
    "eks:index:Cluster/getKubeconfig": lambda m, a: {"result": json.dumps(_profile_kubeconfig(a))},
    "aws:cloudwatch/getLogGroup:getLogGroup": lambda m, a: {
        "name": a["name"], "id": a["name"], "tags": m.log_group_tags.get(a["name"], {}),
        "arn": f"arn:aws:logs:{m.region}:{ACCOUNT}:log-group:{a['name']}"},
    "aws:cloudwatch/getLogGroups:getLogGroups": lambda m, a: {
        "logGroupNames": [g for g in m.log_groups if g.startswith(a.get("logGroupNamePrefix", ""))],
        "arns": [], "id": m.region},
    "aws:ecr/getAuthorizationToken:getAuthorizationToken": lambda m, a: {
        "userName": "AWS", "password": "mock-token", "authorizationToken": "QVdTOm1vY2s=",
        "proxyEndpoint": f"https://{ACCOUNT}.dkr.ecr.{m.region}.amazonaws.com", "expiresAt": "2099-01-01T00:00:00Z",
        "id": m.region},
}
