"""Noise sources: where a member's unit perturbation comes from (``es.GaussianNoise``, ``es.NoiseTable``,
``es.LowRankNoise``), the params' ``Layout`` they read, and ``es.LowRank`` values."""

from es.noise.layout import Layout
from es.noise.lowrank import LowRank, matmul, materialise
from es.noise.sources import (
    MIN_SLICE, NOISE_SOURCES, UNROLL, GaussianNoise, LowRankNoise, NoiseSource, NoiseTable, accumulate,
    standard_normal, standard_normal_in_rows, threefry2x32, weighted_sums,
)

__all__ = [
    "GaussianNoise", "Layout", "LowRank", "LowRankNoise", "MIN_SLICE", "NOISE_SOURCES", "NoiseSource", "NoiseTable",
    "UNROLL", "accumulate", "materialise", "matmul", "standard_normal", "standard_normal_in_rows", "threefry2x32",
    "weighted_sums",
]
