"""Crash-safe checkpoints on a shared volume, fenced so that a replaced world's late commit is never loaded.

Only global rank 0 writes. A checkpoint is written to a temp file in the same directory,
flushed and fsynced, then ``os.replace``d over its final name and the directory fsynced:
a reader sees either the whole file or nothing, whatever moment the writer dies at.
Loading walks from the newest file down; a file that does not load (written by something
else, a truncated copy) is renamed aside with a warning naming it, never deleted. When
checkpoints exist and none loads, the resume fails (:class:`CheckpointError`) rather than
silently training from scratch. Retention only ever deletes files older than the one just
written, so the newest valid checkpoint is never deleted.

**Fences.** Every world (one rendezvous round's workers) is numbered by a *generation* its rank 0 takes before it
trains, and records in ``checkpoints/fences/<generation>.json`` (created with ``link(2)``: fails if the name exists)
the state it restored (its *base*: the generation and step of that checkpoint or snapshot, or none) and its
*lineage*. Each checkpoint and snapshot records its world's generation. The states a loader may use are the lineage
of the newest world: that world's own states, and each base's world's states up to the base's step, back along the
chain (:func:`lineage_of`). A commit is refused right before its rename while the agent holds no lease
(eks_ddp_runtime.fence) or this world is no longer the newest.

With the etcd rendezvous the run's store decides (eks_ddp_runtime/fence_store.py: the generation by a
compare-and-set, the newest by a linearizable read; an empty store re-seeded above every fence file by exclusive
creates): no decision rests on a lookup or a listing a shared file system's client may answer from its cache.
Without a store (the c10d backend) the files decide: the newest fence is found by name, which needs negative lookups
answered by the file server. docs/rendezvous.md "Why two worlds never both commit" has the argument and its
assumptions, as tested.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from eks_ddp_runtime import exitcodes, fence, fence_store
from eks_ddp_trainer.guards import TrainerError

log = logging.getLogger(__name__)

CKPT_DIR = "checkpoints"
_NAME = re.compile(r"^ckpt-(\d{9})\.pt$")
FENCE_DIR = "fences"
"""Under the checkpoint folder: one ``<generation>.json`` per world that trained on this run directory."""
_FENCE_NAME = re.compile(r"^(\d{9})\.json$")
Lineage = dict[int, int | None]
"""Epoch -> the highest step of that world's states a loader may use (None: all); None: no fence (accept all)."""
FORMAT = 2
UNREADABLE_SUFFIX = ".unreadable"
REQUIRED = ("format", "model", "optimizer", "step", "epoch", "sample_in_epoch", "config")

# Test hook: pause rank 0 between writing the temp file and replacing, so a test can kill it mid-save.
PAUSE_STEP_ENV = "EKS_DDP_TEST_PAUSE_SAVE_STEP"
PAUSE_MARKER_ENV = "EKS_DDP_TEST_PAUSE_MARKER"
# Test hook: every checkpoint write takes this many seconds longer (a slow shared volume).
SLOW_SAVE_ENV = "EKS_DDP_TEST_SLOW_SAVE_S"


_FROM_FENCES: Any = object()
"""The default lineage: the run's own (read from its store or its fence files)."""


class CheckpointError(Exception):
    """Checkpoints exist but none can be loaded; the message names the files."""


class CommitRefused(Exception):
    """Raised by a commit gate right before a rename: this world may no longer commit (the temp file is removed)."""


def ckpt_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / CKPT_DIR


def ckpt_path(run_dir: str | os.PathLike, step: int) -> Path:
    return ckpt_dir(run_dir) / f"ckpt-{step:09d}.pt"


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Checkpoint files, oldest first (by the step in the name, not mtime, which a copy can change)."""
    d = ckpt_dir(run_dir)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def writer_tag(generation: int | None = None) -> str:
    """What makes a temp file's name this writer's alone: the world's generation, the host and the pid (pid
    namespaces make equal pids on two nodes likely, so the pid alone is not enough). Only characters safe in a
    file name are kept from the host name."""
    host = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"
    return f"g{-1 if generation is None else generation}-{host}-{os.getpid()}"


def atomic_write_bytes(path: Path, data: bytes, *, before_replace=None, tag: str | None = None) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never a mix. The temp file
    (``.<name>.tmp-<tag>``, :func:`writer_tag` by default) is only ever removed by this writer."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{tag or writer_tag()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    # The rename itself lives in the directory: without this a power cut could lose it on some filesystems.
    fsync_dir(path.parent)


def _pause_hook(step: int):
    want = os.environ.get(PAUSE_STEP_ENV)
    marker = os.environ.get(PAUSE_MARKER_ENV)
    if want is None or marker is None or int(want) != step or Path(marker).exists():
        return None

    def pause() -> None:
        Path(marker).write_text(str(os.getpid()))
        time.sleep(120)

    return pause


def save_checkpoint(run_dir: str | os.PathLike, state: dict[str, Any], *, keep: int) -> Path | None:
    """Write ``state`` (must hold ``step``) atomically and delete all but the newest ``keep`` checkpoints.
    ``state["fence"]["generation"]``, when present, is the writing world's: the commit is refused (None returned,
    nothing written or deleted) when this world may no longer commit (:func:`commit_gate`)."""
    if keep < 1:
        raise ValueError(f"keep_checkpoints: got {keep}; expected >= 1")
    step = int(state["step"])
    generation = (state.get("fence") or {}).get("generation")
    gate = commit_gate(run_dir, generation, f"checkpoint step {step}")
    # The gate first: a world that may not commit touches nothing in the folder (another world's rank 0 may be
    # writing its own temp file there right now), and a refused try costs no serialisation (a pending checkpoint is
    # tried again every half second while the store is away: training/eks_ddp_trainer/commits.py).
    try:
        gate()
    except CommitRefused:
        return None
    buf = io.BytesIO()
    torch.save({"format": FORMAT, **state}, buf)
    d = ckpt_dir(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    # This writer's own temp files only (left by an earlier try that was killed between write and rename):
    # the tag holds the generation, the host and the pid, so no other writer on any node has the same names.
    tag = writer_tag(generation)
    for stale in d.glob(f".ckpt-*.tmp-{tag}"):
        stale.unlink(missing_ok=True)
    path = ckpt_path(run_dir, step)
    data = buf.getvalue()
    time.sleep(float(os.environ.get(SLOW_SAVE_ENV, "0")))
    pause = _pause_hook(step)

    def before_replace() -> None:
        if pause is not None:
            pause()
        gate()  # after any pause: right before the rename
        write_meta(path, data, generation)  # what a restore decides from (restore.py), before the file it describes

    try:
        atomic_write_bytes(path, data, before_replace=before_replace, tag=tag)
    except CommitRefused:
        return None
    if generation is not None and _superseded_why(run_dir, generation) is not None:
        return path  # a newer world may own the folder now: its files are not ours to delete
    # Only files older than the one just written (a valid one) are candidates: a file with a higher
    # step is not ours to judge, and the newest valid checkpoint is never among those deleted.
    older = [p for p in list_checkpoints(run_dir) if _step_of(p) < step]
    for old in older[:max(0, len(older) - (keep - 1))]:
        old.unlink(missing_ok=True)
        meta_path(old).unlink(missing_ok=True)
    if generation is not None:
        _remove_replaced_worlds_temps(d, int(generation))
    return path


_TEMP_GENERATION = re.compile(r"^\.ckpt-.*\.tmp-g(-?\d+)-")


def _remove_replaced_worlds_temps(d: Path, generation: int) -> None:
    """After this world's commit, the temp files of the worlds it replaced (a lower generation in the name: a rank 0
    killed between write and rename, or a cut-off world refused at its gate). Those worlds can never commit again,
    so their temps are litter, never a save in flight that could still land; a temp of this generation or a newer one
    is left alone."""
    for tmp in d.glob(".ckpt-*.tmp-g*"):
        m = _TEMP_GENERATION.match(tmp.name)
        if m and int(m.group(1)) < generation:
            tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------- fences

def fence_dir(run_dir: str | os.PathLike) -> Path:
    return ckpt_dir(run_dir) / FENCE_DIR


def fence_path(run_dir: str | os.PathLike, generation: int) -> Path:
    return fence_dir(run_dir) / f"{generation:09d}.json"


def _listed_generations(run_dir: str | os.PathLike) -> list[int]:
    """The fences a listing of ``fences/`` shows: never one that does not exist (fences are never removed), but on
    a shared file system's client possibly not the newest (a cached directory)."""
    d = fence_dir(run_dir)
    if not d.is_dir():
        return []
    return sorted(int(m.group(1)) for p in d.iterdir() if (m := _FENCE_NAME.match(p.name)))


def _fence_generations(run_dir: str | os.PathLike) -> list[int]:
    """The listing, then each next name looked up until one is absent: generations are allocated one after the
    other, so the newest fence is found by lookups by name even when the listing is stale. (Without a store these
    negative lookups must be answered by the file server: docs/rendezvous.md "The c10d backend".)"""
    found = _listed_generations(run_dir)
    top = max(found, default=0)
    while fence_path(run_dir, top + 1).exists():
        top += 1
        found.append(top)
    return found


def read_fences(run_dir: str | os.PathLike) -> dict[int, dict[str, Any]]:
    """Every world's fence record, by generation (a record that does not parse is logged and left out)."""
    out = {}
    for generation in _fence_generations(run_dir):
        path = fence_path(run_dir, generation)
        try:
            out[generation] = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            log.warning("unreadable fence record %s: %s", path, e)
    return out


def lineage_of(fences: dict[int, dict[str, Any]]) -> Lineage | None:
    """The states a loader may use: the newest world's, then each base's world's up to the base's step, back
    along the chain of bases (generation 0: checkpoints written before any fence). None when there is no fence."""
    if not fences:
        return None
    generation = max(fences)
    out: Lineage = {generation: None}
    while generation in fences and fences[generation].get("base"):
        base_gen, base_step = (int(v) for v in fences[generation]["base"])
        if base_gen >= generation or base_gen in out:
            log.warning("fence record %s: base %s does not come from an older world; the chain ends here",
                        generation, fences[generation]["base"])
            break
        out[base_gen] = base_step
        generation = base_gen
    return out


def read_lineage(run_dir: str | os.PathLike) -> Lineage | None:
    """The lineage of the run's newest world: from the run's store when the launcher passed one (a linearizable
    read; an empty store is seeded first from the fence files, :func:`_seed`), else from the fence files.
    ``fence_store.StoreUnavailable`` when the store did not answer for :data:`FENCE_WAIT_S`."""
    store = _store()
    if store is None:
        return lineage_of(read_fences(run_dir))
    record, _ = _store_newest(store, run_dir)
    return _decode_lineage(record.get("lineage"))


def generation_of(state: dict[str, Any]) -> int:
    """The generation of the world that wrote ``state`` (0: written before fences existed)."""
    return int((state.get("fence") or {}).get("generation", 0))


def on_lineage(lineage: Lineage | None, state: dict[str, Any]) -> bool:
    if lineage is None:
        return True
    generation = generation_of(state)
    if generation not in lineage:
        return False
    limit = lineage[generation]
    return limit is None or int(state["step"]) <= limit


def superseded(run_dir: str | os.PathLike, generation: int) -> bool:
    """A newer world has fenced the run directory, in the run's store **or** on the shared volume.

    With the run's store: its newest world is not ``generation`` (a linearizable read, which no client cache can
    hide; an empty store, wiped since this world fenced, counts as superseded: the wipe restarts every world), or fence
    file ``generation + 1`` exists. The file is what every store's world shares: a second live store (a store pod
    force-deleted while its node still serves it, one recreated by hand or restored, a second stack on the same
    volume) has its own newest, but its worlds create their fence files in the same folder, above this one's
    (generations are allocated one after the other there, by exclusive link(2)). The lookup by name is the file
    server's answer when negative lookups are not cached (the stack mounts EFS with ``lookupcache=positive``:
    docs/rendezvous.md "Two live stores"). ``fence_store.StoreUnavailable`` when the store did not answer for
    :data:`STORE_WAIT_S`. Without a store: the file alone."""
    store = _store()
    if store is not None:
        record, _ = store.newest(STORE_WAIT_S)
        if record is None or int(record["generation"]) != generation:
            return True
    return fence_path(run_dir, generation + 1).exists()


class ReplacedElsewhere(TrainerError):
    """This world's own store still names it the newest, but a newer world that another live store holds has fenced
    the run directory (:func:`replaced_elsewhere`). Nothing can restart this world into that store, and a restart
    into its own would fence the live world out: the worker exits with ``SUPERSEDED`` (contract.py), and so does its
    agent (launch.py), which does not restart it."""

    def __init__(self, message: str) -> None:
        super().__init__(exitcodes.SUPERSEDED, message)


SPLIT_GRACE_S = 60.0
"""How long a fence file above this world may stand while the world's own store still names it the newest before
the world counts as replaced elsewhere even when no record says which store made the file (records from a store
seeded before records named their store, a store restored from a backup of this one). A contender of the same
store claims its generation within one fence try (:data:`FENCE_WAIT_S`) or finds the store away, which this
check then finds too."""
_newer_file_seen: dict[tuple[str, int], float] = {}


def replaced_elsewhere(run_dir: str | os.PathLike, generation: int, store_id: str | None) -> str | None:
    """Why world ``generation``, which its own store (identity ``store_id``) still names the newest, was replaced by
    another store's world, or None while it may be a contender of its own store claiming its generation.

    The fence files above ``generation`` are read by name, upward while they exist (gapless). A world's file (not a
    seed) that names another store than ``store_id`` was linked by a world whose store is not this one and read
    after this store was seeded (a seed is above every file of its time): another live store. A seed's file is not
    enough (two rank 0s that both found an empty store both link a seed; one claim loses). Without such a record,
    a newer file that stands for :data:`SPLIT_GRACE_S` counts too."""
    found = []
    top = generation
    while top < generation + 1000 and fence_path(run_dir, top + 1).exists():
        top += 1
        try:
            record = _file_record(run_dir, top)
        except FenceError:
            continue
        other = record.get("store")
        if not record.get("seed") and other is not None and store_id is not None and other != store_id:
            found.append(f"fence {top} (host {record.get('host')}, store {other[:8]})")
    if found:
        return (f"world {generation} was replaced by {', '.join(found)} on {run_dir}, which this world's rendezvous "
                f"store (identity {store_id[:8] if store_id else None}) does not hold: two live stores")
    if top == generation:
        _newer_file_seen.pop((str(run_dir), generation), None)
        return None
    first = _newer_file_seen.setdefault((str(run_dir), generation), time.monotonic())
    if time.monotonic() - first >= SPLIT_GRACE_S:
        return (f"fence file {generation + 1} on {run_dir} has stood for {SPLIT_GRACE_S:.0f} s while this world's "
                f"rendezvous store still names world {generation} the newest: a world of another store")
    return None


def _superseded_why(run_dir: str | os.PathLike, generation: int) -> str | None:
    """Why world ``generation`` may not commit (a newer world, or a store that did not answer), or None. Raises
    :class:`ReplacedElsewhere` when the newer world is another live store's (every caller is a commit of this world's
    rank 0: the history, a checkpoint on its side thread, whose error reaches the training thread, the final wait)."""
    try:
        if superseded(run_dir, generation):
            store = _store()
            if store is not None:
                record, _ = store.newest(STORE_WAIT_S)
                if record is not None and int(record["generation"]) == generation:
                    why = replaced_elsewhere(run_dir, generation, record.get("store"))
                    if why is not None:
                        raise ReplacedElsewhere(f"{why}; this world commits nothing more and stops (exit "
                                                f"{exitcodes.SUPERSEDED}); see docs/rendezvous.md \"Two live stores\"")
            return f"a newer world than {generation} has fenced {run_dir}; this world was replaced and commits nothing more"
    except (fence_store.StoreUnavailable, ValueError) as e:  # ValueError: a newest record that does not parse
        return f"{e}: a commit needs that check"
    return None


deferrals = fence.Deferrals(stream="stdout")
"""The trainer's deferred commits and waits on the run's store, said once per episode (eks_ddp_runtime.fence)."""


def commit_gate(run_dir: str | os.PathLike, generation: int | None, what: str) -> Callable[[], None]:
    """A check for right before a rename: raises CommitRefused when the agent's lease does not allow ``what``
    (eks_ddp_runtime.fence.lease) or a newer world than ``generation`` has fenced ``run_dir`` (or the run's store
    did not answer that check). A kind of commit's refusals are said once per episode (:data:`deferrals`)."""
    def gate() -> None:
        why = None if generation is None else _superseded_why(run_dir, generation)
        if why is None:
            ok, lease_why = fence.lease()
            why = None if ok else lease_why
        if why is not None:
            deferrals.refused(what, why)
            raise CommitRefused(what)
        deferrals.allowed(what)
    return gate


def until_allowed(commit: Callable[[], Any], poll_s: float = 0.5) -> Any:
    """``commit()`` (which runs a :func:`commit_gate` right before its rename), repeated while the gate refuses
    it: a world that was replaced waits here until its agent stops it."""
    while True:
        try:
            return commit()
        except CommitRefused:
            time.sleep(poll_s)


def commit_bytes(path: Path, data: bytes, *, run_dir: str | os.PathLike, generation: int | None, what: str) -> None:
    """:func:`atomic_write_bytes` behind :func:`commit_gate`, retried until the gate allows it."""
    gate = commit_gate(run_dir, generation, what)
    until_allowed(lambda: atomic_write_bytes(path, data, before_replace=gate))


def write_fence(run_dir: str | os.PathLike, base: tuple[int, int] | None, round_: int | None,
                lineage: Any = _FROM_FENCES) -> int | None:
    """Fence ``run_dir`` for a new world that restored ``base`` ((generation, step), or None for a fresh start)
    chosen from ``lineage`` (what its loader used; default: the run's current one): returns its generation, or None
    when the lease refused it or the run's store did not answer (the caller tries again).

    With the run's store (:func:`_store_fence`) the store allocates the generation; without, the first free file
    name after every fence seen."""
    store = _store()
    if store is not None:
        return _store_fence(store, run_dir, base, round_, lineage)
    d = fence_dir(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    generation = max(_fence_generations(run_dir), default=0) + 1
    record = {"base": list(base) if base is not None else None, "round": round_, "host": socket.gethostname(),
              "pid": os.getpid()}
    while True:
        tmp = d / f".{generation:09d}.tmp-{os.getpid()}"
        tmp.write_text(json.dumps({"generation": generation, **record, "created": time.time()}))
        try:
            if not fence.commit_allowed(f"fence of world {generation}"):
                return None
            os.link(tmp, fence_path(run_dir, generation))  # EEXIST when another world took this generation
        except FileExistsError:
            generation += 1
            continue
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(d)
        return generation


# ---------------------------------------------------------------------------------------------- the run's store

STORE_WAIT_S = 5.0
"""A commit's check waits at most this long for the run's store (the launcher's retries: connection failures only,
100 ms doubling to 1 s), then the commit is deferred: the lease lapses in less during such an outage anyway."""
FENCE_WAIT_S = 10.0
"""A world's fence or loader waits at most this long per try for the store; its caller tries again every second, in
short collectives (training/eks_ddp_trainer/resume.py), until the agent stops it."""
REREAD_WAIT_S = 90.0
"""How long a fence file that the file server says exists (link(2) answered EEXIST) may stay unopenable on this
client (a cached negative lookup lasts at most the directory's attribute cache time, acdirmax, 60 s on EFS's
defaults) before re-seeding an empty store refuses (FenceError)."""

_stores: dict[str, fence_store.FenceStore | None] = {}


class FenceError(Exception):
    """The run's fences cannot be read back consistently (the message names the file and why)."""


def _store() -> fence_store.FenceStore | None:
    """The run's store, when the launcher passed one (eks_ddp_runtime.fence_store.FENCE_STORE_ENV)."""
    raw = os.environ.get(fence_store.FENCE_STORE_ENV)
    if not raw:
        return None
    if raw not in _stores:
        _stores[raw] = fence_store.from_env()
    return _stores[raw]


def _encode_lineage(lineage: Lineage | None) -> list[list[int | None]] | None:
    return None if lineage is None else [[g, limit] for g, limit in sorted(lineage.items(), reverse=True)]


def _decode_lineage(raw: Any) -> Lineage | None:
    if raw is None:
        return None
    return {int(g): (None if limit is None else int(limit)) for g, limit in raw}


def _record(generation: int, base: tuple[int, int] | None, round_: int | None, lineage: Lineage | None,
            seed: bool = False, store_id: str | None = None) -> dict[str, Any]:
    """A fence record. ``store``: the identity of the store it is claimed in, the nonce of that store's seed (a store
    seeded anew, after a wipe or as a second live store, has a new one); a seed's is its own nonce."""
    nonce = uuid.uuid4().hex
    return {"generation": generation, "base": list(base) if base is not None else None, "round": round_,
            "lineage": _encode_lineage(lineage), "seed": seed, "host": socket.gethostname(), "pid": os.getpid(),
            "nonce": nonce, "store": nonce if seed else store_id, "created": time.time()}


def _link_record(run_dir: str | os.PathLike, record: dict[str, Any]) -> bool:
    """Create ``fences/<generation>.json`` holding ``record`` with link(2): False when the name exists. The answer
    is the file server's: the new name is looked up with ``LOOKUP_CREATE | LOOKUP_EXCL`` (Linux fs/namei.c
    ``filename_create``); a cached negative entry is then kept without asking the server (fs/nfs/dir.c
    ``nfs_neg_need_reval`` returns 0 for ``LOOKUP_CREATE``), so the LINK itself goes to the server, which refuses an
    existing name; a cached positive entry answers EEXIST at once, and is never stale here (fences are never
    removed)."""
    d = fence_dir(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{record['generation']:09d}.tmp-{writer_tag(record['generation'])}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, fence_path(run_dir, record["generation"]))
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(d)
    return True


def _file_record(run_dir: str | os.PathLike, generation: int) -> dict[str, Any]:
    """The record in fence file ``generation``, which the file server said exists: opened by name (close-to-open:
    the data is the server's). A cached negative entry can still hide the name for up to the directory's attribute
    cache time: retried for :data:`REREAD_WAIT_S`, then FenceError."""
    path = fence_path(run_dir, generation)
    deadline = time.monotonic() + REREAD_WAIT_S
    while True:
        try:
            with open(path, encoding="utf-8") as f:
                record = json.load(f)
            if not isinstance(record, dict):
                raise ValueError("not an object")
            return record
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                raise FenceError(f"{path}: the file server answered that it exists (link(2): EEXIST) but this client "
                                 f"could not open it for {REREAD_WAIT_S:.0f} s; the run's store, found empty, is "
                                 "not re-seeded from a fence it cannot read") from None
            time.sleep(min(1.0, REREAD_WAIT_S / 10))
        except (OSError, ValueError) as e:
            raise FenceError(f"{path}: got an unreadable fence record ({e}); expected the JSON a world wrote with "
                             "link(2); the run's store is not re-seeded past it") from e


def _file_lineage(run_dir: str | os.PathLike, generation: int, record: dict[str, Any]) -> Lineage | None:
    """The lineage of the world of fence file ``generation``: the record's own (written with the store), or for
    a record written without one, its chain of bases followed by opening each base's file by name."""
    if "lineage" in record:
        return _decode_lineage(record["lineage"])
    out: Lineage = {generation: None}
    while record.get("base"):
        base_gen, base_step = (int(v) for v in record["base"])
        if base_gen >= generation or base_gen in out:
            break
        out[base_gen] = base_step
        if base_gen == 0:
            break
        generation, record = base_gen, _file_record(run_dir, base_gen)
    return out


def _seed(store: fence_store.FenceStore, run_dir: str | os.PathLike) -> None:
    """The run's store holds no fence: a new run, or a store that came back empty (a wiped or recreated member).
    Its fence must not go backwards, so it is seeded from the files without trusting a listing or a negative
    lookup: every generation the store ever held has its file (a world creates its file before its store
    transaction) and the file names are gapless from 1 (each is created by probing upward from a file that exists,
    and none is ever removed). So creating names upward with link(2) from any existing one (the listing's newest,
    a lower bound) until one succeeds takes the first free name ``g``, above every generation ever allocated: each
    EEXIST on the way is the server's answer. ``g`` becomes a *seed*: no world trains under it; its lineage is the
    one of fence ``g - 1`` (read by name), so loaders keep using what the newest world committed."""
    generation = max(_listed_generations(run_dir), default=0) + 1
    while True:
        lineage: Lineage | None = None
        if generation > 1:
            below = _file_record(run_dir, generation - 1)
            prior = _file_lineage(run_dir, generation - 1, below)
            lineage = None if prior is None else {generation: None, **prior}
        record = _record(generation, None, None, lineage, seed=True)
        if _link_record(run_dir, record):
            break
        generation += 1
    if store.claim(record, None, FENCE_WAIT_S):
        log.warning("the run's store held no fence (a new run, or a store that came back empty): seeded it at "
                    "generation %s, above the run directory's fences 1..%s", generation, generation - 1)


def _store_newest(store: fence_store.FenceStore, run_dir: str | os.PathLike) -> tuple[dict[str, Any], bytes]:
    """The store's newest record (seeded first when the store is empty) and its value as stored."""
    for _ in range(3):
        record, raw = store.newest(FENCE_WAIT_S)
        if record is not None and raw is not None:
            return record, raw
        _seed(store, run_dir)
    raise fence_store.StoreUnavailable(f"{store!r}: empty after seeding it three times")


def _store_fence(store: fence_store.FenceStore, run_dir: str | os.PathLike, base: tuple[int, int] | None,
                 round_: int | None, lineage: Any) -> int | None:
    """The store allocates the world's generation: the file ``fences/<g>.json`` first (link(2), probing upward from
    the store's newest + 1: the record stays in the run directory), then one transaction that makes it the newest
    if the newest is still the one read. A lost transaction leaves the file as the record of a world that never
    started and tries again above the new newest."""
    if not fence.commit_allowed("fence of a new world"):
        return None
    try:
        newest, raw = _store_newest(store, run_dir)
        loader = _decode_lineage(newest.get("lineage")) if lineage is _FROM_FENCES else lineage
        chain: Lineage = {}
        if base is not None:
            chain = {base[0]: base[1], **{g: v for g, v in (loader or {}).items() if g < base[0]}}
        generation = int(newest["generation"]) + 1
        for _ in range(1000):
            record = _record(generation, base, round_, {generation: None, **chain}, store_id=newest.get("store"))
            if not _link_record(run_dir, record):
                _refuse_above_another_store(run_dir, generation, newest)
                generation += 1
                continue
            while True:
                if store.claim(record, raw, FENCE_WAIT_S):
                    return generation
                now, raw_now = store.newest(FENCE_WAIT_S)
                if now is not None and now.get("nonce") == record["nonce"]:
                    return generation  # the reply was lost, the transaction had landed
                if now is None or raw_now is None:
                    return None  # wiped meanwhile: the next try seeds it again
                raw, newest = raw_now, now
                if int(now["generation"]) >= generation:
                    break  # another world took a newer generation: this file stays as a record, try above it
            generation = int(now["generation"]) + 1
        raise FenceError(f"{fence_dir(run_dir)}: no free fence name in 1000 tries")
    except fence_store.StoreUnavailable as e:
        deferrals.refused("fence of a new world", str(e), said="deferred")
        return None


def _refuse_above_another_store(run_dir: str | os.PathLike, generation: int, newest: dict[str, Any]) -> None:
    """Fence file ``generation`` exists above this store's newest (``newest``): a contender of this store, or a world
    that another live store holds. Raises :class:`ReplacedElsewhere` for the latter (its record names another store
    and is no seed: :func:`replaced_elsewhere`): a world fenced here, above it, would take the run directory from the
    live world, which would then take it back, each restart losing the other's progress."""
    record = _file_record(run_dir, generation)
    other, mine = record.get("store"), newest.get("store")
    if not record.get("seed") and other is not None and mine is not None and other != mine:
        raise ReplacedElsewhere(
            f"fence {generation} on {run_dir} is a world of another rendezvous store (identity {other[:8]}, host "
            f"{record.get('host')}) that this store (identity {mine[:8]}, newest {newest['generation']}) does not hold: "
            "two live stores; this world does not fence above it and stops (exit "
            f"{exitcodes.SUPERSEDED}); see docs/rendezvous.md \"Two live stores\"")


def same_run(saved: dict[str, Any], now: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """What differs between a checkpoint's run identity and this run's, as {key: (saved, now)}; {} when the
    checkpoint belongs to this run. Keys the checkpoint has and this run no longer counts (``epochs``, which
    older checkpoints held: the run resumes with the new count) are ignored."""
    return {k: (saved.get(k), v) for k, v in now.items() if saved.get(k) != v}


def _step_of(path: Path) -> int:
    m = _NAME.match(path.name)
    return int(m.group(1)) if m else -1


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    return _checked(torch.load(path, map_location=map_location, weights_only=True), path)


def load_checkpoint_bytes(data: bytes, name: str) -> dict[str, Any]:
    """A checkpoint's state from bytes already read (and checked against their SHA-256): one read of the file."""
    return _checked(torch.load(io.BytesIO(data), map_location="cpu", weights_only=True), name)


def _checked(state: Any, path: Any) -> dict[str, Any]:
    if not isinstance(state, dict) or any(k not in state for k in REQUIRED):
        raise ValueError(f"{path}: not an eks-ddp checkpoint (missing keys)")
    if state["format"] != FORMAT:
        raise ValueError(f"{path}: checkpoint format {state['format']}; expected {FORMAT}")
    return state


def load_latest(run_dir: str | os.PathLike, map_location: str | torch.device = "cpu", *, set_aside: bool = False,
                allow_none_valid: bool = False,
                lineage: Lineage | None = _FROM_FENCES) -> tuple[dict[str, Any], Path] | None:
    """The newest checkpoint that loads and is on the lineage (default: the run directory's fences), or None
    when there is none.

    Checkpoints off the lineage (a replaced world's late commits) are skipped with a warning and left alone.
    Unreadable files are logged by name (and with ``set_aside`` renamed to ``*.unreadable``, out of
    the way of retention). If there are checkpoint files and none loads, raises CheckpointError
    unless ``allow_none_valid`` (then returns None: train from scratch).
    """
    if lineage is _FROM_FENCES:
        lineage = read_lineage(run_dir)
    bad: list[Path] = []
    reasons: list[str] = []
    found = None
    for path in reversed(list_checkpoints(run_dir)):
        try:
            state = load_checkpoint(path, map_location)
        except Exception as e:  # any failure to load is reported with the file's name
            log.warning("unreadable checkpoint %s: %s", path, e)
            bad.append(path)
            reasons.append(f"{path}: {type(e).__name__}: {e}")
            continue
        if not on_lineage(lineage, state):
            log.warning("checkpoint %s (world %s, step %s) is not on the lineage of the newest fence %s: skipped",
                        path, generation_of(state), state["step"], lineage)
            continue
        found = state, path
        break
    if bad and found is None and not allow_none_valid:
        # Left in place: a retry must fail the same way, not find an empty folder and start over.
        raise CheckpointError("no readable checkpoint; unreadable: " + "; ".join(reasons))
    if set_aside:
        for path in bad:
            set_aside_file(path)
    return found


# ---------------------------------------------------------------------------------------------- metadata sidecars

META_SUFFIX = ".meta.json"


def meta_path(path: Path) -> Path:
    """The metadata sidecar of checkpoint ``path``: ``ckpt-<step>.pt.meta.json``."""
    return path.with_name(path.name + META_SUFFIX)


def write_meta(path: Path, data: bytes, generation: Any) -> None:
    """The sidecar of the checkpoint about to be renamed to ``path``: its step, generation, size and SHA-256, so a
    restore chooses what to resume from without opening any checkpoint, and checks the one it reads."""
    meta = {"format": FORMAT, "step": _step_of(path), "generation": int(generation or 0), "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest()}
    atomic_write_bytes(meta_path(path), json.dumps(meta).encode(), tag=writer_tag(generation))


def read_meta(path: Path) -> dict[str, Any] | None:
    """The sidecar of checkpoint ``path``, or None (a checkpoint written before sidecars, or a sidecar that does not
    parse or names another step: the checkpoint is then checked by loading it, as before)."""
    try:
        meta = json.loads(meta_path(path).read_text())
        if not isinstance(meta, dict) or meta.get("step") != _step_of(path) or meta.get("format") != FORMAT:
            return None
        return {k: meta[k] for k in ("step", "generation", "size", "sha256")}
    except (OSError, ValueError, KeyError):
        return None


def set_aside_file(path: Path) -> None:
    """Rename an unreadable checkpoint to ``*.unreadable`` (never deleted), and drop its sidecar."""
    path.rename(path.with_name(path.name + UNREADABLE_SUFFIX))
    meta_path(path).unlink(missing_ok=True)
