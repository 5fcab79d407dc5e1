"""The restore path (training/eks_ddp_trainer/restore.py) in a real 3-process gloo world on two "nodes": the copy is
chosen from metadata, one rank reads it, the others get it as tensors; committed checkpoints opened at most once."""

from __future__ import annotations

import json
import os
import random
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from eks_ddp_runtime.dist import DistEnv
from eks_ddp_trainer import checkpoint as ckpt
from eks_ddp_trainer import restore
from eks_ddp_trainer.snapshot import Snapshots

IDENT = {"model": "m", "seed": 0}
NODE = [0, 1, 1]
"""Ranks 0 | 1, 2: two nodes, each with its own snapshot folder; rank 1 is the second node's local rank 0."""


def _state(step: int, value: float) -> dict:
    return {"step": step, "epoch": 0, "sample_in_epoch": step * 16, "samples_seen": step * 16,
            "model": {"w": torch.full((3,), value), "n": torch.tensor(step), "mask": torch.tensor([True, False]),
                      "empty": torch.zeros(0, 4, dtype=torch.float64)},
            "optimizer": {"state": {0: {"momentum": torch.arange(5, dtype=torch.bfloat16)}},
                          "param_groups": [{"lr": 0.1, "params": [0]}]},
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
            "config": {"identity": IDENT, "note": ("a", 1, None)}}


def _scenario(name: str, base: Path, rank: int, env: DistEnv, opened: list[str]) -> dict:
    run, roots = base / name / "run", [str(base / name / f"node{n}") for n in (0, 1)]
    snaps = Snapshots(run, rank, root=roots[NODE[rank]], writer=rank in (0, 1))
    if rank == 0:
        for step in (5, 9) if name != "snapshot_newer" else (5,):
            ckpt.save_checkpoint(run, _state(step, float(step)), keep=3)
        if name == "durable_damaged":  # a flipped byte: the sidecar's SHA-256 no longer matches
            path = ckpt.ckpt_path(run, 9)
            blob = bytearray(path.read_bytes())
            blob[len(blob) // 2] ^= 0xFF
            path.write_bytes(bytes(blob))
        if name == "no_sidecar":
            ckpt.meta_path(ckpt.ckpt_path(run, 9)).unlink()
    if rank == 1 and name != "no_sidecar":  # the second node holds a snapshot at step 7
        snaps._write(_state(7, 7.0))
    dist.barrier()
    opened.clear()
    got = restore.restore_state(env, run, False, snaps, IDENT)
    dist.barrier()
    st = got.state
    if st is not None:
        torch.set_rng_state(st["rng"]["torch"])  # what the trainer does with it (it crashed on a view once)
        random.setstate(st["rng"]["python"])
    same = (st is not None and torch.equal(st["model"]["w"], torch.full((3,), float(st["step"])))
            and st["model"]["mask"].tolist() == [True, False] and st["model"]["empty"].shape == (0, 4)
            and st["optimizer"]["state"][0]["momentum"].dtype == torch.bfloat16
            and torch.equal(st["rng"]["torch"], torch.get_rng_state()) and st["config"]["note"] == ("a", 1, None)
            and isinstance(st["rng"]["python"][1], tuple) and int(st["model"]["n"]) == st["step"])
    return {"step": None if st is None else st["step"], "source": got.source, "intact": same, "opens": list(opened),
            "set_aside": sorted(p.name for p in ckpt.ckpt_dir(run).glob("*.unreadable"))}


SCENARIOS = ("snapshot_newer", "durable_newer", "durable_damaged", "no_sidecar")


def _worker(rank: int, port: int, base: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    opened: list[str] = []

    def hook(event: str, args: tuple) -> None:
        if event == "open" and isinstance(args[0], str) and args[0].endswith(".pt") and "/checkpoints/ckpt-" in args[0]:
            if isinstance(args[1], str) and args[1].startswith("r"):
                opened.append(args[0])

    sys.addaudithook(hook)
    random.seed(1234)  # every rank's Python RNG equal, so the restored one can be compared with the live one
    torch.manual_seed(1234)
    dist.init_process_group("gloo", rank=rank, world_size=3)
    try:
        env = DistEnv(rank, 0 if rank < 2 else 1, 3, torch.device("cpu"), "gloo", 0)
        out = {n: _scenario(n, Path(base), rank, env, opened) for n in SCENARIOS}
        Path(base, f"rank{rank}.json").write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # three gloo processes, four restores
def test_one_rank_reads_the_copy_chosen_from_metadata_and_sends_it_as_tensors(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_worker, args=(port, str(tmp_path)), nprocs=3)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    for name in SCENARIOS:
        got = [r[name] for r in ranks]
        assert all(g["intact"] for g in got), (name, got)
        opens = [len(g["opens"]) for g in got]
        if name == "snapshot_newer":
            # Durable step 5, the second node's snapshot step 7: no checkpoint opened anywhere.
            assert [(g["step"], g["source"]) for g in got] == [(7, "snapshot")] * 3 and opens == [0, 0, 0]
        elif name == "durable_newer":
            # Durable step 9 beats the snapshot (7): rank 0 alone reads it, once.
            assert [(g["step"], g["source"]) for g in got] == [(9, "durable")] * 3 and opens == [1, 0, 0]
        elif name == "durable_damaged":
            # Step 9 fails its sidecar's checksum: set aside, not used; the snapshot (7) is newer than step 5.
            assert [(g["step"], g["source"]) for g in got] == [(7, "snapshot")] * 3 and opens == [1, 0, 0]
            assert got[0]["set_aside"] == ["ckpt-000000009.pt.unreadable"]
        else:
            # A checkpoint from before sidecars: chosen by the step in its name, checked by loading it, on rank 0.
            assert [(g["step"], g["source"]) for g in got] == [(9, "durable")] * 3 and opens == [1, 0, 0]
