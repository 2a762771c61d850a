"""Who is who in a population: member indices, antithetic pairs and shared keys.

Every device derives the same keys from the run key, so any device can rebuild
any member's perturbation without receiving it::

    generation_key = fold_in(run_key, generation)
    noise key of noise vector j  = fold_in(fold_in(generation_key, 0), j)
    eval key of member i         = fold_in(fold_in(generation_key, 1), i)

With common random numbers (``es.CommonRandomNumbers``) the members of an
antithetic pair share the eval key of index ``i // 2``, or the whole generation
shares the eval key of index 0.

With antithetic sampling, members ``2j`` and ``2j + 1`` share noise vector ``j``
with signs ``+1`` and ``-1``; without it, member ``i`` owns noise vector ``i``.
All functions here are pure and work on traced integers.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from es.engine.partition import apart
from es.noise import threefry
from es.noise.layout import Layout

_NOISE_STREAM = 0
_EVAL_STREAM = 1

EVAL_KEY_SHARING = ("member", "pair", "generation")
"""Who shares an eval key: each member its own, the two members of an antithetic pair, or the whole generation."""


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


def vector_keys(gen_key: jax.Array, count: int) -> jax.Array:
    """The keys of the generation's ``count`` noise vectors: ``noise_key(gen_key, j)`` for ``j < count``.

    For threefry keys (JAX's default) one unrolled hash of the ``count`` counters (``es.noise.threefry``), as
    ``jax.random.fold_in`` hashes them: the same keys as a ``vmap`` of ``noise_key``, without the rolled loop of
    five steps that JAX lowers its threefry to on a CPU, each step a few small kernels and copies (es.minimize's
    step: about 3% of a generation; its programs 0.89-1.03x the compile time; docs/benchmarks.md).
    """
    if not threefry.is_threefry(gen_key):
        return jax.vmap(noise_key, in_axes=(None, 0))(gen_key, jnp.arange(count))
    data = jax.random.key_data(jax.random.fold_in(gen_key, _NOISE_STREAM))
    x0, x1 = threefry.threefry2x32(data[0], data[1], jnp.zeros(count, jnp.uint32), jnp.arange(count, dtype=jnp.uint32))
    return jax.random.wrap_key_data(jnp.stack([x0, x1], axis=-1), impl=jax.random.key_impl(gen_key))


def eval_key(gen_key: jax.Array, member: jax.Array, shared_by: str = "member") -> jax.Array:
    """Key passed to ``fitness_fn`` for member ``member`` (``shared_by``: one of ``EVAL_KEY_SHARING``)."""
    index = {"member": member, "pair": member // 2, "generation": member * 0}[shared_by]
    return jax.random.fold_in(jax.random.fold_in(gen_key, _EVAL_STREAM), index)


def member_seed(key: jax.Array) -> jax.Array:
    """uint32 seed of the member whose evaluation key is ``key``: what an ``es.HostFitness`` passes ``fn``.

    ``key`` is ``eval_key(generation_key, member)``, the key a JAX fitness would
    receive; ``np.random.default_rng(seed)`` then gives the member reproducible
    randomness.
    """
    return jax.random.bits(key, (), jnp.uint32)


def compute_dtype(dtype) -> jnp.dtype:
    """The dtype members and updates are computed in for params of ``dtype``: float32, or float64 params'."""
    return jnp.promote_types(dtype, jnp.float32)


class Generation:
    """One generation's population, rebuilt on demand from shared keys (never stored).

    Member ``i`` is ``mean + scale * noise_sign(i) * eps_{noise_index(i)}``
    (``mean + noise_sign(i) * scale @ eps`` for a ``[D, D]`` scale), built in
    ``compute_dtype`` (float32, or float64 for float64 params) and cast to the
    params' dtype. ``scale`` is the strategy's: a scalar, ``float[D]`` or
    ``float[D, D]``. Used inside traced code only.

    Args:
      noise: the strategy's noise source; ``aux`` what its ``prepare`` built.
      key: this generation's key (``generation_key``).
      params: the mean (a pytree).
      scale: the strategy's ``scale`` this generation.
      antithetic: whether members come in ``+/-`` pairs.
      generation: the generation's number (int32 scalar), for messages about
        its members (``es.HostFitness`` names the generation that failed).
      vectors: how many noise vectors the generation has (``popsize``, or
        ``popsize / 2`` antithetic): their keys are derived once, here, and
        every use (evaluation, sums, the best member) reads them, where each
        use derived its own: the same keys, and about a tenth less compile
        time (docs/benchmarks.md).
    """

    def __init__(self, noise, aux, key, params, scale, antithetic: bool, generation=None, *, vectors: int):
        self.noise, self.aux, self.key = noise, aux, key
        self.vector_keys = vector_keys(key, vectors)
        self.generation = generation
        self.params, self.scale, self.antithetic = params, scale, antithetic
        self.flat, self.unravel = ravel_pytree(params)
        self.layout = Layout.of(params)
        self.dim = self.layout.dim
        self.dtype = compute_dtype(self.flat.dtype)

    def noise_keys(self, indices: jax.Array) -> jax.Array:
        """The keys of the noise vectors ``indices`` (any shape; a scalar index gives one key)."""
        return self.vector_keys[indices]

    def eval_keys(self, members: jax.Array, shared_by: str = "member") -> jax.Array:
        """The keys ``fitness_fn`` receives for ``members`` (``eval_key`` of each)."""
        return jax.vmap(functools.partial(eval_key, self.key, shared_by=shared_by))(members)

    def noise_vectors(self, indices: jax.Array) -> jax.Array:
        """float32[len(indices), D]: the noise vectors with those indices."""
        return jax.vmap(self.noise.sample, in_axes=(None, 0, None))(self.aux, self.noise_keys(indices), self.layout)

    def noise_rows(self, indices: jax.Array) -> jax.Array:
        """``noise_vectors(indices)``, drawn one vector per step of a loop: the same values, held in memory once
        for all the sums that read them. XLA would otherwise copy the draw (the hash and its transform) into each
        consumer's fused loop, a program several times larger for the same arithmetic (docs/benchmarks.md)."""
        return jax.lax.map(lambda key: self.noise.sample(self.aux, key, self.layout), self.noise_keys(indices))

    def step(self, sign: jax.Array, eps: jax.Array) -> jax.Array:
        """``scale * sign * eps`` (``sign * scale @ eps`` for a matrix scale): one member's offset from the mean."""
        if jnp.ndim(self.scale) == 2:
            return sign * jnp.matmul(self.scale, eps.astype(self.scale.dtype), precision=jax.lax.Precision.HIGHEST)
        return self.scale * sign * eps

    def perturb(self, sign: jax.Array, eps: jax.Array):
        """The params pytree ``mean + step(sign, eps)`` for one member."""
        return self.unravel((self.flat.astype(self.dtype) + self.step(sign, eps)).astype(self.flat.dtype))

    def members(self, members: jax.Array, pairs: bool = False):
        """The params of ``members`` (a pytree with leading axis ``len(members)``).

        ``pairs`` (antithetic only; ``members`` = ``2j, 2j+1, ...`` from an
        even index) draws each pair's noise once and uses it with both signs;
        the noise is the same, and the member params too, up to the rounding
        of ``scale * eps`` (see docs/design.md).
        """
        if pairs:
            eps = self.noise_vectors(noise_index(members[0::2], True))
            eps = jnp.broadcast_to(eps[:, None], (eps.shape[0], 2, self.dim)).reshape(members.shape[0], self.dim)
        else:
            eps = self.noise_vectors(noise_index(members, self.antithetic))
        return jax.vmap(self.perturb)(noise_sign(members, self.antithetic), eps)

    def member(self, member: jax.Array):
        """The params of one member (a scalar int32 index)."""
        index = noise_index(member, self.antithetic)
        eps = self.noise.sample(self.aux, self.noise_keys(index), self.layout)
        return self.perturb(noise_sign(member, self.antithetic), eps)

    def member_coordinates(self, member: jax.Array, start=0, size: int | None = None) -> jax.Array:
        """Coordinates ``[start, start + size)`` of one member's raveled params (default: all ``D``).

        The arithmetic of ``perturb`` on those coordinates alone, compiled
        ``apart``, so that a slice has the bits of the same coordinates of
        the whole in any program (``es.engine.update``). A slice needs a
        ``sliceable`` noise source and a scalar or per-coordinate scale.
        """
        size = self.dim if size is None else size
        whole = isinstance(start, int) and start == 0 and size == self.dim
        index = noise_index(member, self.antithetic)
        key, sign = self.noise_keys(index), noise_sign(member, self.antithetic)
        mean = self.flat if whole else jax.lax.dynamic_slice(self.flat, (start,), (size,))
        if jnp.ndim(self.scale) == 2:
            assert whole, "a matrix scale is never split"
            return apart(lambda mean, step: (mean.astype(self.dtype) + step).astype(mean.dtype), mean,
                         self.step(sign, self.noise.sample(self.aux, key, self.layout)))
        if whole:
            eps = self.noise.sample(self.aux, key, self.layout)
        else:
            eps = self.noise.sample(self.aux, key, self.layout, start, size)
        scale = self.scale if jnp.ndim(self.scale) == 0 or whole else jax.lax.dynamic_slice(
            self.scale, (start,), (size,))
        return apart(lambda mean, scale, eps: (mean.astype(self.dtype) + scale * eps).astype(mean.dtype),
                     mean, scale * sign, eps)

    def fitness_inputs(self, members: jax.Array, pairs: bool = False):
        """``(params, in_axes)``: what the fitness receives for ``members``, and how to ``vmap`` over it.

        The member params (leading axis ``len(members)``, ``in_axes`` 0), or
        with ``LowRankNoise(factored=True)`` the mean's matrix leaves as
        ``es.LowRank`` values whose base is shared (``in_axes`` ``None``).
        """
        if not self.noise.factored:
            return self.members(members, pairs), 0
        scales = self.scale * noise_sign(members, self.antithetic)
        keys = self.noise_keys(noise_index(members, self.antithetic))
        return self.noise.factored_members(self.params, keys, scales, self.layout)
