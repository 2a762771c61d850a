"""es.run: segments equal one evolve call, checkpoints restore exactly or are refused, the log stays exact."""

import json
import pathlib
import shutil

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import sphere

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
        ({"w": jnp.zeros(7), "b": jnp.ones(2)}, r"\['w'\] is float32\[6\] in the checkpoint but float32\[7\] here"),
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


def test_a_checkpoint_whose_metadata_lacks_a_field_is_refused(tmp_path):
    state = initial_state()._replace(generation=jnp.int32(3))
    with es.checkpoint.Checkpointer(tmp_path, keep=1) as checkpointer:
        checkpointer.save(state, {"fitness_mean": np.arange(3, dtype=np.float32)}, CONFIG, "digest")
        checkpointer.wait()
        meta = tmp_path / "3" / "meta" / "metadata"
        record = json.loads(meta.read_text())
        for field in ("sha256", "config", "initial_sha256", "history"):
            meta.write_text(json.dumps({name: value for name, value in record.items() if name != field}))
            with pytest.raises(es.CheckpointError, match=rf"checkpoint .*3 is corrupt .*lacks the field {field}$"):
                checkpointer.restore(3, like=initial_state())


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
    chex.assert_trees_all_equal(resumed.state, reference(8)[0])


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
