"""docs/results.md from the runs ``python -m experiments.reproduce`` saved: the table of final returns against the
published ES returns (``REFERENCES``, ``PUBLISHED``), the strategy comparison, and the learning curves (PNG).

    python -m experiments.reproduce --report-only     # re-render the page from experiments/results/*.json
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "experiments" / "results"
STRATEGY_RESULTS_DIR = RESULTS_DIR / "strategies"  # --strategy runs, for the comparison table
DOCS = ROOT / "docs"

# The reference each env's verdict compares with: the best published ES return we know of.
# Classic control: the gymnax-blines ES checkpoints (github.com/RobertTLange/gymnax-blines).
# MinAtar: NeuroEvoBench (Lange et al. 2023, "NeuroEvoBench: benchmarking evolutionary optimizers for
# deep learning applications", NeurIPS Datasets and Benchmarks), tuned, 5 seeds.
REFERENCES = {"CartPole-v1": 500.0, "Pendulum-v1": -130.0, "MountainCarContinuous-v0": 92.0,
              "Breakout-MinAtar": 14.9, "Asterix-MinAtar": 13.6}
REFERENCE_SOURCES = {"CartPole-v1": "gymnax-blines ES", "Pendulum-v1": "gymnax-blines ES",
                     "MountainCarContinuous-v0": "gymnax-blines ES", "Breakout-MinAtar": "NeuroEvoBench SNES",
                     "Asterix-MinAtar": "NeuroEvoBench SNES"}
# Every published return shown beside ours: env -> [(source, method, return, protocol)].
NEUROEVOBENCH = "NeuroEvoBench (tuned, 5 seeds)"
NEUROEVOBENCH_PROTOCOL = "1,500 generations x popsize 256 x 8 episodes, CNN, argmax actions, episodes capped at 500 steps"
PUBLISHED = {
    "Breakout-MinAtar": [
        (NEUROEVOBENCH, "SNES", 14.9, NEUROEVOBENCH_PROTOCOL),
        (NEUROEVOBENCH, "sep-CMA-ES", 14.0, NEUROEVOBENCH_PROTOCOL),
        (NEUROEVOBENCH, "LES", 12.3, NEUROEVOBENCH_PROTOCOL),
        (NEUROEVOBENCH, "SimpleGA", 7.9, NEUROEVOBENCH_PROTOCOL),
        (NEUROEVOBENCH, "OpenAI-ES", 4.0, NEUROEVOBENCH_PROTOCOL + " (quoted as about 4)"),
        ("gymnax-blines", "SimpleGA", 6.5, "2e9 env steps"),
        ("gymnax README", "PPO", 28.0, "gradient-based RL, for scale"),
    ],
    "Asterix-MinAtar": [
        (NEUROEVOBENCH, "SNES", 13.6, NEUROEVOBENCH_PROTOCOL),
        (NEUROEVOBENCH, "OpenAI-ES", 3.3, NEUROEVOBENCH_PROTOCOL),
        ("gymnax README", "PPO", 15.0, "gradient-based RL, for scale"),
    ],
}

CURVE_EPISODES = 16  # episodes per point of the learning curve
# gymnax-blines' statistic (train/es.py there): the mean evaluated on 164 test episodes every few
# generations, and the best of those evaluations reported. We evaluate after every segment.
REFERENCE_TEST_EPISODES = 164


def load_runs(directory: Path = RESULTS_DIR) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {}
    for path in sorted(glob.glob(str(directory / "*.json"))):
        with open(path) as f:
            run = json.load(f)
        runs.setdefault(run["env"], []).append(run)
    return runs


def comparison_table(strategy_runs: dict[str, list[dict]], runs: dict[str, list[dict]]) -> str:
    """Per env (rows) and strategy (columns): the final return's mean ± std over seeds; the best in bold.

    ``strategy_runs`` are ``--strategy`` runs (``experiments/results/strategies/``): each strategy at
    its own defaults with the env config's popsize, episodes and generations. A strategy without such
    runs shows the config's own runs (``runs``) when the config uses it; a strategy with runs on no env has
    no column. Strategies tied with the best at the table's precision are all in bold and all named in the
    "best" column.
    """
    from experiments.bench.common import markdown_table

    import es

    envs = {env: _by_strategy(env, strategy_runs, runs) for env in sorted(strategy_runs, key=_env_order)}
    names = [name for name in es.STRATEGIES if any(name in by_strategy for by_strategy in envs.values())]
    rows = []
    for env, by_strategy in envs.items():
        best = _best(by_strategy)
        cells = []
        for name in names:
            if name not in by_strategy:
                cells.append("—")
                continue
            returns = [run["final_return_mean"] for run in by_strategy[name]]
            text = f"{_fmt(float(np.mean(returns)))} ± {_fmt(float(np.std(returns)))}"
            cells.append(f"**{text}**" if name in best else text)
        seeds = "/".join(sorted({str(len(by_strategy[name])) for name in best}))
        rows.append([f"`{env}`", *cells, f"{', '.join(best)} (seeds: {seeds})"])
    return markdown_table(["environment", *names, "best"], rows)


def best_strategy_sentences(strategy_runs: dict[str, list[dict]], runs: dict[str, list[dict]]) -> list[str]:
    """One line per env of ``comparison_table``: the best strategy and the settings its runs used."""
    lines = []
    for env in sorted(strategy_runs, key=_env_order):
        by_strategy = _by_strategy(env, strategy_runs, runs)
        best = _best(by_strategy)
        value = _fmt(float(np.mean([run["final_return_mean"] for run in by_strategy[best[0]]])))
        if len(best) > 1:
            lines.append(f"- `{env}`: {', '.join(best[:-1])} and {best[-1]} tie at {value}; any of them will do.")
            continue
        run = by_strategy[best[0]][0]
        source = "the config's settings" if run in runs.get(env, []) else "its defaults and the config's popsize"
        lines.append(f"- `{env}`: {best[0]} ({value}), with {source}: `{_settings(run['config']['strategy'])}`.")
    return lines


def _by_strategy(env: str, strategy_runs: dict[str, list[dict]], runs: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """``env``'s runs per strategy: its ``--strategy`` runs, and the config's runs for a strategy without them."""
    by_strategy: dict[str, list[dict]] = {}
    for run in strategy_runs[env]:
        by_strategy.setdefault(_strategy_name(run), []).append(run)
    compared = set(by_strategy)
    for run in runs.get(env, []):
        if _strategy_name(run) not in compared:
            by_strategy.setdefault(_strategy_name(run), []).append(run)
    return by_strategy


def _best(by_strategy: dict[str, list[dict]]) -> list[str]:
    """The strategies whose mean final return equals the best one's at the table's precision, in table order."""
    import es

    means = {name: float(np.mean([r["final_return_mean"] for r in rs])) for name, rs in by_strategy.items()}
    top = _fmt(max(means.values()))
    return [name for name in es.STRATEGIES if name in means and _fmt(means[name]) == top]


def _settings(strategy: dict) -> str:
    """A strategy section of a saved config as a call, e.g. ``es.OpenES(popsize=256, optimizer=adam(learning_rate=0.03))``."""
    skip = {"name", "maximize", "noise", "exchange", "eval_batch_size", "update_batch_size"}
    items = []
    for key, value in strategy.items():
        if key in skip:
            continue
        if isinstance(value, dict):
            arguments = ", ".join(f"{k}={v!r}" for k, v in value.items() if k != "name")
            items.append(f"{key}={value['name']}({arguments})")
        else:
            items.append(f"{key}={value!r}")
    return f"es.{strategy['name']}({', '.join(items)})"


def with_kept_sections(report: str, page: Path) -> str:
    """``report`` followed by the sections of ``page`` that other scripts write (between their markers),
    as they are: ``experiments.gymnasium_results``'s MuJoCo section."""
    from experiments.gymnasium_results import BEGIN, END

    old = page.read_text() if page.exists() else ""
    if BEGIN not in old:
        return report
    section = BEGIN + old.split(BEGIN, 1)[1].split(END, 1)[0] + END
    return report.rstrip("\n") + "\n\n" + section + "\n"


def plot(env: str, runs: list[dict], path: Path, lines: dict[str, float] | None = None,
         episodes: int = CURVE_EPISODES) -> None:
    """Each run's ``curve`` (``generation``, ``env_steps``, ``return`` of the mean policy on ``episodes``
    episodes) against generations and env steps; ``lines``: ``{label: return}`` drawn across (default: the
    env's reference)."""
    if lines is None:
        lines = {REFERENCE_SOURCES[env]: REFERENCES[env]} if env in REFERENCES else {}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for run in runs:
        gens = [p["generation"] for p in run["curve"]]
        steps = [p["env_steps"] / 1e6 for p in run["curve"]]
        returns = [p["return"] for p in run["curve"]]
        axes[0].plot(gens, returns, label=f"seed {run['seed']}")
        axes[1].plot(steps, returns, label=f"seed {run['seed']}")
    for ax, xlabel in zip(axes, ("generation", "environment steps (millions)")):
        for (label, value), style in zip(lines.items(), ("--", ":", "-.")):
            ax.axhline(value, color="k", ls=style, lw=1, label=label)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"return of the mean policy ({episodes} episodes)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    strategies = sorted({run.get("strategy", "OpenES") for run in runs})
    fig.suptitle(f"{', '.join(strategies)} on {env}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _strategy_name(run: dict) -> str:
    """The strategy of a saved run (runs saved before strategies were named in configs are OpenES)."""
    return run["config"]["strategy"].get("name", "OpenES")


def _fmt(x: float) -> str:
    return f"{x:,.1f}"


def _matches(value: float, reference: float | None) -> str:
    """"yes"/"no": ``value`` reaches ``reference`` up to float32 averaging error ("—": no reference)."""
    if reference is None:
        return "—"
    return "yes" if value >= reference - 1e-5 * max(1.0, abs(reference)) else "no"


ENV_ORDER = ["CartPole-v1", "Pendulum-v1", "MountainCarContinuous-v0", "Breakout-MinAtar", "Asterix-MinAtar"]


def _env_order(env: str) -> tuple[int, str]:
    return (ENV_ORDER.index(env), "") if env in ENV_ORDER else (len(ENV_ORDER), env)


def write_report(runs: dict[str, list[dict]], device: str, notes_path: Path | None,
                 strategy_runs: dict[str, list[dict]] | None = None) -> str:
    from experiments.bench.common import markdown_table

    envs = sorted(runs, key=_env_order)
    rows = []
    for env in envs:
        rs = sorted(runs[env], key=lambda r: r["seed"])
        finals = np.array([r["final_return_mean"] for r in rs])
        ref = REFERENCES.get(env)
        bests = np.array([r["best_reference_test_return"] for r in rs])
        verdict, best_verdict = (_matches(returns.mean(), ref) for returns in (finals, bests))
        rows.append([
            f"`{env}`",
            _strategy_name(rs[0]),
            f"**{_fmt(finals.mean())} ± {_fmt(finals.std())}**",
            "—" if ref is None else f"{_fmt(ref)} ({REFERENCE_SOURCES[env]})",
            verdict,
            ", ".join(_fmt(f) for f in finals),
            f"{_fmt(bests.mean())} ± {_fmt(bests.std())}",
            best_verdict,
            rs[0]["generations"],
            f"{rs[0]['popsize']}",
            f"{np.mean([r['env_steps'] for r in rs]) / 1e6:,.1f} M",
            f"{np.mean([r['wall_s'] / len(r.get('trained_with_seeds', [r['seed']])) for r in rs]):,.0f} s",
        ])
        plot(env, rs, DOCS / "img" / f"{env}.png")
    table = markdown_table(
        ["environment", "strategy", "return (mean ± std over seeds)", "reference (best published ES)", "matched",
         "per seed", f"best of per-segment {REFERENCE_TEST_EPISODES}-episode evaluations",
         "matched (that statistic)", "generations", "popsize", "env steps / seed", "wall time per seed"],
        rows,
    )
    published = markdown_table(
        ["environment", "source", "method", "return", "protocol"],
        [[f"`{env}`", source, method, _fmt(value), protocol]
         for env in envs for source, method, value, protocol in PUBLISHED.get(env, [])],
    )
    seeds = sorted({r["seed"] for rs in runs.values() for r in rs})
    eval_episodes = "/".join(str(n) for n in sorted({r["eval_episodes"] for rs in runs.values() for r in rs}))
    parts = [
        "# Results on gymnax environments",
        "",
        "Generated by `python -m experiments.reproduce` from the configs in `experiments/configs/` "
        "(do not edit by hand; notes come from `experiments/results_notes.md`).",
        "",
        f"- **Return**: the mean parameters after the last generation, evaluated on {eval_episodes} fresh "
        "episodes per seed whose keys are never used in training (observation statistics frozen at their "
        "trained values); the table gives mean ± std over seeds of those per-seed means.",
        f"- **Seeds**: {', '.join(map(str, seeds))}. **Env steps**: environment transitions taken by the training population "
        "(counted exactly, before each episode's end). **Wall time**: training only (all `es.evolve` "
        "calls, including compilation), not the evaluations; seeds trained together as one program "
        "(`es.evolve_many`, `trained_with_seeds` in their JSON) share its time, and the column gives that time "
        "divided by the number of seeds.",
        f"- **Device**: {device}. The machine's 2 cores may have been shared with other jobs while these ran, so "
        "wall times are noisy upper bounds.",
        "- **Reference**: classic control, the returns of the gymnax-blines ES checkpoints "
        "(github.com/RobertTLange/gymnax-blines, `agents/<env>/es.pkl`). Its training script reports the "
        f"best of several evaluations of the mean on {REFERENCE_TEST_EPISODES} test episodes (one every 5 "
        "generations), a maximum over noisy estimates and so an optimistic one; the column \"best of "
        f"per-segment {REFERENCE_TEST_EPISODES}-episode evaluations\" computes that statistic for our runs "
        "(one evaluation after every segment, on held-out episodes), for a like-for-like comparison. The "
        "\"return\" column, one evaluation of the final mean, is the stricter number and the one we quote. "
        "MinAtar: the best ES return in NeuroEvoBench (Lange et al. 2023); every published number we compare "
        "with is in the second table (the values as cited in the project's issue 12, not re-read from the paper).",
        "",
        table,
        "",
        "Published returns beside ours:",
        "",
        published,
        "",
    ]
    for env in envs:
        parts += [f"![{env}](img/{env}.png)", ""]
    if strategy_runs:
        parts += [
            "## Which strategy for which environment",
            "",
            "Each strategy at its own defaults (its dataclass's, not `tasks.default_strategy`'s) with the config's "
            "popsize, task options and generations, and the same evaluation "
            "(`python -m experiments.reproduce CONFIG --strategy NAME`); a strategy without such runs shows the "
            "config's own runs (the first table) if the config uses it. Mean ± std over seeds of the final return; "
            "the best in bold.",
            "",
            comparison_table(strategy_runs, runs),
            "",
            *best_strategy_sentences(strategy_runs, runs),
            "",
        ]
    if notes_path is not None and notes_path.exists():
        parts += [notes_path.read_text().strip(), ""]
    return "\n".join(parts)
