"""Results off the cluster: rank 0 uploads the run's results to S3 at the end of training.

The training Job sets ``EKS_DDP_RESULTS_URL=s3://<bucket>/runs/<runId>/`` and ``EKS_DDP_RESULTS_KMS_KEY``
(the bucket's key, ``components/eks_ddp/infra/results.py``) and its service account assumes a role that may only write
under that prefix, with that key. Uploaded:
``metrics.json``, ``history.jsonl``, ``training-curve.png`` (drawn here when matplotlib is
installed; ``eks_ddp_local.fetch_results`` draws it anyway) and ``model.pt``.

A failed upload never fails a finished run (the results are still on the shared volume): it is
logged loudly, one line per file, with the fix, and written to ``<run dir>/results-upload-failed``
(the shared volume outlives the pods and their logs); a later complete upload removes that file.
``python -m eks_ddp_trainer.upload [RUN_DIR]`` uploads again from any pod that mounts the run's directory
with the trainer's environment, and exits 1 while anything failed to upload.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from eks_ddp_runtime.contract import RESULTS_KMS_KEY_ENV as KMS_KEY_ENV
from eks_ddp_runtime.contract import RESULTS_URL_ENV as RESULTS_ENV

"""The bucket's KMS key (ARN); every object is written under it (the bucket policy refuses any other key)."""
FILES = ("metrics.json", "history.jsonl", "training-curve.png", "model.pt")
"""What a run's results are, in upload order (the model, the largest, last)."""
FAILED_MARKER = "results-upload-failed"
"""Written into the run's directory when an upload failed: what failed and why, one line each."""


def split_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix/`` -> (bucket, "some/prefix/")."""
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    if not url.startswith("s3://") or not bucket:
        raise ValueError(f"{url!r}: expected s3://<bucket>/<prefix>/")
    return bucket, (prefix.rstrip("/") + "/") if prefix else ""


def _draw_curve(run_dir: Path) -> None:
    try:
        from eks_ddp_trainer.plot import plot_history

        plot_history(run_dir / "history.jsonl", run_dir / "training-curve.png", title=f"eks-ddp run {run_dir.name}")
    except ImportError:
        print("[results] matplotlib is not in the image: the curve is drawn by eks_ddp_local.fetch_results", flush=True)
    except (OSError, ValueError) as err:
        print(f"[results] no training curve: {err}", flush=True)


def upload_results(run_dir: str | os.PathLike, url: str, *, client=None, kms_key_arn: str | None = None) -> list[str]:
    """Upload the run's result files to ``url`` (SSE-KMS under ``kms_key_arn`` when given; else the bucket's
    default encryption); returns the keys written. Never raises: a failure is printed and written to
    ``run_dir/results-upload-failed`` (removed again by an upload where nothing failed)."""
    run_dir = Path(run_dir)
    failures: list[str] = []
    extra = {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": kms_key_arn} if kms_key_arn else None
    try:
        bucket, prefix = split_url(url)
        if client is None:
            import boto3

            client = boto3.client("s3")
        if not (run_dir / "training-curve.png").exists() and (run_dir / "history.jsonl").exists():
            _draw_curve(run_dir)
    except Exception as err:  # noqa: BLE001 - a finished run must not fail on its upload
        failures.append(f"{url}: {type(err).__name__}: {err}")
        print(f"[results] UPLOAD FAILED: {url}: {type(err).__name__}: {err}; results stay in {run_dir}",
              file=sys.stderr, flush=True)
        _mark(run_dir, url, failures)
        return []
    written = []
    for name in FILES:
        path = run_dir / name
        if not path.exists():
            continue
        key = prefix + name
        try:
            client.upload_file(str(path), bucket, key, ExtraArgs=extra)
            written.append(key)
        except Exception as err:  # noqa: BLE001
            failures.append(f"{path.name} -> s3://{bucket}/{key}: {type(err).__name__}: {err}")
            print(f"[results] UPLOAD FAILED: {path} -> s3://{bucket}/{key}: {type(err).__name__}: {err} "
                  f"(the file stays in {run_dir}; check the trainer role's s3:PutObject on that prefix)",
                  file=sys.stderr, flush=True)
    _mark(run_dir, url, failures)
    if written:
        print(f"[results] uploaded {len(written)} file(s) to s3://{bucket}/{prefix}: "
              + ", ".join(k.rsplit("/", 1)[-1] for k in written), flush=True)
    return written


def upload_from_env(run_dir: str | os.PathLike) -> list[str]:
    """Upload when the Job asked for it (``EKS_DDP_RESULTS_URL`` set); a local run uploads nothing."""
    url = os.environ.get(RESULTS_ENV)
    return upload_results(run_dir, url, kms_key_arn=os.environ.get(KMS_KEY_ENV) or None) if url else []


def _mark(run_dir: Path, url: str, failures: list[str]) -> None:
    """Write (or, with no failure, remove) the run directory's failure marker; never raises."""
    marker = run_dir / FAILED_MARKER
    try:
        if not failures:
            marker.unlink(missing_ok=True)
            return
        tmp = marker.with_name(marker.name + ".tmp")
        tmp.write_text(f"results upload to {url} failed; the files stay in {run_dir}\n"
                       + "".join(f"{f}\n" for f in failures)
                       + "fix: the trainer role's s3:PutObject on the prefix and, for an SSE-KMS bucket, "
                         "kms:GenerateDataKey on its key (storage.resultsKmsKeyArn); then "
                         "python -m eks_ddp_trainer.upload <run dir> uploads again\n")
        os.replace(tmp, marker)
        print(f"[results] wrote {marker}", file=sys.stderr, flush=True)
    except OSError as err:
        print(f"[results] could not write {marker}: {err}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Upload a run's results as the Job would (``EKS_DDP_RESULTS_URL``, ``EKS_DDP_RESULTS_KMS_KEY``): exit 0
    when nothing failed, 1 when an upload failed (``results-upload-failed`` says what), 2 on usage errors."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m eks_ddp_trainer.upload", description=main.__doc__)
    parser.add_argument("run_dir", nargs="?", default=os.environ.get("EKS_DDP_RUN_DIR"),
                        help="the run's directory (default: $EKS_DDP_RUN_DIR)")
    args = parser.parse_args(argv)
    if not args.run_dir or not os.environ.get(RESULTS_ENV):
        parser.error(f"needs a run directory (or EKS_DDP_RUN_DIR) and {RESULTS_ENV}")
    upload_from_env(args.run_dir)
    return 1 if (Path(args.run_dir) / FAILED_MARKER).exists() else 0


if __name__ == "__main__":
    sys.exit(main())
