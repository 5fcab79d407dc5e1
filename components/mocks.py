"""Run the Pulumi program under Pulumi's mock engine: no CLI, no plugins, no cloud.

Used by the offline plan (``python -m components.plan``) and by the tests. A
:class:`RecordingMocks` fills in what the cloud would assign (ids, ARNs,
endpoints, digests) and answers the invokes the program makes; a recording
monitor keeps every registration with its URN and parent, so tests can
assert on the resource tree. Each :func:`run_program` call starts from fresh
global state (``set_mocks`` is process-global).
"""

from __future__ import annotations

import hashlib
import json
import runpy
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime import mocks as _mocks
from pulumi.runtime import rpc, settings
from pulumi.runtime.config import set_all_config
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from . import rules

ACCOUNT = "123456789012"
PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Recorded:
    """One registered resource, as the engine saw it."""

    urn: str
    type: str
    name: str
    custom: bool
    parent_urn: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    provider: str = ""
    ignore_changes: list[str] = field(default_factory=list)
    """Property paths registered with ``ignore_changes``."""
    retain_on_delete: bool = False
    """Whether the resource was registered with ``retain_on_delete``."""
    dependencies: list[str] = field(default_factory=list)
    """URNs the resource depends on (``depends_on`` and the resources behind its input Outputs)."""
    import_id: str = ""
    """The ``import_`` ID the resource was registered with (adopting an existing cloud resource)."""
    replace_on_changes: list[str] = field(default_factory=list)
    """Property paths registered with ``replace_on_changes``."""

    @property
    def parent_type(self) -> str:
        """Type token of the parent (the mock URN carries the parent type chain)."""
        qualified = self.urn.split("::")[2]
        chain = qualified.split("$")
        return chain[-2] if len(chain) > 1 else ""


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


class RecordingMocks(pulumi.runtime.Mocks):
    """Mocks that fill cloud-assigned outputs and answer the program's invokes."""

    def __init__(self, region: str = "us-west-2", zones: int = 4):
        self.region = region
        self.zones = [f"{region}{c}" for c in "abcdef"[:zones]]
        self.zone_ids = [f"usw2-az{i + 1}" for i in range(len(self.zones))]
        """Zone IDs in the order of ``zones`` (an account's name-to-ID mapping); tests may replace it."""
        self.inputs: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.log_groups: list[str] = []
        """CloudWatch log groups that already exist in the account (``getLogGroups`` answers from it)."""
        self._lock = threading.Lock()

    # -- resources ---------------------------------------------------------------------------
    def new_resource(self, args: _mocks.MockResourceArgs) -> tuple[str | None, dict]:
        with self._lock:
            self.inputs[(args.typ, args.name)] = dict(args.inputs)
        state = dict(args.inputs)
        rid = f"{args.name}-id"
        typ = args.typ
        if typ.startswith("aws:"):
            svc = _service(typ)
            state.setdefault("arn", f"arn:aws:{svc}:{self.region}:{ACCOUNT}:{typ.split(':')[-1].lower()}/{args.name}")
        filler = _OUTPUTS.get(typ)
        if filler is not None:
            rid, extra = filler(self, args.name, args.inputs)
            state.update(extra)
        state.setdefault("id", rid)
        return rid, state

    # -- invokes -----------------------------------------------------------------------------
    def call(self, args: _mocks.MockCallArgs) -> tuple[dict, list | None]:
        with self._lock:
            self.calls.append((args.token, dict(args.args)))
        handler = _INVOKES.get(args.token)
        if handler is None:
            return {}, []  # no check failures (None would break the mock monitor)
        return handler(self, args.args), []


# Type-specific outputs: type token -> (mocks, name, inputs) -> (id, extra outputs).
def _eks_cluster(m: RecordingMocks, name: str, inputs: dict) -> tuple[str, dict]:
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


def _aws_eks_cluster(m: RecordingMocks, name: str, inputs: dict) -> tuple[str, dict]:
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
    def fill(m: RecordingMocks, name: str, inputs: dict) -> tuple[str, dict]:
        return f"{prefix}-{_digest(name)[:17]}", {}
    return fill


def _docker_image(m: RecordingMocks, name: str, inputs: dict) -> tuple[str, dict]:
    digest = "sha256:" + _digest(json.dumps(inputs, sort_keys=True, default=str))
    tags = inputs.get("tags") or [f"{name}:latest"]
    repo = str(tags[0]).rsplit(":", 1)[0]
    return f"{name}-image", {"digest": digest, "ref": f"{repo}@{digest}"}


def _ecr_repository(m: RecordingMocks, name: str, inputs: dict) -> tuple[str, dict]:
    repo_name = inputs.get("name", name)
    return repo_name, {"repositoryUrl": f"{ACCOUNT}.dkr.ecr.{m.region}.amazonaws.com/{repo_name}",
                       "registryId": ACCOUNT, "name": repo_name}


def _efs(m: RecordingMocks, name: str, inputs: dict) -> tuple[str, dict]:
    fs_id = f"fs-{_digest(name)[:17]}"
    return fs_id, {"dnsName": f"{fs_id}.efs.{m.region}.amazonaws.com"}


def _node_group(m: RecordingMocks, name: str, inputs: dict) -> tuple[str, dict]:
    """A managed node group: autonamed like the provider does when nodeGroupName is unset."""
    group = inputs.get("nodeGroupName") or f"{name}-{_digest(name)[:8]}"
    cluster = inputs.get("clusterName", "cluster")
    # EKS names the group's Auto Scaling group eks-<group>-<uuid>.
    asg = f"eks-{group}-{_digest(group + 'asg')[:8]}"
    return f"{cluster}:{group}", {"nodeGroupName": group, "status": "ACTIVE",
                                  "resources": [{"autoscalingGroups": [{"name": asg}]}]}


def _s3_bucket(m: RecordingMocks, name: str, inputs: dict) -> tuple[str, dict]:
    n = inputs.get("bucket") or f"{inputs.get('bucketPrefix', '')}{_digest(name)[:12]}"
    return n, {"bucket": n, "arn": f"arn:aws:s3:::{n}"}


def _named(m: RecordingMocks, name: str, inputs: dict) -> tuple[str, dict]:
    """Resources whose id is their (possibly generated) name."""
    n = inputs.get("name") or inputs.get("clusterName") or name
    return n, {"name": n}


def _pem(kind: str, *fields: str):
    """pulumi-tls resources: placeholder PEM blocks (the provider makes the real keys and certificates)."""
    def fill(m: RecordingMocks, name: str, inputs: dict) -> tuple[str, dict]:
        pem = f"-----BEGIN {kind}-----\nbW9jayB7bmFtZX0=\n-----END {kind}-----\n"
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
    "aws:efs/accessPoint:AccessPoint": _with_prefix("fsap"),
    "aws:ecr/repository:Repository": _ecr_repository,
    "aws:iam/role:Role": _named,
    "aws:s3/bucket:Bucket": _s3_bucket,
    "aws:eks/nodeGroup:NodeGroup": _node_group,
    "docker-build:index:Image": _docker_image,
}


def _subnet(m: RecordingMocks, args: dict) -> dict:
    """An existing subnet: zones handed out in order of first lookup, so two ids land in two zones."""
    subnet_id = args.get("id", "subnet-unknown")
    with m._lock:
        seen = m.__dict__.setdefault("_subnet_zones", {})
        zone = seen.setdefault(subnet_id, m.zones[len(seen) % len(m.zones)])
    return {"id": subnet_id, "availabilityZone": zone, "vpcId": "vpc-existing", "cidrBlock": "10.0.0.0/20",
            "availableIpAddressCount": 4000, "mapPublicIpOnLaunch": False}


def _policy_document(m: RecordingMocks, args: dict) -> dict:
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


def _availability_zones(m: RecordingMocks, a: dict) -> dict:
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
    "eks:index:Cluster/getKubeconfig": lambda m, a: {"result": json.dumps(_profile_kubeconfig(a))},
    "aws:cloudwatch/getLogGroups:getLogGroups": lambda m, a: {
        "logGroupNames": [g for g in m.log_groups if g.startswith(a.get("logGroupNamePrefix", ""))],
        "arns": [], "id": m.region},
    "aws:ecr/getAuthorizationToken:getAuthorizationToken": lambda m, a: {
        "userName": "AWS", "password": "mock-token", "authorizationToken": "QVdTOm1vY2s=",
        "proxyEndpoint": f"https://{ACCOUNT}.dkr.ecr.{m.region}.amazonaws.com", "expiresAt": "2099-01-01T00:00:00Z",
        "id": m.region},
}


class _RecordingMonitor(_mocks.MockMonitor):
    """The mock monitor, keeping each registration's parent and inputs in order."""

    def __init__(self, mocks: RecordingMocks):
        super().__init__(mocks)
        self.recorded: list[Recorded] = []
        self._rec_lock = threading.Lock()

    def RegisterResource(self, request):  # noqa: N802 (gRPC method name)
        response = super().RegisterResource(request)
        if request.type == "pulumi:pulumi:Stack":
            return response
        reg = self.resources[response.urn]
        inputs = self.mocks.inputs.get((request.type, request.name), {})
        with self._rec_lock:
            self.recorded.append(Recorded(urn=response.urn, type=request.type, name=request.name,
                                          custom=bool(request.custom), parent_urn=request.parent,
                                          inputs=inputs, outputs=dict(reg.state), provider=request.provider,
                                          ignore_changes=list(request.ignoreChanges),
                                          retain_on_delete=bool(request.retainOnDelete),
                                          dependencies=list(request.dependencies),
                                          import_id=request.importId,
                                          replace_on_changes=list(request.replaceOnChanges)))
        return response

    def Invoke(self, request):  # noqa: N802 (gRPC method name)
        if request.tok == "pulumi:pulumi:getResource":  # rehydrating a resource reference: recorded for tests
            with self.mocks._lock:
                self.mocks.calls.append((request.tok, {}))
        return super().Invoke(request)

    def Call(self, request):  # noqa: N802 (gRPC method name)
        """Resource methods (``Cluster.get_kubeconfig``): answered like invokes, from ``_INVOKES``."""
        from google.protobuf import struct_pb2
        from pulumi.runtime.proto import provider_pb2

        _mocks._ensure_event_loop()
        # Drop the ``__self__`` resource reference before deserialising: rebuilding it would start a
        # ``getResource`` task on this worker thread's event loop, which the program's loop later awaits
        # ("attached to a different loop"). The mocks answer from the other arguments alone.
        raw = struct_pb2.Struct()
        raw.CopyFrom(request.args)
        if "__self__" in raw.fields:
            del raw.fields["__self__"]
        args = rpc.deserialize_properties(raw)
        ret, _ = self.mocks.call(_mocks.MockCallArgs(token=request.tok, args=args, provider=request.provider))
        return provider_pb2.CallResponse(**{"return": _sync_await(rpc.serialize_properties(ret, {}))})


@dataclass
class ProgramResult:
    """What a mock run of the program registered and exported."""

    resources: list[Recorded]
    outputs: dict[str, Any]
    secret_outputs: set[str]
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def of_type(self, typ: str) -> list[Recorded]:
        return [r for r in self.resources if r.type == typ]

    def one(self, typ: str, name: str | None = None) -> Recorded:
        found = [r for r in self.of_type(typ) if name is None or r.name == name]
        if len(found) != 1:
            raise AssertionError(f"expected one {typ} named {name!r}, found {[r.name for r in found]}")
        return found[0]

    def by_urn(self, urn: str) -> Recorded | None:
        return next((r for r in self.resources if r.urn == urn), None)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.resources:
            out[r.type] = out.get(r.type, 0) + 1
        return dict(sorted(out.items()))


def run_program(config: dict[str, Any], *, stack: str = "dev", project: str = "eks-ddp",
                program: Path | Callable[[], None] | None = None, region: str = "us-west-2",
                mocks: RecordingMocks | None = None, recorded: list[Recorded] | None = None) -> ProgramResult:
    """Run ``__main__.py`` (or ``program``: a file, or a function) under fresh mocks.

    ``config`` maps full keys ("eks-ddp:job", "aws:region") to values; objects and
    lists are JSON-encoded as Pulumi does. Exceptions from the program propagate.
    A function program lets tests build one component alone.
    """
    program = program or PROJECT_ROOT / "__main__.py"
    mocks = mocks or RecordingMocks(region=region)
    monitor = _RecordingMonitor(mocks)
    if recorded is not None:  # the caller sees what was registered even when the program fails
        monitor.recorded = recorded
    encoded = {k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items()}
    set_all_config(encoded, [])
    settings.ROOT.set(None)  # a fresh root Stack for this run
    pulumi.runtime.set_mocks(mocks, project=project, stack=stack, preview=False, monitor=monitor)
    settings.SETTINGS.rpc_manager.clear()
    settings.SETTINGS.outputs.clear()

    def body() -> None:
        if callable(program):
            program()
        else:
            runpy.run_path(str(program), run_name="__main__")

    _sync_await(run_pulumi_func(body))
    root = settings.get_root_resource()
    exported = dict(getattr(root, "outputs", {}) or {})
    outputs: dict[str, Any] = {}
    secrets: set[str] = set()
    for key, value in exported.items():
        out = pulumi.Output.from_input(value)
        outputs[key] = _sync_await(out.future())
        if _sync_await(out.is_secret()):
            secrets.add(key)
    resources = sorted(monitor.recorded, key=lambda r: r.urn)
    return ProgramResult(resources=resources, outputs=outputs, secret_outputs=secrets, calls=list(mocks.calls))


def deserialize(value: Any) -> Any:  # pragma: no cover - convenience for debugging
    return _sync_await(rpc.deserialize_properties(value))
