"""What every figure of the report shares: matplotlib on its file-only backend, and one atomic way to save.

Kept apart from the figures themselves so that drawing one figure (a comparison's) loads neither pandas nor
the suite tables' readers.
"""

from __future__ import annotations

import os
from pathlib import Path

DPI = 120


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display is needed or used)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:
    """Save `fig` as the PNG `path` atomically (a temporary file, then a rename) and close it."""
    plt = pyplot()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}.png")
    try:
        fig.savefig(tmp, dpi=DPI, bbox_inches="tight")
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return path
