"""Plotting helpers shared by the notebooks: labelled heatmaps and 2-D vector pictures.

Importing this module registers the Korean font shipped with the package
(``coursekit/assets/fonts``, package data; in the repository ``coursekit/assets`` links to
the course's top-level ``assets/``) as the fallback of matplotlib's default
sans-serif font, so Hangul labels render on any machine, offline, with no system font
installed. A label holding ``$math$`` is set entirely by mathtext, which has no Hangul:
keep Korean and math in separate labels.
"""
from __future__ import annotations

from importlib import resources
from typing import Sequence

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib import font_manager

# importlib.resources, not a path beside __file__: it finds package data in an installed
# wheel and in the editable install alike
KOREAN_FONT = resources.files("coursekit").joinpath("assets", "fonts", "NanumSquareR.ttf")


def use_korean_font() -> None:
    """Make matplotlib fall back to NanumSquare (shipped, OFL) for glyphs DejaVu Sans lacks."""
    font_manager.fontManager.addfont(str(KOREAN_FONT))
    name = font_manager.FontProperties(fname=str(KOREAN_FONT)).get_name()
    # matplotlib falls back along font.family, one font per entry: the default first
    families = [f for f in matplotlib.rcParams["font.family"] if f != name]
    matplotlib.rcParams["font.family"] = families + [name]


use_korean_font()


def heatmap(matrix: object, row_labels: Sequence[str], col_labels: Sequence[str], *,
            title: str, xlabel: str = "", ylabel: str = "", ax=None, cmap: str = "viridis",
            annotate: bool = True, fmt: str = "{:.2f}", vmin: float | None = None,
            vmax: float | None = None):
    """Draw ``matrix`` (rows, cols) with token labels on both axes and a colour bar.

    Returns the matplotlib Axes. Values are printed in the cells when ``annotate``, in black
    or white, whichever stands out from the cell's colour, and larger when the cells are few.
    ``vmin``/``vmax`` fix the colour scale, so that several maps can be compared.
    """
    m = np.asarray(matrix.detach() if hasattr(matrix, "detach") else matrix, dtype=float)
    if m.shape != (len(row_labels), len(col_labels)):
        raise ValueError(f"matrix has shape {m.shape} but there are "
                         f"{len(row_labels)} row and {len(col_labels)} column labels")
    if ax is None:
        _, ax = plt.subplots(figsize=(0.55 * len(col_labels) + 2.5, 0.45 * len(row_labels) + 1.5))
    image = ax.imshow(m, cmap=cmap, vmin=vmin, vmax=vmax)
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ax.set_xticks(range(len(col_labels)), col_labels, rotation=45, ha="right")
    ax.set_yticks(range(len(row_labels)), row_labels)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if annotate:
        size = 9 if max(m.shape) <= 6 else 8 if max(m.shape) <= 11 else 7
        for (i, j), value in np.ndenumerate(m):
            ax.text(j, i, fmt.format(value), ha="center", va="center", fontsize=size,
                    color="black" if np.isnan(value) else _ink(image.cmap(image.norm(value))))
    return ax


def _ink(rgba) -> str:
    """Black on a light colour, white on a dark one (by the colour's relative luminance)."""
    r, g, b = rgba[:3]
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.45 else "white"


def vectors_2d(vectors: object, labels: Sequence[str], *, title: str, ax=None,
               highlight: int | None = None):
    """Draw 2-D vectors (n, 2) as arrows from the origin, labelled in a legend.

    The vector at index ``highlight`` is drawn thicker, in red. Returns the Axes.
    """
    v = np.asarray(vectors, dtype=float)
    if v.ndim != 2 or v.shape[1] != 2 or v.shape[0] != len(labels):
        raise ValueError(f"expected vectors of shape ({len(labels)}, 2), got {v.shape}")
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 5))
    colours = iter(plt.cm.tab10.colors[:3] + plt.cm.tab10.colors[4:])
    for i, (x, y) in enumerate(v):
        main = i == highlight
        colour = "tab:red" if main else next(colours)
        ax.quiver(0, 0, x, y, angles="xy", scale_units="xy", scale=1, color=colour,
                  width=0.012 if main else 0.007, label=labels[i])
    low = np.minimum(v.min(axis=0), 0) - 0.3
    high = np.maximum(v.max(axis=0), 0) + 0.3
    ax.set_xlim(low[0], high[0])
    ax.set_ylim(low[1], high[1])
    ax.axhline(0, color="grey", lw=0.5)
    ax.axvline(0, color="grey", lw=0.5)
    ax.set_aspect("equal")
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=9, frameon=False)
    return ax
