"""Test setup: 8 emulated CPU devices, set before JAX creates its backend, and one compilation cache.

Every test process (``make test`` runs one per file, two at a time) keeps its compiled programs in JAX's
persistent compilation cache in ``.cache/jax`` at the repository's root (``$ES_COMPILATION_CACHE`` if set), so
a program that another file, or an earlier run, compiled is loaded instead of compiled again. The child
processes the tests start (CLI runs, ``es.launch`` ranks, workers) inherit it through JAX's own environment
variables. JAX's size limit is off for it (``-1``): with a limit, JAX lists and reads the whole directory at
every write, thousands of writes a suite; ``tests/run_files.py`` trims it once before the files start.
"""

import os
import pathlib

import chex

chex.set_n_cpu_devices(8)
os.environ.setdefault("ES_COMPILATION_CACHE", str(pathlib.Path(__file__).resolve().parents[1] / ".cache" / "jax"))

import jax  # noqa: E402
import pytest  # noqa: E402

import es  # noqa: E402

os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", "-1")  # no scan of the directory at every write
for name, value in es.compilation_cache.environment(es.enable_compilation_cache()).items():  # $ES_COMPILATION_CACHE
    os.environ.setdefault(name, value)  # and the same for the child processes the tests start
jax.config.update("jax_compilation_cache_max_size", int(os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"]))

NUM_DEVICES = 8


@pytest.fixture(scope="session", autouse=True)
def _eight_devices():
    assert jax.device_count() == NUM_DEVICES, "tests need 8 emulated CPU devices"
    yield


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs at ``tmp_path / "disk"`` and a function to remount it (``remount("ro")``, ``"size=8m"``);
    skipped where mounting is not permitted."""
    import subprocess

    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")

    def remount(options):
        subprocess.run(["mount", "-o", f"remount,{options}", str(mount_point)], check=True)

    try:
        yield mount_point, remount
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
