"""``eks-ddp``: one command per run, for a local run and a cluster run alike, working after its pods and nodes are gone.

    eks-ddp status RUN [--json]            running / succeeded / failed, with the failing rank's exit code and last lines
    eks-ddp logs RUN [--follow] [--rank N] [--tail N]
    eks-ddp cancel RUN
    eks-ddp fetch RUN [--out DIR]          results (S3) and kept logs of a cluster run
    eks-ddp destroy-check [--stack S]      before `pulumi destroy`: what in the stack's VPC the state does not hold
                                           and would block the delete (eks_ddp.tooling.destroy_check)

``RUN`` is a local run's directory (``eks-ddp-local``'s ``<out>/<run-id>``), a local run's id under ``--runs``
(default ``demo-out``, eks-ddp-local's ``--out``), or a cluster run's ``runId`` from the stack's ``runs`` output
(``pulumi stack output --json`` in this folder, ``--stack`` to name one, ``--outputs FILE`` for a saved copy).
Everything is read from the run's kept logs (eks_ddp_runtime/runlogs.py) and the launcher's final marker; a
cluster run's Job status is asked of kubectl while the Job exists, and its kept logs are copied into
``results/<runId>/logs`` (``--cache``) off the run's shared volume.

Exit status: 0 (for ``status``: any state but failed), 1 a failed run or a failed command, 2 a usage
error or an unknown run (the known ones are listed). Imports no torch.
"""

from eks_ddp.tooling.runs.cli import main

__all__ = ["main"]
