"""Sweeps of ``python -m experiments.train``: the grid of seeds and settings, and the sweep directory.

    python -m experiments.train CONFIG.yaml --seeds 0-7 --sweep strategy.sigma=0.05,0.1

``--seeds`` takes ranges and lists (``0-7``, ``0,3,5``, ``0-3,8``); each
``--sweep KEY=V1,V2,...`` names a ``strategy`` key and its values (YAML, so
``--sweep 'strategy.sigma={schedule: ...},{schedule: ...}'`` works too);
several ``--sweep`` flags span their product. Every setting runs with every
seed, all runs in one ``es.run_many`` program. The sweep directory holds::

    SWEEP_DIR/
      sweep.yaml                              the base config, the seeds, the swept values, the runs
      strategy.sigma=0.05_seed0/ ...          one run directory per run (as a single run writes it)
      comparison.png                          per setting: mean and spread over the seeds
"""

from __future__ import annotations

import itertools
import pathlib
import re
from typing import Any, NamedTuple

from experiments import config as config_lib
from experiments.config import ConfigError

SWEEP_NAME = "sweep.yaml"
COMPARISON_NAME = "comparison.png"
OPTIMIZER_PREFIX = "strategy.optimizer"


class Run(NamedTuple):
    """One run of a sweep.

    Attributes:
      name: its directory's name inside the sweep directory.
      seed: its ``run.seed``.
      setting: swept key -> value (empty when only seeds vary).
      config: its resolved config (the base config with ``setting`` and ``seed``).
    """

    name: str
    seed: int
    setting: dict
    config: dict


def parse_seeds(text: str) -> list[int]:
    """``"0-7"``, ``"0,3,5"``, ``"0-3,8"`` -> the seeds, in order, each once; raises ``ConfigError``."""
    seeds = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not match or (match[2] is not None and int(match[2]) < int(match[1])):
            raise ConfigError(f"--seeds {text!r}: give seeds >= 0 as a range or a list, e.g. --seeds 0-7 or "
                              "--seeds 0,3,5 or --seeds 0-3,8.")
        low = int(match[1])
        high = low if match[2] is None else int(match[2])
        seeds += [seed for seed in range(low, high + 1) if seed not in seeds]
    return seeds


def parse_sweep(texts: list[str]) -> dict[str, list]:
    """``["strategy.sigma=0.05,0.1", ...]`` -> ``{"strategy.sigma": [0.05, 0.1], ...}``; raises ``ConfigError``."""
    axes = {}
    for text in texts:
        key, equals, values = text.partition("=")
        key = key.strip()
        if not equals or not values.strip():
            raise ConfigError(f"--sweep {text!r} must look like strategy.KEY=VALUE,VALUE,..., e.g. "
                              "--sweep strategy.sigma=0.05,0.1.")
        if not key.startswith("strategy."):
            raise ConfigError(
                f"--sweep {key}: a sweep varies strategy settings (its runs share the task and the run "
                "settings; seeds go in --seeds); sweep a strategy.KEY, or start separate runs."
            )
        if key in axes:
            raise ConfigError(f"--sweep {key} is given twice; give all its values in one --sweep {key}=V1,V2,...")
        parsed = config_lib.parse_yaml(f"[{values}]", f"the values of --sweep {key}")
        if len(parsed) < 1 or any(parsed.count(v) > 1 for v in parsed):
            raise ConfigError(f"--sweep {key}: give distinct values, e.g. --sweep {key}=0.05,0.1 (got {values}).")
        axes[key] = parsed
    return axes


def grid(base: dict, seeds: list[int], axes: dict[str, list]) -> list[Run]:
    """Every setting (the product of the ``axes``) with every seed, settings first; configs resolved."""
    runs = []
    for values in itertools.product(*axes.values()):
        setting = dict(zip(axes, values))
        for seed in seeds:
            raw = config_lib.set_values(base, {**setting, "run.seed": seed}, "--sweep")
            runs.append(Run(run_name(setting, seed), seed, dict(setting), config_lib.resolve(raw)))
    return runs


def injects_hyperparams(axes: dict[str, list]) -> bool:
    """Whether the sweep varies the optimizer, whose runs then build it with ``optax.inject_hyperparams``."""
    return any(key == OPTIMIZER_PREFIX or key.startswith(OPTIMIZER_PREFIX + ".") for key in axes)


def setting_label(setting: dict) -> str:
    """``"strategy.sigma=0.05, strategy.weight_decay=0.01"`` (``"all runs"`` when only seeds vary)."""
    return ", ".join(f"{key}={_text(value)}" for key, value in setting.items()) or "all runs"


def run_name(setting: dict, seed: int) -> str:
    """The directory name of a run: its setting and seed, in characters safe for any filesystem."""
    parts = [f"{key}={_text(value)}" for key, value in setting.items()] + [f"seed{seed}"]
    return re.sub(r"[^A-Za-z0-9._=+-]+", "-", "_".join(parts)).strip("-")


def _text(value: Any) -> str:
    return config_lib.dump(value).strip().removesuffix("...").strip() if isinstance(value, (dict, list)) else str(value)


# --------------------------------------------------------------------------- the sweep directory


def is_sweep(directory) -> bool:
    return (pathlib.Path(directory) / SWEEP_NAME).is_file()


def manifest(base: dict, seeds: list[int], axes: dict[str, list], runs: list[Run]) -> str:
    """The text of ``sweep.yaml``: what ``--resume SWEEP_DIR`` and the comparison plot read back."""
    return config_lib.dump({
        "config": base,
        "seeds": seeds,
        "sweep": axes,
        "runs": [{"dir": run.name, "seed": run.seed, "setting": run.setting} for run in runs],
    })


def read_manifest(directory) -> tuple[dict, list[int], dict[str, list], list[dict]]:
    """``(base config, seeds, axes, runs)`` of a sweep directory; raises ``ConfigError``."""
    path = pathlib.Path(directory) / SWEEP_NAME
    stored = config_lib.load(path)
    missing = [key for key in ("config", "seeds", "sweep", "runs") if key not in stored]
    if missing:
        raise ConfigError(f"{path} lacks {missing}; it was not written by python -m experiments.train --seeds/--sweep.")
    return stored["config"], stored["seeds"], stored["sweep"], stored["runs"]


def groups(directory) -> dict[str, list[pathlib.Path]]:
    """The run directories of a sweep by setting label (the seeds of each setting), in the sweep's order."""
    directory = pathlib.Path(directory)
    by_setting: dict[str, list[pathlib.Path]] = {}
    for run in read_manifest(directory)[3]:
        by_setting.setdefault(setting_label(run["setting"]), []).append(directory / run["dir"])
    return by_setting

