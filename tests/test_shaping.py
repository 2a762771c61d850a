"""Fitness shaping against hand-computed values."""

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from es.strategies import shaping


@pytest.mark.slow
def test_centered_rank_matches_hand_computed_values():
    # ranks of [3, 1, 2] are [2, 0, 1]; rank / (n - 1) - 0.5
    chex.assert_trees_all_close(shaping.centered_rank(jnp.array([3.0, 1.0, 2.0])), jnp.array([0.5, -0.5, 0.0]))
    # five members: ranks [4, 0, 3, 1, 2] -> [0.5, -0.5, 0.25, -0.25, 0]
    chex.assert_trees_all_close(
        shaping.centered_rank(jnp.array([10.0, -3.0, 7.0, 0.0, 1.0])),
        jnp.array([0.5, -0.5, 0.25, -0.25, 0.0]),
    )


def test_centered_rank_gives_ties_their_average_rank():
    # [1, 1, 3]: the tied pair shares ranks 0 and 1 -> 0.5 -> 0.5 / 2 - 0.5 = -0.25
    chex.assert_trees_all_close(shaping.centered_rank(jnp.array([1.0, 1.0, 3.0])), jnp.array([-0.25, -0.25, 0.5]))
    chex.assert_trees_all_close(shaping.centered_rank(jnp.full(4, 2.0)), jnp.zeros(4))


def test_z_score_matches_hand_computed_values():
    # mean 2, population std sqrt(2/3)
    expected = np.array([-1.0, 0.0, 1.0]) / np.sqrt(2.0 / 3.0)
    chex.assert_trees_all_close(shaping.z_score(jnp.array([1.0, 2.0, 3.0])), expected, rtol=1e-6)
    chex.assert_trees_all_close(shaping.z_score(jnp.full(3, 5.0)), jnp.zeros(3))


def test_raw_is_identity():
    chex.assert_trees_all_equal(shaping.raw(jnp.array([1.5, -2.0])), jnp.array([1.5, -2.0]))


def test_minimize_reverses_the_order():
    weights, _ = shaping.shape_fitness(jnp.array([3.0, 1.0, 2.0]), "centered_rank", maximize=False)
    chex.assert_trees_all_close(weights, jnp.array([-0.5, 0.5, 0.0]))


@pytest.mark.parametrize("bad", [jnp.nan, jnp.inf, -jnp.inf])
def test_invalid_fitness_ranks_strictly_worst(bad):
    weights, valid = shaping.shape_fitness(jnp.array([1.0, bad, 0.0, 2.0]), "centered_rank", maximize=True)
    chex.assert_trees_all_close(weights, jnp.array([1 / 6, -0.5, -1 / 6, 0.5]), rtol=1e-6)
    chex.assert_trees_all_equal(valid, jnp.array([True, False, True, True]))


@pytest.mark.parametrize("method", ["z_score", "raw", lambda f: f * 2.0])
def test_invalid_fitness_takes_the_worst_valid_value(method):
    with_nan, _ = shaping.shape_fitness(jnp.array([1.0, jnp.nan, 0.0, 2.0]), method, maximize=True)
    replaced, _ = shaping.shape_fitness(jnp.array([1.0, 0.0, 0.0, 2.0]), method, maximize=True)
    chex.assert_trees_all_close(with_nan, replaced)


@pytest.mark.slow
def test_all_invalid_gives_zero_weights():
    for method in ["centered_rank", "z_score", "raw"]:
        weights, valid = shaping.shape_fitness(jnp.array([jnp.nan, jnp.inf]), method, maximize=True)
        chex.assert_trees_all_equal(weights, jnp.zeros(2))
        assert not bool(valid.any())
