"""
matplotlib for files only (no display), imported when a script first plots, and the one way the scripts write
their figures: eval_math.py's depth and frontier plots, experiments/repeat.py's and experiments/claims.py's.

    python eval_math.py --init out/depth --task depth --data data/depth   # writes depth_accuracy.png through these
"""

from pathlib import Path


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    return plt


def save_figures(figs, out_dir):
    """Write each (figure, file name) of figs as a PNG in out_dir and close it; returns the paths."""
    for fig, name in figs:
        fig.tight_layout()
        fig.savefig(Path(out_dir) / name, dpi=120)
        pyplot().close(fig)
    return [Path(out_dir) / name for _, name in figs]
