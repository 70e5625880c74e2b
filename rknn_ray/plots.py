"""PNG plots for a run folder (matplotlib, headless Agg backend)."""
from __future__ import annotations

import io

import matplotlib
import matplotlib.ticker  # noqa: F401  (the comparison plot's eps ticks)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from rknn_ray.runio import atomic_path  # noqa: E402


def save_png(fig, path: str, dpi: int = 90) -> None:
    """Write a figure atomically as PNG and close it."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi)
    plt.close(fig)


def save_accuracy_vs_eps(fig, ax, path: str, title: str, xlabel: str = "target eps",
                         top: float = 1.0, legend_loc: str | None = None) -> None:
    """Finish and save an experiment's 'student accuracy vs eps' plot (jobs.compare,
    jobs.grid): log eps axis, accuracy in [0, top], a legend if anything is named."""
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("student test accuracy")
    ax.set_ylim(0, top)
    ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, **({"loc": legend_loc} if legend_loc else {}))
    fig.tight_layout()
    save_png(fig, path)


def runs_vs_eps_png(points) -> bytes:
    """:func:`runs_vs_eps_figure` as PNG bytes."""
    fig = runs_vs_eps_figure(points)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def runs_vs_eps_figure(points):
    """A folder of runs side by side (``rknn-ray report FOLDER``): per ``(group, eps,
    student accuracy, label accuracy)`` point, student accuracy solid and label accuracy
    dashed against eps, one colour per group (trust model / mechanism, and the data set when
    the folder holds runs of several: a line never joins two data sets); PNG bytes.
    ``group`` may be a (data set, model/mechanism) pair."""
    fig, ax = plt.subplots(figsize=(8, 4.2))
    sets = {g[0] for g, *_ in points if isinstance(g, tuple)}
    points = [((f"{g[0]}: {g[1]}" if len(sets) > 1 else g[1]) if isinstance(g, tuple) else g,
               *rest) for g, *rest in points]
    groups = list(dict.fromkeys(g for g, *_ in points))
    for i, g in enumerate(groups):
        mine = sorted((e, s, lab) for gg, e, s, lab in points if gg == g)
        colour = f"C{i % 10}"
        for col, style, marker, what in ((1, "-", "o", "student"), (2, "--", "s", "labels")):
            xy = [(p[0], p[col]) for p in mine if p[col] is not None and p[col] == p[col]]
            if xy:
                ax.plot([x for x, _ in xy], [y for _, y in xy], ls=style, marker=marker,
                        color=colour, mfc=colour if what == "student" else "white",
                        label=f"{g}: {what}")
    eps = [p[1] for p in points]
    if min(eps) > 0 and max(eps) / min(eps) >= 4:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xticks(sorted(set(eps)))
    ax.set_xlabel("eps (spent, as the run's accountant reports)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1.02)
    ax.set_title("runs in this folder: student (solid) and labels (dashed) vs eps")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def run_summary_png(path: str, report: dict, history: list[dict], gaps: np.ndarray,
                    correct: np.ndarray, noise_bound: float | None,
                    gap_kind: str = "released") -> None:
    """Three panels: accuracies, student training curve, count gap vs label correctness.

    ``gap_kind`` says what the gaps were computed from: 'released' (the noisy counts:
    safe to share) or 'non-private' (exact private counts: diagnostics only).
    """
    save_png(run_summary_figure(report, history, gaps, correct, noise_bound, gap_kind), path)


def run_summary_figure(report: dict, history: list[dict], gaps: np.ndarray,
                       correct: np.ndarray, noise_bound: float | None,
                       gap_kind: str = "released"):
    """The figure :func:`run_summary_png` saves. An accuracy that was not measured is drawn
    as the report's reason (``accuracy.not_measured``) under the bars, not as a bar; without
    a public truth to measure count gaps against (a user's unlabelled public table) the
    third panel is left out rather than drawn empty."""
    panels = 3 if gaps.size else 2
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4.2))
    acc = report["accuracy"]
    names, vals, colors = ["labels (private)", "student"], [acc.get("labels"), acc.get("student")], \
        ["#4477aa", "#228833"]
    nonprivate = (report.get("diagnostics") or {}).get("nonprivate_labels")
    if nonprivate is not None:            # diagnostics only: never in a default run folder
        names, vals, colors = ["labels (non-private)"] + names, [nonprivate] + vals, \
            ["#999999"] + colors
    vals = [np.nan if v is None else v for v in vals]
    bars = axes[0].bar(names, np.nan_to_num(vals), color=colors)   # a NaN bar breaks the layout
    for b, v in zip(bars, vals):
        axes[0].text(b.get_x() + b.get_width() / 2, (0 if np.isnan(v) else v) + 0.01,
                     "n/a" if np.isnan(v) else f"{v:.3f}", ha="center")
    notes = acc.get("not_measured") or {}
    reasons = sorted({notes[k] for k in ("labels", "student") if k in notes})
    if reasons:           # under the axis: a caption across the bars hid the student's
        axes[0].set_xlabel("n/a: " + "\nn/a: ".join(reasons), fontsize=8, color="#555555")
    p = report["privacy"]
    axes[0].set_ylim(0, 1.08)
    axes[0].set_title(f"{p['model']} / {p['mechanism']}: eps={p['eps']:.3g}, delta={p['delta']:.2g}")
    axes[0].set_ylabel("accuracy")
    if history:
        ep = [h.get("epoch", i + 1) for i, h in enumerate(history)]
        axes[1].plot(ep, [h.get("train_loss", np.nan) for h in history], label="train loss")
        if any("test_accuracy" in h for h in history):
            ax2 = axes[1].twinx()
            ax2.plot(ep, [h.get("test_accuracy", np.nan) for h in history], color="#228833",
                     label="test accuracy")
            ax2.set_ylim(0, 1)
            ax2.set_ylabel("test accuracy")
        axes[1].set_xlabel("epoch")
        axes[1].set_ylabel("loss")
    axes[1].set_title("student training")
    if gaps.size:
        bins = np.linspace(gaps.min(), gaps.max() + 1, 30)
        axes[2].hist([gaps[correct], gaps[~correct]], bins=bins, stacked=True,
                     color=["#228833", "#cc3311"], label=["query label correct", "wrong"])
        if noise_bound:
            axes[2].axvline(2 * noise_bound, color="k", ls="--",
                            label="2 x error bound (Remark 1)")
        axes[2].legend()
        axes[2].set_xlabel(f"{gap_kind} count gap (public true class - best other)")
        axes[2].set_title(f"per-query {gap_kind} count gap vs label correctness")
    fig.tight_layout()
    return fig
