"""The clients x classes heatmap of a partition's label counts (like FedLC Figure 4)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from fedskew.data.partitions.base import Partition
from fedskew.data.partitions.store import atomic_write_bytes

# Cells are annotated with counts only when the grid is small enough to read.
_ANNOTATE_MAX_CELLS = 600
_ANNOTATE_MAX_SIDE = 40


def plot_heatmap(p: Partition, png_path: Path, title: str | None = None) -> None:
    """Clients x classes heatmap of sample counts (like FedLC Figure 4), written atomically.

    Counts are written in the cells when the grid is small enough to read. Uses the Agg
    canvas directly, so the pyplot backend of the caller is left untouched.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    counts = np.asarray(p.label_counts)
    m, c = counts.shape
    annotate = m * c <= _ANNOTATE_MAX_CELLS and max(m, c) <= _ANNOTATE_MAX_SIDE
    cell = 0.55 if annotate else 0.14
    width = min(max(4.0, c * cell + 2.0), 30.0)
    height = min(max(3.0, m * cell + 1.5), 30.0)
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(counts, aspect="auto", cmap="viridis", interpolation="nearest")
    fig.colorbar(im, ax=ax, label="samples")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    if title is None:
        meta = p.meta
        title = f"{meta.get('dataset', '') or 'data'}: {meta.get('scheme', '')} {meta.get('params', {})}"
    ax.set_title(title, fontsize=9)
    if c <= 50:
        ax.set_xticks(range(c))
    if m <= 50:
        ax.set_yticks(range(m))
    if annotate:
        vmax = counts.max() if counts.size else 0
        font = 7 if max(m, c) > 20 else 8
        for i in range(m):
            for j in range(c):
                v = int(counts[i, j])
                color = "black" if vmax and v > 0.6 * vmax else "white"
                ax.text(j, i, str(v), ha="center", va="center", fontsize=font, color=color)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    atomic_write_bytes(Path(png_path), buf.getvalue())
