"""The noise-source contract: what the engine asks of a source of unit perturbations ``eps``.

A noise source is a small frozen (hashable) config object; its methods take the params' ``Layout``
(static leaf shapes; ``layout.dim`` = ``D``). ``es.GaussianNoise``, ``es.NoiseTable`` and
``es.LowRankNoise`` implement it; a source of your own that has these members works everywhere they do.
``sample`` is a pure function of the key, so every device rebuilds the same perturbation from the same
key and nothing is ever transferred.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax

from es.noise.layout import Layout


@runtime_checkable
class NoiseSource(Protocol):
    """What the engine calls on a noise source.

    Attributes (class constants):
      pairs_share_draws: an antithetic pair draws its vector once and uses it with both signs when
        evaluated (a draw costs more than a copy).
      sliceable: ``sums`` over a coordinate slice costs only that slice and equals the same coordinates
        of the full sums bit for bit (what ``exchange="sharded"`` needs).
      factored: the fitness receives matrix leaves as ``es.LowRank`` values (``factored_members``,
        ``factored_example``) instead of arrays.
      independent_coordinates: the coordinates of one ``eps`` are independent N(0, 1) (what a
        per-coordinate variance update, which reads ``eps**2``, or a covariance update assumes).
    """

    pairs_share_draws: bool
    sliceable: bool
    factored: bool
    independent_coordinates: bool

    def check(self, layout: Layout) -> None:
        """Raise ``ValueError`` before compiling if the source cannot serve these params."""

    def prepare(self, layout: Layout) -> Any:
        """Built once per compiled call on every device (nothing, or a table): ``aux``."""

    def draw_size(self, layout: Layout) -> int:
        """Floats drawn per noise vector (``D``; fewer for low-rank noise)."""

    def sample(self, aux: Any, key: jax.Array, layout: Layout) -> jax.Array:
        """float32[D]: the perturbation of one noise key, in ``ravel_pytree`` order."""

    def sums(self, aux: Any, keys: jax.Array, linear: jax.Array, square: jax.Array | None, layout: Layout,
             start: int | jax.Array = 0, size: int | None = None) -> tuple[jax.Array, jax.Array | None]:
        """``(sum_b linear[b] eps_b[start:start+size], sum_b square[b] eps_b[start:start+size]**2 or None)``,
        computed the cheapest way the source allows (never materialising ``[b, D]`` where it can)."""
