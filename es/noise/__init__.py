"""Noise sources: where a member's unit perturbation ``eps`` comes from.

``NoiseSource`` is the contract (a Protocol); ``es.GaussianNoise`` (fresh draws, the default),
``es.NoiseTable`` (slices of a shared table) and ``es.LowRankNoise`` (rank-r matrix perturbations)
implement it. ``threefry`` holds the exact N(0, 1) kernel they draw with, ``accumulate`` the ordered
weighted sums the update is made of, ``layout`` the params' static shapes.
"""

from es.noise.accumulate import MIN_SLICE, UNROLL, accumulate, outer_sum, weighted_sums
from es.noise.gaussian import GaussianNoise
from es.noise.layout import Layout
from es.noise.lowrank import LowRank, LowRankNoise, matmul, materialise
from es.noise.source import NoiseSource
from es.noise.table import NoiseTable
from es.noise.threefry import standard_normal, standard_normal_in_rows, threefry2x32

__all__ = [
    "GaussianNoise", "Layout", "LowRank", "LowRankNoise", "MIN_SLICE", "NoiseSource", "NoiseTable", "UNROLL",
    "accumulate", "materialise", "matmul", "outer_sum", "standard_normal", "standard_normal_in_rows",
    "threefry2x32", "weighted_sums",
]
