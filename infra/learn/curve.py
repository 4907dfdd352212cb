"""The learning curve as a PNG: held-out success and mean online reward by policy version (left) and
by wall time (right). matplotlib (the `plot` extra) is imported lazily, with the Agg backend."""

from __future__ import annotations

from pathlib import Path


def write_curve(points: list[dict], path: Path, title: str) -> Path:
    """`points`: one dict per version with `version_number`, `minutes`, `success` (0..1) and
    `mean_reward` (0..1 or None)."""
    fig, axes = _two_panels()
    for ax, key, label in (
        (axes[0], "version_number", "policy version"),
        (axes[1], "minutes", "wall time (min)"),
    ):
        xs = [p[key] for p in points]
        ax.plot(xs, [p["success"] for p in points], marker="o", label="held-out success")
        rewarded = [(p[key], p["mean_reward"]) for p in points if p.get("mean_reward") is not None]
        if rewarded:
            ax.plot(*zip(*rewarded, strict=True), marker="s", linestyle="--", label="mean reward (online)")
        ax.set_xlabel(label)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    return _save(fig, axes, "rate / reward", title, path)


def write_runs_curve(runs: dict[str, list[dict]], path: Path, title: str) -> Path:
    """`agentstream bench learn`'s curve: held-out success by wall time, one line per run (sampled
    solid, greedy dashed in the same colour; a run named "control" in grey). `runs`: name -> the
    run's points (`minutes`, `success`, `greedy_success` or None)."""
    fig, axes = _two_panels()
    for k, (name, points) in enumerate(runs.items()):
        colour = "grey" if name == "control" else f"C{k}"
        xs = [p["minutes"] for p in points]
        axes[0].plot(xs, [p["success"] for p in points], marker="o", color=colour, label=name)
        greedy = [(p["minutes"], p["greedy_success"]) for p in points if p.get("greedy_success") is not None]
        if greedy:
            axes[1].plot(*zip(*greedy, strict=True), marker="s", linestyle="--", color=colour, label=name)
    for ax, label in ((axes[0], "sampled (temperature 1)"), (axes[1], "greedy (temperature 0)")):
        ax.set_title(label)
        ax.set_xlabel("minutes of learning")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    return _save(fig, axes, "held-out success", title, path)


def _two_panels():
    """A figure with two side-by-side panels sharing the y axis (matplotlib's Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, 2, figsize=(10, 4), sharey=True)


def _save(fig, axes, ylabel: str, title: str, path: Path) -> Path:
    import matplotlib.pyplot as plt

    axes[0].set_ylabel(ylabel)
    axes[0].legend(loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
