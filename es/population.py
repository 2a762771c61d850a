"""Who is who in a population: member indices, antithetic pairs and shared keys.

Every device derives the same keys from the run key, so any device can rebuild
any member's perturbation without receiving it::

    generation_key = fold_in(run_key, generation)
    noise key of noise vector j  = fold_in(fold_in(generation_key, 0), j)
    eval key of member i         = fold_in(fold_in(generation_key, 1), i)

With antithetic sampling, members ``2j`` and ``2j + 1`` share noise vector ``j``
with signs ``+1`` and ``-1``; without it, member ``i`` owns noise vector ``i``.
All functions here are pure and work on traced integers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_NOISE_STREAM = 0
_EVAL_STREAM = 1


def noise_index(member: jax.Array, antithetic: bool) -> jax.Array:
    """Index of the noise vector member ``member`` uses (int32, any shape)."""
    return member // 2 if antithetic else member


def noise_sign(member: jax.Array, antithetic: bool) -> jax.Array:
    """+1 or -1 (float32): the sign member ``member`` applies to its noise vector."""
    member = jnp.asarray(member)
    if not antithetic:
        return jnp.ones(member.shape, jnp.float32)
    return (1 - 2 * (member % 2)).astype(jnp.float32)


def generation_key(run_key: jax.Array, generation: jax.Array) -> jax.Array:
    """The key every draw of generation ``generation`` descends from."""
    return jax.random.fold_in(run_key, generation)


def noise_key(gen_key: jax.Array, index: jax.Array) -> jax.Array:
    """Key of noise vector ``index`` in the generation of ``gen_key``."""
    return jax.random.fold_in(jax.random.fold_in(gen_key, _NOISE_STREAM), index)


def eval_key(gen_key: jax.Array, member: jax.Array) -> jax.Array:
    """Key passed to ``fitness_fn`` for member ``member``."""
    return jax.random.fold_in(jax.random.fold_in(gen_key, _EVAL_STREAM), member)
