"""Compiling a lowered program with XLA options that the installed XLA may not know.

``compile_with(lowered, options)`` is ``lowered.compile(options)`` less any option this XLA rejects (jax 0.11
dropped ``xla_cpu_use_fusion_emitters``): the program then compiles with XLA's default for it. es passes
options that change how fast a program compiles and how its machine code is optimised, not what it means:
es.minimize's loop (``es.engine.loop.compiler_options``) and the report's program, which never runs
(``es.parallel.collectives.REPORT_COMPILER_OPTIONS``).
"""

from __future__ import annotations

import jax


def compile_with(lowered: jax.stages.Lowered, options: dict | None) -> jax.stages.Compiled:
    """``lowered`` compiled with ``options`` (``None``: XLA's defaults), leaving out those this XLA does not know."""
    while True:
        try:
            return lowered.compile(options)
        except jax.errors.JaxRuntimeError as error:  # an XLA without an option: named in the error
            unknown = {name for name in options or () if f"'{name}'" in str(error)}
            if not unknown:
                raise
            options = {name: value for name, value in options.items() if name not in unknown}
