"""The bar chart of ratios (matplotlib, an optional extra)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from ...errors import import_optional
from ...runtime.files import in_place, saving
from .timing import CaseResult


def check_plot_support() -> None:
    """Raise ImportError with the install hint if matplotlib is missing."""
    import_optional("matplotlib", "--plot", "pip install onnx-recurrent[plot]")


def plot_path(path: str) -> str:
    """Where ``--plot`` writes: ``path``, ``.png`` appended where it has no suffix (as
    matplotlib's ``savefig`` does), except to an existing device or pipe
    (``/dev/null``), written as named (a PNG). Raises ValueError for a suffix no
    matplotlib writer takes, before the bench runs; ImportError without matplotlib."""
    check_plot_support()
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    suffix = os.path.splitext(path)[1][1:]
    if not suffix:
        return path if in_place(path) else path + ".png"
    formats = Figure().canvas.get_supported_filetypes()
    if suffix.lower() not in formats:
        known = ", ".join(formats)
        raise ValueError(f"--plot {path}: matplotlib cannot write .{suffix} ({known})")
    return path


def plot_ratios(results: Sequence[CaseResult], path: str | os.PathLike, title: str = "") -> None:
    """A bar chart of ours over the fastest peer per case, as its first target measures
    it (through Layer at step and S; log scale, targets marked) and, where
    onnx.reference ran, of its time over ours."""
    check_plot_support()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    rows = [r for r in results if r.error is None]
    labels = [f"{r.case.shape.name} {r.case.label}" for r in rows]
    x = np.arange(len(rows))
    fig, axes = plt.subplots(2, 1, figsize=(max(8.0, 0.38 * len(rows) + 2), 9), sharex=True)
    panels = (("ratio", axes[0]), ("speedup", axes[1]))
    for kind, ax in panels:
        values, colors, bounds, hatches = [], [], [], []
        for r in rows:
            target = next((t for t in r.case.targets if t.kind == kind), None)
            if kind == "ratio":
                peer, face = r.case.baseline, "ours"
                if target is not None:  # the first: through Layer at step and S
                    peer, face = target.runtime, target.ours
                value = r.ratio(peer, face)
                hatches.append("//" if r.peer(peer) in r.notes else "")
            else:
                ratio = r.ratio("reference")
                value = None if ratio is None else 1.0 / ratio
                hatches.append("")
            met = (
                None
                if target is None or value is None
                else target.met(value if kind == "ratio" else 1.0 / value)
            )
            values.append(np.nan if value is None else value)
            colors.append("tab:gray" if met is None else ("tab:green" if met else "tab:red"))
            bounds.append(np.nan if target is None else target.bound)
        ax.bar(x, values, color=colors, hatch=hatches)
        ax.scatter(x, bounds, marker="_", s=300, color="black", label="target", zorder=3)
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_yscale("log")
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.legend(loc="best")
        if kind == "ratio":
            ax.set_ylabel(
                "ours / fastest peer's time\n(onnxruntime or OpenVINO; at step and S "
                "through Layer)"
            )
            ax.set_title(title or "onnx-recurrent bench: lower is better")
        else:
            ax.set_ylabel("onnx.reference time / ours\n(higher is better)")
    axes[1].set_xticks(x)
    axes[1].set_xticklabels(labels, rotation=70, ha="right", fontsize=8)
    fig.tight_layout()
    path = plot_path(os.fspath(path))
    with saving(path) as f:
        fig.savefig(f, dpi=120, format=os.path.splitext(path)[1][1:].lower() or "png")
    plt.close(fig)
