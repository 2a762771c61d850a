"""es.run: segments equal one evolve call, checkpoints restore exactly or are refused, the log stays exact."""

import asyncio
import errno
import gc
import json
import pathlib
import shutil
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import sphere

import es
from es.runs.metrics_log import read_metrics

STRATEGY = es.OpenES(popsize=8, sigma=0.1, optimizer=optax.adam(0.05))
CONFIG = {"task": "sphere", "seed": 0}
SEGMENT = 4  # every test compiles segments of 4 and 2 generations only (plus one reference call)


def initial_state(seed=0, params=None):
    params = {"w": jnp.linspace(-1.0, 1.0, 6), "b": jnp.ones(2)} if params is None else params
    return STRATEGY.init(jax.random.key(seed), params)


def run(run_dir, generations, state=None, **kwargs):
    kwargs = {"segment": SEGMENT, "config": CONFIG, "progress": False, **kwargs}
    return es.run(STRATEGY, sphere, initial_state() if state is None else state, generations, run_dir=run_dir,
                  **kwargs)


def reference(generations, state=None):
    """One uninterrupted evolve call, metrics on the host."""
    final, metrics = es.evolve(STRATEGY, sphere, initial_state() if state is None else state, generations)
    return final, {name: np.asarray(values) for name, values in metrics.items()}


def log_rows(run_dir):
    return read_metrics(pathlib.Path(run_dir) / "metrics.jsonl")


def assert_log_matches(run_dir, metrics, generations):
    rows = log_rows(run_dir)
    assert [row["generation"] for row in rows] == list(range(generations))
    for name, values in metrics.items():
        logged = np.array([row[name] for row in rows], dtype=values.dtype)
        np.testing.assert_array_equal(logged, values)  # exact: float32 round-trips through the JSON text


@pytest.mark.slow
def test_run_in_segments_equals_one_evolve_call_bit_for_bit(tmp_path):
    result = run(tmp_path, 10)  # segments of 4, 4 and 2
    final, metrics = reference(10)
    assert result.completed
    chex.assert_trees_all_equal(result.state, final)
    chex.assert_trees_all_equal(result.metrics, metrics)
    assert result.time_s.shape == (10,) and np.all(np.diff(result.time_s) >= 0)
    assert_log_matches(tmp_path, metrics, 10)
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()) == [4, 8, 10]
    chex.assert_trees_all_equal(es.load_params(tmp_path / "params.npz", like=final.params), final.params)
    chex.assert_trees_all_equal(es.load_params(tmp_path / "params.npz", like=final.params, best=True),
                                final.best_params)


def test_resume_continues_bit_for_bit_and_keeps_the_last_checkpoints(tmp_path):
    run(tmp_path, 6, keep_checkpoints=2)  # segments of 4 and 2
    result = run(tmp_path, 10, resume=True, keep_checkpoints=2)  # 2 (to 8), then 2
    final, metrics = reference(10)
    chex.assert_trees_all_equal(result.state, final)
    chex.assert_trees_all_equal(result.metrics, metrics)
    assert_log_matches(tmp_path, metrics, 10)
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()) == [8, 10]


def test_an_old_checkpoint_a_kill_left_half_deleted_is_removed_on_resume(tmp_path, caplog):
    run(tmp_path, 8)  # checkpoints 4 and 8
    (tmp_path / "checkpoints" / "4" / "_CHECKPOINT_METADATA").unlink()  # orbax was deleting 4 when killed
    result = run(tmp_path, 10, resume=True)  # keeps 3: orbax itself would delete nothing
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()) == [8, 10]
    assert "Metadata file does not exist" not in caplog.text
    final, metrics = reference(10)
    chex.assert_trees_all_equal(result.state, final)
    chex.assert_trees_all_equal(result.metrics, metrics)


def test_a_fresh_run_digests_its_initial_state_once(tmp_path, monkeypatch):
    digested = []
    monkeypatch.setattr(es.runs.resume, "state_digest", lambda state: digested.append(state) or "digest")
    run(tmp_path, 4)
    assert len(digested) == 1
    run(None, 4)  # nothing written: no digest needed
    assert len(digested) == 1


def test_log_has_every_generation_once_after_a_resume(tmp_path):
    """A run killed after logging a segment it had not checkpointed, mid-way through a line."""
    run(tmp_path, 8)
    shutil.rmtree(tmp_path / "checkpoints" / "8")  # the log is now 4 generations ahead of the checkpoint
    with open(tmp_path / "metrics.jsonl", "a") as log:
        log.write('{"generation": 8, "best_fit')  # and ends in half a line
    (tmp_path / "params.npz").unlink()
    result = run(tmp_path, 10, resume=True)
    final, metrics = reference(10)
    chex.assert_trees_all_equal(result.metrics, metrics)
    assert_log_matches(tmp_path, metrics, 10)
    assert (tmp_path / "metrics.jsonl").read_text().endswith("}\n")


def test_resume_restores_a_fitness_state_bit_for_bit(tmp_path):
    fitness = es.StatefulFitness(
        init=lambda: {"count": jnp.zeros((), jnp.float32), "mean": jnp.zeros(2)},
        evaluate=lambda p, k, s: (sphere(p, k) - 0.01 * jnp.sum(s["mean"]), p["b"]),
        update=lambda s, stats: {"count": s["count"] + 1, "mean": 0.5 * s["mean"] + 0.5 * stats.mean(0)},
    )
    state = STRATEGY.init(jax.random.key(3), {"w": jnp.linspace(-1.0, 1.0, 6), "b": jnp.ones(2)}, fitness=fitness)
    uninterrupted = es.run(STRATEGY, fitness, state, 8, run_dir=tmp_path / "a", segment=SEGMENT, progress=False)
    es.run(STRATEGY, fitness, state, 4, run_dir=tmp_path / "b", segment=SEGMENT, progress=False)
    resumed = es.run(STRATEGY, fitness, state, 8, run_dir=tmp_path / "b", segment=SEGMENT, progress=False,
                     resume=True)
    chex.assert_trees_all_equal(resumed, uninterrupted._replace(time_s=resumed.time_s))
    assert float(resumed.state.fitness_state["count"]) == 8


@pytest.mark.parametrize("key", [jax.random.key(7), jax.random.PRNGKey(7)], ids=["typed", "raw"])
def test_checkpoints_restore_the_same_kind_of_key(tmp_path, key):
    state = initial_state()._replace(key=key, generation=jnp.int32(5))
    history = {"fitness_mean": np.arange(5, dtype=np.float32), "num_invalid": np.zeros(5, np.int32)}
    with es.checkpoint.Checkpointer(tmp_path, keep=1) as checkpointer:
        checkpointer.save(state, history, CONFIG, "digest")
        checkpointer.wait()
        restored = checkpointer.restore(5, like=initial_state()._replace(key=key))
    assert restored.state.key.dtype == key.dtype
    chex.assert_trees_all_equal(restored.state, state)
    chex.assert_trees_all_equal(restored.history, history)
    assert (restored.generation, restored.config, restored.initial_digest) == (5, CONFIG, "digest")


def test_resume_refuses_a_checkpoint_of_another_config(tmp_path):
    run(tmp_path, 4)
    with pytest.raises(es.CheckpointError, match=r"made by another run: config.seed: checkpoint has 0, this run has 1"):
        run(tmp_path, 6, resume=True, config={"task": "sphere", "seed": 1})


@pytest.mark.parametrize(
    "params, fragment",
    [
        ({"w": jnp.zeros(7), "b": jnp.ones(2)}, r"\['w'\] is float32\[6\] in the checkpoint but float32\[7\] here.*"
                                                 r"other params, another strategy or popsize, or another optimizer"),
        ({"w": jnp.zeros(6), "c": jnp.ones(2)}, r"the checkpoint has .*\['b'\].*which this run lacks"),
        ({"w": jnp.zeros(6, jnp.bfloat16), "b": jnp.ones(2)}, r"\['w'\] is float32\[6\] in the checkpoint but bfloat16"),
    ],
    ids=["shape", "structure", "dtype"],
)
def test_resume_refuses_a_checkpoint_of_other_params(tmp_path, params, fragment):
    run(tmp_path, 4)
    with pytest.raises(es.CheckpointError, match=fragment):
        run(tmp_path, 6, resume=True, state=initial_state(params=params))


def test_resume_refuses_another_initial_state(tmp_path):
    run(tmp_path, 4)
    with pytest.raises(es.CheckpointError, match="another initial state"):
        run(tmp_path, 6, resume=True, state=initial_state(seed=1))


def corrupt_checksum(path):
    meta = path / "meta" / "metadata"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "sha256": "0" * 64}))  # arrays no longer match


def corrupt_metadata(path):
    (path / "meta" / "metadata").write_text("{not json")


def corrupt_arrays(path):
    for data in (path / "arrays").rglob("*"):
        if data.is_file() and data.parent.name == "d":  # the array data files
            data.write_bytes(b"\x00garbage" * 8)


def test_reads_of_a_corrupt_checkpoint_that_nobody_awaits_print_nothing_and_other_failures_still_do(tmp_path,
                                                                                                       caplog):
    """Orbax reads a checkpoint's leaves in asyncio tasks and stops at the first failure (es's one warning); asyncio
    logged each other failed read, "Task exception was never retrieved" with a traceback, whenever the garbage
    collector reached its task (the CLI's output sometimes had one). Such tasks, failing as tensorstore does on
    garbage, log nothing once a run directory was opened, nor do the futures of a full disk's other array writes
    ("Future exception was never retrieved"); a task failing otherwise is still logged."""
    run(tmp_path, 2)  # opens a run directory: the filter is in place from here on

    async def fails(error):
        raise error

    loop = asyncio.new_event_loop()
    tasks = [loop.create_task(fails(ValueError('OUT_OF_RANGE: Error opening "cast" driver: Error opening "zarr" '
                                               'driver: Error reading "state.leaf_00015/.zarray"'))),
             loop.create_task(fails(KeyError("a failure of another kind"))), loop.create_future()]
    tasks[-1].set_exception(ValueError('RESOURCE_EXHAUSTED: Error opening "zarr" driver: Error writing '
                                       '"history.fitness_mean/.zarray": No space left on device'))
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    with caplog.at_level("ERROR", logger="asyncio"):
        del tasks
        gc.collect()
    logged = [record for record in caplog.records if record.name == "asyncio"]
    assert len(logged) == 1 and isinstance(logged[0].exc_info[1], KeyError), logged


# Orbax leaves an asyncio callback behind when tensorstore fails to read garbage; harmless here.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("corrupt", [corrupt_checksum, corrupt_metadata, corrupt_arrays])
def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one_with_a_warning(tmp_path, corrupt):
    run(tmp_path, 8)
    corrupt(tmp_path / "checkpoints" / "8")
    with pytest.warns(es.CheckpointWarning, match=r"checkpoints/8 is corrupt.*previous intact checkpoint.*/4 \(generation 4\)"):
        result = run(tmp_path, 10, resume=True)
    final, metrics = reference(10)
    chex.assert_trees_all_equal(result.state, final)  # generations 4..10 were run again
    assert_log_matches(tmp_path, metrics, 10)
    assert (tmp_path / "corrupt_checkpoints" / "8" / "meta").is_dir()  # kept aside, not deleted
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()) == [4, 8, 10]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_run_whose_every_checkpoint_is_corrupt_is_refused(tmp_path):
    run(tmp_path, 4)
    corrupt_checksum(tmp_path / "checkpoints" / "4")
    with pytest.raises(es.CheckpointError, match=r"no intact checkpoint.*checksum.*Start a new run"):
        run(tmp_path, 10, resume=True)


def snapshot(directory):
    """Every file under ``directory`` (path -> bytes) and every directory: to compare a run dir byte for byte."""
    directory = pathlib.Path(directory)
    return {str(p.relative_to(directory)): p.read_bytes() if p.is_file() else None for p in directory.rglob("*")}


def saved_checkpoint(directory, generation=3):
    """A checkpointer holding one checkpoint of ``generation`` (and its metadata file)."""
    checkpointer = es.checkpoint.Checkpointer(directory, keep=1)
    checkpointer.save(initial_state()._replace(generation=jnp.int32(generation)),
                      {"fitness_mean": np.arange(generation, dtype=np.float32)}, CONFIG, "digest")
    checkpointer.wait()
    return checkpointer, directory / str(generation) / "meta" / "metadata"


def test_damaged_metadata_that_still_parses_is_corrupt_not_another_run(tmp_path):
    checkpointer, meta = saved_checkpoint(tmp_path)
    with checkpointer:
        text = meta.read_text()
        record = json.loads(text)
        for damaged in (text.replace('"sphere"', '"sphure"'), text.replace('"digest"', '"digesu"'),
                        json.dumps({name: value for name, value in record.items() if name != "config"}),
                        json.dumps({name: value for name, value in record.items() if name != "record_sha256"})):
            meta.write_text(damaged)
            with pytest.raises(es.checkpoint.CorruptCheckpointError, match=r"3 is corrupt: its metadata"):
                checkpointer.restore(3, like=initial_state())
        meta.write_text(text)
        assert checkpointer.restore(3, like=initial_state()).generation == 3


def old_format(meta):
    """Rewrite a checkpoint's metadata as es-checkpoint-2 wrote it: the same fields, no checksum of its own."""
    record = json.loads(meta.read_text())
    del record["record_sha256"]
    meta.write_text(json.dumps({**record, "format": "es-checkpoint-2"}))


def test_a_checkpoint_of_an_earlier_format_is_refused_naming_the_change(tmp_path):
    checkpointer, meta = saved_checkpoint(tmp_path)
    with checkpointer:
        old_format(meta)
        with pytest.raises(es.CheckpointError, match=r"earlier version of es, in the format 'es-checkpoint-2' \("
                           r".*this version reads and writes 'es-checkpoint-3'.*Start a new run, or resume this one "
                           r"with the version of es that wrote it") as refused:
            checkpointer.restore(3, like=initial_state())
        assert not isinstance(refused.value, es.checkpoint.CorruptCheckpointError)  # refused, not skipped


def test_every_refusal_leaves_the_run_directory_byte_for_byte_as_it_was(tmp_path):
    run(tmp_path, 8)  # checkpoints 4 and 8
    corrupt_arrays(tmp_path / "checkpoints" / "8")  # a resume would fall back, and move 8 aside...
    before = snapshot(tmp_path)
    refusals = [  # ...but each of these is refused first
        (dict(resume=True, config={"task": "sphere", "seed": 1}), "made by another run"),
        (dict(resume=True, state=initial_state(seed=1)), "another initial state"),
        (dict(resume=True, state=initial_state(params={"w": jnp.zeros(7), "b": jnp.ones(2)})), "another structure"),
        (dict(resume=True, generations=2), "already done 4 generations"),
        (dict(generations=12), "already holds checkpoints up to generation 8"),
    ]
    for kwargs, message in refusals:
        with pytest.raises(ValueError, match=message):
            run(tmp_path, kwargs.pop("generations", 12), **kwargs)
        assert snapshot(tmp_path) == before, message
    old_format(tmp_path / "checkpoints" / "4" / "meta" / "metadata")
    before = snapshot(tmp_path)
    with pytest.raises(es.CheckpointError, match="earlier version of es"):
        run(tmp_path, 12, resume=True)
    assert snapshot(tmp_path) == before


def flip_bit(path, bit):
    data = bytearray(path.read_bytes())
    data[bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(bytes(data))


# Orbax leaves an asyncio callback behind when tensorstore fails to read garbage; harmless here.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.slow
def test_a_bit_flipped_anywhere_in_a_checkpoint_falls_back_or_changes_nothing_never_refuses(tmp_path):
    """A seeded sample of single-bit flips: a few in every file of the newest checkpoint, more in our metadata."""
    original = tmp_path / "original"
    run(original, 8)  # checkpoints 4 and 8
    final = reference(8)[0]
    files = sorted(p for p in (original / "checkpoints" / "8").rglob("*") if p.is_file())
    assert len(files) >= 10  # orbax's own files and ours, metadata and arrays
    rng = np.random.default_rng(0)
    outcomes = {"fell back": 0, "unchanged": 0}
    for number, file in enumerate(files):
        for flip in range(8 if file.name == "metadata" else 2):
            run_dir = tmp_path / f"{number}-{flip}"
            shutil.copytree(original, run_dir)
            target = run_dir / file.relative_to(original)
            flip_bit(target, int(rng.integers(target.stat().st_size * 8)))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = run(run_dir, 8, resume=True)
            skipped = [w for w in caught if issubclass(w.category, es.CheckpointWarning)]
            chex.assert_trees_all_equal(result.state, final)
            if skipped:
                assert len(skipped) == 1 and "checkpoints/8 is corrupt" in str(skipped[0].message)
                assert (run_dir / "corrupt_checkpoints" / "8").is_dir()
                outcomes["fell back"] += 1
            else:
                outcomes["unchanged"] += 1
    assert outcomes["fell back"] > 0, outcomes


def test_a_run_directory_in_use_is_not_overwritten(tmp_path):
    run(tmp_path, 4)
    with pytest.raises(ValueError, match="already holds checkpoints up to generation 4.*resume=True"):
        run(tmp_path, 8)
    with pytest.raises(es.CheckpointError, match="already done 4 generations"):
        run(tmp_path, 2, resume=True)


def test_bad_run_arguments_are_refused_before_running(tmp_path):
    for kwargs, error, fragment in [
        ({"segment": 0}, ValueError, "segment"),
        ({"keep_checkpoints": 1.5}, TypeError, "keep_checkpoints"),
        ({"config": {"f": sphere}}, TypeError, "JSON"),
        ({"resume": "yes"}, TypeError, "resume"),
    ]:
        with pytest.raises(error, match=fragment):
            run(tmp_path, 3, **kwargs)
    assert not (tmp_path / "checkpoints").exists()


def test_on_segment_sees_each_segment_with_its_state_and_metrics(tmp_path):
    seen = []

    def on_segment(segment):
        seen.append((segment.start, segment.stop, int(segment.state.generation), len(segment.metrics["fitness_mean"])))
        assert len(log_rows(tmp_path)) == segment.stop  # logged before the hook runs

    result = run(tmp_path, 10, on_segment=on_segment)
    assert seen == [(0, 4, 4, 4), (4, 8, 8, 4), (8, 10, 10, 2)]
    assert result.completed


def test_an_on_segment_error_ends_the_run_and_the_checkpoint_stays(tmp_path):
    def fail_after_the_first(segment):
        if segment.stop > 4:
            raise RuntimeError("dashboard unreachable")

    with pytest.raises(RuntimeError, match="dashboard unreachable"):
        run(tmp_path, 12, on_segment=fail_after_the_first)
    resumed = run(tmp_path, 12, resume=True)
    chex.assert_trees_all_equal(resumed.state, reference(12)[0])


def test_resume_refuses_another_strategy_setting_or_batch_size(tmp_path):
    run(tmp_path, 4)
    other = es.OpenES(popsize=8, sigma=0.2, optimizer=optax.adam(0.05))
    with pytest.raises(es.CheckpointError, match=r"strategy.sigma: checkpoint has 0.1, this run has 0.2"):
        es.run(other, sphere, initial_state(), 8, run_dir=tmp_path, segment=SEGMENT, config=CONFIG, resume=True,
               progress=False)
    with pytest.raises(es.CheckpointError, match=r"execution.update_batch_size: checkpoint has \d+, this run has 3"):
        run(tmp_path, 8, resume=True, update_batch_size=3)
    resumed = run(tmp_path, 8, resume=True, mesh=es.make_mesh(8))  # the mesh may change
    straight = reference(8)[0]
    # The fitness values of a generation, which the stopping history records, may differ in the last bit across
    # device counts for this fitness (XLA compiles each device's evaluation within the mesh's program; the same
    # holds for the fitness metrics, as before the history existed). What the update makes of them does not.
    chex.assert_trees_all_equal(resumed.state._replace(stop_history=None), straight._replace(stop_history=None))
    np.testing.assert_allclose(resumed.state.stop_history.best, straight.stop_history.best, rtol=1e-6)


@pytest.mark.slow
def test_an_snes_run_checkpointed_before_temperature_existed_resumes_and_a_set_temperature_is_checked(tmp_path):
    snes = es.SNES(popsize=8, sigma=0.1)
    assert "temperature" not in snes.describe()  # what checkpoints written before the setting existed hold
    assert es.SNES(popsize=8, sigma=0.1, temperature=30.0).describe()["temperature"] == 30.0
    state = snes.init(jax.random.key(0), jnp.ones(4))
    kwargs = dict(run_dir=tmp_path, segment=SEGMENT, config=CONFIG, progress=False)
    es.run(snes, sphere, state, 4, **kwargs)
    resumed = es.run(snes, sphere, state, 6, resume=True, **kwargs)
    assert int(resumed.state.generation) == 6
    with pytest.raises(es.CheckpointError, match=r"strategy.temperature is only in this run \(30.0\)"):
        es.run(es.SNES(popsize=8, sigma=0.1, temperature=30.0), sphere, state, 8, resume=True, **kwargs)


def test_run_and_run_many_share_their_options_and_defaults():
    import dataclasses
    import inspect

    defaults = {f.name: f.default for f in dataclasses.fields(es.runs.options.RunOptions)
                if f.default is not dataclasses.MISSING}
    for entry in (es.run, es.run_many):
        shared = {name: parameter.default for name, parameter in inspect.signature(entry).parameters.items()
                  if name in defaults}
        assert shared == {name: default for name, default in defaults.items() if name in shared}, entry.__name__
        assert set(defaults) - set(shared) <= {"on_start"}, entry.__name__


def assert_consistent(run_dir):
    """Nothing half-written: no temporary files, and the log ends exactly at the newest complete checkpoint."""
    leftovers = [p.name for p in run_dir.rglob("*") if p.name.endswith(".tmp") or "orbax-checkpoint-tmp" in p.name]
    assert not leftovers, leftovers
    checkpointed = es.checkpoint.Checkpointer.generations_on_disk_of(run_dir / "checkpoints")
    text = (run_dir / "metrics.jsonl").read_text() if (run_dir / "metrics.jsonl").exists() else ""
    assert text == "" or text.endswith("\n")
    assert len(text.splitlines()) == (checkpointed[-1] if checkpointed else 0)


def test_temporary_directories_that_a_failed_writes_other_arrays_create_later_are_removed_too(tmp_path):
    """After a failed write orbax stops waiting, and tensorstore's writes of the other arrays may still create the
    checkpoint's temporary directories (seen once in 40 full-disk runs on a loaded machine): they are removed
    until none has appeared for ``SETTLE_S``; one that keeps reappearing ends the wait after ``4 * SETTLE_S``."""
    import threading
    import time

    from es import compat
    from es.runs.checkpoint import SETTLE_S, Checkpointer

    partial = tmp_path / f"8{compat.orbax_tmp_suffix()}" / f"arrays{compat.orbax_tmp_suffix()}"

    def write_partial():
        try:
            partial.mkdir(parents=True, exist_ok=True)
        except OSError:  # removed between mkdir's steps (FileExistsError, then not a directory): again next time
            pass

    late = threading.Timer(SETTLE_S / 5, write_partial)
    late.start()
    Checkpointer.remove_partial_writes(tmp_path, settle_s=SETTLE_S)
    late.join()
    assert list(tmp_path.iterdir()) == []
    stop = threading.Event()

    def again():
        while not stop.wait(0.005):
            write_partial()

    writer = threading.Thread(target=again)
    writer.start()
    start = time.monotonic()
    Checkpointer.remove_partial_writes(tmp_path, settle_s=SETTLE_S)
    elapsed = time.monotonic() - start
    stop.set()
    writer.join()
    assert 4 * SETTLE_S <= elapsed < 4 * SETTLE_S + 1.0


def test_a_full_disk_stops_the_run_with_the_path_and_cause_and_it_resumes_once_there_is_space(small_disk):
    disk, remount = small_disk
    with pytest.raises(es.RunDirError, match=rf"cannot write {disk}/run/\S+: No space left on device\. Nothing "
                                             r"half-written is left: .* holds the run up to its newest complete "
                                             r"checkpoint \(generation \d+\)\. Free space") as stopped:
        run(disk / "run", 12)
    assert stopped.value.errno == errno.ENOSPC
    assert_consistent(disk / "run")
    remount("size=8m")
    result = run(disk / "run", 12, resume=True)
    final, metrics = reference(12)
    chex.assert_trees_all_equal(result.state, final)
    assert_log_matches(disk / "run", metrics, 12)


def test_a_read_only_run_directory_is_refused_with_the_cause_and_left_as_it_was(small_disk):
    disk, remount = small_disk
    remount("size=8m")
    run(disk / "run", 4)
    remount("ro")
    before = snapshot(disk / "run")
    with pytest.raises(es.RunDirError, match=rf"cannot write {disk}/run/\S+: Read-only file system\."):
        run(disk / "run", 8, resume=True)
    assert snapshot(disk / "run") == before
    remount("rw")
    result = run(disk / "run", 8, resume=True)
    chex.assert_trees_all_equal(result.state, reference(8)[0])


def test_run_many_of_no_runs_is_refused_in_its_own_name():
    with pytest.raises(ValueError, match=r"^es.run_many\(strategies=\[\]\): a sweep needs at least one run"):
        es.run_many([], sphere, [], 4)


def test_run_many_names_itself_in_the_sweep_checks_it_shares_with_evolve_many():
    state = initial_state()
    with pytest.raises(TypeError, match=r"^es.run_many\(states=\.\.\.\): got one es.State.*states=\[state\]"):
        es.run_many([STRATEGY], sphere, state, 4)
    snes = es.SNES(popsize=8)
    with pytest.raises(TypeError, match=r"^es.run_many: strategies\[1\] is SNES but strategies\[0\] is OpenES.*own "
                                        r"es.run_many call"):
        es.run_many([STRATEGY, snes], sphere, [state, snes.init(jax.random.key(1), state.params)], 4)
