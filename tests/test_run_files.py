"""tests/run_files.py (what `make test` runs): every file runs, a failure or a hang fails the run, never stalls it."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import run_files as runner

RUNNER = Path(__file__).parent / "run_files.py"

PASSING = "def test_passes():\n    assert 1 + 1 == 2\n"
FAILING = "def test_fails():\n    assert 1 + 1 == 3\n"
# Hangs, with a grandchild that would outlive a runner that killed only its direct child.
HANGING = (
    "import subprocess, sys, time\n"
    "def test_hangs(tmp_path):\n"
    "    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(613)'])\n"
    "    time.sleep(613)\n"
)


def run_files(tmp_path, files: dict, *args) -> subprocess.CompletedProcess:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return subprocess.run(
        [sys.executable, str(RUNNER), *args, "--log-dir", str(tmp_path / "logs"),
         *(str(tmp_path / name) for name in files)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )


def test_every_file_runs_and_one_failure_fails_the_run(tmp_path):
    result = run_files(tmp_path, {"test_a.py": PASSING, "test_b.py": FAILING, "test_c.py": PASSING})
    assert result.returncode == 1, result.stdout
    assert "==== test_a.py: passed" in result.stdout and "==== test_c.py: passed" in result.stdout
    assert "==== test_b.py: FAILED" in result.stdout and "assert (1 + 1) == 3" in result.stdout
    assert result.stdout.rstrip().endswith("failed: test_b.py")


def test_all_passing_files_exit_zero(tmp_path):
    result = run_files(tmp_path, {"test_a.py": PASSING, "test_b.py": PASSING}, "--jobs", "1")
    assert result.returncode == 0, result.stdout
    assert "all 2 test files passed" in result.stdout


def test_a_marker_expression_selects_tests_and_a_file_left_without_any_passes(tmp_path):
    slow = "import pytest\n@pytest.mark.slow\ndef test_slow():\n    assert False, 'deselected'\n"
    result = run_files(tmp_path, {"test_a.py": PASSING + slow, "test_b.py": slow}, "-m", "not slow")
    assert result.returncode == 0, result.stdout
    assert "==== test_b.py: passed" in result.stdout and "1 deselected" in result.stdout


@pytest.mark.slow
def test_a_hanging_file_is_killed_with_its_children_at_the_timeout(tmp_path):
    started = time.monotonic()
    result = run_files(tmp_path, {"test_hang.py": HANGING, "test_ok.py": PASSING}, "--timeout", "5")
    assert time.monotonic() - started < 60
    assert result.returncode == 1, result.stdout
    assert "==== test_hang.py: TIMED OUT after 5 s" in result.stdout
    assert "==== test_ok.py: passed" in result.stdout
    sleepers = subprocess.run(["pgrep", "-f", "time.sleep\\(613\\)"], capture_output=True, text=True).stdout
    assert not sleepers.strip(), f"the hanging file's processes outlived the timeout: {sleepers}"


def test_light_files_named_together_share_one_process_and_the_others_run_alone():
    names = ("test_zzz_new.py", "test_validation.py", "test_invariance.py", "test_compat.py", "test_aaa_new.py")
    assert {"test_compat.py", "test_validation.py"} <= set(runner.TOGETHER[1])
    assert runner.START_FIRST.index("test_invariance.py") < runner.START_FIRST.index("test_validation.py")
    assert runner.ordered([Path(n) for n in names]) == [  # a group goes where its first START_FIRST file puts it
        (Path("test_invariance.py"),), (Path("test_compat.py"), Path("test_validation.py")),
        (Path("test_aaa_new.py"),), (Path("test_zzz_new.py"),)]
    together = [name for group in runner.TOGETHER for name in group]
    assert len(together) == len(set(together)) and all((runner.TESTS / name).is_file() for name in together)
    assert all((runner.TESTS / name).is_file() for name in runner.START_FIRST)


def test_the_tests_cache_is_trimmed_to_its_limit_least_recently_written_first(tmp_path):
    for age, name in enumerate(["old-cache", "sub/older-than-new.pkl", "new-cache"]):
        path = tmp_path / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"x" * 100)
        os.utime(path, (1000.0 + age, 1000.0 + age))
    assert runner.trim_cache(tmp_path, max_bytes=250) == 1
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == [
        "new-cache", "sub/older-than-new.pkl"]
    assert runner.trim_cache(tmp_path / "absent") == 0
