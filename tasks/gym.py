"""gymnasium environments as tasks: a numpy policy's episode return, evaluated in worker processes.

    task = tasks.make("gymnasium:Hopper-v5")          # any gymnasium id (MuJoCo: pip install es[gymnasium])
    params = task.init_params(key)                    # {"out": {"w": f32[obs, act], "b": f32[act]}}: linear
    state = strategy.init(key, params, fitness=task.fitness)
    state, metrics = es.evolve(strategy, task.fitness, state, 100)     # task.fitness: an es.HostFitness
    held_out = task.held_out(10).mean_return(state.params, key, state.fitness_state)

The environments run in numpy, outside JAX, so ``task.fitness`` is an
``es.HostFitness``: every member's episodes run in one of the worker
processes (one environment per worker, made once), and the engine gathers the
returns. The policy is linear by default (``policy="linear"``, the setting of
Mania et al. 2018's ARS) or an MLP (``policy="mlp"``), evaluated in numpy with
the parameters of ``tasks.MLPPolicy``; observations are normalised with
running statistics kept in ``state.fitness_state`` (``obs_norm=True``, ARS's
V2 and Salimans et al.'s normalisation: each member reports the count, mean
and squared deviations of the observations it saw, and the engine folds them
in after every generation, as for the gymnax tasks).

``reward_offset`` is added to every step's reward in the fitness only (never
in ``mean_return``): ``None`` subtracts the survival bonus of Hopper,
Walker2d, Ant and Humanoid, as ARS does (Mania et al. 2018, section 4.2;
rl-baselines3-zoo's ``alive_bonus_offset``), so that standing still is not a
local optimum; other environments get 0. Training settings some families
need (``TRAINING_DEFAULTS``): Ant trains on 250-step episodes
(``training_steps``; held-out episodes still run to ``max_steps``) with common
random numbers (``common_random_numbers="generation"``: every member of a
generation starts from the same state).

Continuous (``Box``) actions are the policy's outputs clipped to the bounds
(``action_squash="clip"``, the default for linear policies) or squashed by
``tanh`` into them (``"tanh"``, the default for MLPs); ``Discrete`` actions
are the argmax of the outputs. Other action spaces (``MultiDiscrete``,
``MultiBinary``, ``Tuple``, ``Dict``, ...) are refused when the task is made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import es
from es import validation
from es.engine.members import member_seed
from es.fitness.functions import check_shared_by
from tasks import mujoco_warnings
from tasks import obs_norm as obsnorm
from tasks.env_options import check_episode_options, check_hidden_sizes, option_pairs
from tasks.envs import EnvFitnessState, MemberStats, update_fitness_state
from tasks.policies import BoxHead, DiscreteHead, MLPPolicy
from tasks.registry import make_owner, register_family

PyTree = Any

PREFIX = "gymnasium:"
POLICIES = ("linear", "mlp")
ACTION_SQUASHES = ("clip", "tanh")
DEFAULT_HIDDEN_SIZES = (64, 64)
NUMPY_ACTIVATIONS = {
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0.0),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "identity": lambda x: x,
}
# The survival bonus per step of the MuJoCo locomotion envs that have one (their healthy_reward default).
SURVIVAL_BONUS = {"Hopper": 1.0, "Walker2d": 1.0, "Ant": 1.0, "Humanoid": 5.0}
# Training settings of tasks.make("gymnasium:<family>-v<k>") where the family needs them (tuned here for ARS,
# tasks.default_strategy; experiments/results_notes.md): on Ant-v5, Mania et al.'s settings on full episodes
# climbed about 100 above the zero policy in 0.7 M steps, with 250-step training episodes and members compared on
# the same start state 3,600 in 4.3 M.
TRAINING_DEFAULTS = {"Ant": {"training_steps": 250, "common_random_numbers": "generation"}}


@functools.lru_cache(maxsize=None)
def make_env(env_id: str, max_steps: int, env_kwargs: tuple[tuple[str, Any], ...] = ()):
    """The gymnasium environment (one per process and settings: made once, then reset for every episode); a
    MuJoCo one's load warnings as Python warnings (``tasks.mujoco_warnings``)."""
    import gymnasium

    on_mujoco = "mujoco" in str(gymnasium.spec(env_id).entry_point)
    with mujoco_warnings.as_python_warnings() if on_mujoco else contextlib.nullcontext():
        return gymnasium.make(env_id, max_episode_steps=max_steps, disable_env_checker=True, **dict(env_kwargs))


@dataclasses.dataclass(frozen=True)
class GymTask:
    """Maximise a numpy policy's mean return on a gymnasium environment.

    Attributes:
      env_id: a gymnasium environment id (without the ``gymnasium:`` prefix).
      policy: the ``MLPPolicy`` whose parameters are evolved (``hidden_sizes=()``
        is the linear policy); its head is a ``BoxHead`` or ``DiscreteHead``.
      num_episodes: episodes averaged per fitness evaluation.
      max_steps: steps per episode at most (gymnasium's time limit).
      obs_norm: normalise observations with running statistics.
      action_squash: ``"clip"`` or ``"tanh"``, how outputs become Box actions.
      reward_offset: added to every step's reward in ``fitness`` (not in ``mean_return``).
      obs_categories: for a ``Discrete`` observation space, its size (one-hot); 0 for boxes.
      env_kwargs: ``(name, value)`` pairs passed to ``gymnasium.make``.
      num_workers, timeout_s: of the ``es.HostFitness`` (worker processes, seconds per member).
      common_random_numbers: ``None``, or who shares an episode seed in training (``"generation"`` or
        ``"pair"``): ``fitness`` is then an ``es.CommonRandomNumbers``, so the members compared start
        their episodes from the same states. A training setting: ``held_out`` evaluates without.
      training_steps: steps per training episode at most (``None``: ``max_steps``); held-out episodes
        (``mean_return``) run to ``max_steps``.
    """

    env_id: str
    policy: MLPPolicy
    num_episodes: int = 1
    max_steps: int = 1000
    obs_norm: bool = True
    action_squash: str = "clip"
    reward_offset: float = 0.0
    obs_categories: int = 0
    env_kwargs: tuple[tuple[str, Any], ...] = ()
    num_workers: int | None = None
    timeout_s: float | None = None
    common_random_numbers: str | None = None
    training_steps: int | None = None

    def __getstate__(self):  # what a worker receives: the settings, not the cached HostFitness and its pool
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def obs_size(self) -> int:
        return self.policy.obs_size

    @property
    def env(self):
        """This process's environment for the task."""
        return make_env(self.env_id, self.max_steps, self.env_kwargs)

    # ------------------------------------------------------------------ policy

    def init_params(self, key: jax.Array) -> PyTree:
        """The policy's initial parameters (a dict of float32 arrays; zeros for the linear policy)."""
        return self.policy.init(key)

    def features(self, obs) -> np.ndarray:
        """float32[obs_size]: one observation, flattened (or one-hot encoded)."""
        if self.obs_categories:
            return np.eye(self.obs_categories, dtype=np.float32)[int(obs)]
        return np.asarray(obs, np.float32).reshape(-1)

    def act(self, params: PyTree, x: np.ndarray):
        """The action for features ``x`` (already normalised), in numpy."""
        activation = NUMPY_ACTIVATIONS[self.policy.activation]
        for i in range(len(self.policy.hidden_sizes)):
            layer = params[f"hidden_{i}"]
            x = activation(x @ layer["w"] + layer["b"])
        out = x @ params["out"]["w"] + params["out"]["b"]
        head = self.policy.head
        if isinstance(head, DiscreteHead):
            return int(np.argmax(out))
        low, high = np.asarray(head.low, np.float32), np.asarray(head.high, np.float32)
        if self.action_squash == "tanh":
            finite = np.isfinite(low) & np.isfinite(high)
            squashed = np.where(finite, low, 0.0) + 0.5 * (np.tanh(out) + 1.0) * np.where(finite, high - low, 0.0)
            out = np.where(finite, squashed, out)
        else:
            out = np.clip(out, low, high)
        return out.reshape(head.shape).astype(np.float32)

    # ---------------------------------------------------------------- episodes

    def rollout(self, params: PyTree, seed: int, stats: obsnorm.ObsStats | None, reward_offset: float = 0.0,
                max_steps: int | None = None):
        """``(returns float[num_episodes], lengths int[num_episodes], ObsStats of the observations seen)``.

        Episode ``i`` resets the environment with the ``i``-th int drawn from
        ``np.random.default_rng(seed)`` and runs ``max_steps`` steps at most
        (``None``: the task's ``max_steps``); observations are normalised with
        ``stats`` when ``obs_norm`` (``stats`` in numpy).
        """
        limit = self.max_steps if max_steps is None else min(max_steps, self.max_steps)
        env = self.env
        params = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
        mean = std = None
        if self.obs_norm and stats is not None:
            stats = obsnorm.ObsStats(*(np.asarray(x, np.float32) for x in stats))
            mean, std = stats.mean, obsnorm.std(stats, np)
        rng = np.random.default_rng(seed)
        returns, lengths, seen = [], [], []
        for _ in range(self.num_episodes):
            obs, _ = env.reset(seed=int(rng.integers(2**31 - 1)))
            total, steps, observed = 0.0, 0, []
            while steps < limit:
                x = self.features(obs)
                observed.append(x)
                if mean is not None:
                    x = np.clip((x - mean) / std, -obsnorm.CLIP, obsnorm.CLIP)
                obs, reward, terminated, truncated, _ = env.step(self.act(params, x))
                total += float(reward) + reward_offset
                steps += 1
                if terminated or truncated:
                    break
            returns.append(total)
            lengths.append(steps)
            seen.append(_obs_stats(np.stack(observed)))
        combined = obsnorm.combine(obsnorm.ObsStats(*(np.stack(x) for x in zip(*seen))), np)
        return np.asarray(returns), np.asarray(lengths), combined

    # ----------------------------------------------------------------- fitness

    def evaluate(self, params: PyTree, seed: int, fitness_state: EnvFitnessState):
        """``(mean training return, MemberStats)`` of one member: ``fn`` of the ``es.HostFitness`` (in a worker)."""
        returns, lengths, seen = self.rollout(params, seed, fitness_state.obs, self.reward_offset, self.training_steps)
        obs_stats = seen if self.obs_norm else None
        return float(np.mean(returns)), MemberStats(np.float32(np.sum(lengths)), obs_stats)

    def init_fitness_state(self) -> EnvFitnessState:
        """Zero env steps and (with ``obs_norm``) empty observation statistics."""
        obs = obsnorm.init(self.obs_size) if self.obs_norm else None
        return EnvFitnessState(jnp.zeros((), jnp.float32), obs)

    @property
    def fitness(self):
        """What to hand ``es.evolve``: ``host_fitness``, wrapped in an ``es.CommonRandomNumbers`` when
        ``common_random_numbers`` is set.

        Stateful: ``state.fitness_state`` is an ``EnvFitnessState`` that counts
        env steps and holds the running observation statistics; create the
        state with ``strategy.init(key, params, fitness=task.fitness)``.
        """
        if self.common_random_numbers is None:
            return self.host_fitness
        return es.CommonRandomNumbers(self.host_fitness, self.common_random_numbers)

    @functools.cached_property
    def host_fitness(self) -> es.HostFitness:
        """The task's ``es.HostFitness`` (one per task object: its pool persists; ``close()`` it, or use it
        as a context manager)."""
        scalar = jax.ShapeDtypeStruct((), jnp.float32)
        vector = jax.ShapeDtypeStruct((self.obs_size,), jnp.float32)
        stats = MemberStats(scalar, obsnorm.ObsStats(scalar, vector, vector) if self.obs_norm else None)
        return es.HostFitness(
            self.evaluate, self.num_workers, self.timeout_s,
            init=self.init_fitness_state, update=update_fitness_state, stats=stats,
        )

    def held_out(self, num_episodes: int) -> GymTask:
        """This task as it is evaluated: ``num_episodes`` episodes, each with its own seed (``mean_return`` runs
        them in this process)."""
        return dataclasses.replace(self, num_episodes=num_episodes, common_random_numbers=None)

    def mean_return(self, params: PyTree, key: jax.Array, fitness_state: EnvFitnessState | None = None) -> float:
        """Mean return over ``num_episodes`` episodes, run in this process (the env's own reward).

        With ``obs_norm`` pass the run's ``state.fitness_state`` (the policy
        was trained on normalised observations). ``key`` seeds the episodes
        as ``es.HostFitness`` seeds a member (``es.host.member_seed``).
        """
        if self.obs_norm and fitness_state is None:
            raise ValueError(
                f"gymnasium:{self.env_id} task has obs_norm=True: pass the running statistics, "
                "mean_return(params, key, state.fitness_state)."
            )
        stats = None if fitness_state is None else fitness_state.obs
        seed = int(member_seed(key))
        params = jax.tree.map(np.asarray, params)
        stats = None if stats is None else obsnorm.ObsStats(*(np.asarray(x) for x in stats))
        return float(np.mean(self.rollout(params, seed, stats)[0]))


def _obs_stats(observed: np.ndarray) -> obsnorm.ObsStats:
    """``ObsStats`` of the observations ``[T, obs_size]`` of one episode."""
    mean = observed.mean(axis=0)
    return obsnorm.ObsStats(np.float32(len(observed)), mean, ((observed - mean) ** 2).sum(axis=0))


# ------------------------------------------------------------------ building


def _head(name: str, space):
    import gymnasium.spaces as spaces

    if isinstance(space, spaces.Discrete):
        return DiscreteHead(int(space.n))
    if isinstance(space, spaces.Box) and np.issubdtype(space.dtype, np.floating):
        shape = tuple(int(s) for s in space.shape)
        low = np.broadcast_to(np.asarray(space.low, np.float32), shape).reshape(-1)
        high = np.broadcast_to(np.asarray(space.high, np.float32), shape).reshape(-1)
        return BoxHead(shape, tuple(float(v) for v in low), tuple(float(v) for v in high))
    raise ValueError(
        f"tasks.make({name!r}): the action space {space} is not supported. The numpy policies produce "
        "continuous actions (a float Box) or one discrete action (Discrete); wrap the environment to map "
        "one of those onto its actions, or optimise it with your own es.HostFitness."
    )


def _observation(name: str, space) -> tuple[int, int]:
    """``(obs_size, obs_categories)`` of the observation space."""
    import gymnasium.spaces as spaces

    if isinstance(space, spaces.Discrete):
        return int(space.n), int(space.n)
    if isinstance(space, spaces.Box):
        return math.prod(space.shape), 0
    raise ValueError(
        f"tasks.make({name!r}): the observation space {space} is not supported (a Box or Discrete)."
    )


def gym_factory(env_id: str):
    """The ``tasks.make`` factory of ``gymnasium:<env_id>``."""
    name = PREFIX + env_id

    def factory(
        num_episodes: int = 1,
        max_steps: int | None = None,
        policy: str = "linear",
        hidden_sizes: tuple[int, ...] | None = None,
        activation: str = "tanh",
        action_squash: str | None = None,
        obs_norm: bool = True,
        reward_offset: float | None = None,
        output_scale: float | None = None,
        num_workers: int | None = None,
        timeout_s: float | None = None,
        env_kwargs: dict | None = None,
        common_random_numbers: str | bool | None = None,
        training_steps: int | None = None,
    ) -> GymTask:
        num_episodes, max_steps, policy = check_episode_options(name, num_episodes, max_steps, policy, POLICIES)
        if policy == "linear" and hidden_sizes not in (None, ()):
            raise ValueError(f"tasks.make({name!r}, hidden_sizes={hidden_sizes!r}): a linear policy has no "
                             "hidden layers; use policy='mlp' with hidden_sizes.")
        hidden_sizes = () if policy == "linear" else hidden_sizes or DEFAULT_HIDDEN_SIZES
        hidden_sizes = check_hidden_sizes(name, hidden_sizes, "e.g. (64, 64)")
        owner = make_owner(name)
        activation = validation.check_choice(owner, "activation", activation, sorted(NUMPY_ACTIVATIONS))
        action_squash = "clip" if action_squash is None and policy == "linear" else action_squash or "tanh"
        action_squash = validation.check_choice(owner, "action_squash", action_squash, ACTION_SQUASHES)
        obs_norm = validation.check_bool(owner, "obs_norm", obs_norm)
        if reward_offset is None:
            family = env_id.split("-v")[0]
            reward_offset = -SURVIVAL_BONUS[family] if family in SURVIVAL_BONUS else 0.0
        reward_offset = validation.check_float(f"tasks.make({name!r})", "reward_offset", reward_offset)
        output_scale = (0.0 if policy == "linear" else 0.01) if output_scale is None else output_scale
        output_scale = validation.check_float(f"tasks.make({name!r})", "output_scale", output_scale, minimum=0.0)
        num_workers = validation.check_optional_int(f"tasks.make({name!r})", "num_workers", num_workers)
        timeout_s = validation.check_optional_float(f"tasks.make({name!r})", "timeout_s", timeout_s, positive=True)
        kwargs_pairs = option_pairs(name, "env_kwargs", env_kwargs)
        family_defaults = TRAINING_DEFAULTS.get(env_id.split("-v")[0], {})
        if common_random_numbers is None:
            common_random_numbers = family_defaults.get("common_random_numbers")
        if common_random_numbers is False:
            common_random_numbers = None
        elif common_random_numbers is not None:
            check_shared_by(owner, common_random_numbers, "common_random_numbers")
        if training_steps is None:
            training_steps = family_defaults.get("training_steps")
        training_steps = validation.check_optional_int(owner, "training_steps", training_steps)

        import gymnasium

        spec = gymnasium.spec(env_id)
        if max_steps is None:
            max_steps = int(spec.max_episode_steps or 1000)
        env = make_env(env_id, max_steps, kwargs_pairs)
        obs_size, categories = _observation(name, env.observation_space)
        head = _head(name, env.action_space)
        if categories and obs_norm:
            obs_norm = False  # one-hot features: nothing to normalise
        net = MLPPolicy(obs_size, head, hidden_sizes, activation, float(output_scale))
        return GymTask(env_id, net, num_episodes, max_steps, obs_norm, action_squash, float(reward_offset),
                       categories, kwargs_pairs, num_workers, timeout_s, common_random_numbers, training_steps)

    factory.__doc__ = f"{name}: a numpy policy's mean episode return (see tasks.gym.GymTask)."
    return factory


def _gymnasium_names() -> list[str]:
    try:
        import gymnasium
    except ImportError:  # the es[gymnasium] extra is not installed
        return []
    return [PREFIX + env_id for env_id in gymnasium.registry]


register_family(_gymnasium_names, lambda name: gym_factory(name[len(PREFIX):]))
