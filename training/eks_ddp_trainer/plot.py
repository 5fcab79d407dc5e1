"""The training curve (loss and accuracy over steps) and the evaluation table.

Inputs are the trainer's outputs in the run directory: ``history.jsonl`` (one JSON
object per log record: step, epoch, loss, acc, img_s, world, ...) and
``metrics.json`` (written by global rank 0 after evaluation).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_history(path: Path) -> list[dict[str, Any]]:
    """Step records in step order. A restart replays steps after its checkpoint: the last record of a step wins."""
    by_step: dict[int, dict[str, Any]] = {}
    for raw in Path(path).read_text().splitlines():
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError:
            continue  # a line cut short by a killed writer
        if isinstance(rec, dict) and isinstance(rec.get("step"), int | float) and "loss" in rec:
            by_step[int(rec["step"])] = rec
    return [by_step[s] for s in sorted(by_step)]


def read_test_accuracy(path: Path) -> tuple[int, float] | None:
    """(step, accuracy) of the last evaluation record, if the run got that far."""
    found = None
    for raw in Path(path).read_text().splitlines():
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and rec.get("kind") == "eval" and rec.get("accuracy") is not None:
            found = (int(rec.get("step") or 0), float(rec["accuracy"]))
    return found


def plot_history(history: Path, png: Path, *, title: str = "training curve",
                 marks: dict[str, float] | None = None) -> Path:
    """Write a two-panel PNG (loss; accuracy) of the history; marks are labelled vertical lines at steps."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed; must precede pyplot
    import matplotlib.pyplot as plt

    records = read_history(history)
    if not records:
        raise ValueError(f"{history}: no step records to plot")
    steps = [int(r["step"]) for r in records]
    fig, (ax_loss, ax_acc) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, constrained_layout=True)
    ax_loss.plot(steps, [float(r["loss"]) for r in records], color="tab:blue", marker=".", lw=1.5)
    ax_loss.set_ylabel("training loss")
    ax_loss.set_title(title)
    acc = [(int(r["step"]), float(r["acc"])) for r in records if r.get("acc") is not None]
    if acc:
        ax_acc.plot([s for s, _ in acc], [100 * a for _, a in acc], color="tab:green", marker=".", lw=1.5,
                    label="training accuracy")
    test = read_test_accuracy(history)
    if test is not None:
        ax_acc.plot([test[0]], [100 * test[1]], marker="*", ms=14, color="tab:orange", ls="none",
                    label=f"test accuracy {100 * test[1]:.1f}%")
    ax_acc.set_ylabel("accuracy (%)")
    ax_acc.set_xlabel("optimizer step")
    ax_acc.set_ylim(0, 104)  # room for a marker at 100%
    worlds = sorted({int(r["world"]) for r in records if r.get("world") is not None})
    if len(worlds) > 1:
        ax_acc.text(0.01, 0.95, "world sizes seen: " + ", ".join(map(str, worlds)), transform=ax_acc.transAxes,
                    va="top", fontsize=9)
    for label, step in (marks or {}).items():
        for ax in (ax_loss, ax_acc):
            ax.axvline(step, color="tab:red", ls="--", lw=1)
        ax_loss.annotate(label, (step, 1), xycoords=("data", "axes fraction"), xytext=(4, -12),
                         textcoords="offset points", color="tab:red", fontsize=9)
    for ax in (ax_loss, ax_acc):
        ax.grid(True, alpha=0.3)
    if acc or test is not None:
        ax_acc.legend(loc="lower right")
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def metrics_table(metrics: dict[str, Any]) -> str:
    """Overall and per-class test accuracy as a text table with a bar per class."""
    per_class = metrics.get("per_class") or {}
    totals = metrics.get("per_class_total") or {}
    head = (f"test accuracy {100 * metrics['accuracy']:.1f}% ({metrics.get('correct', '?')}/{metrics.get('total', '?')}"
            f" images; step {metrics.get('step', '?')}, world size {metrics.get('world_size', '?')})")
    lines = [head, f"{'class':<12} {'accuracy':>8} {'images':>6}", "-" * 50]
    for name, acc in per_class.items():
        shown = "     -" if acc is None else f"{100 * acc:7.1f}%"
        bar = "" if acc is None else "#" * round(20 * acc)
        lines.append(f"{name:<12} {shown:>8} {totals.get(name, ''):>6}  {bar}")
    return "\n".join(lines)


def print_metrics(path: Path) -> None:
    print(metrics_table(json.loads(Path(path).read_text())))


def summarize(run_dir: Path, png: Path, *, title: str, kill_step: int | None = None) -> tuple[Path | None, Path | None]:
    """Print the evaluation table and write the training curve; returns (metrics.json, PNG), None where missing."""
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.json"
    plot = None
    if metrics.exists():
        print_metrics(metrics)
        print(f"[local] metrics: {metrics}")
    history = run_dir / "history.jsonl"
    if history.exists():
        marks = {f"worker killed (step {kill_step})": float(kill_step)} if kill_step is not None else None
        try:
            plot = plot_history(history, png, title=title, marks=marks)
            print(f"[local] training curve: {plot}")
        except ValueError as err:
            print(f"[local] no training curve: {err}")
    return (metrics if metrics.exists() else None), plot
