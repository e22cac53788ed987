"""Loss curve PNG from the CSV metrics, since people would rather look at a curve than a CSV."""

from __future__ import annotations

import csv
from pathlib import Path


def read_series(metrics_csv: Path, key: str) -> tuple[list[int], list[float]]:
    steps, values = [], []
    with metrics_csv.open() as f:
        for row in csv.DictReader(f):
            if row.get(key):
                steps.append(int(row["step"]))
                values.append(float(row[key]))
    return steps, values


def plot_loss(metrics_csv: Path, out_png: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for key, style in (("loss", "-"), ("val_loss", "o-")):
        steps, values = read_series(metrics_csv, key)
        if steps:
            ax.plot(steps, values, style, label=key, markersize=4)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_png)
    plt.close(fig)
    return out_png
