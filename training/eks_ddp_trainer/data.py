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

from eks_ddp_trainer import integrity
from eks_ddp_trainer.config import DEFAULT_BN_GROUP, DEFAULT_GLOBAL_BATCH, MIN_STEPS
from eks_ddp_trainer.integrity import DataError  # the trainer catches it from here

BATCHES_DIR = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
META_FILE = "batches.meta"
ALL_FILES = (*TRAIN_FILES, TEST_FILE, META_FILE)
DEFAULT_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
# Per-channel statistics of the CIFAR-10 training set.
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


def _get(d: dict, key: str):
    """The real pickles (encoding='bytes') have b'data' keys; generated ones may have 'data'."""
    if key in d:
        return d[key]
    return d[key.encode()]


def _read_pickle(checker: integrity.Checker, name: str) -> dict:
    """A batch: its bytes as checked (``integrity.Checker``), through the restricted unpickler."""
    path = checker.root / name
    blob = checker.read(name)  # raises DataError naming the file; nothing is unpickled before it passed
    try:
        d = integrity.safe_loads(blob)
    except Exception as e:  # noqa: BLE001 - whatever a malformed pickle raises, the file is bad input
        raise DataError(f"{path}: unreadable ({type(e).__name__}: {e})") from e
    if not isinstance(d, dict):
        raise DataError(f"{path}: not a CIFAR batch (a {type(d).__name__}, expected a dict)")
    return d


def _read_split(checker: integrity.Checker, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for name in names:
        p = checker.root / name
        d = _read_pickle(checker, name)
        try:
            xs.append(np.asarray(_get(d, "data"), dtype=np.uint8).reshape(-1, 3, 32, 32))
            ys.append(np.asarray(_get(d, "labels"), dtype=np.int64))
        except (KeyError, ValueError, TypeError) as e:
            raise DataError(f"{p}: not a CIFAR batch ({type(e).__name__}: {e})") from e
        if len(xs[-1]) != len(ys[-1]):
            raise DataError(f"{p}: {len(xs[-1])} images but {len(ys[-1])} labels")
    return np.concatenate(xs), np.concatenate(ys)


def read_class_names(root: Path, *, checker: integrity.Checker | None = None) -> list[str]:
    """The class names in ``batches.meta`` (the defaults without one), checked (``integrity.Checker``, by
    default under the Job's pin) before it is unpickled."""
    meta = root / META_FILE
    if not meta.exists():
        return list(DEFAULT_CLASSES)
    names = _get(_read_pickle(checker or integrity.Checker(root, integrity.pin_from_env()), META_FILE),
                 "label_names")
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


def load_cifar(data_dir: str | os.PathLike, device: torch.device, *, train: bool = True,
               pin: str | None = None) -> Cifar:
    """Read the python batches under ``<data_dir>/cifar-10-batches-py`` onto ``device`` as uint8.

    Every file read is first checked against the data stage's manifest and ``pin`` (default: the Job's
    ``EKS_DDP_DATA_PIN``), then unpickled with the restricted unpickler (``training/eks_ddp_trainer/integrity.py``);
    a failure raises DataError naming the file.
    """
    root = batches_root(data_dir)
    missing = [f for f in (*TRAIN_FILES, TEST_FILE) if not (root / f).exists()]
    if missing:
        raise FileNotFoundError(f"{root}: missing {', '.join(missing)} (run python -m eks_ddp_trainer.prepare_data)")
    checker = integrity.Checker(root, pin if pin is not None else integrity.pin_from_env())

    def to_dev(x: np.ndarray, y: np.ndarray) -> Split:
        return Split(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device))

    empty = Split(torch.empty(0, 3, 32, 32, dtype=torch.uint8, device=device),
                  torch.empty(0, dtype=torch.int64, device=device))
    tr = to_dev(*_read_split(checker, TRAIN_FILES)) if train else empty
    te = to_dev(*_read_split(checker, (TEST_FILE,)))
    return Cifar(tr, te, read_class_names(root, checker=checker))


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
    integrity.write_manifest(root, ALL_FILES)
    return root


# ---------------------------------------------------------------------------- sharding

def epoch_permutation(n: int, epoch: int, seed: int) -> torch.Tensor:
    """The epoch's global order. A CPU generator seeded by (seed, epoch), so every rank and every restart agrees."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g)


@dataclass(frozen=True)
class Batching:
    """How an epoch of ``n`` samples is cut into optimizer steps, independently of the world size.

    The epoch's order is cut into BatchNorm groups of ``group`` samples (the last group also takes
    the ``n % group`` left over, so every sample is used once per epoch); a step takes
    ``global_batch // group`` consecutive groups (the epoch's last step may take fewer). The
    processes of a step share its groups, contiguous runs whose counts differ by at most one; a
    process left without a group (more processes than groups) trains on an empty batch.
    """

    n: int
    global_batch: int
    group: int

    def __post_init__(self) -> None:
        if self.group < 1 or self.global_batch % self.group:
            raise ValueError(f"global batch {self.global_batch} must be a multiple of the BN group {self.group}")

    @property
    def groups_per_epoch(self) -> int:
        return max(1, self.n // self.group)

    @property
    def groups_per_step(self) -> int:
        return self.global_batch // self.group

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.groups_per_epoch // self.groups_per_step)

    def _group_start(self, i: int) -> int:
        return self.n if i >= self.groups_per_epoch else i * self.group

    def step_of(self, pos: int) -> int:
        """The step (within the epoch) that starts at sample position ``pos``."""
        step, rem = divmod(pos, self.groups_per_step * self.group)
        if rem or step >= self.steps_per_epoch:
            raise ValueError(f"sample position {pos} is not the start of a step of {self}")
        return step

    def step_range(self, step: int) -> tuple[int, int]:
        """[start, end) sample positions of the epoch's ``step``."""
        first = step * self.groups_per_step
        return self._group_start(first), self._group_start(first + self.groups_per_step)

    def rank_range(self, step: int, world: int, rank: int) -> tuple[int, int]:
        """[start, end) sample positions of this rank's part of ``step`` (whole groups; may be empty)."""
        first = step * self.groups_per_step
        count = min(self.groups_per_step, self.groups_per_epoch - first)
        a, b = rank_slice(count, world, rank)
        return self._group_start(first + a), self._group_start(first + b)


def rank_slice(count: int, world: int, rank: int) -> tuple[int, int]:
    """[start, end) of this rank's part of ``count`` items (parts differ by at most one)."""
    base, extra = divmod(count, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def rank_indices(perm: torch.Tensor, pos: int, world: int, rank: int, batching: Batching) -> tuple[torch.Tensor, int]:
    """This rank's sample indices for the step starting at epoch position ``pos``, and the step's span."""
    step = batching.step_of(pos)
    start, end = batching.step_range(step)
    a, b = batching.rank_range(step, world, rank)
    return perm[a:b], end - start


# ---------------------------------------------------------------------------- augmentation

_NORM: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}


def _mean_std(device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    # Made once per device: torch.tensor(..., device=cuda) is a pageable host-to-device copy, which waits for
    # every queued kernel (a host sync in every step).
    key = (device, dtype)
    if key not in _NORM:
        _NORM[key] = (torch.tensor(MEAN, device=device, dtype=dtype).view(1, 3, 1, 1) * 255,
                      torch.tensor(STD, device=device, dtype=dtype).view(1, 3, 1, 1) * 255)
    return _NORM[key]


def normalize(x_u8: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    mean, std = _mean_std(x_u8.device, dtype)
    return (x_u8.to(dtype) - mean) / std


@dataclass(frozen=True)
class StepNoise:
    """The random part of one step's augmentation, drawn for the whole step so that it does not depend
    on how the step is split between processes: a translation per sample, in [-pad, pad]."""

    dy: torch.Tensor
    dx: torch.Tensor

    @staticmethod
    def draw(span: int, pad: int, generator: torch.Generator, device: torch.device) -> StepNoise:
        d = torch.randint(-pad, pad + 1, (2, span), device=device, generator=generator)
        return StepNoise(d[0], d[1])

    def part(self, a: int, b: int) -> StepNoise:
        return StepNoise(self.dy[a:b], self.dx[a:b])


def augment(x_u8: torch.Tensor, noise: StepNoise, flip: torch.Tensor, pad: int = 2) -> torch.Tensor:
    """Translate each image by (dy, dx) with reflect padding and mirror those with ``flip``; normalized float32."""
    x = normalize(x_u8)
    n, _, h, w = x.shape
    if n == 0:
        return x
    padded = F.pad(x, (pad, pad, pad, pad), mode="reflect")
    dev = x.device
    rows = (noise.dy[:, None] + pad + torch.arange(h, device=dev))[:, None, :, None]
    cols = (noise.dx[:, None] + pad + torch.arange(w, device=dev))[:, None, None, :]
    cols = torch.where(flip[:, None, None, None], cols.flip(-1), cols)
    bidx = torch.arange(n, device=dev)[:, None, None, None]
    cidx = torch.arange(3, device=dev)[None, :, None, None]
    return padded[bidx, cidx, rows, cols]


def flip_parity(n: int, seed: int) -> torch.Tensor:
    """A fixed random bit per sample; epoch e mirrors sample i iff bit[i] differs from e's parity.

    Alternating flips (Jordan 2024, section 3.6): every sample is seen mirrored and unmirrored in
    consecutive epochs instead of by coin toss.
    """
    g = torch.Generator().manual_seed(seed * 7_919 + 17)
    return torch.randint(0, 2, (n,), generator=g, dtype=torch.uint8).bool()


# ---------------------------------------------------------------------------- batch planning

def plan_batching(n: int, epochs: int, global_batch: int = DEFAULT_GLOBAL_BATCH,
                  group: int = DEFAULT_BN_GROUP, min_steps: int = MIN_STEPS) -> Batching:
    """The batching a run of ``epochs`` over ``n`` samples uses: ``global_batch``, capped for small data sets
    so that the run has at least ``min_steps`` steps (0: no cap).

    Depends on the data set and the flags only, never on the world size, so a resize keeps it.
    """
    group = min(group, global_batch)
    cap = max(group, n * epochs // min_steps // group * group) if min_steps else global_batch
    return Batching(n, min(global_batch // group * group, cap), group)


def write_digits_cifar(data_dir: str | os.PathLike, n_test: int = 500, seed: int = 0) -> Path:
    """scikit-learn's handwritten digits (1,797 real 8x8 images) as a CIFAR-format set, for tests and benchmarks.

    Upsampled bilinearly to 32x32 and repeated over three channels; split 1,297 train / ``n_test``
    test, stratified, with ``seed``. Needs scikit-learn (the dev extra), which the image does not ship.
    Returns the ``cifar-10-batches-py`` directory.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.from_numpy(digits.images).float()[:, None] * (255 / 16)
    x = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False).clamp(0, 255).round()
    x = x.to(torch.uint8).expand(-1, 3, -1, -1).reshape(len(x), -1).numpy()
    y = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=n_test, random_state=seed, stratify=y)
    root = batches_root(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    for i, chunk in enumerate(np.array_split(np.arange(len(y_tr)), len(TRAIN_FILES))):
        with open(root / TRAIN_FILES[i], "wb") as f:
            pickle.dump({"data": x_tr[chunk], "labels": y_tr[chunk].tolist()}, f)
    with open(root / TEST_FILE, "wb") as f:
        pickle.dump({"data": x_te, "labels": y_te.tolist()}, f)
    with open(root / META_FILE, "wb") as f:
        pickle.dump({"label_names": [str(d) for d in range(10)]}, f)
    integrity.write_manifest(root, ALL_FILES)
    return root
