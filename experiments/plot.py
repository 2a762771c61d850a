"""Learning curves of one or more runs, overlaid, and the comparison of a sweep's settings.

    python -m experiments.plot RUN_DIR [RUN_DIR ...] [-o OUT.png]
    python -m experiments.plot SWEEP_DIR [-o OUT.png]

Each run draws its population mean fitness (solid, with a +-1 std band) and
its best fitness so far (dashed) against the generation, from its
``metrics.jsonl``. One run defaults to ``RUN_DIR/learning_curve.png``,
several to ``learning_curves.png`` in the current directory. A sweep
directory of ``python -m experiments.train --seeds/--sweep`` gives its
comparison plot (``plot_sweep``), by default ``SWEEP_DIR/comparison.png``.
Matplotlib's Agg backend is used directly, so no display is needed and
pyplot's global state is left alone.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

from es.runs.metrics_log import read_metrics
from es.runs.segments import LOG_NAME
from experiments import grid

CURVE_NAME = "learning_curve.png"


def _task_label(run_dir: pathlib.Path) -> str | None:
    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    from experiments import config as config_lib

    try:
        task = config_lib.load(path).get("task", {})
    except ValueError:
        return None
    options = ", ".join(f"{k}={v}" for k, v in (task.get("options") or {}).items())
    return f"{task.get('name')}({options})" if options else str(task.get("name"))


def plot_runs(run_dirs: list, output) -> pathlib.Path:
    """Draw the runs in ``run_dirs`` into the PNG ``output``; return its path."""
    figure, (axes,) = _figure(1)
    tasks = []
    for index, run_dir in enumerate(map(pathlib.Path, run_dirs)):
        curves = _curves(run_dir)
        generation, mean, std, best = (curves[k] for k in ("generation", "fitness_mean", "fitness_std",
                                                           "best_fitness"))
        color = f"C{index % 10}"
        name = run_dir.name or str(run_dir)
        axes.plot(generation, mean, color=color, linewidth=1.5, label=f"{name}: population mean")
        axes.fill_between(generation, mean - std, mean + std, color=color, alpha=0.15, linewidth=0)
        axes.plot(generation, best, color=color, linewidth=1.2, linestyle="--", label=f"{name}: best so far")
        label = _task_label(run_dir)
        if label and label not in tasks:
            tasks.append(label)
    axes.set_xlabel("generation")
    axes.set_ylabel("fitness (higher is better)" if len(tasks) <= 1 else "fitness")
    axes.set_title(", ".join(tasks) if tasks else "learning curves")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small", loc="best")
    output = pathlib.Path(output)
    figure.savefig(output, dpi=120)
    return output


def _figure(columns: int):
    """A figure of ``columns`` side-by-side axes, drawn by Agg (no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8 if columns == 1 else 12, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    return figure, [figure.add_subplot(1, columns, i) for i in range(1, columns + 1)]


def _curves(run_dir: pathlib.Path) -> dict[str, np.ndarray]:
    """``generation``, ``fitness_mean``, ``fitness_std`` and ``best_fitness`` of a run, from its log."""
    log = run_dir / LOG_NAME
    if not log.is_file():
        raise ValueError(f"{run_dir} holds no {LOG_NAME}; is it a run directory of experiments.train?")
    rows = read_metrics(log)
    if not rows:
        raise ValueError(f"{log} has no generations yet.")
    return {name: np.array([row[name] for row in rows], float)
            for name in ("generation", "fitness_mean", "fitness_std", "best_fitness")}


def plot_sweep(groups: dict[str, list], output, title: str | None = None) -> pathlib.Path:
    """Compare a sweep's settings: per setting, the mean over its seeds' runs and its spread, into ``output``.

    ``groups`` maps a setting's label to its run directories (one per seed).
    Left: the population mean fitness; right: the best fitness so far; each
    the mean over the seeds (line) and +-1 standard deviation over the seeds
    (band), over the generations all of them completed.
    """
    figure, (left, right) = _figure(2)
    tasks = []
    for index, (label, run_dirs) in enumerate(groups.items()):
        curves = [_curves(pathlib.Path(run_dir)) for run_dir in run_dirs]
        length = min(len(c["generation"]) for c in curves)
        generation = curves[0]["generation"][:length]
        color = f"C{index % 10}"
        for axes, name in ((left, "fitness_mean"), (right, "best_fitness")):
            values = np.stack([c[name][:length] for c in curves])
            mean, spread = values.mean(axis=0), values.std(axis=0)
            axes.plot(generation, mean, color=color, linewidth=1.5, label=f"{label} ({len(curves)} seeds)")
            axes.fill_between(generation, mean - spread, mean + spread, color=color, alpha=0.2, linewidth=0)
        task = _task_label(pathlib.Path(run_dirs[0]))
        if task and task not in tasks:
            tasks.append(task)
    for axes, what in ((left, "population mean fitness"), (right, "best fitness so far")):
        axes.set_xlabel("generation")
        axes.set_ylabel(f"{what} (mean ± std over seeds)")
        axes.grid(alpha=0.3)
    left.legend(fontsize="small", loc="best")
    figure.suptitle(title or ", ".join(tasks) or "sweep")
    output = pathlib.Path(output)
    figure.savefig(output, dpi=120)
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.plot", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories of experiments.train")
    parser.add_argument("-o", "--output", help="PNG to write (default: see above)")
    args = parser.parse_args(argv)
    output = args.output or (pathlib.Path(args.run_dirs[0]) / CURVE_NAME if len(args.run_dirs) == 1
                             else pathlib.Path("learning_curves.png"))
    try:
        if len(args.run_dirs) == 1 and grid.is_sweep(args.run_dirs[0]):
            sweep_dir = pathlib.Path(args.run_dirs[0])
            path = plot_sweep(grid.groups(sweep_dir), args.output or sweep_dir / grid.COMPARISON_NAME)
        else:
            path = plot_runs(args.run_dirs, output)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
