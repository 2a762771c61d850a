"""Neural policies for gymnax tasks: an MLP or a small CNN, with a head per action space.

Policies are frozen dataclasses of Python values (sizes, activation names,
action bounds), so they are static and hashable under ``jit``; their
parameters are a plain pytree of float32 arrays::

    {"conv": {"w": f32[k, k, C, channels], "b": f32[channels]},   # CNNPolicy only
     "hidden_0": {"w": f32[n_in, h0], "b": f32[h0]}, ...,
     "out": {"w": f32[h_last, head.size], "b": f32[head.size]}}

They are written in plain ``jax.numpy`` rather than flax: a policy is three
lines of algebra, ES never needs gradients or mutable collections, and a
dataclass of ints and strings is trivially static and hashable (a flax module
holding the same values would work too, but adds a dependency to the config).

Initialisation follows Salimans et al. (2017): hidden layers use
``N(0, 1/fan_in)`` weights and zero biases; the output layer is scaled down
(``output_scale``, default 0.01) so that tanh heads start near the middle of
the action box.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

import es

PyTree = Any

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "tanh": jnp.tanh,
    "relu": jax.nn.relu,
    "elu": jax.nn.elu,
    "gelu": jax.nn.gelu,
    "silu": jax.nn.silu,
    "sigmoid": jax.nn.sigmoid,
    "identity": lambda x: x,
}

DISCRETE_SELECTIONS = ("argmax", "categorical")  # action_selection for Discrete action spaces
BOX_SELECTIONS = ("tanh", "gaussian")  # action_selection for Box action spaces


@dataclasses.dataclass(frozen=True)
class DiscreteHead:
    """``num_actions`` logits -> an int32 action.

    ``selection="argmax"`` is deterministic (ES's usual choice: the noise is in
    the parameters); ``"categorical"`` samples from ``softmax(logits)``.
    """

    num_actions: int
    selection: str = "argmax"

    @property
    def size(self) -> int:
        return self.num_actions

    def act(self, out: jax.Array, key: jax.Array) -> jax.Array:
        if self.selection == "categorical":
            return jax.random.categorical(key, out).astype(jnp.int32)
        return jnp.argmax(out).astype(jnp.int32)


def _squash(low: tuple[float, ...], high: tuple[float, ...], shape: tuple[int, ...], out: jax.Array) -> jax.Array:
    """``low + (tanh(out) + 1) / 2 * (high - low)`` per element (``out`` itself where a bound is infinite)."""
    low, high = np.asarray(low, np.float32), np.asarray(high, np.float32)
    finite = np.isfinite(low) & np.isfinite(high)
    squashed = np.where(finite, low, 0.0) + 0.5 * (jnp.tanh(out) + 1.0) * np.where(finite, high - low, 0.0)
    return jnp.where(finite, squashed, out).reshape(shape)


@dataclasses.dataclass(frozen=True)
class BoxHead:
    """``prod(shape)`` outputs -> ``low + (tanh(out) + 1) / 2 * (high - low)``, shaped ``shape``.

    ``low`` and ``high`` are flat tuples of floats (one per action element);
    elements with an infinite bound are passed through unsquashed. Deterministic
    (``action_selection="tanh"``).
    """

    shape: tuple[int, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def act(self, out: jax.Array, key: jax.Array) -> jax.Array:
        del key
        return _squash(self.low, self.high, self.shape, out)


@dataclasses.dataclass(frozen=True)
class GaussianHead:
    """``2 * prod(shape)`` outputs ``(m, s)`` -> a sampled action in the box (``action_selection="gaussian"``).

    A squashed Gaussian: with ``n = prod(shape)``, ``m = out[:n]``, ``s = out[n:]``
    and ``eps ~ N(0, I_n)`` drawn from the step's action key::

        u      = m + init_std * exp(clip(s, -10, 5)) * eps
        action = low + (tanh(u) + 1) / 2 * (high - low)     (u itself where a bound is infinite)

    so every action lies in ``[low, high]``, and the policy controls its own
    exploration: the standard deviation of ``u`` is ``init_std`` where ``s = 0``
    (as at initialisation, the output layer being scaled down) and shrinks or
    grows with ``s``. The return of a sampled policy is an expectation over
    actions, smooth in the parameters even where a deterministic policy's is
    flat (Salimans et al. 2017 add action noise for the same reason).

    Attributes:
      shape, low, high: as ``BoxHead``.
      init_std: the standard deviation of ``u`` where the log-scale output is 0 (> 0).
    """

    shape: tuple[int, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    init_std: float = 0.5

    @property
    def size(self) -> int:
        return 2 * math.prod(self.shape)

    def act(self, out: jax.Array, key: jax.Array) -> jax.Array:
        n = math.prod(self.shape)
        mean, log_scale = out[:n], out[n:]
        std = self.init_std * jnp.exp(jnp.clip(log_scale, -10.0, 5.0))
        u = mean + std * jax.random.normal(key, (n,), out.dtype)
        return _squash(self.low, self.high, self.shape, u)


Head = DiscreteHead | BoxHead | GaussianHead


def _dense_init(key: jax.Array, n_in: int, n_out: int, scale: float = 1.0) -> dict:
    w = scale * jax.random.normal(key, (n_in, n_out), jnp.float32) / math.sqrt(n_in)
    return {"w": w, "b": jnp.zeros((n_out,), jnp.float32)}


def _dense(layer: dict, x: jax.Array) -> jax.Array:
    """``x @ w + b``; ``es.matmul`` so that ``es.LowRankNoise(factored=True)`` keeps ``w`` factored."""
    return es.matmul(x, layer["w"]) + layer["b"]


def _mlp_init(key: jax.Array, n_in: int, hidden_sizes: tuple[int, ...], n_out: int, output_scale: float):
    keys = jax.random.split(key, len(hidden_sizes) + 1)
    params = {}
    for i, size in enumerate(hidden_sizes):
        params[f"hidden_{i}"] = _dense_init(keys[i], n_in, size)
        n_in = size
    params["out"] = _dense_init(keys[-1], n_in, n_out, output_scale)
    return params


def _mlp_apply(params: dict, x: jax.Array, num_hidden: int, activation: str) -> jax.Array:
    act = ACTIVATIONS[activation]
    for i in range(num_hidden):
        x = act(_dense(params[f"hidden_{i}"], x))
    return _dense(params["out"], x)


@dataclasses.dataclass(frozen=True)
class MLPPolicy:
    """Flattened observation -> hidden layers -> head.

    Attributes:
      obs_size: number of observation features (after flattening).
      head: a ``DiscreteHead``, ``BoxHead`` or ``GaussianHead``.
      hidden_sizes: widths of the hidden layers (``()`` gives a linear policy).
      activation: a key of ``ACTIVATIONS``.
      output_scale: scale of the output layer's initial weights.
    """

    obs_size: int
    head: Head
    hidden_sizes: tuple[int, ...] = (32, 32)
    activation: str = "tanh"
    output_scale: float = 0.01

    def init(self, key: jax.Array) -> PyTree:
        return _mlp_init(key, self.obs_size, self.hidden_sizes, self.head.size, self.output_scale)

    def logits(self, params: PyTree, obs: jax.Array) -> jax.Array:
        """float32[head.size], the head's input for one observation."""
        return _mlp_apply(params, obs.reshape(-1), len(self.hidden_sizes), self.activation)

    def apply(self, params: PyTree, obs: jax.Array, key: jax.Array) -> jax.Array:
        """The action for one observation (``key`` is used by sampling heads only)."""
        return self.head.act(self.logits(params, obs), key)


@dataclasses.dataclass(frozen=True)
class CNNPolicy:
    """Image ``[H, W, C]`` -> one ``kernel x kernel`` conv (SAME, stride 1) -> MLP -> head.

    The MinAtar baseline architecture (Young & Tian 2019) with ``channels=16``
    and ``hidden_sizes=(128,)``; a 2-D observation ``[H, W]`` is one channel.
    """

    obs_shape: tuple[int, ...]
    head: Head
    channels: int = 16
    kernel: int = 3
    hidden_sizes: tuple[int, ...] = (64,)
    activation: str = "relu"
    output_scale: float = 0.01

    @property
    def _image_shape(self) -> tuple[int, int, int]:
        return self.obs_shape if len(self.obs_shape) == 3 else (*self.obs_shape, 1)

    def init(self, key: jax.Array) -> PyTree:
        conv_key, mlp_key = jax.random.split(key)
        h, w, c = self._image_shape
        fan_in = self.kernel * self.kernel * c
        conv = {
            "w": jax.random.normal(conv_key, (self.kernel, self.kernel, c, self.channels), jnp.float32)
            / math.sqrt(fan_in),
            "b": jnp.zeros((self.channels,), jnp.float32),
        }
        mlp = _mlp_init(mlp_key, h * w * self.channels, self.hidden_sizes, self.head.size, self.output_scale)
        return {"conv": conv, **mlp}

    def logits(self, params: PyTree, obs: jax.Array) -> jax.Array:
        x = obs.reshape((1, *self._image_shape))
        x = jax.lax.conv_general_dilated(
            x, params["conv"]["w"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        x = ACTIVATIONS[self.activation](x + params["conv"]["b"])
        mlp = {k: v for k, v in params.items() if k != "conv"}
        return _mlp_apply(mlp, x.reshape(-1), len(self.hidden_sizes), self.activation)

    def apply(self, params: PyTree, obs: jax.Array, key: jax.Array) -> jax.Array:
        return self.head.act(self.logits(params, obs), key)


Policy = MLPPolicy | CNNPolicy
