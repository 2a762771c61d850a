"""A hand-written Breakout-MinAtar rule: move the paddle towards the ball's column.

    python -m experiments.breakout_baseline

Shows what a policy a linear map of the observation can represent achieves (logits
``left = a * (paddle_x - ball_x)``, ``right = -left``, ``noop = 0`` are linear in the one-hot
channels), for comparison with the ES results in docs/results.md.
"""

from __future__ import annotations


def main() -> None:
    import jax
    import jax.numpy as jnp

    import tasks

    task = tasks.make("Breakout-MinAtar", num_episodes=16, obs_norm=False)
    env, env_params = task.env, task.gymnax_params

    def track_ball(obs):
        paddle_x = jnp.argmax(obs[9, :, 0])
        ball_x = jnp.argmax(jnp.max(obs[:, :, 1], axis=0))
        return jnp.where(paddle_x > ball_x, 1, jnp.where(paddle_x < ball_x, 2, 0))  # ['n', 'l', 'r']

    def episode(key):
        obs, state = env.reset(key, env_params)

        def body(carry):
            t, alive, obs, state, total = carry
            obs, state, reward, terminated, truncated, _ = env.step(
                jax.random.fold_in(key, t), state, track_ball(obs), env_params
            )
            return t + 1, alive & ~(terminated | truncated), obs, state, total + alive * reward

        init = (0, jnp.bool_(True), obs, state, jnp.float32(0.0))
        t, _, _, _, total = jax.lax.while_loop(lambda c: c[1] & (c[0] < task.max_steps), body, init)
        return total, t

    returns, steps = jax.jit(jax.vmap(episode))(jax.random.split(jax.random.key(0), task.num_episodes))
    print(f"track-the-ball rule on Breakout-MinAtar, {task.num_episodes} episodes: "
          f"returns {returns.tolist()}, steps {steps.tolist()}")


if __name__ == "__main__":
    main()
