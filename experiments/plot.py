"""Learning curves of one or more runs, overlaid.

    python -m experiments.plot RUN_DIR [RUN_DIR ...] [-o OUT.png]

Each run draws its population mean fitness (solid, with a +-1 std band) and
its best fitness so far (dashed) against the generation, from its
``metrics.jsonl``. One run defaults to ``RUN_DIR/learning_curve.png``,
several to ``learning_curves.png`` in the current directory. Matplotlib's Agg
backend is used directly, so no display is needed and pyplot's global state
is left alone.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

from es.metrics_log import read_metrics
from es.runner import LOG_NAME

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
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    tasks = []
    for index, run_dir in enumerate(map(pathlib.Path, run_dirs)):
        log = run_dir / LOG_NAME
        if not log.is_file():
            raise ValueError(f"{run_dir} holds no {LOG_NAME}; is it a run directory of experiments.train?")
        rows = read_metrics(log)
        if not rows:
            raise ValueError(f"{log} has no generations yet.")
        generation = np.array([row["generation"] for row in rows])
        mean = np.array([row["fitness_mean"] for row in rows], float)
        std = np.array([row["fitness_std"] for row in rows], float)
        best = np.array([row["best_fitness"] for row in rows], float)
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
        path = plot_runs(args.run_dirs, output)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
