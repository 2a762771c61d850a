"""gymnax environments as tasks: a neural policy's mean episode return.

    task = tasks.make("CartPole-v1")                   # every id in gymnax.registered_envs
    params = task.init_params(key)                     # the policy's parameters (a dict of arrays)
    fitness = task.fitness(params, key)                # mean return over num_episodes episodes

An episode starts from ``env.reset`` and runs until the first step that is
terminated or truncated, or ``max_steps`` steps. gymnax resets inside ``step``
when an episode ends, so the loop masks explicitly: a reward counts only while
the episode is alive (the reward of the final step counts, nothing after it),
and the loop stops once every episode of the batch is done.

Everything that shapes the computation is a static Python value of the frozen
``EnvTask``: the env id and constructor kwargs, env-parameter overrides, the
number of episodes, the step limit and the policy's sizes. The gymnax
environment object is rebuilt from those (and cached), never traced.

With ``obs_norm=True`` the fitness is an ``es.StatefulFitness`` that
normalises observations with running statistics kept in the ES state (see
``tasks/obs_norm.py``); create the state with
``strategy.init(key, params, fitness=task.fitness)``.

``env_factory`` builds the task from ``tasks.make``'s options, checked and
resolved (env params, action head, observation features) in
``tasks/env_options.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

import es
from es import validation
from es.fitness.functions import check_shared_by
from tasks import obs_norm as obsnorm
from tasks.env_options import (
    action_head,
    check_env_params,
    check_episode_options,
    check_hidden_sizes,
    is_image,
    observation_features,
    option_pairs,
    override_params,
)
from tasks.policies import ACTIVATIONS, CNNPolicy, MLPPolicy, Policy
from tasks.registry import make_owner, register_family

PyTree = Any
POLICIES = ("mlp", "cnn")
DEFAULT_HIDDEN_SIZES = {"mlp": (64, 64), "cnn": (64,)}
IMAGE_MLP_HIDDEN_SIZES = ()
"""``hidden_sizes=None`` with ``policy="mlp"`` on image observations (MinAtar): a linear policy, which learned
faster there than MLPs of 32 and 64 x 64 units on 2 CPU cores (docs/tasks.md, MinAtar)."""
DEFAULT_ACTIVATION = {"mlp": "relu", "cnn": "relu"}


class Rollouts(NamedTuple):
    """What ``num_episodes`` episodes of one policy produced.

    Attributes:
      returns: float32[num_episodes], undiscounted episode returns.
      lengths: int32[num_episodes], steps taken before the episode ended.
      obs_stats: ``ObsStats`` (count, mean, M2) of the raw observations the
        policy acted on, over all episodes, or ``None`` when not requested.
    """

    returns: jax.Array
    lengths: jax.Array
    obs_stats: obsnorm.ObsStats | None


class EnvFitnessState(NamedTuple):
    """``state.fitness_state`` of an env task's ``StatefulFitness``.

    Attributes:
      env_steps: float32 scalar, environment steps taken by all members so far
        (float32: exact up to 2**24, then rounded to ~1e-7 relative).
      obs: running ``ObsStats`` when the task normalises observations, else ``None``.
    """

    env_steps: jax.Array
    obs: obsnorm.ObsStats | None


class MemberStats(NamedTuple):
    """What one member reports besides its fitness (gathered as ``[popsize, ...]``)."""

    env_steps: jax.Array
    obs_stats: obsnorm.ObsStats | None


@functools.partial(jax.jit, static_argnums=0)
def _mean_return(task: EnvTask, params: PyTree, key: jax.Array, stats: obsnorm.ObsStats | None) -> jax.Array:
    """``task.mean_return`` as one program (called eagerly, the rollout's vmapped while loop and the policy's
    operations were each a program of their own: 23 to compile for a held-out Pendulum evaluation)."""
    return jnp.mean(task.rollout(params, key, stats).returns)


def update_fitness_state(fitness_state: EnvFitnessState, stats: MemberStats) -> EnvFitnessState:
    """Fold the population's ``MemberStats`` (leading axis popsize, member order) into the fitness state."""
    env_steps = fitness_state.env_steps + jnp.sum(stats.env_steps)
    obs = fitness_state.obs
    if obs is not None:
        obs = obsnorm.merge(obs, stats.obs_stats)
    return EnvFitnessState(env_steps, obs)


@functools.lru_cache(maxsize=None)
def make_env(env_id: str, env_kwargs: tuple[tuple[str, Any], ...] = ()):
    """``(env, default_params)`` from ``gymnax.make`` (cached: envs are immutable)."""
    import gymnax

    try:
        return gymnax.make(env_id, **dict(env_kwargs))
    except TypeError as error:
        raise TypeError(f"tasks.make({env_id!r}, env_kwargs={dict(env_kwargs)}): {error}") from error
    except OSError as error:  # e.g. MNISTBandit-bsuite downloads MNIST when it is built
        raise RuntimeError(
            f"gymnax could not build {env_id!r}: {error}. (MNISTBandit-bsuite downloads MNIST to "
            "/tmp/mnist when constructed; it needs network access once.)"
        ) from error


@dataclasses.dataclass(frozen=True)
class EnvTask:
    """Maximise a policy's mean return on a gymnax environment.

    Attributes:
      env_id: a gymnax environment id.
      policy: the ``MLPPolicy`` or ``CNNPolicy`` (static sizes and action head).
      num_episodes: episodes averaged per fitness evaluation (vmapped).
      max_steps: steps per episode at most (the loop bound).
      obs_norm: normalise observations with running statistics (``fitness`` is
        then an ``es.StatefulFitness``).
      env_kwargs: ``(name, value)`` pairs passed to the env's constructor.
      env_params: ``(name, value)`` overrides of the env's default ``EnvParams``.
      obs_shape: the shape of the features the policy sees (the raw
        observation's shape, or ``(n,)`` for one-hot encoded ones).
      obs_categories: for a ``Discrete`` observation space, its size
        (observations are one-hot encoded); 0 for boxes.
      random_start_actions: ``N >= 0``; each episode starts with ``n ~ U{0..N}``
        uniformly random actions before the policy acts (the "random starts"
        of Mnih et al. 2015 and Salimans et al. 2017), so that a policy cannot
        memorise a routine for a few deterministic start states (MinAtar
        Breakout has two). A training setting: ``held_out`` evaluates without.
      common_random_numbers: ``None``, or who shares an evaluation key in
        training (``"generation"`` or ``"pair"``): ``fitness`` is then an
        ``es.CommonRandomNumbers``, so members are compared on the same
        episodes, start states and action draws (EvoJAX's training protocol).
    """

    env_id: str
    policy: Policy
    num_episodes: int
    max_steps: int
    obs_norm: bool = False
    env_kwargs: tuple[tuple[str, Any], ...] = ()
    env_params: tuple[tuple[str, Any], ...] = ()
    obs_shape: tuple[int, ...] = ()
    obs_categories: int = 0
    random_start_actions: int = 0
    common_random_numbers: str | None = None

    # ------------------------------------------------------------- environment

    @property
    def env(self):
        """The gymnax environment object (cached per ``env_id`` and ``env_kwargs``)."""
        return make_env(self.env_id, self.env_kwargs)[0]

    @property
    def gymnax_params(self):
        """The env's ``EnvParams``: its defaults with ``env_params`` applied."""
        env, defaults = make_env(self.env_id, self.env_kwargs)
        return override_params(defaults, self.env_params)

    @property
    def image_observations(self) -> bool:
        """Whether observations are images ``[H, W]`` or ``[H, W, C]`` (MinAtar), not vectors or one-hot categories."""
        return is_image(self.obs_shape, self.obs_categories)

    @property
    def obs_size(self) -> int:
        """Number of features the policy sees (flattened, one-hot for discrete observations)."""
        return math.prod(self.obs_shape)

    def features(self, obs: jax.Array) -> jax.Array:
        """float32[obs_size]: one raw observation, flattened (or one-hot encoded)."""
        if self.obs_categories:
            return jax.nn.one_hot(obs, self.obs_categories, dtype=jnp.float32).reshape(-1)
        return jnp.asarray(obs, jnp.float32).reshape(-1)

    # ------------------------------------------------------------------ policy

    def init_params(self, key: jax.Array) -> PyTree:
        """The policy's initial parameters (a dict of float32 arrays)."""
        return self.policy.init(key)

    def act(self, params: PyTree, obs: jax.Array, key: jax.Array, stats: obsnorm.ObsStats | None = None):
        """The policy's action for one raw observation (normalised with ``stats`` if given)."""
        x = self.features(obs)
        if stats is not None:
            x = obsnorm.normalize(stats, x)
        return self.policy.apply(params, x, key)

    # ---------------------------------------------------------------- rollouts

    def rollout(self, params: PyTree, key: jax.Array, stats: obsnorm.ObsStats | None = None) -> Rollouts:
        """Run ``num_episodes`` episodes (vmapped) of the policy ``params``.

        Args:
          params: the policy's parameters.
          key: the randomness of every episode. Episode ``i`` uses
            ``k = split(key, num_episodes)[i]``: ``reset_key, run_key =
            split(k)``, and step ``t`` uses ``action_key, step_key =
            split(fold_in(run_key, t))``.
          stats: running observation statistics. When given, observations are
            normalised with them (if ``obs_norm``) and the statistics of the
            observations seen are returned in ``obs_stats``.
        """
        keys = jax.random.split(key, self.num_episodes)
        out = jax.vmap(lambda k: self._episode(params, k, stats))(keys)
        if stats is not None:
            out = out._replace(obs_stats=obsnorm.combine(out.obs_stats))
        return out

    def held_out(self, num_episodes: int) -> EnvTask:
        """This task as it is evaluated: ``num_episodes`` episodes on the standard env (no random start actions),
        each with its own key."""
        return dataclasses.replace(self, num_episodes=num_episodes, random_start_actions=0, common_random_numbers=None)

    def _episode(self, params: PyTree, key: jax.Array, stats: obsnorm.ObsStats | None) -> Rollouts:
        env, env_params = self.env, self.gymnax_params
        reset_key, run_key = jax.random.split(key)
        obs, env_state = env.reset(reset_key, env_params)
        normalize_with = stats if self.obs_norm else None
        seen = obsnorm.init(self.obs_size) if stats is not None else None
        if self.random_start_actions:  # n ~ U{0..N} random actions first (the episode's own draw)
            num_random = jax.random.randint(jax.random.fold_in(reset_key, 1), (), 0, self.random_start_actions + 1)
            action_space = env.action_space(env_params)

        def cond(carry):
            t, alive = carry[0], carry[1]
            return jnp.logical_and(t < self.max_steps, alive)

        def body(carry):
            t, alive, obs, env_state, total, length, seen = carry
            action_key, step_key = jax.random.split(jax.random.fold_in(run_key, t))
            weight = alive.astype(jnp.float32)
            if seen is not None:
                seen = obsnorm.add(seen, self.features(obs), weight)
            action = self.act(params, obs, action_key, normalize_with)
            if self.random_start_actions:
                random_action = action_space.sample(jax.random.fold_in(action_key, 1))
                action = jnp.where(t < num_random, random_action, action)
            obs, env_state, reward, terminated, truncated, _ = env.step(step_key, env_state, action, env_params)
            total = total + weight * jnp.reshape(reward, ()).astype(jnp.float32)
            length = length + alive.astype(jnp.int32)
            alive = jnp.logical_and(alive, jnp.logical_not(jnp.logical_or(terminated, truncated)))
            return t + 1, alive, obs, env_state, total, length, seen

        init = (jnp.int32(0), jnp.bool_(True), obs, env_state, jnp.float32(0.0), jnp.int32(0), seen)
        _, _, _, _, total, length, seen = jax.lax.while_loop(cond, body, init)
        return Rollouts(total, length, seen)

    # ----------------------------------------------------------------- fitness

    def mean_return(self, params: PyTree, key: jax.Array, fitness_state: EnvFitnessState | None = None):
        """Mean return (float32 scalar) over ``num_episodes`` episodes.

        With ``obs_norm`` pass the run's ``state.fitness_state`` (the policy
        was trained on normalised observations).
        """
        if self.obs_norm and fitness_state is None:
            raise ValueError(
                f"{self.env_id} task has obs_norm=True: pass the running statistics, "
                "mean_return(params, key, state.fitness_state)."
            )
        stats = None if fitness_state is None else fitness_state.obs
        return _mean_return(self, params, key, stats)

    def init_fitness_state(self) -> EnvFitnessState:
        """Zero env steps and (with ``obs_norm``) empty observation statistics."""
        obs = obsnorm.init(self.obs_size) if self.obs_norm else None
        return EnvFitnessState(jnp.zeros((), jnp.float32), obs)

    def evaluate(self, params: PyTree, key: jax.Array, fitness_state: EnvFitnessState):
        """``(mean return, MemberStats)`` of one member under ``fitness_state``."""
        out = self.rollout(params, key, fitness_state.obs)
        return jnp.mean(out.returns), MemberStats(jnp.sum(out.lengths).astype(jnp.float32), out.obs_stats)

    def update_fitness_state(self, fitness_state: EnvFitnessState, stats: MemberStats) -> EnvFitnessState:
        """Fold the population's ``MemberStats`` (leading axis popsize, member order) in."""
        return update_fitness_state(fitness_state, stats)

    @property
    def fitness(self):
        """What to hand ``es.evolve``, the task's one fitness: an ``es.StatefulFitness`` whose value is the mean
        return over ``num_episodes`` episodes and whose state counts env steps
        (``state.fitness_state.env_steps``) and, with ``obs_norm``, holds the running observation statistics.
        Each member additionally reports its steps (one float), all-gathered with the fitnesses. Wrapped in an
        ``es.CommonRandomNumbers`` when ``common_random_numbers`` is set.

        Make the state with ``strategy.init(key, params, fitness=task.fitness)``. Callable as
        ``fitness(params, key) -> float32 scalar`` too (under the initial statistics).
        """
        return self._shared(es.StatefulFitness(self.init_fitness_state, self.evaluate, self.update_fitness_state))

    def _shared(self, fitness):
        """``fitness``, evaluated with common random numbers if the task asks for them."""
        if self.common_random_numbers is None:
            return fitness
        return es.CommonRandomNumbers(fitness, self.common_random_numbers)


# ------------------------------------------------------------------ building


def env_factory(env_id: str):
    """The ``tasks.make`` factory of gymnax environment ``env_id``."""

    def factory(
        num_episodes: int = 1,
        max_steps: int | None = None,
        policy: str = "mlp",
        hidden_sizes: tuple[int, ...] | None = None,
        activation: str | None = None,
        action_selection: str | None = None,
        obs_norm: bool | None = None,
        conv_channels: int = 16,
        output_scale: float = 0.01,
        env_params: dict | None = None,
        env_kwargs: dict | None = None,
        random_start_actions: int = 0,
        common_random_numbers: str | None = None,
    ) -> EnvTask:
        num_episodes, max_steps, policy = check_episode_options(env_id, num_episodes, max_steps, policy, POLICIES)
        owner = make_owner(env_id)
        random_start_actions = validation.check_int(owner, "random_start_actions", random_start_actions, minimum=0)
        if common_random_numbers is not None:
            check_shared_by(owner, common_random_numbers, "common_random_numbers")
        if validation.is_int(hidden_sizes):
            hidden_sizes = (hidden_sizes,)
        if hidden_sizes is not None:
            hidden_sizes = check_hidden_sizes(env_id, hidden_sizes, "e.g. (32, 32), or () for a linear policy")
        activation = DEFAULT_ACTIVATION[policy] if activation is None else activation
        activation = validation.check_choice(owner, "activation", activation, sorted(ACTIVATIONS))
        obs_norm = validation.check_optional_bool(owner, "obs_norm", obs_norm)
        conv_channels = validation.check_int(owner, "conv_channels", conv_channels, minimum=1)
        output_scale = validation.check_float(owner, "output_scale", output_scale, positive=True)
        kwargs_pairs = option_pairs(env_id, "env_kwargs", env_kwargs)
        params_pairs = option_pairs(env_id, "env_params", env_params)

        env, defaults = make_env(env_id, kwargs_pairs)
        check_env_params(env_id, defaults, params_pairs)
        gymnax_params = override_params(defaults, params_pairs)
        if max_steps is None:
            max_steps = int(gymnax_params.max_steps_in_episode)
        obs_shape, categories = observation_features(env_id, env, gymnax_params)
        images = is_image(obs_shape, categories)
        head = action_head(env_id, env.action_space(gymnax_params), action_selection, images)
        if hidden_sizes is None:
            hidden_sizes = IMAGE_MLP_HIDDEN_SIZES if images and policy == "mlp" else DEFAULT_HIDDEN_SIZES[policy]
        if obs_norm is None:  # auto: array observations (Salimans et al.), not one-hot encoded categories
            obs_norm = categories == 0
        if policy == "cnn":
            if len(obs_shape) not in (2, 3):
                raise ValueError(
                    f"tasks.make({env_id!r}, policy='cnn'): the CNN needs image observations [H, W(, C)], "
                    f"but {env_id} observes shape {obs_shape}; use policy='mlp'."
                )
            net = CNNPolicy(obs_shape, head, conv_channels, 3, hidden_sizes, activation, float(output_scale))
        else:
            net = MLPPolicy(math.prod(obs_shape), head, hidden_sizes, activation, float(output_scale))
        return EnvTask(env_id, net, num_episodes, max_steps, obs_norm, kwargs_pairs, params_pairs, obs_shape, categories,
                       random_start_actions, common_random_numbers)

    factory.__doc__ = f"{env_id}: a policy's mean episode return (see tasks.envs.EnvTask)."
    return factory


def _gymnax_env_ids() -> list[str]:
    import gymnax

    return list(gymnax.registered_envs)


register_family(_gymnax_env_ids, env_factory)
