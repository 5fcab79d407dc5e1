"""Fetch a cluster run's results from S3 and show them as the local runner does.

    eval "$(pulumi stack output fetchResults)"
    python -m eks_ddp_local.fetch_results s3://<bucket>/runs/<runId>/ [--region R] [--profile P] [--out results/<runId>]

Downloads ``metrics.json``, ``history.jsonl``, ``training-curve.png`` and ``model.pt`` into
``--out``, prints the per-class table and (re)draws ``training-curve.png`` from the history
with the same code as ``eks_ddp_local.cli``. Uses your AWS credentials (``s3:GetObject``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eks_ddp_trainer.upload import FILES, split_url


def fetch(url: str, out: Path, *, client=None) -> list[Path]:
    """Download the run's result files that exist; returns their local paths."""
    bucket, prefix = split_url(url)
    if client is None:
        import boto3

        client = boto3.client("s3")
    out.mkdir(parents=True, exist_ok=True)
    listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    present = {o["Key"] for o in listed}
    got = []
    for name in FILES:
        if prefix + name in present:
            client.download_file(bucket, prefix + name, str(out / name))
            got.append(out / name)
    return got


def main(argv: list[str] | None = None) -> int:
    from eks_ddp_trainer.plot import summarize

    p = argparse.ArgumentParser(prog="eks-ddp-fetch-results", description=__doc__.split("\n\n")[0])
    p.add_argument("url", help="s3://<bucket>/runs/<runId>/ (the stack output results.url)")
    p.add_argument("--region", help="the stack's region (default: your AWS configuration's)")
    p.add_argument("--out", type=Path, help="local folder (default results/<runId>)")
    p.add_argument("--profile", help="AWS profile to read with (the stack's aws:profile; default: your configuration's)")
    a = p.parse_args(argv)
    try:
        bucket, prefix = split_url(a.url)
    except ValueError as err:
        p.error(str(err))
    out = a.out or Path("results") / (prefix.rstrip("/").rsplit("/", 1)[-1] or bucket)
    import boto3
    import botocore.exceptions

    try:
        got = fetch(a.url, out, client=boto3.Session(profile_name=a.profile).client("s3", region_name=a.region))
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as err:
        print(f"eks-ddp-fetch-results: {a.url}: {err}", file=sys.stderr)
        return 1
    if not got:
        print(f"eks-ddp-fetch-results: nothing under {a.url} yet (the run uploads when training ends)",
              file=sys.stderr)
        return 1
    print(f"[fetch] {len(got)} file(s) in {out}: {', '.join(g.name for g in got)}")
    metrics, _ = summarize(out, out / "training-curve.png", title=f"eks-ddp run {out.name}")
    return 0 if metrics is not None else 1


if __name__ == "__main__":
    sys.exit(main())
