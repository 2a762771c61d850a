"""Train with any strategy from a YAML config: progress bar, metrics log, checkpoints, learning curve.

    python -m experiments.train CONFIG.yaml [--set section.key=VALUE ...] [--run-dir DIR]
    python -m experiments.train [CONFIG.yaml] --resume RUN_DIR [--set run.generations=400]
    python -m experiments.train CONFIG.yaml --seeds 0-7 [--sweep strategy.KEY=V1,V2,... ...] [--run-dir DIR]

The run directory (default ``runs/<config name>-<date>-<time>``) holds
``config.yaml`` (the resolved config), ``metrics.jsonl`` (one line per
generation), ``checkpoints/<generation>/`` (the last ``run.keep_checkpoints``),
``params.npz`` (final params and best params) and ``learning_curve.png``.
``--set`` values are YAML (``--set strategy.popsize=512``,
``--set 'strategy.sigma={schedule: cosine_decay, init_value: 1.0, decay_steps: 500}'``).
``--resume`` continues a stopped or killed run bit-identically; it may change
what ``es.run`` lets a resume change: ``run.generations``, ``run.segment``,
``run.keep_checkpoints``, and ``run.num_devices`` and ``run.exchange`` unless
the run uses (or switches to) ``exchange: gradient``.

``--seeds`` and ``--sweep`` run a grid as one program (``es.run_many``):
every ``--sweep`` setting (the product of several) with every seed. The
directory then is a sweep directory (``experiments/grid.py``): ``sweep.yaml``,
one run directory per run, named by its setting and seed, and
``comparison.png``, the mean and spread over the seeds of each setting.
``--resume SWEEP_DIR`` continues every run of the sweep. A sweep varies
``strategy`` keys only, and only numeric ones (``sigma``, ``weight_decay``,
an optimizer's ``learning_rate``...): those the runs of one program may
differ in; sweeping an optimizer argument builds every run's optimizer with
``optax.inject_hyperparams``.

Every CPU core this process may use is one JAX device unless XLA_FLAGS or
JAX_NUM_CPU_DEVICES says otherwise. Compiled programs are kept in JAX's
persistent compilation cache (``~/.cache/es/jax``, or ``$ES_COMPILATION_CACHE``;
``ES_COMPILATION_CACHE=off`` turns it off), so a second run compiles nothing
the first one compiled.

Under the launcher, ``python -m es.launch --processes N [--devices-per-process M]
-- python -m experiments.train CONFIG.yaml ...``, the N processes form one run
(``es.distributed.initialize``): the population is sharded over the devices of
every process (M each, 1 by default), only process 0 writes the run directory
and prints, and ``--resume`` works the same (every process reads the
checkpoint). A signal to the launcher or to any process stops every process
after the same segment.

``--resume RUN_DIR`` also works when ``RUN_DIR/config.yaml`` is lost: with
a CONFIG, that config (checked against the checkpoints); without one, the
task, strategy, seed and batch sizes recorded in the newest intact
checkpoint, every other ``run`` key at its default (``--set`` them). The
config is written back once the resume is accepted.

Exit status: 0 the run is complete; 2 a bad config or argument, or a
checkpoint that was refused (nothing ran, and the run directory is byte for
byte as it was); 74 the run directory cannot be written (no space left, a
read-only file system: the message names the file and the cause; nothing
half-written is left, and ``--resume RUN_DIR`` continues once it is fixed);
130 / 143 stopped by SIGINT / SIGTERM: the first signal checkpoints the segment
in progress (for a gymnasium task, the generation in progress) and stops, a
second stops at once, keeping the last checkpoint (continue with ``--resume
RUN_DIR`` either way); 1 anything else.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import sys
import time
import warnings

from experiments import config as config_lib
from experiments import grid
from experiments.devices import emulate_cpu_devices

CONFIG_NAME = "config.yaml"
EXIT_BAD_INPUT = 2
EXIT_CANNOT_WRITE = 74  # sysexits.h EX_IOERR: the run directory cannot be written (no space left, read-only)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("config", nargs="?", metavar="CONFIG.yaml", help="the experiment config")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                        help="override a config value, e.g. strategy.popsize=512 (repeatable)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    parser.add_argument("--run-dir", metavar="DIR", help="directory of a new run (default: runs/<config>-<time>)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--seeds", metavar="SEEDS",
                        help="run every seed of SEEDS (e.g. 0-7, 0,3,5 or 0-3,8) in one program: a sweep")
    parser.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...", dest="sweeps",
                        help="run every value of a strategy key, e.g. strategy.sigma=0.05,0.1 (repeatable: "
                             "their product), each with every seed, in one program")
    args = parser.parse_args(argv)
    if args.resume is not None and (args.seeds is not None or args.sweeps):
        parser.error("--resume SWEEP_DIR continues a sweep with the seeds and values it started with; "
                     "drop --seeds and --sweep")
    if args.config is None and args.resume is None:
        parser.error("give a CONFIG.yaml, or --resume RUN_DIR")
    if args.resume is not None and args.run_dir is not None:
        parser.error("--run-dir names a new run; --resume RUN_DIR continues an existing one (use one of them)")
    return args


def prepare(args: argparse.Namespace) -> tuple[pathlib.Path, dict, bool]:
    """``(run_dir, resolved config, resuming)``; raises ``ConfigError`` for any bad input."""
    if args.resume is not None:
        run_dir = pathlib.Path(args.resume)
        stored_path = run_dir / CONFIG_NAME
        if stored_path.is_file():
            stored = config_lib.resolve(config_lib.load(stored_path))
        elif run_dir.is_dir():  # lost: the checkpoints hold what determines the run (checked again on resume)
            stored = config_lib.resolve(_config_from_checkpoint(run_dir))
        else:
            raise config_lib.ConfigError(f"--resume {run_dir}: no such run directory.")
        config = config_lib.with_overrides(config_lib.load(args.config) if args.config else stored, args.overrides)
        _check_same_identity(run_dir, stored, config)
        return run_dir, config, True
    config = config_lib.with_overrides(config_lib.load(args.config), args.overrides)
    return new_run_dir(args), config, False


def _config_from_checkpoint(run_dir: pathlib.Path) -> dict:
    """The config of a run whose ``config.yaml`` is lost, from its newest intact checkpoint's metadata.

    The checkpoint holds what determines the run (``config_lib.identity``: task, strategy section, seed)
    and the batch sizes; the other ``run`` keys take their defaults (``--set`` changes them, e.g.
    ``run.generations``). ``es.run`` then checks this config against the checkpoint it resumes from.
    """
    from es.runs.checkpoint import CheckpointError, Checkpointer
    from es.runs.segments import CHECKPOINTS_NAME

    checkpointer = Checkpointer(run_dir / CHECKPOINTS_NAME, writer=False)
    try:
        reasons = []
        for generation in reversed(checkpointer.generations()):
            try:
                identity = checkpointer.record(generation)["config"]
            except CheckpointError as error:
                reasons.append(str(error))
                continue
            execution = identity["execution"]
            run = {key: execution[key] for key in ("eval_batch_size", "update_batch_size") if key in execution}
            if "gradient_exchange_devices" in execution:
                run.update(exchange="gradient", num_devices=execution["gradient_exchange_devices"])
            return config_lib.from_identity(identity["config"], run)
    finally:
        checkpointer.close()
    why = f": {'; '.join(reasons)}" if reasons else ""
    raise config_lib.ConfigError(
        f"--resume {run_dir}: no {CONFIG_NAME} there and no intact checkpoint to rebuild it from{why}; give the "
        "run directory experiments.train created."
    )


def new_run_dir(args: argparse.Namespace) -> pathlib.Path:
    """``--run-dir``, or ``runs/<config name>-<date>-<time>``; refused if it holds anything."""
    if args.run_dir is not None:
        run_dir = pathlib.Path(args.run_dir)
    else:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        run_dir = pathlib.Path("runs") / f"{pathlib.Path(args.config).stem}-{stamp}"
        suffix = 1
        while run_dir.exists():
            suffix += 1
            run_dir = run_dir.with_name(f"{pathlib.Path(args.config).stem}-{stamp}-{suffix}")
    if run_dir.exists() and any(run_dir.iterdir()):
        raise config_lib.ConfigError(
            f"--run-dir {run_dir} exists and is not empty; continue it with --resume {run_dir}, "
            "or choose another --run-dir."
        )
    return run_dir


def prepare_sweep(args: argparse.Namespace) -> tuple[pathlib.Path, dict, list[int], dict, list, bool]:
    """``(sweep_dir, base config, seeds, swept values, runs, resuming)``; raises ``ConfigError``."""
    if args.resume is not None:
        sweep_dir = pathlib.Path(args.resume)
        stored, seeds, axes, _ = grid.read_manifest(sweep_dir)
        stored = config_lib.resolve(stored)
        base = config_lib.with_overrides(config_lib.load(args.config) if args.config else stored, args.overrides)
        runs = grid.grid(base, seeds, axes)
        _check_same_identity(sweep_dir, grid.grid(stored, seeds, axes)[0].config, runs[0].config)
        return sweep_dir, base, seeds, axes, runs, True
    base = config_lib.with_overrides(config_lib.load(args.config), args.overrides)
    seeds = grid.parse_seeds(args.seeds) if args.seeds is not None else [base["run"]["seed"]]
    axes = grid.parse_sweep(args.sweeps)
    return new_run_dir(args), base, seeds, axes, grid.grid(base, seeds, axes), False


def _check_same_identity(run_dir: pathlib.Path, stored: dict, config: dict) -> None:
    """Refuse a resume whose config differs from the stored one in what determines the results."""
    old, new = config_lib.identity(stored), config_lib.identity(config)
    if old != new:
        from es.runs.checkpoint import describe_difference

        raise config_lib.ConfigError(
            f"--resume {run_dir}: the config differs from the run's in what determines its results: "
            f"{describe_difference(old, new, 'the run', 'now')}. A resume may change only how the run executes "
            "(run.generations, run.segment, run.keep_checkpoints, run.num_devices, run.exchange, as es.run "
            "allows); start a new run for anything else."
        )


def refuse_islands(config: dict) -> None:
    """``run.islands > 1`` is ``experiments.reproduce``'s protocol: train trains one run per seed (``ConfigError``)."""
    islands = config["run"]["islands"]
    if islands > 1:
        also = "" if config["run"]["sigma_after_islands"] is None else " --set run.sigma_after_islands=null"
        raise config_lib.ConfigError(
            f"run.islands = {islands}: islands (several runs per seed, the best by training fitness kept) are "
            "trained by python -m experiments.reproduce CONFIG; experiments.train trains one run per seed: "
            f"add --set run.islands=1{also}."
        )


def make_mesh(config: dict, popsize: int):
    """The mesh of ``run.num_devices`` devices: ``es.make_mesh``'s policy (null: the most that divide popsize)."""
    import es

    try:
        return es.make_mesh(config["run"]["num_devices"], popsize=popsize)
    except (TypeError, ValueError) as error:
        raise config_lib.ConfigError(f"run.num_devices / strategy.popsize: {error}") from None


def execution(config: dict) -> dict:
    """The keyword arguments of ``es.evolve``/``es.run`` that say how the run executes."""
    return {key: config["run"][key] for key in ("exchange", "eval_batch_size", "update_batch_size")}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    emulate_cpu_devices()  # before JAX starts its backend

    import es

    es.compilation_cache.enable_by_default()  # a later run of the same programs loads them ($ES_COMPILATION_CACHE)
    warnings.showwarning = _one_line_checkpoint_warnings(warnings.showwarning)

    try:  # joins the other processes under es.launch or srun; nothing in a plain process
        es.distributed.initialize()
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    sweeping = args.seeds is not None or bool(args.sweeps) or (args.resume is not None and grid.is_sweep(args.resume))
    error, prepared = (_prepare_sweep if sweeping else _prepare_run)(args)
    # Every process checks its inputs before process 0 writes anything (the others read config.yaml on resume).
    errors = es.distributed.all_processes("experiments.train/checked", error or "")
    if any(errors):
        if es.is_writer():  # each distinct error once
            for process, message in enumerate(errors):
                if message and message not in errors[:process]:
                    where = f"process {process}: " if len(errors) > 1 and process else ""
                    print(f"error: {where}{message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return (_train_sweep if sweeping else _train)(args, *prepared)


def _train(args, run_dir, config, resuming, task, strategy, fitness, state, mesh) -> int:
    """One run: ``es.run`` into ``run_dir``; the exit status."""
    import es

    run = config["run"]

    def on_start(generation: int) -> None:  # accepted: now the run directory may change
        if es.is_writer():
            _write_atomically(run_dir / CONFIG_NAME, config_lib.dump(config), make_parents=True)
            print(_header(config, strategy, mesh) + f"\nrun dir: {run_dir}" + _resuming(resuming, generation),
                  flush=True)

    start = time.perf_counter()
    try:
        result = es.run(
            strategy, fitness, state, run["generations"], run_dir=run_dir, segment=run["segment"],
            keep_checkpoints=run["keep_checkpoints"], config=config_lib.identity(config), resume=resuming,
            mesh=mesh, progress=not args.no_progress, description=config["task"]["name"], on_start=on_start,
            **execution(config),
        )
        if es.is_writer():
            _report(run_dir, result, time.perf_counter() - start)
    except es.CheckpointError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except es.RunDirError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_CANNOT_WRITE
    except (KeyboardInterrupt, SystemExit) as stopped:
        return _stopped_at_once(stopped, run_dir)
    return 0 if result.completed else 128 + result.stopped_by


def _stopped_at_once(stopped: BaseException, run_dir: pathlib.Path) -> int:
    """The exit status after a second signal stopped the run at once (``es.run`` raised ``KeyboardInterrupt`` or
    ``SystemExit(143)``), with a line saying what is left; any other ``SystemExit`` goes on."""
    import signal

    if isinstance(stopped, SystemExit) and stopped.code != 128 + signal.SIGTERM:
        raise stopped
    status = 128 + (signal.SIGINT if isinstance(stopped, KeyboardInterrupt) else signal.SIGTERM)
    print(f"\nstopped at once by a second {signal.Signals(status - 128).name}: {run_dir} keeps its last complete "
          f"checkpoint; continue with: python -m experiments.train --resume {run_dir}", file=sys.stderr, flush=True)
    return status


def _train_sweep(args, sweep_dir, base, seeds, axes, runs, resuming, strategies, fitness, states, mesh) -> int:
    """A sweep: ``es.run_many`` into one run directory per run of ``sweep_dir``; the exit status."""
    import es

    run = base["run"]
    run_dirs = [sweep_dir / each.name for each in runs]

    def on_start(generation: int) -> None:  # accepted: now the sweep directory may change
        if es.is_writer():
            _write_atomically(sweep_dir / grid.SWEEP_NAME, grid.manifest(base, seeds, axes, runs), make_parents=True)
            for each, run_dir in zip(runs, run_dirs):
                _write_atomically(run_dir / CONFIG_NAME, config_lib.dump(each.config), make_parents=True)
            settings = len(runs) // len(seeds)
            print(_header(base, strategies[0], mesh) + f"\n{len(runs)} runs in one program: seeds "
                  f"{','.join(map(str, seeds))}" + (f" x {settings} settings of {', '.join(axes)}" if axes else "")
                  + f"\nsweep dir: {sweep_dir}" + _resuming(resuming, generation), flush=True)

    start = time.perf_counter()
    try:
        results = es.run_many(
            strategies, fitness, states, run["generations"], run_dirs=run_dirs, segment=run["segment"],
            keep_checkpoints=run["keep_checkpoints"], configs=[config_lib.identity(each.config) for each in runs],
            resume=resuming, mesh=mesh, progress=not args.no_progress,
            description=f"{base['task']['name']} x{len(runs)}", on_start=on_start, **execution(base),
        )
        if es.is_writer():
            _report_sweep(sweep_dir, runs, results, time.perf_counter() - start)
    except es.CheckpointError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except es.RunDirError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_CANNOT_WRITE
    except (KeyboardInterrupt, SystemExit) as stopped:
        return _stopped_at_once(stopped, sweep_dir)
    return 0 if results[0].completed else 128 + results[0].stopped_by


def _one_line_checkpoint_warnings(show):
    """``warnings.showwarning`` that prints an ``es.CheckpointWarning`` (a checkpoint skipped) as one line."""
    import es

    if getattr(show, "one_line_checkpoint_warnings", False):
        return show

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, es.CheckpointWarning):
            print(f"warning: {message}", file=sys.stderr if file is None else file, flush=True)
        else:
            show(message, category, filename, lineno, file, line)

    showwarning.one_line_checkpoint_warnings = True
    return showwarning


def _resuming(resuming: bool, generation: int) -> str:
    return f" (resuming at generation {generation})" if resuming else ""


def _header(config: dict, strategy, mesh) -> str:
    """The first line a run prints: task, strategy, generations, devices."""
    import jax

    import es

    run = config["run"]
    options = ", ".join(f"{k}={v}" for k, v in config["task"]["options"].items())
    processes = es.distributed.process_count()
    where = f" in {processes} processes" if processes > 1 else ""
    return (f"{config['task']['name']}({options}) | {type(strategy).__name__} popsize {strategy.popsize} | "
            f"{run['generations']} generations in segments of {run['segment']} | {mesh.size} "
            f"{jax.default_backend()} device(s){where}")


def _prepare_run(args: argparse.Namespace):
    """``(error message, None)`` or ``(None, (run_dir, config, resuming, task, strategy, fitness, state, mesh))``."""
    from es.engine import check_evolve_args
    from es.fitness import adapter

    try:
        run_dir, config, resuming = prepare(args)
        refuse_islands(config)
        task, strategy = config_lib.build(config)
        fitness, state = config_lib.initial_state(task, strategy, config["run"]["seed"])
        mesh = make_mesh(config, strategy.popsize)
        check_evolve_args(strategy, adapter(fitness), state, config["run"]["generations"], mesh, **execution(config))
    except config_lib.ConfigError as error:
        return str(error), None
    except (TypeError, ValueError) as error:  # es's own checks of the strategy against the task
        return f"strategy / task: {error}", None
    return None, (run_dir, config, resuming, task, strategy, fitness, state, mesh)


def _prepare_sweep(args: argparse.Namespace):
    """``(error message, None)`` or ``(None, (sweep_dir, base, seeds, axes, runs, resuming, strategies, fitness,
    states, mesh))``."""
    from es.engine import check_evolve_many_args
    from es.fitness import adapter

    try:
        sweep_dir, base, seeds, axes, runs, resuming = prepare_sweep(args)
        refuse_islands(base)
        inject = grid.injects_hyperparams(axes)
        built = [config_lib.build(each.config, inject_hyperparams=inject) for each in runs]
        task = built[0].task  # a sweep varies strategy keys only: every run has this task
        strategies = [experiment.strategy for experiment in built]
        states = [config_lib.initial_state(task, strategy, each.seed)[1] for strategy, each in zip(strategies, runs)]
        mesh = make_mesh(base, strategies[0].popsize)
        check_evolve_many_args(strategies, adapter(task.fitness), states, base["run"]["generations"], mesh,
                               **execution(base))
    except config_lib.ConfigError as error:
        return str(error), None
    except (TypeError, ValueError) as error:  # es's checks of the runs against each other and the task
        return f"sweep: {error}", None
    return None, (sweep_dir, base, seeds, axes, runs, resuming, strategies, task.fitness, states, mesh)


def _write_atomically(path: pathlib.Path, text: str, make_parents: bool = False) -> None:
    """``path`` written whole or not at all (``es.RunDirError`` naming it and the cause otherwise)."""
    from es.runs import storage

    if make_parents:
        with storage.writing(path.parent):
            path.parent.mkdir(parents=True, exist_ok=True)
    storage.write_atomically(path, text)


def _plot(plot, output: pathlib.Path, *args) -> None:
    """``plot(*args, output)`` into a temporary file, renamed into place: a plot is whole or absent."""
    from es.runs import storage

    tmp = output.with_name(output.stem + ".tmp" + output.suffix)
    try:
        with storage.writing(output):
            plot(*args, tmp)
            os.replace(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)


def _report(run_dir: pathlib.Path, result, seconds: float) -> None:
    from experiments.plot import CURVE_NAME, plot_runs

    generations = int(result.state.generation)
    written = [CONFIG_NAME, f"metrics.jsonl ({generations} lines)", "checkpoints/"]
    if generations:
        _plot(plot_runs, run_dir / CURVE_NAME, [run_dir])
        written.append(CURVE_NAME)
    if result.completed:
        written.insert(3, "params.npz")
        best = result.metrics["best_fitness"][-1] if generations else float("nan")
        mean = result.metrics["fitness_mean"][-1] if generations else float("nan")
        print(f"done: {generations} generations in {seconds:.1f} s; best fitness {best:.6g}, "
              f"last population mean {mean:.6g}")
    else:
        import signal

        print(f"stopped by {signal.Signals(result.stopped_by).name} at generation {generations} (checkpointed); "
              f"continue with: python -m experiments.train --resume {run_dir}")
    print(f"wrote {run_dir}/: {', '.join(written)}")


def _report_sweep(sweep_dir: pathlib.Path, runs: list, results: list, seconds: float) -> None:
    from experiments.plot import CURVE_NAME, plot_runs, plot_sweep

    import numpy as np

    generations = int(results[0].state.generation)
    if generations:
        for each in runs:
            _plot(plot_runs, sweep_dir / each.name / CURVE_NAME, [sweep_dir / each.name])
        _plot(plot_sweep, sweep_dir / grid.COMPARISON_NAME, grid.groups(sweep_dir))
    if results[0].completed:
        print(f"done: {len(runs)} runs of {generations} generations in {seconds:.1f} s")
    else:
        import signal

        print(f"stopped by {signal.Signals(results[0].stopped_by).name} at generation {generations} (checkpointed); "
              f"continue with: python -m experiments.train --resume {sweep_dir}")
    if generations:
        by_setting: dict[str, list] = {}
        for each, result in zip(runs, results):
            by_setting.setdefault(grid.setting_label(each.setting), []).append(result.metrics)
        for label, metrics in by_setting.items():
            best = np.array([m["best_fitness"][-1] for m in metrics], float)
            mean = np.array([m["fitness_mean"][-1] for m in metrics], float)
            print(f"  {label}: best fitness {best.mean():.6g} ± {best.std():.3g}, last population mean "
                  f"{mean.mean():.6g} ± {mean.std():.3g} over {len(metrics)} seed(s)")
    written = [grid.SWEEP_NAME, f"{len(runs)} run directories"] + ([grid.COMPARISON_NAME] if generations else [])
    print(f"wrote {sweep_dir}/: {', '.join(written)}")


if __name__ == "__main__":
    sys.exit(main())
