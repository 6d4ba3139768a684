"""Plots of the benchmark tables (matplotlib, Agg backend: no display needed).

    plot_attention(rows, out_dir)  -> attention_time.png, attention_memory.png
        one panel per (pass, dtype, head dim); x: sequence length (log2), y: median ms or
        peak MiB (log); one line per implementation; "x" markers on the panel's top edge
        where that implementation ran out of memory.
    plot_model(rows, out_dir)      -> model.png
        step time and peak memory against context length, one line per
        (size, attention, precision, mode).

Rows are the dicts ``perf.bench.attention`` and ``perf.bench.model`` produce.
``save_figure(fig, path)`` lays out, writes and closes any other benchmark's figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from perf.lib.measure import OOM  # noqa: E402

_MARKERS = "osD^v<>ph*"


def _ordered(values):
    out = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def _series_panel(ax, series: dict, value_key: str, x_key: str):
    """Lines for each series; OOM points marked on the top edge. Returns True if anything was drawn."""
    drawn, oom_points = False, []
    for i, (label, rows) in enumerate(series.items()):
        rows = sorted(rows, key=lambda r: r[x_key])
        xs = [r[x_key] for r in rows if r.get(value_key) is not None]
        ys = [r[value_key] for r in rows if r.get(value_key) is not None]
        line = None
        if xs:
            (line,) = ax.plot(xs, ys, marker=_MARKERS[i % len(_MARKERS)], markersize=4, label=label)
            drawn = True
        ooms = [r[x_key] for r in rows if r.get("status") == OOM]
        if ooms:
            oom_points.append((ooms, line.get_color() if line is not None else f"C{i}", label))
    if drawn:
        ax.set_yscale("log")
    top = ax.get_ylim()[1] if drawn else 1.0
    for xs, color, label in oom_points:
        ax.scatter(xs, [top] * len(xs), marker="x", color=color, s=40, clip_on=False,
                   label=f"{label} OOM" if not drawn else None, zorder=3)
    if oom_points:
        drawn = True
    if drawn:
        ax.set_xscale("log", base=2)
    ax.grid(True, which="both", alpha=0.3)
    return drawn


def save_figure(fig, path: str | Path, dpi: int = 120) -> Path:
    """Lay the figure out, write it to ``path`` and close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return Path(path)


def plot_attention(rows: Sequence[dict], out_dir: str | Path) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    passes = _ordered(r["pass"] for r in rows)
    panels = _ordered((r["dtype"], r["d"]) for r in rows)
    impls = _ordered(r["impl"] for r in rows)
    paths = []
    for value_key, ylabel, name in (("ms", "median time (ms)", "attention_time.png"),
                                    ("peak_mib", "peak memory (MiB)", "attention_memory.png")):
        fig, axes = plt.subplots(len(passes), len(panels), figsize=(max(6.0, 3.4 * len(panels)), 2.8 * len(passes)),
                                 squeeze=False, sharex=True)
        for pi, pass_ in enumerate(passes):
            for ci, (dtype, d) in enumerate(panels):
                ax = axes[pi][ci]
                series = {impl: [r for r in rows if r["impl"] == impl and r["pass"] == pass_
                                 and r["dtype"] == dtype and r["d"] == d] for impl in impls}
                drawn = _series_panel(ax, {k: v for k, v in series.items() if v}, value_key, "seq")
                if not drawn:
                    ax.text(0.5, 0.5, "no data" if value_key == "ms" else "no CUDA memory data",
                            ha="center", va="center", transform=ax.transAxes, fontsize=8)
                ax.set_title(f"{pass_}, {dtype}, d={d}", fontsize=9)
                if ci == 0:
                    ax.set_ylabel(ylabel, fontsize=8)
                if pi == len(passes) - 1:
                    ax.set_xlabel("sequence length", fontsize=8)
                ax.tick_params(labelsize=7)
        handles, labels = {}, {}
        for ax in axes.flat:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(lab, h)
        if handles:
            fig.legend(list(handles.values()), list(handles.keys()), loc="upper center",
                       bbox_to_anchor=(0.5, 1.0 - 0.35 / fig.get_figheight()),
                       ncol=min(len(handles), 6), fontsize=8, frameon=False)
        title = "causal attention, " + ("median time" if value_key == "ms" else "peak memory") + " (x on top edge: OOM)"
        fig.suptitle(title, fontsize=10, y=1.0 - 0.08 / fig.get_figheight(), va="top")
        fig.tight_layout(rect=(0, 0, 1, 1.0 - 0.55 / fig.get_figheight()))
        path = out_dir / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def plot_model(rows: Sequence[dict], out_dir: str | Path, name: str = "model.png") -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    keys = _ordered((r["size"], r["attention"], r["precision"], r["mode"]) for r in rows)
    series = {" ".join(map(str, k)): [r for r in rows if (r["size"], r["attention"], r["precision"], r["mode"]) == k]
              for k in keys}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), squeeze=False)
    for ax, (value_key, ylabel) in zip(axes[0], (("mean_ms", "mean step time (ms)"), ("peak_mib", "peak memory (MiB)"))):
        if not _series_panel(ax, series, value_key, "context"):
            ax.text(0.5, 0.5, "no data" if value_key == "mean_ms" else "no CUDA memory data",
                    ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("context length")
        ax.set_ylabel(ylabel)
    handles = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if handles:
        fig.legend(list(handles.values()), list(handles.keys()), loc="center right", fontsize=7, frameon=False)
    fig.suptitle("GPT model benchmark (x on top edge: OOM)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.78 if handles else 1, 1))
    path = out_dir / name
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
