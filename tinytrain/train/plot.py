"""Loss curve PNG from the CSV metrics, since people would rather look at a curve than a CSV; the
learning rate beside it, each stage's first step marked on both (trainer.stage)."""

from __future__ import annotations

import csv
from pathlib import Path


def read_series(metrics_csv: Path, key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of `key`, the steps counted as progress lines and checkpoint names count them."""
    from tinytrain.train.metrics_csv import optimizer_step  # here: plot_evals' callers need no Lightning

    steps, values = [], []
    with metrics_csv.open() as f:
        for row in csv.DictReader(f):
            if row.get(key):
                steps.append(optimizer_step(row))
                values.append(float(row[key]))
    return steps, values


def stage_starts(metrics_csv: Path) -> list[tuple[int, str]]:
    """(first step, name) of each stage after the first, from metrics.csv's `stage` column."""
    from tinytrain.train.metrics_csv import optimizer_step

    starts, current = [], None
    with metrics_csv.open() as f:
        for row in csv.DictReader(f):
            stage = row.get("stage") or None
            if stage and stage != current:
                if current is not None:
                    starts.append((optimizer_step(row), stage))
                current = stage
    return starts


def plot_loss(metrics_csv: Path, out_png: Path, title: str, loss_name: str = "cross-entropy (nats/token)") -> Path:
    """`loss_name`: what `loss` measures (a preference objective's loss is not a cross-entropy)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, lr_ax) = plt.subplots(1, 2, figsize=(11, 4), dpi=110, gridspec_kw={"width_ratios": [2, 1]})
    for key, style in (("loss", "-"), ("val_loss", "o-")):
        steps, values = read_series(metrics_csv, key)
        if steps:
            ax.plot(steps, values, style, label=key, markersize=4)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(loss_name)
    ax.set_title(title)
    steps, values = read_series(metrics_csv, "lr")
    lr_ax.plot(steps, values, "-", color="tab:green")
    lr_ax.set_xlabel("optimizer step")
    lr_ax.set_title("learning rate")
    for a in (ax, lr_ax):
        for step, stage in stage_starts(metrics_csv):
            a.axvline(step, color="grey", linestyle="--", linewidth=0.8)
            a.annotate(stage, (step, 1.0), xycoords=("data", "axes fraction"), fontsize=7, ha="left", va="top")
        a.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_png)
    plt.close(fig)
    return out_png


def plot_evals(evals_csv: Path, out_png: Path, title: str) -> Path | None:
    """Each downstream metric (evals.csv) against the tokens seen, one panel each."""
    rows = list(csv.DictReader(evals_csv.open())) if evals_csv.exists() else []
    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for r in rows:
        if r["tokens"]:  # a backfilled run with a batch warm-up has none
            series.setdefault((r["task"], r["metric"]), []).append((int(r["tokens"]), float(r["value"])))
    if not series:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(series))
    n_rows = -(-len(series) // cols)
    fig, axes = plt.subplots(n_rows, cols, figsize=(4 * cols, 3 * n_rows), dpi=110, squeeze=False)
    for ax, ((task, metric), points) in zip(axes.flat, sorted(series.items())):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", markersize=4)
        ax.set_title(f"{task} {metric}", fontsize=9)
        ax.set_xlabel("tokens seen")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(series) :]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out_png)
    plt.close(fig)
    return out_png
