"""How ``exchange="sharded"`` splits the ``D`` coordinates over ``n`` devices, and norms that do not depend on it.

Device ``d`` of ``n`` *owns* coordinates ``[d S, min((d + 1) S, D))`` and works
on the *slice* ``[start_d, start_d + S)``, ``start_d = min(d S, D - S)``: the
last slices move back inside ``[0, D)`` (a read past ``D`` would leave the
member's noise), so they may overlap the slice before, and a device may own
nothing. ``S = slice_size(D, n, align)`` is ``ceil(D / n)``, rounded up to a
multiple of ``BLOCK`` where the devices sum norms (``align=BLOCK``), so that
every owned range then starts on a block boundary::

    D = 20,000, n = 4, BLOCK = 1,024, S = 5,120:
      device 0 owns [0, 5120)      slice [0, 5120)
      device 3 owns [15360, 20000) slice [14880, 20000)

Norms (the metrics ``grad_norm``, ``update_norm``, ``params_norm``) are
summed in an order fixed by ``D`` alone: squares summed pairwise within each
block of ``BLOCK`` coordinates (the last one padded with zeros), then the
blocks' sums pairwise. Pairwise halving is elementwise additions only, which
XLA never reorders, so a device can sum the blocks it owns, gather the block
sums, and get the bits one device gets for the whole vector.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from es.noise.accumulate import MIN_SLICE

BLOCK = 2**10
"""Coordinates per block of a norm, and the granularity of a device's slice (``noise.MIN_SLICE`` is a multiple)."""


def slice_size(dim: int, num_devices: int, align: int = 1) -> int:
    """``S``: ``ceil(D / n)`` rounded up to a multiple of ``align``, at least ``noise.MIN_SLICE`` (below it the
    update is cheap, and ``GaussianNoise`` sums it with a reduction that XLA rounds by shape), at most ``D``
    (then nothing is split: every device works on all of ``D``)."""
    per_device = -(-dim // num_devices)
    return min(dim, max(align * -(-per_device // align), MIN_SLICE))


@dataclasses.dataclass(frozen=True)
class Partition:
    """The coordinates of ``dim`` params over ``num_devices`` devices (static).

    Attributes:
      dim: ``D``.
      num_devices: ``n``.
      align: slices are a multiple of it: 1 when only sums are split (the
        fewest bytes), ``BLOCK`` when each device also sums the norms of
        the blocks it owns (a coordinatewise update).
    """

    dim: int
    num_devices: int
    align: int = 1

    @property
    def size(self) -> int:
        """``S``, the length of every device's slice."""
        return slice_size(self.dim, self.num_devices, self.align)

    @property
    def split(self) -> bool:
        """Whether a slice is less than all of ``D`` (else every device works on everything)."""
        return self.size < self.dim

    @property
    def blocks_per_slice(self) -> int:
        return -(-self.size // BLOCK)

    def start(self, device: int | jax.Array) -> int | jax.Array:
        """Where device ``device``'s slice starts (``device`` may be traced: ``lax.axis_index``)."""
        if isinstance(device, int):
            return min(device * self.size, self.dim - self.size)
        return jnp.minimum(device * self.size, self.dim - self.size)

    def owned(self, device: int) -> tuple[int, int]:
        """``[lo, hi)``: the coordinates device ``device`` owns (empty when ``lo >= hi``)."""
        return min(device * self.size, self.dim), min((device + 1) * self.size, self.dim)

    def assemble(self, gathered: jax.Array) -> jax.Array:
        """``[D]`` from the tiled all-gather of every device's slice (``[n * S]``): each coordinate from its owner.

        Static slices and one concatenation: data movement only, so the
        result has the bits the owners computed.
        """
        pieces = []
        for device in range(self.num_devices):
            lo, hi = self.owned(device)
            if lo < hi:
                at = device * self.size + lo - self.start(device)
                pieces.append(gathered[at:at + hi - lo])
        return jnp.concatenate(pieces) if len(pieces) > 1 else pieces[0]

    def owned_block_sums(self, device: jax.Array, values: jax.Array) -> jax.Array:
        """float32[..., S / BLOCK]: ``block_square_sums`` of the blocks device ``device`` owns, from its slice
        ``values`` (``[..., S]``: leading axes are vectors summed alike, in one program part).

        Needs ``align == BLOCK``. Block ``k`` of the result is global block ``device * S / BLOCK + k``;
        blocks past ``D``, or of a device that owns nothing, are 0. Gathered
        (tiled) over the devices, the first ``ceil(D / BLOCK)`` entries are
        ``block_square_sums`` of the whole vector.
        """
        values = values.astype(jnp.float32)
        padded = jnp.concatenate([values, jnp.zeros(values.shape, jnp.float32)], axis=-1)
        owned = jax.lax.dynamic_slice_in_dim(padded, device * self.size - self.start(device), self.size, axis=-1)
        return block_square_sums(owned)


def num_blocks(dim: int) -> int:
    return -(-dim // BLOCK)


def halve(x: jax.Array) -> jax.Array:
    """Pairwise sums along the last axis (a power of two long) down to length 1, dropped."""
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = x[..., :half] + x[..., half:]
    return x[..., 0]


def apart(fn: Callable, *args):
    """``fn(*args)``, compiled apart from the surrounding program: as the body of a loop that runs once.

    XLA on CPU contracts a multiply feeding an add into one FMA (one
    rounding instead of two) wherever its fusions put them together, and
    fuses differently as the surrounding program differs (one device or
    several, the whole vector or a slice); ``optimization_barrier`` does not
    stop it. A ``while_loop`` body is a computation of its own, fused alone,
    so ``fn``'s arithmetic rounds the same in every program that calls it
    this way. The loop's trip count (1) is hidden from XLA's loop
    simplifier, which would otherwise inline the body.
    """
    shapes = jax.eval_shape(fn, *args)
    outputs = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    first = jnp.ravel(jax.tree.leaves(args)[0])[0]
    bits = jax.lax.bitcast_convert_type(first.astype(jnp.float32), jnp.uint32)
    trips = 1 + jnp.minimum(bits, jnp.uint32(0)).astype(jnp.int32)  # 1, which XLA cannot prove
    return jax.lax.while_loop(lambda c: c[0] < trips, lambda c: (c[0] + 1, c[1], fn(*c[1])),
                              (jnp.zeros((), jnp.int32), args, outputs))[2]


def block_square_sums(values: jax.Array) -> jax.Array:
    """float32[..., ceil(len / BLOCK)]: the pairwise sum of squares of each block of the last axis (the last
    block padded with zeros); leading axes are vectors summed alike (one ``apart`` for all of them).

    The squares are computed ``apart``, so that no program fuses one into the first addition. A vector of
    one block is padded only to the next power of two: halving a block whose second half is zeros adds
    ``+0.0`` to each entry of the first half, which changes no bit, so the sum is the full block's, with
    fewer operations to compile.
    """
    values = values.astype(jnp.float32)
    length = values.shape[-1]
    blocks = num_blocks(length)
    width = BLOCK if blocks > 1 else 1 << (length - 1).bit_length()
    padded = jnp.pad(values, [(0, 0)] * (values.ndim - 1) + [(0, blocks * width - length)])
    squares = apart(lambda x: x * x, padded)
    return halve(squares.reshape(*values.shape[:-1], blocks, width))


def norm_from_block_sums(block_sums: jax.Array, dim: int) -> jax.Array:
    """The norm of a ``dim``-vector from its ``block_square_sums`` (at least ``num_blocks(dim)`` of them)."""
    sums = block_sums[:num_blocks(dim)]
    width = 1 << (sums.shape[0] - 1).bit_length()
    return jnp.sqrt(halve(jnp.pad(sums, (0, width - sums.shape[0]))))


def all_finite(tree) -> jax.Array:
    """Whether every float in ``tree`` is finite: a scalar bool (the check that keeps a NaN/inf out of a state)."""
    floats = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in floats])) if floats else jnp.bool_(True)


def norm(tree) -> jax.Array:
    """float32 L2 norm of a pytree (or array), summed in the order ``exchange="sharded"`` reproduces on any mesh.

    A scalar is taken as a norm already and returned as is (a strategy may
    report its norms itself; the built-in ones return the vectors).
    """
    if jax.tree_util.treedef_is_leaf(jax.tree.structure(tree)) and jnp.ndim(tree) == 0:
        return jnp.asarray(tree, jnp.float32)
    flat, _ = ravel_pytree(tree)
    return norm_from_block_sums(block_square_sums(flat), flat.shape[0])
