"""What a (re)started world resumes from, decided from metadata, read by one rank and sent to the others as tensors.

A restart used to read the newest durable checkpoint on rank 0 (to validate it), then on every rank, and only then
look at the node-local snapshots. Now:

1. Rank 0 reads the run's lineage (the run's store or its fence files: checkpoint.py) and the durable checkpoints'
   *sidecars* (``ckpt-<step>.pt.meta.json``: step, generation, size, SHA-256, written before the checkpoint's
   rename). Every rank reads the header of its node's snapshot (snapshot.py: the same fields, in /dev/shm).
   Nothing here opens a checkpoint.
2. The newest copy wins; at an equal step the snapshot (node memory, not the shared volume). A durable checkpoint
   is read only when it is newer than every snapshot the survivors hold.
3. One rank reads the chosen copy: rank 0 the durable file (one open, its bytes checked against the sidecar's size
   and SHA-256 before anything is unpickled), or the lowest rank whose node holds the newest snapshot. A copy that
   fails its check is not used: a durable file is set aside (``*.unreadable``, as before), a snapshot removed, and
   the choice is made again without it. When checkpoints exist and none is usable the run fails with BAD_INPUT
   unless ``--start-over``.
4. That rank sends the state to every other rank with :func:`broadcast_state`: the tensors' bytes in one flat
   buffer (``torch.distributed.broadcast``), and the small rest (step, config, RNG, optimizer groups) as a
   ``torch.save`` skeleton loaded with ``weights_only=True``, so a peer never unpickles anything a checkpoint could
   not hold.

A checkpoint written before sidecars existed has its step in its name: it is chosen by that, and checked by loading
it (on rank 0 only), as before.
"""

from __future__ import annotations

import hashlib
import io
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from eks_ddp_runtime import exitcodes, fence_store
from eks_ddp_runtime.dist import DistEnv
from eks_ddp_trainer import checkpoint as ckpt
from eks_ddp_trainer.guards import TrainerError
from eks_ddp_trainer.snapshot import Snapshots

log = logging.getLogger(__name__)

CHUNK_BYTES = 256 << 20
"""A state is broadcast in pieces of at most this many bytes (bounds a collective's buffer, not the copy)."""
_ALIGN = 16

NONE, DURABLE, SNAPSHOT, FAILED = 0, 1, 2, 3


@dataclass
class Restored:
    state: dict[str, Any] | None
    lineage: ckpt.Lineage | None
    source: str
    """'durable', 'snapshot' or 'none'."""


@dataclass
class Candidate:
    path: Path
    step: int
    meta: dict[str, Any] | None
    """The sidecar (None: a checkpoint from before sidecars, checked by loading it)."""


def durable_candidates(run_dir: Path, lineage: ckpt.Lineage | None) -> list[Candidate]:
    """The durable checkpoints a restore may use, newest first, from their names and sidecars only: one whose
    sidecar puts it off ``lineage`` (a replaced world's late commit) is skipped with a warning."""
    out = []
    for path in reversed(ckpt.list_checkpoints(run_dir)):
        meta = ckpt.read_meta(path)
        if meta is not None and not ckpt.on_lineage(lineage, {"step": meta["step"],
                                                              "fence": {"generation": meta["generation"]}}):
            log.warning("checkpoint %s (world %s, step %s) is not on the lineage of the newest fence %s: skipped",
                        path, meta["generation"], meta["step"], lineage)
            continue
        out.append(Candidate(path, ckpt._step_of(path), meta))
    return out


def read_durable(c: Candidate, lineage: ckpt.Lineage | None) -> dict[str, Any]:
    """The state in ``c``, read once and checked: size and SHA-256 against its sidecar, then the keys and format,
    the lineage and the sidecar's generation against the state's own. Raises ValueError naming what failed."""
    data = c.path.read_bytes()
    if c.meta is not None:
        if len(data) != c.meta["size"]:
            raise ValueError(f"{len(data)} bytes; its sidecar says {c.meta['size']}")
        got = hashlib.sha256(data).hexdigest()
        if got != c.meta["sha256"]:
            raise ValueError(f"sha256 {got} differs from its sidecar's {c.meta['sha256']}")
    state = ckpt.load_checkpoint_bytes(data, str(c.path))
    if c.meta is not None and ckpt.generation_of(state) != int(c.meta["generation"]):
        raise ValueError(f"world {ckpt.generation_of(state)} wrote it; its sidecar says {c.meta['generation']}")
    if not ckpt.on_lineage(lineage, state):
        raise _OffLineage(f"world {ckpt.generation_of(state)}, step {state['step']}: not on the lineage {lineage}")
    return state


class _OffLineage(ValueError):
    """A checkpoint from before sidecars turned out to be off the lineage once loaded: skipped, not set aside."""


def _metadata(env: DistEnv, run_dir: Path) -> tuple[ckpt.Lineage | None, list[Candidate]]:
    """Rank 0's lineage and durable candidates, the lineage sent to all (small: a dict of ints); waits, in short
    collectives, while the run's store does not answer."""
    while True:
        box: list[Any] = [None, None, False]
        candidates: list[Candidate] = []
        if env.is_main:
            try:
                box[0] = ckpt.read_lineage(run_dir)
                candidates = durable_candidates(run_dir, box[0])
            except fence_store.StoreUnavailable as e:  # said once per episode (checkpoint.deferrals)
                ckpt.deferrals.refused("choosing the checkpoint", str(e), said="waits for the run's store")
                box[2] = True
            except (ckpt.FenceError, OSError) as e:
                box[1] = f"{run_dir}: {e}"
            else:
                ckpt.deferrals.allowed("choosing the checkpoint", said="done")
        if env.distributed:
            dist.broadcast_object_list(box, src=0)
        if box[1]:
            raise TrainerError(exitcodes.BAD_INPUT, box[1])
        if not box[2]:
            return box[0], candidates
        time.sleep(1.0)


def restore_state(env: DistEnv, run_dir: Path, start_over: bool, snaps: Snapshots,
                  identity: dict[str, Any]) -> Restored:
    """The newest usable state of the run on every rank (module docstring), or none: a fresh start."""
    lineage, candidates = _metadata(env, run_dir)
    bad: list[str] = []
    bad_paths: list[Path] = []
    while True:
        meta = snaps.meta(identity, lineage)
        mine = int(meta["step"]) if meta is not None else -1
        newest = _all_reduce(env, mine, dist.ReduceOp.MAX) if env.distributed else mine
        decision = torch.tensor([NONE, -1], dtype=torch.int64)
        state: dict[str, Any] | None = None
        if env.is_main:
            while candidates and candidates[0].step > newest:
                c = candidates.pop(0)
                try:
                    state = read_durable(c, lineage)
                    decision[:] = torch.tensor([DURABLE, c.step])
                    break
                except _OffLineage as e:
                    log.warning("checkpoint %s: %s: skipped", c.path, e)
                except Exception as e:  # any failure to read or check it is reported with the file's name
                    log.warning("unreadable checkpoint %s: %s", c.path, e)
                    bad.append(f"{c.path}: {type(e).__name__}: {e}")
                    bad_paths.append(c.path)
            if state is None:
                if newest >= 0:
                    decision[:] = torch.tensor([SNAPSHOT, newest])
                elif bad and not start_over:
                    decision[0] = FAILED
            if decision[0] != FAILED:
                # Set aside only when the run goes on: a retry of a failed one must fail the same way.
                for path in bad_paths:
                    ckpt.set_aside_file(path)
                bad_paths.clear()
        if env.distributed:
            decision = _broadcast_ints(env, decision, 0)
        kind, step = (int(v) for v in decision.tolist())
        if kind == FAILED:
            named = "; ".join(bad) if env.is_main else "rank 0's log names them"
            raise TrainerError(exitcodes.BAD_INPUT, f"{run_dir}: no readable checkpoint; unreadable: {named} "
                               "(--start-over trains from scratch instead)")
        if kind == NONE:
            return Restored(None, lineage, "none")
        if kind == DURABLE:
            if env.is_main:
                print(f"[restore] step {step} from the durable checkpoint, read by rank 0 alone", flush=True)
            return Restored(broadcast_state(env, state, 0), lineage, "durable")
        # The newest snapshot: the lowest rank whose node holds it reads it, checks it and sends it.
        src = _all_reduce(env, env.rank if mine == step else env.world_size, dist.ReduceOp.MIN) \
            if env.distributed else 0
        ok = 0
        if env.rank == src:
            state = snaps.read(identity, lineage)
            ok = int(state is not None and int(state["step"]) == step)
            if not ok:
                print(f"[restore] the node-local snapshot {snaps.path} (step {step}) failed its check: removed, "
                      "choosing again without it", flush=True)
                snaps.set_aside()
        if env.distributed:
            ok = int(_broadcast_ints(env, torch.tensor([ok], dtype=torch.int64), src).item())
        if ok:
            if env.rank == src:
                print(f"[restore] step {step} from the node-local snapshot of rank {src}'s node", flush=True)
            return Restored(broadcast_state(env, state, src), lineage, "snapshot")


def _all_reduce(env: DistEnv, value: int, op: Any) -> int:
    t = torch.tensor([value], dtype=torch.int64, device=env.device)
    dist.all_reduce(t, op=op)
    return int(t.item())


def _broadcast_ints(env: DistEnv, t: torch.Tensor, src: int) -> torch.Tensor:
    t = t.to(env.device)
    dist.broadcast(t, src=src)
    return t.cpu()


# ---------------------------------------------------------------------------------------------- the state as tensors

def _split(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """``obj`` with every tensor replaced by ``{"__eks_ddp_tensor__": i}`` (its index in ``tensors``)."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj.detach())
        return {"__eks_ddp_tensor__": len(tensors) - 1}
    if isinstance(obj, dict):
        return {k: _split(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_split(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_split(v, tensors) for v in obj)
    return obj


def _join(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if len(obj) == 1 and "__eks_ddp_tensor__" in obj:
            return tensors[obj["__eks_ddp_tensor__"]]
        return {k: _join(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_join(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_join(v, tensors) for v in obj)
    return obj


def _bcast_bytes(env: DistEnv, buf: torch.Tensor, src: int) -> torch.Tensor:
    """Broadcast the uint8 CPU tensor ``buf`` in place (through the device for NCCL), in CHUNK_BYTES pieces."""
    on_device = env.device.type != "cpu"
    for a in range(0, buf.numel(), CHUNK_BYTES):
        piece = buf[a:a + CHUNK_BYTES]
        if on_device:
            moved = piece.to(env.device)
            dist.broadcast(moved, src=src)
            if env.rank != src:
                piece.copy_(moved.cpu())
        else:
            dist.broadcast(piece, src=src)
    return buf


def broadcast_state(env: DistEnv, state: dict[str, Any] | None, src: int) -> dict[str, Any]:
    """``state`` (given on ``src``, None elsewhere) on every rank, its tensors on CPU. Three broadcasts: the
    sizes, the skeleton (a ``torch.save`` of the state without its tensors, with each tensor's dtype and shape),
    then every tensor's bytes in one flat buffer."""
    if not env.distributed:
        assert state is not None
        return state
    sizes = torch.zeros(2, dtype=torch.int64)
    if env.rank == src:
        assert state is not None
        tensors: list[torch.Tensor] = []
        skeleton = _split(state, tensors)
        layout, offset = [], 0
        for t in tensors:
            nbytes = t.numel() * t.element_size()
            layout.append((str(t.dtype).removeprefix("torch."), list(t.shape), offset, nbytes))
            offset += -(-nbytes // _ALIGN) * _ALIGN
        out = io.BytesIO()
        torch.save({"skeleton": skeleton, "layout": layout}, out)
        head = torch.frombuffer(bytearray(out.getvalue()), dtype=torch.uint8)
        flat = torch.empty(offset, dtype=torch.uint8)
        for t, (_, _, off, nbytes) in zip(tensors, layout, strict=True):
            if nbytes:
                flat[off:off + nbytes] = t.contiguous().cpu().reshape(-1).view(torch.uint8)
        sizes[:] = torch.tensor([head.numel(), flat.numel()])
    sizes = _broadcast_ints(env, sizes, src)
    if env.rank != src:
        head = torch.empty(int(sizes[0]), dtype=torch.uint8)
        flat = torch.empty(int(sizes[1]), dtype=torch.uint8)
    _bcast_bytes(env, head, src)
    _bcast_bytes(env, flat, src)
    if env.rank == src:
        return state  # type: ignore[return-value]
    received = torch.load(io.BytesIO(head.numpy().tobytes()), weights_only=True)
    views = []
    for dtype, shape, off, nbytes in received["layout"]:
        dt = getattr(torch, dtype)
        # Each tensor gets storage of its own: some consumers (torch.set_rng_state) need a tensor that owns it.
        views.append(flat[off:off + nbytes].view(dt).reshape(shape).clone() if nbytes else
                     torch.empty(shape, dtype=dt))
    del flat
    return _join(received["skeleton"], views)
