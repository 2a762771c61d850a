"""BBOB-style benchmark functions: a random shift, a random rotation, ill-conditioning.

Registered names (options ``dim=10``, ``seed=0``, ``rotate=None``)::

    bbob_sphere        ||z||^2,                    z = x - x_opt                         (BBOB f1)
    bbob_ellipsoid     sum 10^(6 i/(D-1)) z_i^2,   z = T_osz(R (x - x_opt))              (BBOB f10)
    bbob_rastrigin     rastrigin(z),               z = R L^10 Q T_asy^0.2 T_osz(R (x - x_opt))  (f15)
    bbob_rosenbrock    rosenbrock(z),              z = max(1, sqrt(D)/8) R (x - x_opt) + 1   (f9)
    bbob_bent_cigar    z_1^2 + 1e6 sum_{i>1} z_i^2, z = R T_asy^0.5(R (x - x_opt))        (f12)

``x_opt`` is uniform in ``[-4, 4]^D`` and ``R``, ``Q`` are uniformly random
rotations; all are drawn with NumPy from ``seed``, so the task stays a small,
static, hashable config ``(name, dim, seed, rotate)`` and the same seed gives
the same function everywhere. Rotations are used when ``rotate=True``, and by
default (``rotate=None``) when ``dim <= 100``; without them the functions are
separable (identity rotations). As in BBOB the search box is ``[-5, 5]^D``;
unlike BBOB the optimal value is 0 (no random offset ``f_opt``), so
``-fitness`` is directly the gap to the optimum.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from es import validation
from tasks import functions
from tasks.registry import make_owner, register

AUTO_ROTATE_MAX_DIM = 100  # rotate=None rotates up to this dim (a D x D matrix per rotation)
ROTATE_MAX_DIM = 2000  # rotate=True refuses larger dims (two 16 MB constants already)


def t_osz(x: jax.Array) -> jax.Array:
    """BBOB's oscillation transform (elementwise); ``t_osz(0) = 0``, monotone."""
    zero = x == 0
    log_abs = jnp.where(zero, 0.0, jnp.log(jnp.where(zero, 1.0, jnp.abs(x))))
    c1 = jnp.where(x > 0, 10.0, 5.5)
    c2 = jnp.where(x > 0, 7.9, 3.1)
    out = jnp.sign(x) * jnp.exp(log_abs + 0.049 * (jnp.sin(c1 * log_abs) + jnp.sin(c2 * log_abs)))
    return jnp.where(zero, 0.0, out)


def t_asy(x: jax.Array, beta: float) -> jax.Array:
    """BBOB's asymmetry transform: ``x_i^(1 + beta (i-1)/(D-1) sqrt(x_i))`` for ``x_i > 0``."""
    d = x.shape[-1]
    power = 1.0 + beta * jnp.arange(d, dtype=x.dtype) / max(d - 1, 1) * jnp.sqrt(jnp.maximum(x, 0.0))
    positive = jnp.maximum(x, 1e-30)
    return jnp.where(x > 0, positive**power, x)


def _conditioning(d: int, alpha: float) -> np.ndarray:
    """The diagonal of BBOB's ``Lambda^alpha``: ``alpha^((i-1) / (2 (D-1)))``."""
    return (alpha ** (0.5 * np.arange(d) / max(d - 1, 1))).astype(np.float32)


def _sphere(z, r, q):
    return jnp.sum(z**2)


def _ellipsoid(z, r, q):
    return functions.ellipsoid(t_osz(r @ z))


def _rastrigin(z, r, q):
    y = t_asy(t_osz(r @ z), 0.2)
    return functions.rastrigin(r @ (jnp.asarray(_conditioning(z.shape[-1], 10.0)) * (q @ y)))


def _rosenbrock(z, r, q):
    scale = max(1.0, float(np.sqrt(z.shape[-1])) / 8.0)
    return functions.rosenbrock(scale * (r @ z) + 1.0)


def _bent_cigar(z, r, q):
    y = r @ t_asy(r @ z, 0.5)
    return y[0] ** 2 + 1e6 * jnp.sum(y[1:] ** 2)


BBOB_FUNCTIONS: dict[str, Callable] = {
    "bbob_sphere": _sphere,
    "bbob_ellipsoid": _ellipsoid,
    "bbob_rastrigin": _rastrigin,
    "bbob_rosenbrock": _rosenbrock,
    "bbob_bent_cigar": _bent_cigar,
}


def _random_rotation(rng: np.random.Generator, d: int) -> np.ndarray:
    """A Haar-uniform orthogonal ``d x d`` matrix (QR of a Gaussian with sign fix)."""
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    return (q * np.sign(np.diag(r))).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class BBOBTask(functions.BoxMinimisation):
    """A shifted (and optionally rotated) benchmark function; fitness ``-f(x)``, maximum 0.

    Attributes:
      name: the registered name (a key of ``BBOB_FUNCTIONS``).
      dim: number of parameters.
      seed: where the shift and rotations come from (NumPy ``default_rng``).
      rotate: whether ``R`` and ``Q`` are random rotations (else identities).
    """

    name: str
    dim: int
    seed: int = 0
    rotate: bool = True
    lower: float = -5.0
    upper: float = 5.0

    @functools.cached_property
    def _constants(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(x_opt float32[D], R float32[D, D], Q float32[D, D])``, derived from ``seed``."""
        rng = np.random.default_rng(self.seed)
        x_opt = rng.uniform(-4.0, 4.0, self.dim).astype(np.float32)
        if self.rotate:
            return x_opt, _random_rotation(rng, self.dim), _random_rotation(rng, self.dim)
        eye = np.eye(self.dim, dtype=np.float32)
        return x_opt, eye, eye

    def function(self, x: jax.Array) -> jax.Array:
        """The value to minimise (float32 scalar); 0 at ``optimum()``."""
        x_opt, r, q = self._constants
        z = x - jnp.asarray(x_opt)
        return BBOB_FUNCTIONS[self.name](z, jnp.asarray(r), jnp.asarray(q))

    def optimum(self) -> np.ndarray:
        """float32[dim], the minimiser ``x_opt``."""
        return self._constants[0].copy()

    def optimal_value(self) -> float:
        return 0.0


def _bbob_factory(name: str) -> Callable[..., BBOBTask]:
    def factory(dim: int = 10, seed: int = 0, rotate: bool | None = None) -> BBOBTask:
        dim = functions.check_dim(name, dim)
        seed = validation.check_int(make_owner(name), "seed", seed, minimum=0)
        rotate = validation.check_optional_bool(make_owner(name), "rotate", rotate)
        if rotate is None:
            rotate = dim <= AUTO_ROTATE_MAX_DIM
        if rotate and dim > ROTATE_MAX_DIM:
            raise ValueError(
                f"tasks.make({name!r}, dim={dim}, rotate=True): rotations are dense D x D matrices; "
                f"use dim <= {ROTATE_MAX_DIM} or rotate=False."
            )
        return BBOBTask(name, dim, int(seed), rotate)

    factory.__doc__ = f"{name}: shifted{' and rotated' if name != 'bbob_sphere' else ''} (see tasks.bbob)."
    return factory


for _name in BBOB_FUNCTIONS:
    register(_name, _bbob_factory(_name))
