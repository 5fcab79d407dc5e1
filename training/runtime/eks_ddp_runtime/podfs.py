"""The training pod's read-only filesystem, rehearsed in a local run's workers (``eks-ddp-local --module/--script``).

On the cluster a worker runs as uid 1000 on a read-only root filesystem with ``/app`` as its working directory
(components/eks_ddp/workloads/elastic_job/pods.py): only the run's directory (``$EKS_DDP_RUN_DIR``), ``/tmp`` (also
``$HOME``) and ``/dev/shm`` are writable, and the data set is mounted read-only. A script that writes ``./ckpt``
works on a laptop and fails there with ``[Errno 30] Read-only file system``. The local runner names the folders that
are read-only in the pod, its working directory and the data set, in :data:`READ_ONLY_ENV`; each worker forked from
the zygote (workers.py ``run_worker``) then refuses, with the pod's errno (EROFS), any write below them that is not
also below a writable place nearer to it (the run's directory, which the runner puts under ``--out``, or the temp
folder; a working directory below the temp folder stays read-only).

It is a Python audit hook (PEP 578: ``sys.addaudithook``; the events ``open``, ``os.mkdir``, ``os.rename``,
``os.remove``, ``os.rmdir``, ``os.symlink``, ``os.link``, ``os.truncate`` are CPython's, listed in the "Audit events
table" of the Python docs): it sees every write the worker's Python code asks for (``open``, ``pathlib``, ``os``,
``shutil``, ``torch.save`` to a path), not one made by native code on its own, and it applies to forked workers
only (``EKS_DDP_FORK_WORKERS=0`` starts fresh interpreters, which it cannot reach). The uid is not rehearsed.
"""

from __future__ import annotations

import errno
import os
import sys
import tempfile

READ_ONLY_ENV = "EKS_DDP_LOCAL_READ_ONLY"
"""``os.pathsep``-separated folders a local run's workers may not write below (the pod's read-only places)."""
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {"os.mkdir": (0,), "os.remove": (0,), "os.rmdir": (0,), "os.truncate": (0,), "os.rename": (0, 1),
                "os.symlink": (1,), "os.link": (1,)}
"""The events that change the filesystem, and which of their arguments are paths written."""


def _depth(path: str, roots: list[str]) -> int:
    """The length of the deepest of ``roots`` that holds ``path``; -1 for none."""
    return max((len(r) for r in roots if path == r or path.startswith(r.rstrip(os.sep) + os.sep)), default=-1)


class PodFilesystem:
    """The hook: ``read_only`` folders, except below ``writable`` ones."""

    def __init__(self, read_only: list[str], writable: list[str]) -> None:
        self.read_only = [os.path.realpath(p) for p in read_only]
        self.writable = [os.path.realpath(p) for p in writable]

    def refused(self, path: object) -> str | None:
        """``path`` resolved, when a write there is refused; else None."""
        if not isinstance(path, (str, bytes, os.PathLike)):
            return None  # a file descriptor, or nothing
        try:
            raw = os.fsdecode(os.fspath(path))
        except TypeError:
            return None
        full = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(raw))), os.path.basename(raw))
        # The nearest folder decides: a run directory under the working directory (``--out`` is relative) is
        # writable, a working directory under the temp folder is not.
        return full if _depth(full, self.read_only) > _depth(full, self.writable) else None

    def error(self, path: object) -> OSError:
        """The pod's error (EROFS), saying where a worker can write: ``[Errno 30] Read-only file system (...): 'path'``."""
        return OSError(errno.EROFS, "Read-only file system (as in the training pod: writable are only "
                       "$EKS_DDP_RUN_DIR, /tmp and /dev/shm)",
                       os.fsdecode(os.fspath(path)) if isinstance(path, (str, bytes, os.PathLike)) else str(path))

    def __call__(self, event: str, args: tuple) -> None:
        if event == "open":
            path, _mode, flags = args
            if isinstance(flags, int) and flags & _WRITES and self.refused(path) is not None:
                if flags & os.O_CREAT and flags & os.O_EXCL and os.path.lexists(path):
                    return  # EEXIST first, as the kernel answers it
                raise self.error(path)
            return
        positions = _PATH_EVENTS.get(event)
        if positions is None:
            return
        for i in positions:
            path = args[i] if i < len(args) else None
            if self.refused(path) is None:
                continue
            if event == "os.mkdir" and isinstance(path, (str, bytes, os.PathLike)) and os.path.lexists(path):
                return  # mkdir of an existing folder: EEXIST first, as on a read-only filesystem
            raise self.error(path)


def install(environ=os.environ) -> PodFilesystem | None:
    """In a worker: the hook, when the local runner asks for it (:data:`READ_ONLY_ENV`); None otherwise."""
    raw = environ.get(READ_ONLY_ENV, "")
    read_only = [p for p in raw.split(os.pathsep) if p]
    if not read_only:
        return None
    writable = [p for p in (environ.get("EKS_DDP_RUN_DIR"), tempfile.gettempdir(), "/tmp", "/dev/shm") if p]
    hook = PodFilesystem(read_only, writable)
    sys.addaudithook(hook)
    return hook
