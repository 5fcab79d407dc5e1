"""The boto3 clients preflight asks, with short timeouts: an unreachable endpoint becomes a warning in seconds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def clients(region: str, profile: str | None = None) -> tuple[Any, Any, Any]:
    """boto3 clients with short timeouts: an unreachable endpoint becomes a warning in seconds, not minutes."""
    import boto3
    from botocore.config import Config

    config = Config(region_name=region, connect_timeout=5, read_timeout=15,
                    retries={"max_attempts": 3, "mode": "standard"})
    session = boto3.Session(profile_name=profile) if profile else boto3.Session()
    return (session.client("ec2", config=config), session.client("service-quotas", config=config),
            session.client("eks", config=config))


def ecr_clients(profile: str | None = None) -> Callable[[str], Any]:
    """ECR clients by region (an image's registry may sit in another region than the stack), made once each."""
    import functools

    import boto3
    from botocore.config import Config

    session = boto3.Session(profile_name=profile) if profile else boto3.Session()
    return functools.cache(lambda region: session.client("ecr", config=Config(
        region_name=region, connect_timeout=5, read_timeout=15, retries={"max_attempts": 3, "mode": "standard"})))


def logs_client(region: str, profile: str | None = None) -> Any:
    """A CloudWatch Logs client with the same short timeouts as :func:`clients`."""
    import boto3
    from botocore.config import Config

    config = Config(region_name=region, connect_timeout=5, read_timeout=15,
                    retries={"max_attempts": 3, "mode": "standard"})
    return (boto3.Session(profile_name=profile) if profile else boto3.Session()).client("logs", config=config)


def clients_sts(region: str, profile: str | None = None) -> Any:
    """The STS client of the same credentials as :func:`clients` (who runs this update)."""
    import boto3
    from botocore.config import Config

    session = boto3.Session(profile_name=profile) if profile else boto3.Session()
    return session.client("sts", config=Config(region_name=region, connect_timeout=5, read_timeout=15))


def fsx_client(region: str, profile: str | None = None) -> Any:
    """An FSx client with the same short timeouts as :func:`clients` (the FSx for Lustre backend's checks)."""
    import boto3
    from botocore.config import Config

    config = Config(region_name=region, connect_timeout=5, read_timeout=15,
                    retries={"max_attempts": 3, "mode": "standard"})
    return (boto3.Session(profile_name=profile) if profile else boto3.Session()).client("fsx", config=config)
