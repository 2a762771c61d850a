"""es/compat.py gathers every private name of jax, orbax and optax that es uses; on the versions pyproject.toml
supports each takes its primary path (a moved name shows up here, not as a silent fallback)."""

import subprocess
import sys

import jax
import optax
import orbax.checkpoint as ocp

from es import compat


def test_the_supported_versions_are_the_ones_installed():
    assert jax.__version__.startswith("0.10."), jax.__version__
    assert ocp.__version__.startswith("0.12."), ocp.__version__
    assert optax.__version__.startswith("0.2."), optax.__version__


def test_orbax_names_its_temporary_directories_as_es_expects():
    assert compat.orbax_tmp_suffix() == compat.ORBAX_TMP_SUFFIX
    assert hasattr(ocp.CheckpointManager, "_maybe_await_cleanup_tmp_directory")


def test_jax_private_names_are_found():
    code = "from es import compat; print(compat.backends_are_initialized()); import jax; jax.devices(); " \
           "print(compat.backends_are_initialized())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]  # not None: the private query answers
    names = [env.name for env in compat.cluster_environments()]
    assert {"slurm", "ompi"} <= set(names)
    from jax._src import distributed

    assert hasattr(distributed.global_state, "client")


def test_optax_aliases_are_the_optimizers_by_name():
    aliases = compat.optax_aliases()
    assert {"adam", "sgd", "adamw", "rmsprop", "lion"} <= set(aliases)
    assert "chain" not in aliases and "apply_updates" not in aliases


def test_jax_persistent_cache_writes_can_be_held_back_on_one_thread():
    from jax._src import config

    before = config.persistent_cache_min_compile_time_secs.value
    with compat.no_persistent_cache_writes():
        assert config.persistent_cache_min_compile_time_secs.value == float("inf")  # the primary path
    assert config.persistent_cache_min_compile_time_secs.value == before
