"""compute_gae of every top-level script against a plain per-env loop (terminations, truncations and both at once)."""

import glob
import os

import numpy as np
import pytest
import torch
from conftest import ROOT, import_script

SCRIPTS = sorted(
    os.path.basename(path)[: -len(".py")]
    for pattern in ("ppo_*.py", "ppg_*.py")
    for path in glob.glob(os.path.join(ROOT, pattern))
)


def reference_gae(rewards, values, terminations, truncations, final_values, next_value, gamma, lam):
    """A plain per-env loop: terminated steps bootstrap nothing, truncated ones the value of their final obs."""
    num_steps, num_envs = rewards.shape
    advantages = np.zeros((num_steps, num_envs))
    for env in range(num_envs):
        following = 0.0
        for t in reversed(range(num_steps)):
            if terminations[t, env]:
                successor, carry = 0.0, 0.0
            elif truncations[t, env]:
                successor, carry = final_values[t, env], 0.0
            else:
                successor = values[t + 1, env] if t + 1 < num_steps else next_value[env]
                carry = following
            delta = rewards[t, env] + gamma * successor - values[t, env]
            following = delta + gamma * lam * carry
            advantages[t, env] = following
    return advantages, advantages + values


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("seed", range(3))
def test_gae_matches_a_plain_loop(script, seed):
    rng = np.random.default_rng(seed)
    num_steps, num_envs = 33, 6
    rewards, values = rng.normal(size=(num_steps, num_envs)), rng.normal(size=(num_steps, num_envs))
    terminations = rng.random((num_steps, num_envs)) < 0.1
    truncations = rng.random((num_steps, num_envs)) < 0.1  # both at once happens too: termination wins
    final_values = rng.normal(size=(num_steps, num_envs)) * truncations
    next_value = rng.normal(size=num_envs)
    expected = reference_gae(rewards, values, terminations, truncations, final_values, next_value, 0.97, 0.9)
    t = lambda a: torch.as_tensor(a, dtype=torch.float64)  # noqa: E731
    got = import_script(script).compute_gae(
        t(rewards), t(values), t(terminations).bool(), t(truncations).bool(), t(final_values), t(next_value), 0.97, 0.9
    )
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g.numpy(), e, atol=1e-10)


@pytest.mark.parametrize("script", SCRIPTS)
def test_explained_variance_matches_numpy(script):
    """explained_variance against numpy's variances; NaN, not a division by zero, where returns are constant."""
    explained_variance = import_script(script).explained_variance
    rng = np.random.default_rng(0)
    returns, values = rng.normal(size=(16, 4)), rng.normal(size=(16, 4))
    expected = 1 - np.var(returns - values) / np.var(returns)
    got = explained_variance(*(torch.tensor(x, dtype=torch.float32) for x in (values, returns)))
    assert got.shape == () and abs(got.item() - expected) < 1e-5
    perfect = explained_variance(torch.tensor(returns), torch.tensor(returns))
    assert perfect.item() == pytest.approx(1.0)
    assert torch.isnan(explained_variance(torch.tensor(values), torch.full((16, 4), 3.0)))
