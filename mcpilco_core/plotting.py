"""Plots people would rather look at than read: evaluation time series."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .plant import DoublePendulum
from .simulation import MODE_CODES, Trajectory

MODE_COLORS = {"policy": "tab:blue", "lqr": "tab:green", "damping": "tab:orange", "safe": "tab:red",
               "idle": "lightgrey", "reset": "black", "other": "tab:purple"}


def pyplot():
    """matplotlib.pyplot on a file backend (files only: works on machines without a display)."""
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "pdf", "svg", "cairo"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _figure(rows: int, height: float):
    return pyplot().subplots(rows, 1, sharex=True, figsize=(12, height),
                             gridspec_kw={"height_ratios": [3] * (rows - 1) + [0.6]})


def plot_evaluation(traj: Trajectory, plant: DoublePendulum, path: str | Path, title: str = "",
                    windows: Sequence[Sequence[float]] = ()) -> Path:
    """Angles, velocities, torques, end-effector height (with the 0.45 m score line), disturbance
    windows shaded, and the controller mode as a colour band; written to ``path`` (png/pdf/svg)."""
    fig, axes = _figure(5, 11)
    t, x = traj.t, traj.x
    panels = [(axes[0], [x[:, 0], x[:, 1]], ["q1", "q2"], "angle (rad)"),
              (axes[1], [x[:, 2], x[:, 3]], ["dq1", "dq2"], "velocity (rad/s)"),
              (axes[2], [traj.u[:, 0], traj.u[:, 1]], ["tau1 (shoulder)", "tau2 (elbow)"], "torque (N m)")]
    for ax, series, labels, ylabel in panels:
        for values, label in zip(series, labels):
            ax.plot(t[: len(values)], values, lw=0.8, label=label)
        ax.set_ylabel(ylabel)
        ax.legend(loc="upper right", fontsize=8)
    height = plant.end_effector_height(x)
    axes[3].plot(t, height, lw=0.8, color="tab:blue", label="end-effector height")
    axes[3].axhline(plant.height_threshold, color="tab:red", ls="--", lw=1,
                    label=f"score line {plant.height_threshold:.2f} m")
    axes[3].set_ylabel("height (m)")
    axes[3].legend(loc="upper right", fontsize=8)
    for ax in axes[:4]:
        for start, end in windows:
            ax.axvspan(start, end, color="grey", alpha=0.25, lw=0)
        ax.grid(alpha=0.3)
    _mode_band(axes[4], t, traj.mode)
    axes[4].set_xlabel("time (s)")
    return save_figure(fig, path, title, dpi=110)


def save_figure(fig, path: str | Path, title: str = "", dpi: int = 100) -> Path:
    """Title, lay out, write (creating the folder) and close ``fig``; returns the path written."""
    import matplotlib.pyplot as plt

    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def _mode_band(ax, t: np.ndarray, modes: np.ndarray) -> None:
    """Controller mode over time as coloured spans, with a legend of the modes that occur."""
    from matplotlib.patches import Patch

    names = {code: name for name, code in MODE_CODES.items()}
    change = np.flatnonzero(np.diff(modes)) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [len(modes)]])
    for s, e in zip(starts, ends):
        ax.axvspan(t[s], t[e], color=MODE_COLORS[names[int(modes[s])]], lw=0)
    present = [names[int(c)] for c in np.unique(modes)]
    ax.legend(handles=[Patch(color=MODE_COLORS[n], label=n) for n in present], loc="center left",
              bbox_to_anchor=(1.0, 0.5), fontsize=8)
    ax.set_yticks([])
    ax.set_ylabel("mode")
