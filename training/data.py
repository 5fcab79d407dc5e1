"""CIFAR-10 on the device: loading, a learnable synthetic stand-in, sharding and augmentation.

The whole set is ~180 MB as uint8, so it lives on the GPU and batches are cut by
indexing: no DataLoader, no worker processes. Sharding is defined by a *global*
sample position inside an epoch, not by per-rank indices, so a job that restarts
at another world size continues exactly where the last checkpoint left off.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

BATCHES_DIR = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
META_FILE = "batches.meta"
DEFAULT_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
# Per-channel statistics of the CIFAR-10 training set.
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


def _get(d: dict, key: str):
    """The real pickles (encoding='bytes') have b'data' keys; generated ones may have 'data'."""
    if key in d:
        return d[key]
    return d[key.encode()]


def _read_pickle(path: Path) -> dict:
    with open(path, "rb") as f:
        return pickle.load(f, encoding="bytes")


def _read_split(paths: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for p in paths:
        d = _read_pickle(p)
        xs.append(np.asarray(_get(d, "data"), dtype=np.uint8).reshape(-1, 3, 32, 32))
        ys.append(np.asarray(_get(d, "labels"), dtype=np.int64))
    return np.concatenate(xs), np.concatenate(ys)


def read_class_names(root: Path) -> list[str]:
    meta = root / META_FILE
    if not meta.exists():
        return list(DEFAULT_CLASSES)
    names = _get(_read_pickle(meta), "label_names")
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names]


@dataclass
class Split:
    images: torch.Tensor
    """uint8, (N, 3, 32, 32), on the device."""
    labels: torch.Tensor
    """int64, (N,), on the device."""

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass
class Cifar:
    train: Split
    test: Split
    classes: list[str]


def batches_root(data_dir: str | os.PathLike) -> Path:
    return Path(data_dir) / BATCHES_DIR


def load_cifar(data_dir: str | os.PathLike, device: torch.device, *, train: bool = True) -> Cifar:
    """Read the python batches under ``<data_dir>/cifar-10-batches-py`` onto ``device`` as uint8."""
    root = batches_root(data_dir)
    missing = [f for f in (*TRAIN_FILES, TEST_FILE) if not (root / f).exists()]
    if missing:
        raise FileNotFoundError(f"{root}: missing {', '.join(missing)} (run python -m training.prepare_data)")

    def to_dev(x: np.ndarray, y: np.ndarray) -> Split:
        return Split(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device))

    empty = Split(torch.empty(0, 3, 32, 32, dtype=torch.uint8, device=device),
                  torch.empty(0, dtype=torch.int64, device=device))
    tr = to_dev(*_read_split([root / f for f in TRAIN_FILES])) if train else empty
    te = to_dev(*_read_split([root / TEST_FILE]))
    return Cifar(tr, te, read_class_names(root))


def write_synthetic_cifar(data_dir: str | os.PathLike, n_train: int = 500, n_test: int = 200, seed: int = 0,
                          *, noise: float = 60.0) -> Path:
    """Write a small, learnable CIFAR-format set: each class has its own colour and stripe pattern, plus noise.

    Same layout as the real archive (five train batches, test batch, batches.meta) with str keys, so
    the loader's bytes/str handling is exercised. Returns the ``cifar-10-batches-py`` directory.
    """
    rng = np.random.default_rng(seed)
    root = batches_root(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    colours = rng.uniform(40, 215, size=(10, 3))
    yy, xx = np.mgrid[0:32, 0:32]

    def make(n: int) -> tuple[np.ndarray, list[int]]:
        labels = np.arange(n) % 10
        rng.shuffle(labels)
        imgs = np.empty((n, 3, 32, 32), dtype=np.float32)
        for c in range(10):
            # Stripe orientation/frequency differ per class, so shape as well as colour is informative.
            freq = 1 + c % 5
            wave = np.sin((xx if c < 5 else yy) * freq * np.pi / 16) * 40
            imgs[labels == c] = colours[c][:, None, None] + wave[None]
        imgs += rng.normal(0, noise, size=imgs.shape)
        flat = np.clip(imgs, 0, 255).astype(np.uint8).reshape(n, -1)
        return flat, [int(v) for v in labels]

    x, y = make(n_train)
    for i, chunk in enumerate(np.array_split(np.arange(n_train), len(TRAIN_FILES))):
        with open(root / TRAIN_FILES[i], "wb") as f:
            pickle.dump({"data": x[chunk], "labels": [y[j] for j in chunk], "batch_label": f"synthetic {i + 1}"}, f)
    x, y = make(n_test)
    with open(root / TEST_FILE, "wb") as f:
        pickle.dump({"data": x, "labels": y, "batch_label": "synthetic test"}, f)
    with open(root / META_FILE, "wb") as f:
        pickle.dump({"label_names": list(DEFAULT_CLASSES), "num_cases_per_batch": n_train // 5, "num_vis": 3072}, f)
    return root


# ---------------------------------------------------------------------------- sharding

def epoch_permutation(n: int, epoch: int, seed: int) -> torch.Tensor:
    """The epoch's global order. A CPU generator seeded by (seed, epoch), so every rank and every restart agrees."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g)


def steps_in_epoch(n: int, world: int, batch_size: int) -> int:
    """Global steps per epoch. A tail smaller than the world size joins the previous step (no rank gets 0)."""
    gb = world * batch_size
    full, rem = divmod(n, gb)
    return max(1, full + (1 if rem >= world else 0))


def step_span(n: int, pos: int, world: int, batch_size: int) -> int:
    """How many global samples the step starting at sample ``pos`` of the epoch consumes."""
    gb = world * batch_size
    left = n - pos
    if left <= 0:
        return 0
    # Last step: take everything that is left if the remainder after one more full step would be < world.
    if left < gb + world:
        return left
    return gb


def rank_slice(span: int, world: int, rank: int) -> tuple[int, int]:
    """[start, end) of this rank's part of a step of ``span`` samples (parts differ by at most one)."""
    base, extra = divmod(span, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def rank_indices(perm: torch.Tensor, pos: int, world: int, rank: int, batch_size: int) -> tuple[torch.Tensor, int]:
    """This rank's sample indices for the step starting at global position ``pos``, and the step's span."""
    span = step_span(len(perm), pos, world, batch_size)
    a, b = rank_slice(span, world, rank)
    return perm[pos + a: pos + b], span


# ---------------------------------------------------------------------------- augmentation

def normalize(x_u8: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    mean = torch.tensor(MEAN, device=x_u8.device, dtype=dtype).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=x_u8.device, dtype=dtype).view(1, 3, 1, 1) * 255
    return (x_u8.to(dtype) - mean) / std


def augment(x_u8: torch.Tensor, generator: torch.Generator | None = None, pad: int = 4) -> torch.Tensor:
    """Random crop after reflect padding, and random horizontal flip, on the device; returns normalized float32."""
    x = normalize(x_u8)
    n, _, h, w = x.shape
    if n == 0:
        return x
    padded = F.pad(x, (pad, pad, pad, pad), mode="reflect")
    dev = x.device
    oy = torch.randint(0, 2 * pad + 1, (n,), device=dev, generator=generator)
    ox = torch.randint(0, 2 * pad + 1, (n,), device=dev, generator=generator)
    rows = (oy[:, None] + torch.arange(h, device=dev))[:, None, :, None]
    cols = (ox[:, None] + torch.arange(w, device=dev))[:, None, None, :]
    flip = torch.rand(n, device=dev, generator=generator) < 0.5
    cols = torch.where(flip[:, None, None, None], cols.flip(-1), cols)
    bidx = torch.arange(n, device=dev)[:, None, None, None]
    cidx = torch.arange(3, device=dev)[None, :, None, None]
    return padded[bidx, cidx, rows, cols]
