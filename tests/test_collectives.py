"""What crosses devices, read from the compiled HLO (every strategy's fitness exchange at 100k params:
tests/test_strategies.py)."""

import re

import jax
import jax.numpy as jnp
from helpers import compiled_temp_bytes, sphere

import es

CONSTANT_BYTES = 64


GRADIENT_CASE = (es.OpenES(popsize=64, sigma=0.1), 10_000)
"""A strategy and a params count whose gradient exchange moves a params-sized all-reduce (two tests' program)."""


def test_gradient_exchange_moves_a_params_sized_vector():
    strategy, dim = GRADIENT_CASE
    state = strategy.init(jax.random.key(0), jnp.zeros(dim))
    report = es.collectives_report(strategy, sphere, state, es.make_mesh(8), exchange="gradient")
    assert report.max_bytes >= 10_000 * 4
    assert "all-reduce" in {c.op for c in report.collectives}


def test_one_device_has_no_collectives():
    strategy = es.OpenES(popsize=16, sigma=0.1)
    state = strategy.init(jax.random.key(0), jnp.zeros(100))
    report = es.collectives_report(strategy, sphere, state)
    assert report.crossing == () and report.total_bytes == 0, str(report)


def test_parse_collectives_reads_sync_and_async_ops():
    hlo = """
  %all-gather.1 = f32[256]{0} all-gather(f32[32]{0} %x), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}
  %ars = (f32[10]{0}, f32[80]{0}) all-gather-start(f32[10]{0} %y), replica_groups={{0,1},{2,3}}, dimensions={0}
  %agd = f32[80]{0} all-gather-done((f32[10]{0}, f32[80]{0}) %ars)
  %all-reduce.2 = (f32[3]{0}, s32[]) all-reduce(f32[3]{0} %a, s32[] %b), replica_groups={{0}}, to_apply=%sum
  %add.3 = f32[3]{0} add(f32[3]{0} %a, f32[3]{0} %a)
"""
    found = es.parallel.collectives.parse_collectives(hlo)
    assert [(c.op, c.bytes, c.group_size) for c in found] == [
        ("all-gather", 1024, 8),
        ("all-gather", 320, 2),
        ("all-reduce", 16, 1),
    ]
    report = es.CollectivesReport(8, found)
    assert report.total_bytes == 1024 + 320 and report.max_bytes == 1024


def test_the_report_reads_the_hlo_and_buffers_of_xlas_default_compile():
    """The report's program skips LLVM's optimisation (``REPORT_COMPILER_OPTIONS``): its optimised HLO, where the
    collectives are placed and combined, is the text of the program compiled with XLA's defaults, and its
    buffers are theirs (what tests read with ``helpers.compiled_temp_bytes``)."""
    from es.engine import execution
    from es.parallel import collectives

    strategy, dim = GRADIENT_CASE  # the report's program is the test above's
    state = strategy.init(jax.random.key(0), jnp.zeros(dim))
    mesh = es.make_mesh(8)
    fitness = es.fitness.adapter(sphere)
    _, resolved = execution.check_evolve_args(strategy, fitness, state, 1, mesh, "gradient")
    state = es.parallel.global_arrays.replicate(state, mesh)
    lowered = collectives._one_generation.lower(strategy.program(), fitness, mesh, resolved,
                                                strategy.hyperparameters(dim), state)
    report_text = es.compiled_generation_hlo(strategy, sphere, state, mesh, exchange="gradient")
    default = lowered.compile()
    assert without_debug_info(report_text) == without_debug_info(default.as_text())
    assert compiled_temp_bytes(lowered) == default.memory_analysis().temp_size_in_bytes > 0
    assert {c.op for c in collectives.parse_collectives(report_text)} >= {"all-gather", "all-reduce"}


def without_debug_info(hlo_text: str) -> str:
    """An optimised HLO module's computations without the source metadata of their instructions and the file
    and stack-frame tables before them: what XLA compiled, whichever call traced it."""
    return re.sub(r", metadata=\{[^}]*\}", "", hlo_text[hlo_text.index("\n%"):])
