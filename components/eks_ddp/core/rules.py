"""Validation rules shared by the stack config (``config.py``) and the components' Args.

Each rule is a pure function ``rule(key, value, ...) -> str | None``: ``None`` when the value is
fine, else one line naming the key, the bad value and what is allowed. ``config.py`` reports
them with YAML keys (``job.epochs``) and collects every problem; the component Args classes
call :func:`require` with their Python field names, so a program that builds a component
directly gets the same rule and a clear ``ValueError`` instead of a failure deep in AWS.
"""

from __future__ import annotations

import inspect
import ipaddress
import math
import re
from collections.abc import Iterable
from typing import Any

from eks_ddp_trainer.config import MODELS  # the bundled trainer's own names: declared there once

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_LABEL_MAX = 63
EKS_CLUSTER_NAME = re.compile(r"^[0-9A-Za-z][A-Za-z0-9\-_]*$")
EKS_CLUSTER_NAME_MAX = 100
IMAGE_BY_DIGEST = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")
MY_IP = "curl -s https://checkip.amazonaws.com"

#: Every AWS region EKS runs in (commercial, GovCloud, China), from the AWS "Regions and zones" list.
AWS_REGIONS = (
    "af-south-1", "ap-east-1", "ap-east-2", "ap-northeast-1", "ap-northeast-2", "ap-northeast-3",
    "ap-south-1", "ap-south-2", "ap-southeast-1", "ap-southeast-2", "ap-southeast-3", "ap-southeast-4",
    "ap-southeast-5", "ap-southeast-6", "ap-southeast-7", "ca-central-1", "ca-west-1", "cn-north-1",
    "cn-northwest-1", "eu-central-1", "eu-central-2", "eu-north-1", "eu-south-1", "eu-south-2", "eu-west-1",
    "eu-west-2", "eu-west-3", "il-central-1", "me-central-1", "me-south-1", "mx-central-1", "sa-east-1",
    "us-east-1", "us-east-2", "us-gov-east-1", "us-gov-west-1", "us-west-1", "us-west-2",
)

#: The only retention values CloudWatch Logs accepts (PutRetentionPolicy).
CLOUDWATCH_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192,
                             2557, 2922, 3288, 3653)

#: gp3 volume size limits (EBS): at most 16 TiB; at least what the GPU AMI and multi-GB training images need.
GP3_MAX_GIB = 16384
MIN_ROOT_VOLUME_GIB = 50

#: Namespaces the cluster owns: training workloads never go there.
RESERVED_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")

#: RFC 5737 documentation ranges: the example stacks' placeholders live there; nobody's real address does.
DOCUMENTATION_RANGES = tuple(ipaddress.IPv4Network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"))

#: The widest single CIDR the API endpoint may be opened to, and the most the list may span together: a /16 is
#: 65,536 addresses, a company's or a campus's egress range at most; wider is a large part of an ISP.
MIN_PUBLIC_PREFIX = 16

#: Largest global batch the trainer accepts (CIFAR-10 has 50,000 training images).
MAX_GLOBAL_BATCH = 65536



def _got(key: str, value: Any, expected: str) -> str:
    return f"{key}: got {value!r}; expected {expected}"


def is_output(value: Any) -> bool:
    """A value known only when the deployment runs: a ``pulumi.Output`` (or another awaitable Input).

    Checked by class name so this module stays importable without Pulumi (the stack config uses it)."""
    return any(c.__name__ == "Output" and c.__module__.startswith("pulumi") for c in type(value).__mro__) \
        or inspect.isawaitable(value)


def known(key: str, value: Any, expected: str, why: str) -> str | None:
    """For a field whose value the program itself needs (a name, a count, a choice): an Output cannot be used."""
    if is_output(value):
        return f"{key}: got a pulumi Output; expected {expected} known when the program runs ({why})"
    return None


def listed(values: Any) -> Any:
    """A sequence as a list, or an Output of one (a StackReference's) passed through whole."""
    return values if is_output(values) else list(values)


def plain_list(values: Any) -> list[Any] | None:
    """The items of a sequence given as a plain value; None for one known only at deploy time (an Output)."""
    return None if is_output(values) else list(values)


def outputs_skipped(values: Any) -> list[Any]:
    """The plain values of a sequence, leaving out Outputs (known only at deploy time, so not checked here)."""
    return [v for v in values if not is_output(v)]


def whole(key: str, value: Any, minimum: int = 1, maximum: int | None = None) -> str | None:
    if is_output(value):
        return known(key, value, "a whole number", "it sizes what the program creates")
    if isinstance(value, bool) or not isinstance(value, int):
        return _got(key, value, "a whole number")
    if value < minimum or (maximum is not None and value > maximum):
        span = f">= {minimum}" + ("" if maximum is None else f" and <= {maximum}")
        return _got(key, value, f"a whole number {span}")
    return None


def dns_label(key: str, value: Any, max_len: int = DNS_LABEL_MAX) -> str | None:
    if not isinstance(value, str) or not DNS_LABEL.match(value) or len(value) > max_len:
        return _got(key, value, f"lowercase letters, digits and '-', starting and ending with a letter or digit "
                                f"(max {max_len})")
    return None


RUN_ID_MAX = 40
"""Longest run id: it names the Job (pods '<job>-<run_id>-<index>' must stay host names) and the S3 prefix."""


def run_id(key: str, value: Any) -> str | None:
    return dns_label(key, value, RUN_ID_MAX)


def namespace(key: str, value: Any) -> str | None:
    bad = dns_label(key, value)
    if bad:
        return bad
    if value in RESERVED_NAMESPACES or value.startswith("kube-"):
        return _got(key, value, "a namespace of your own (not default or kube-*), e.g. 'training'")
    return None


AZ = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")
ODCR = re.compile(r"^cr-[0-9a-f]{8,17}$")
IAM_PRINCIPAL = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+$")


def zone(key: str, value: Any, region: str | None = None) -> str | None:
    if not isinstance(value, str) or not AZ.match(value) or (region and not value.startswith(region)):
        return _got(key, value, f"a zone of region {region!r}" if region else "an availability zone such as us-west-2a")
    return None


def capacity_reservation_id(key: str, value: Any) -> str | None:
    if is_output(value):
        return None
    if not isinstance(value, str) or not ODCR.match(value):
        return _got(key, value, "an id like cr-0123456789abcdef0")
    return None


def iam_principal(key: str, value: Any) -> str | None:
    if is_output(value):
        return None
    if not isinstance(value, str) or not IAM_PRINCIPAL.match(value):
        return _got(key, value, "an IAM role or user ARN such as arn:aws:iam::123456789012:role/ci-deployer")
    return None


DURATION = re.compile(r"^(\d+h)?(\d+m)?(\d+s)?$(?<!^)")


def duration_minutes(text: str) -> float:
    """Minutes in a duration such as ``10m``, ``90s`` or ``1h30m`` (the autoscaler's Go duration subset)."""
    units = {"h": 60.0, "m": 1.0, "s": 1 / 60}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([hms])", text))


def scale_down_time(key: str, value: Any) -> str | None:
    if not isinstance(value, str) or not DURATION.match(value) or not 0 < duration_minutes(value) <= 24 * 60:
        return _got(key, value, "a duration of at most 24h such as 10m, 90s, 1h or 1h30m")
    return None


def region(key: str, value: Any) -> str | None:
    if value not in AWS_REGIONS:
        return _got(key, value, "an AWS region such as us-west-2 (known: " + ", ".join(AWS_REGIONS) + ")")
    return None


def retention_days(key: str, value: Any) -> str | None:
    if value not in CLOUDWATCH_RETENTION_DAYS:
        return _got(key, value, "one of CloudWatch's retention values: "
                    + ", ".join(map(str, CLOUDWATCH_RETENTION_DAYS)))
    return None


def root_volume_gib(key: str, value: Any) -> str | None:
    return whole(key, value, MIN_ROOT_VOLUME_GIB, GP3_MAX_GIB)


def global_batch(key: str, value: Any) -> str | None:
    return whole(key, value, 1, MAX_GLOBAL_BATCH)


def learning_rate(key: str, value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value < 100:
        return _got(key, value, "a number in (0, 100)")
    return None


def model(key: str, value: Any) -> str | None:
    return None if value in MODELS else _got(key, value, "one of " + ", ".join(repr(m) for m in MODELS))


def image_by_digest(key: str, value: Any) -> str | None:
    if not isinstance(value, str) or not IMAGE_BY_DIGEST.match(value):
        return _got(key, value, "an image pinned by digest, "
                    "e.g. 123456789012.dkr.ecr.us-west-2.amazonaws.com/trainer@sha256:<64 hex>")
    return None


PYTHON_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Variables the job sets for every worker (run and data directories): a workload reads them, never sets them.
RESERVED_ENV_PREFIX = "EKS_DDP_"
S3_PREFIX = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(?P<prefix>([^/\s]+/)*)$")


def python_module(key: str, value: Any) -> str | None:
    if not isinstance(value, str) or not PYTHON_MODULE.match(value):
        return _got(key, value, "a Python module name such as mypkg.train (what python -m takes)")
    return None


def script_path(key: str, value: Any) -> str | None:
    if not isinstance(value, str) or not value or any(c.isspace() for c in value) or value.startswith("-"):
        return _got(key, value, "a path to a script in the image such as /app/train.py (no spaces; arguments go "
                                "in args)")
    return None


def env_names(key: str, env: Any) -> list[str]:
    """Names of environment variables a workload sets: shell-style, and not the job's own EKS_DDP_*."""
    problems: list[str] = []
    for name in env:
        if not isinstance(name, str) or not ENV_NAME.match(name):
            problems.append(_got(f"{key}.{name}", name, "a variable name of letters, digits and '_', not starting "
                                                        "with a digit"))
        elif name.startswith(RESERVED_ENV_PREFIX):
            problems.append(_got(f"{key}.{name}", name, f"a name not starting with {RESERVED_ENV_PREFIX} (the job "
                                                        "sets those: EKS_DDP_RUN_DIR, EKS_DDP_DATA_DIR)"))
    return problems


def s3_prefix(key: str, value: Any) -> str | None:
    """An S3 prefix the data stage copies: ``s3://bucket/`` or ``s3://bucket/some/prefix/`` (trailing '/')."""
    if not isinstance(value, str) or not S3_PREFIX.match(value):
        hint = ""
        if isinstance(value, str) and value.startswith("s3://") and not value.endswith("/"):
            folder, _, last = value.rpartition("/")
            if "." in last and folder.count("/") >= 3:  # s3://bucket/.../name.ext: one object, not a folder
                hint = (f" ({last} names one object: the stage copies every object under a prefix; give the folder "
                        f"that holds it, {folder}/, or put it in a folder of its own)")
            else:
                hint = f" (end it with '/': {value}/)"
        return _got(key, value, "an S3 prefix such as s3://my-bucket/datasets/imagenet/ (a bucket name, then "
                                f"folders, ending with '/'){hint}")
    return None


S3_BUCKET = re.compile(r"^(?!xn--)(?!.*\.\.)(?!\d+\.\d+\.\d+\.\d+$)[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
"""An S3 bucket name (S3 user guide "General purpose bucket naming rules": 3-63 lowercase letters, digits, '.'
and '-', starting and ending with a letter or digit, no '..', not an IP address, not 'xn--')."""


def s3_bucket(key: str, value: Any) -> str | None:
    if not isinstance(value, str) or not S3_BUCKET.match(value):
        hint = " (a bucket name, not a URI)" if isinstance(value, str) and "/" in value else ""
        return _got(key, value, "an S3 bucket name: 3-63 lowercase letters, digits, '.' and '-', starting and "
                                f"ending with a letter or digit{hint}")
    return None


MANIFEST_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def manifest_sha256(key: str, value: Any) -> str | None:
    """A staged data set's pin: the SHA-256 of its manifest (64 lowercase hex digits), or None."""
    if value is None or (isinstance(value, str) and MANIFEST_SHA256.match(value)):
        return None
    return _got(key, value, "64 lowercase hex digits: the sha256 of the data set's manifest, which the S3 stage "
                            "logs (sha256sum /shared/data/<name>/.eks-ddp-manifest.json)")


def cluster_name(key: str, value: Any) -> str | None:
    if not isinstance(value, str) or not EKS_CLUSTER_NAME.match(value) or len(value) > EKS_CLUSTER_NAME_MAX:
        return _got(key, value, "letters, digits, '-' and '_', starting with a letter or digit "
                    f"(EKS cluster names, max {EKS_CLUSTER_NAME_MAX})")
    return None


def _cidr(key: str, value: Any) -> ipaddress.IPv4Network | str:
    """Parse an IPv4 CIDR strictly: a prefix length is required and host bits must be zero. The network, or what is
    wrong with ``value``."""
    if isinstance(value, str) and value.endswith("/0"):
        return _got(key, value, "a CIDR narrower than /0, which is the whole internet")
    if not isinstance(value, str) or "/" not in value:
        return _got(key, value, f"an IPv4 CIDR with a prefix length, e.g. {value}/32"
                    if isinstance(value, str) else "an IPv4 CIDR such as 10.0.0.0/16")
    try:
        net = ipaddress.ip_network(value)
    except ValueError:
        try:
            loose = ipaddress.ip_network(value, strict=False)
        except ValueError:
            return _got(key, value, "an IPv4 CIDR such as 10.0.0.0/16")
        return _got(key, value, f"a CIDR without host bits, e.g. {loose}")
    if not isinstance(net, ipaddress.IPv4Network):
        return _got(key, value, "an IPv4 CIDR")
    return net


def public_access_cidrs(key: str, values: Iterable[Any], *, placeholders_ok: bool = False) -> list[str]:
    """CIDRs that may reach the public Kubernetes API endpoint: real, public, and not the whole internet.

    ``placeholders_ok`` lets documentation ranges through (the offline plan of an example stack).
    """
    problems: list[str] = []
    values = list(values)
    if not values:
        return [f"{key}: got []; expected at least one CIDR: your IP as a /32 ({MY_IP})"]
    total = 0
    for i, value in enumerate(values):
        k = f"{key}[{i}]"
        net = _cidr(k, value)
        if isinstance(net, str):
            problems.append(net)
            continue
        total += net.num_addresses
        if any(net.subnet_of(doc) for doc in DOCUMENTATION_RANGES):
            if placeholders_ok:
                continue
            problems.append(_got(k, value, f"your own network, not a documentation placeholder (RFC 5737): "
                                           f"set your IP with: pulumi config set --path '{k}' "
                                           f"\"$({MY_IP})/32\""))
        elif net.prefixlen < MIN_PUBLIC_PREFIX:
            problems.append(_got(k, value, f"a prefix of /{MIN_PUBLIC_PREFIX} or longer: this opens the Kubernetes "
                                           "API endpoint to a large part of the whole internet; use your IP as a /32"))
        elif not net.is_global:
            problems.append(_got(k, value, "a public CIDR: the endpoint is reached from the internet, so private, "
                                           "loopback, link-local and shared ranges never match; use your public IP "
                                           f"({MY_IP}) as a /32"))
    if not problems and total > 2 ** (32 - MIN_PUBLIC_PREFIX):
        problems.append(_got(key, values, f"CIDRs that together span at most a /{MIN_PUBLIC_PREFIX} "
                                          f"({2 ** (32 - MIN_PUBLIC_PREFIX):,} addresses): several wide ranges "
                                          "open the endpoint to a large part of the internet as one would"))
    return problems


def ipv4_cidr(key: str, value: Any) -> str | None:
    """What is wrong with ``value`` as a strict IPv4 CIDR narrower than /0 (:func:`_cidr`), or None."""
    net = _cidr(key, value)
    return net if isinstance(net, str) else None


def vpc_cidr(key: str, value: Any) -> str | None:
    net = _cidr(key, value)
    if isinstance(net, str):
        return net
    if not 16 <= net.prefixlen <= 24:
        return _got(key, value, "an IPv4 CIDR from /16 to /24")
    if not net.is_private or net.is_loopback or net.is_link_local or net.is_multicast or net.is_reserved \
            or net.subnet_of(ipaddress.IPv4Network("0.0.0.0/8")) \
            or any(net.overlaps(doc) for doc in DOCUMENTATION_RANGES):
        return _got(key, value, "a private range (RFC 1918): inside 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16")
    return None


def require(*problems: str | None | list[str]) -> None:
    """Raise one ValueError listing every problem (for component Args)."""
    flat: list[str] = []
    for p in problems:
        if isinstance(p, list):
            flat += p
        elif p:
            flat.append(p)
    if flat:
        raise ValueError("; ".join(flat))


def partition(region: str) -> str:
    """The AWS partition of a region, as ARNs name it: aws, aws-cn (China) or aws-us-gov (GovCloud)."""
    return "aws-cn" if region.startswith("cn-") else "aws-us-gov" if region.startswith("us-gov-") else "aws"


DNS_SUFFIXES = {"aws": "amazonaws.com", "aws-cn": "amazonaws.com.cn", "aws-us-gov": "amazonaws.com"}
"""Each partition's DNS suffix (the provider's ``aws.get_partition().dns_suffix``): service endpoints, and so the
``kms:ViaService`` values, end with it (``s3.cn-north-1.amazonaws.com.cn``)."""


def dns_suffix(partition_name: str) -> str:
    return DNS_SUFFIXES.get(partition_name, "amazonaws.com")


def ec2_principal(partition_name: str) -> str:
    """EC2's service principal: ``ec2.amazonaws.com.cn`` in China, where EKS requires it in a node role's trust
    ("Following required service principals [ec2.amazonaws.com.cn] were not found", awslabs/cdk-eks-blueprints
    issue 558; hashicorp/terraform-provider-aws pull 47141). Most other services keep ``.amazonaws.com`` there."""
    return f"ec2.{dns_suffix(partition_name)}" if partition_name == "aws-cn" else "ec2.amazonaws.com"


def s3_gateway_service_name(region: str) -> str:
    """The S3 gateway endpoint's service name: China regions prefix ``cn.`` (``cn.com.amazonaws.<region>.s3``)."""
    return f"{'cn.' if partition(region) == 'aws-cn' else ''}com.amazonaws.{region}.s3"
