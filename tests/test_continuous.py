"""ppo_continuous.py: the tanh-squashed Gaussian against torch.distributions, normalisation that survives a
checkpoint, GAE and truncations, the CLI on Pendulum, BipedalWalker and HalfCheetah, and learning on Pendulum."""

import functools
import glob
import math
import os

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import (
    EPISODE_TAGS,
    ITERATION_TAGS,
    assert_ctrl_c_keeps_logs_and_a_checkpoint,
    assert_non_finite_loss_stops_and_keeps_last_good_checkpoint,
    assert_one_line_error,
    assert_same_seed_same_losses,
    assert_training_replays_the_rollout,
    first_step_reaching,
    import_script,
    read_scalars,
    run_dirs,
    run_script,
)
from test_fsmn_cartpole import reference_gae
from torch.distributions import AffineTransform, Normal, TanhTransform, TransformedDistribution

SCRIPT = "ppo_continuous.py"
p = import_script("ppo_continuous")
TINY = ["--num-envs", "2", "--num-minibatches", "2", "--update-epochs", "2", "--no-progress"]


def random_params(seed: int, batch: int = 64, act_dim: int = 3, dtype=torch.float64):
    """Random means, log-stds and bounds: bounds of every width, offset from zero, some of them very narrow."""
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(batch, act_dim, generator=g, dtype=dtype) * 3
    log_std = torch.rand(batch, act_dim, generator=g, dtype=dtype) * 4 - 3  # std in [0.05, 2.7]
    low = torch.randn(act_dim, generator=g, dtype=dtype) * 5
    width = torch.tensor([1e-3, 1.0, 40.0], dtype=dtype)[:act_dim]
    return mean, log_std, low, low + width, g


def reference_distribution(mean, log_std, low, high) -> TransformedDistribution:
    """torch's own squashed Gaussian: Normal, then tanh, then the affine map of [-1, 1] onto [low, high]. Both
    transforms cache their last input, so log_prob of a sample never goes through atanh."""
    return TransformedDistribution(
        Normal(mean, log_std.exp()),
        [TanhTransform(cache_size=1), AffineTransform(loc=(high + low) / 2, scale=(high - low) / 2, cache_size=1)],
    )


# ---------------------------------------------------------------------------------------------------------------------
# The tanh-squashed Gaussian


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("spread", [1.0, 4.0])  # 4: samples deep in the tails, actions within float eps of the bounds
def test_log_prob_and_sample_match_torch_distributions(seed, spread):
    mean, log_std, low, high, _ = random_params(seed)
    mean = mean * spread
    reference = reference_distribution(mean, log_std, low, high)
    torch.manual_seed(seed)
    u = reference.base_dist.sample()
    action = reference.transforms[1](reference.transforms[0](u))  # both transforms now cache their input
    torch.testing.assert_close(p.squash_action(u, low, high), action, rtol=0, atol=1e-12)
    expected = reference.log_prob(action).sum(-1)
    got = p.squashed_log_prob(u, mean, log_std, low, high)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-8)


def test_log_prob_matches_the_naive_formula_where_it_is_finite():
    """Independent of torch's TanhTransform: log N(u) - log(1 - tanh(u)^2) - log((high - low) / 2) in float64."""
    mean, log_std, low, high, g = random_params(7)
    u = torch.randn(mean.shape, generator=g, dtype=torch.float64) * 4
    naive = Normal(mean, log_std.exp()).log_prob(u) - torch.log(1 - torch.tanh(u) ** 2) - torch.log((high - low) / 2)
    torch.testing.assert_close(p.squashed_log_prob(u, mean, log_std, low, high), naive.sum(-1), rtol=1e-9, atol=1e-9)


def test_sampling_distribution_matches_torch_distributions():
    """The agent's own sampler (mean + std * noise, then squash) draws from the same distribution as torch's:
    equal quantiles of 200k actions per dimension."""
    mean = torch.tensor([[0.3, -2.0, 1.5]])
    log_std = torch.tensor([[0.0, -1.0, 0.7]])
    low, high = torch.tensor([-2.0, 0.0, -0.5]), torch.tensor([2.0, 1.0, 3.0])
    torch.manual_seed(0)
    u = mean + log_std.exp() * torch.randn(200_000, 3)
    ours = p.squash_action(u, low, high)
    theirs = reference_distribution(mean.double(), log_std.double(), low.double(), high.double()).sample((200_000,))[:, 0]
    q = torch.tensor([0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99], dtype=torch.float64)
    scale = (high - low).double()
    torch.testing.assert_close(
        torch.quantile(ours.double(), q, dim=0) / scale, torch.quantile(theirs, q, dim=0) / scale, atol=0.01, rtol=0
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_no_nan_or_inf_for_large_pre_squash_values(dtype):
    """|u| up to 20 (tanh(u) == +-1 in float32 from |u| ~ 9): log-prob, log-det and gradients stay finite."""
    u = torch.linspace(-20, 20, 401, dtype=dtype).unsqueeze(-1).requires_grad_()
    mean = torch.zeros(401, 1, dtype=dtype, requires_grad=True)
    log_std = torch.full((401, 1), 1.0, dtype=dtype, requires_grad=True)
    low, high = torch.tensor([-2.0], dtype=dtype), torch.tensor([2.0], dtype=dtype)
    log_det = p.tanh_log_abs_det(u)
    logprob = p.squashed_log_prob(u, mean, log_std, low, high)
    entropy = p.squashed_entropy(mean, log_std, low, high, u.detach() * 2)
    (logprob.sum() + entropy.sum()).backward()
    for t in (log_det, logprob, entropy, u.grad, mean.grad, log_std.grad):
        assert torch.isfinite(t).all()
    # -log(1 - tanh(u)^2) ~ 2|u| - 2 log 2 in the tails
    torch.testing.assert_close(log_det[[0, -1], 0], torch.full((2,), -2 * 20 + 2 * math.log(2), dtype=dtype))
    action = p.squash_action(u.detach(), low, high)
    assert ((action >= low) & (action <= high)).all()


def test_entropy_estimate_is_unbiased():
    """Averaged over many noise draws, the one-sample estimate equals -E[log p(a)] under torch's distribution."""
    mean, log_std = torch.tensor([[0.5, -1.0]], dtype=torch.float64), torch.tensor([[0.3, -0.5]], dtype=torch.float64)
    low, high = torch.tensor([-1.0, 0.0], dtype=torch.float64), torch.tensor([1.0, 5.0], dtype=torch.float64)
    torch.manual_seed(0)
    estimate = p.squashed_entropy(mean, log_std, low, high, torch.randn(400_000, 2, dtype=torch.float64)).mean()
    reference = reference_distribution(mean, log_std, low, high)
    monte_carlo = -reference.log_prob(reference.sample((400_000,))).sum(-1).mean()
    assert abs(estimate - monte_carlo) < 0.02, (estimate, monte_carlo)


def make_agent(state_dependent_std: bool, seed: int = 0, log_std_init: float = 0.0):
    torch.manual_seed(seed)
    args = p.Args(state_dependent_std=state_dependent_std, log_std_init=log_std_init, actor_hidden_sizes=(16,))
    space = gym.spaces.Box(np.array([-3.0, 0.5, -0.01], np.float32), np.array([-1.0, 0.6, 0.01], np.float32))
    return p.Agent(5, space, args), space


@pytest.mark.parametrize("state_dependent_std", [False, True])
def test_actions_within_bounds_and_deterministic_action_is_rescaled_tanh_mean(state_dependent_std):
    agent, space = make_agent(state_dependent_std, log_std_init=2.0)  # wide: many samples saturate tanh
    with torch.no_grad():
        agent.actor_mean.weight.normal_(0, 3)  # means far in the tails too
        x = torch.randn(4096, 5) * 3
        u, logprob, entropy, value = agent.get_action_and_value(x)
        assert u.shape == (4096, 3) and logprob.shape == entropy.shape == value.shape == (4096,)
        assert torch.isfinite(logprob).all() and torch.isfinite(entropy).all()
        for action in (p.squash_action(u, agent.action_low, agent.action_high), agent.act(x, deterministic=False)):
            assert all(space.contains(a) for a in action.numpy())
        mean, log_std = agent.actor_params(x)
        assert (log_std >= agent.log_std_min).all() and (log_std <= agent.log_std_max).all()
        low, high = torch.as_tensor(space.low), torch.as_tensor(space.high)
        torch.testing.assert_close(agent.act(x, deterministic=True), low + (torch.tanh(mean) + 1) / 2 * (high - low))
        # the log-prob of a given u is the one the rollout stored: evaluation on stored samples is exact
        _, again, _, _ = agent.get_action_and_value(x, u)
        torch.testing.assert_close(again, logprob, rtol=0, atol=0)


def test_state_dependent_std_depends_on_the_state():
    agent, _ = make_agent(state_dependent_std=True, log_std_init=-0.5)
    with torch.no_grad():
        _, log_std = agent.actor_params(torch.randn(8, 5))
    assert log_std.std(0).max() > 0 and abs(log_std.mean() + 0.5) < 0.1
    agent, _ = make_agent(state_dependent_std=False, log_std_init=-0.5)
    with torch.no_grad():
        _, log_std = agent.actor_params(torch.randn(8, 5))
    assert (log_std == -0.5).all()


# ---------------------------------------------------------------------------------------------------------------------
# Normalisation statistics: correct, saved, restored exactly, frozen in evaluation


def test_running_norm_matches_numpy():
    norm = p.RunningNorm(3)
    data = np.random.default_rng(0).normal(loc=[1.0, -5.0, 100.0], scale=[0.1, 2.0, 30.0], size=(1000, 3))
    for chunk in np.array_split(data, 17):
        norm.update(torch.as_tensor(chunk, dtype=torch.float32))
    np.testing.assert_allclose(norm.mean.numpy(), data.mean(0), rtol=1e-5)
    np.testing.assert_allclose(norm.var.numpy(), data.var(0), rtol=1e-3)
    assert float(norm.count) == pytest.approx(1000)
    x = torch.tensor([[1.0, -5.0, 100.0], [1e6, -1e6, 100.0]])
    expected = np.clip((x.numpy() - data.mean(0)) / np.sqrt(data.var(0) + 1e-8), -10, 10)
    np.testing.assert_allclose(norm(x).numpy(), expected, rtol=1e-3, atol=1e-3)


def stats_of(state: dict) -> dict:
    return {k: v.clone() for k, v in state.items() if k.startswith(("obs_norm.", "return_norm."))}


def test_normalisation_statistics_round_trip_and_are_frozen_in_evaluation(in_tmp, monkeypatch):
    args = p.Args(num_envs=2, num_steps=64, total_timesteps=2 * 64 * 3, num_minibatches=2, progress=False)
    args.save_model = True
    p.main(args)
    (path,) = glob.glob("runs/*/checkpoint.pt")
    checkpoint = torch.load(path, weights_only=True)
    saved = stats_of(checkpoint["model"])
    assert set(saved) == {f"{m}.{b}" for m in ("obs_norm", "return_norm") for b in ("mean", "var", "count")}
    # every observation the rollouts saw went into the statistics, once each, after its rollout
    assert float(saved["obs_norm.count"]) == pytest.approx(1e-4 + 2 * 64 * 3)
    assert float(saved["return_norm.count"]) == pytest.approx(1e-4 + 2 * 64 * 3)
    assert (saved["obs_norm.var"] != 1).all() and (saved["obs_norm.mean"] != 0).all()

    agent, _ = p.build_agent_from_checkpoint(checkpoint, torch.device("cpu"))
    for key, value in stats_of(agent.state_dict()).items():
        assert torch.equal(value, saved[key]), key

    def no_update(self, x):
        raise AssertionError("evaluation must not update the normalisation statistics")

    with monkeypatch.context() as patched:
        patched.setattr(p.RunningNorm, "update", no_update)
        returns = p.evaluate(path, episodes=2, deterministic=True, device=torch.device("cpu"), seed=0)
    assert len(returns) == 2 and all(-3300 < r <= 0 for r in returns)

    # evaluation with frozen statistics is reproducible: same returns on a second load
    assert p.evaluate(path, episodes=2, deterministic=True, device=torch.device("cpu"), seed=0) == returns

    # --resume starts from the saved statistics: after 2 more iterations the count is the saved one plus the new samples
    args = p.Args(num_envs=2, num_steps=64, total_timesteps=2 * 64 * 5, num_minibatches=2, progress=False)
    args.save_model, args.resume = True, path
    p.main(args)
    resumed = stats_of(torch.load(path, weights_only=True)["model"])
    assert float(resumed["obs_norm.count"]) == pytest.approx(float(saved["obs_norm.count"]) + 2 * 64 * 2)


def test_no_norm_obs_leaves_observations_raw():
    plain = p.Agent(3, gym.spaces.Box(-1, 1, (1,)), p.Args(norm_obs=False))
    raw = torch.tensor([[100.0, -3.0, 0.5]])
    torch.testing.assert_close(plain.obs_norm(raw), raw)


def test_training_replays_the_rollout_exactly(in_tmp, monkeypatch):
    """Training sees the observations normalised by the statistics the rollout used (frozen for its length, updated
    after it): at a learning rate of 0, KL 0 in every minibatch."""
    assert_training_replays_the_rollout(p, monkeypatch, num_envs=4, num_steps=48, num_minibatches=2)


def test_compiled_loss_equals_eager_and_training_replays_the_rollout(in_tmp, monkeypatch):
    """--compile: the compiled minibatch loss equals the eager one (1e-5), the loss and every statistic but the
    entropy estimate, whose noise inductor draws from its own generator; compiled as the script does (the minibatch
    gathered inside, inductor's C++ wrapper), the loss and its gradients too; and a compiled run replays its rollout
    (KL 0 at a learning rate of 0), so the compiled rollout step and the compiled loss agree on log-probabilities."""
    torch.manual_seed(0)
    agent, args = p.Agent(3, gym.spaces.Box(-2.0, 2.0, (2,)), p.Args()), p.Args()
    with torch.no_grad():
        agent.actor_mean.weight.normal_()
    minibatch = (torch.randn(16, 3), torch.randn(16, 2), -torch.rand(16), torch.randn(16), torch.randn(16), torch.randn(16))
    eager_loss, eager_stats = p.minibatch_loss(agent, args, *minibatch)
    compiled_loss, compiled_stats = torch.compile(p.minibatch_loss)(agent, args, *minibatch)
    torch.testing.assert_close(compiled_loss, eager_loss, atol=1e-5, rtol=1e-5)
    not_entropy = [0, 1, 3, 4, 5, 6]
    torch.testing.assert_close(compiled_stats[not_entropy], eager_stats[not_entropy], atol=1e-5, rtol=1e-5)
    # as the script compiles it on the CPU: the gather inside, inductor's C++ wrapper; the loss and its gradients
    batch, mb_inds = tuple(torch.cat([x, x.flip(0)]) for x in minibatch), torch.tensor([20, 3, 7, 31, 0, 12])
    gradients = []
    for loss_fn in (p.minibatch_loss_at, torch.compile(p.minibatch_loss_at, options={"cpp_wrapper": True})):
        agent.zero_grad()
        loss, _ = loss_fn(agent, args, mb_inds, *batch)
        loss.backward()
        gradients.append([loss.detach()] + [param.grad.clone() for param in agent.parameters()])
    for compiled, eager in zip(*gradients[::-1]):
        torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-4)
    assert_training_replays_the_rollout(p, monkeypatch, num_envs=4, num_steps=48, num_minibatches=2, compile=True)


def test_the_rollout_runs_on_rollout_threads_and_the_update_on_all(in_tmp, monkeypatch):
    """--rollout-threads: every rollout step runs on that many torch CPU threads, every minibatch on the count the
    run started with (here 3, so neither is the default); 0 leaves the rollout on the update's count."""
    seen = []
    for name in ("rollout_step", "minibatch_loss"):
        original = getattr(p, name)

        def spy(*inputs, original=original, name=name):
            seen.append((name, torch.get_num_threads()))
            return original(*inputs)

        monkeypatch.setattr(p, name, spy)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        for rollout_threads, expected in ((2, 2), (0, 3)):
            seen.clear()
            args = dict(num_envs=2, num_steps=16, total_timesteps=64, num_minibatches=2, progress=False)
            p.main(p.Args(**args, rollout_threads=rollout_threads))
            assert set(seen) == {("rollout_step", expected), ("minibatch_loss", 3)}
            assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(threads)


def test_the_rollout_sample_is_the_update_distribution():
    """sample_action_and_value (the rollout's call) draws u from the same Gaussian and gives the same log-prob and
    value as get_action_and_value (the update's) for that u."""
    agent = p.Agent(3, gym.spaces.Box(-2.0, 2.0, (2,)), p.Args())
    with torch.no_grad():
        agent.actor_mean.weight.normal_()
    x = torch.randn(5, 3)
    torch.manual_seed(0)
    u, logprob, value = agent.sample_action_and_value(x)
    torch.manual_seed(0)
    u_ref, logprob_ref, _, value_ref = agent.get_action_and_value(x)
    torch.testing.assert_close(u, u_ref, rtol=0, atol=0)
    torch.testing.assert_close(logprob, logprob_ref, rtol=0, atol=0)
    torch.testing.assert_close(value, value_ref, rtol=0, atol=0)


@pytest.mark.parametrize("compile", [False, True])
def test_the_rollout_step_gives_the_env_the_squash_of_its_own_sample(compile):
    """rollout_step returns the env action (squashed inside the compiled graph under --compile): exactly
    squash_action of the u it stores, in the bounds, for the sample drawn from the normalised observation."""
    low, high = np.array([-2.0, 0.0, -1.0], dtype=np.float32), np.array([2.0, 3.0, -0.5], dtype=np.float32)
    agent = p.Agent(4, gym.spaces.Box(low, high), p.Args())
    with torch.no_grad():
        agent.actor_mean.weight.normal_(std=5.0)
        agent.obs_norm.mean.fill_(1.0)
    obs = torch.randn(64, 4)
    step = torch.compile(p.rollout_step, options={"cpp_wrapper": True}) if compile else p.rollout_step  # as the script
    torch.manual_seed(0)
    with torch.inference_mode():
        u, logprob, value, env_action = step(agent, obs)
    torch.manual_seed(0)
    with torch.inference_mode():
        u_ref, logprob_ref, value_ref = agent.sample_action_and_value(agent.obs_norm(obs))
    torch.testing.assert_close(env_action, p.squash_action(u, agent.action_low, agent.action_high), rtol=0, atol=1e-6)
    assert (env_action >= agent.action_low).all() and (env_action <= agent.action_high).all()
    if not compile:  # inductor draws its own random stream
        torch.testing.assert_close((u, logprob, value), (u_ref, logprob_ref, value_ref), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------------------------
# GAE and truncations


@pytest.mark.parametrize("seed", range(3))
def test_gae_matches_a_plain_loop(seed):
    rng = np.random.default_rng(seed)
    num_steps, num_envs = 40, 5
    rewards, values = rng.normal(size=(num_steps, num_envs)), rng.normal(size=(num_steps, num_envs))
    terminations = rng.random((num_steps, num_envs)) < 0.05
    truncations = rng.random((num_steps, num_envs)) < 0.1
    final_values = rng.normal(size=(num_steps, num_envs)) * truncations
    next_value = rng.normal(size=num_envs)
    expected = reference_gae(rewards, values, terminations, truncations, final_values, next_value, 0.95, 0.95)
    t = lambda a: torch.as_tensor(a, dtype=torch.float64)
    got = p.compute_gae(
        t(rewards), t(values), t(terminations).bool(), t(truncations).bool(), t(final_values), t(next_value), 0.95, 0.95
    )
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g.numpy(), e, atol=1e-10)


def test_truncations_bootstrap_from_the_normalised_final_observation(in_tmp, monkeypatch):
    """Inside the script's loop, on a Pendulum truncated every 12 steps: final values are filled exactly at the
    truncated steps, each the critic's value of the raw final observation normalised with the statistics in use."""
    gym.register("PendulumShort-v1", entry_point="gymnasium.envs.classic_control:PendulumEnv", max_episode_steps=12)
    seen, normalized, valued = [], [], []
    original_gae, original_norm, original_value = p.compute_gae, p.RunningNorm.forward, p.Agent.get_value

    def spy_gae(rewards, values, terminations, truncations, final_values, next_value, gamma, gae_lambda):
        seen.append([x.clone() for x in (terminations, truncations, final_values)])
        return original_gae(rewards, values, terminations, truncations, final_values, next_value, gamma, gae_lambda)

    def spy_norm(self, x):
        out = original_norm(self, x)
        normalized.append((x.clone(), out.clone(), self.mean.clone(), self.var.clone()))
        return out

    def spy_value(self, x):
        value = original_value(self, x)
        valued.append((x.clone(), value.clone()))
        return value

    monkeypatch.setattr(p, "compute_gae", spy_gae)
    monkeypatch.setattr(p.RunningNorm, "forward", spy_norm)
    monkeypatch.setattr(p.Agent, "get_value", spy_value)
    args = p.Args(env_id="PendulumShort-v1", num_envs=3, num_steps=20, total_timesteps=180, num_minibatches=2, progress=False)
    p.main(args)
    terminations, truncations, final_values = (torch.cat(x) for x in zip(*seen))
    assert truncations.sum() == 3 * (60 // 12) and not terminations.any()
    assert (final_values[~truncations] == 0).all() and (final_values[truncations] != 0).all()

    nontrivial = []
    for expected_values in final_values[truncations].view(-1, 3):  # all three envs are truncated at the same steps
        (critic_input,) = [x for x, v in valued if v.shape == (3,) and torch.equal(v, expected_values)]
        (raw, mean, var) = [(x, m, s) for x, out, m, s in normalized if torch.equal(out, critic_input)][0]
        torch.testing.assert_close(raw[:, 0] ** 2 + raw[:, 1] ** 2, torch.ones(3))  # (cos, sin, omega): a real observation
        nontrivial.append(not torch.equal(raw, critic_input) and float(var.min()) != 1.0)
        torch.testing.assert_close(critic_input, ((raw - mean) / torch.sqrt(var + 1e-8)).clamp(-10, 10), rtol=0, atol=0)
    # the first rollout (truncated at step 12) runs with the initial statistics; the 4 truncations after it with the
    # statistics updated after each rollout
    assert nontrivial == [False, True, True, True, True]


# ---------------------------------------------------------------------------------------------------------------------
# Determinism and a non-finite loss


def test_same_seed_same_losses(in_tmp):
    assert_same_seed_same_losses(p, num_envs=2, num_steps=64, num_minibatches=2)


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(in_tmp, monkeypatch):
    assert_non_finite_loss_stops_and_keeps_last_good_checkpoint(p, monkeypatch, num_envs=2, num_steps=32, num_minibatches=2)


# ---------------------------------------------------------------------------------------------------------------------
# The envs


def test_the_envs_step_as_gymnasium_makes_them_but_with_an_empty_info():
    """make_env's DropStepInfo: the same observations, rewards and flags as HalfCheetah made by gym.make, step for step
    up to a truncation, and no step info of the env's own (x_velocity, ...); a vector env of them (in this process and
    in worker processes) still reports each truncated episode's final observation and statistics."""
    limit, rng = 30, np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (2 * limit, 2, 6)).astype(np.float32)

    def ours(i, in_worker=False):
        return lambda: gym.wrappers.TimeLimit(p.make_env("HalfCheetah-v5", i, False, "unused", in_worker)(), limit)

    plain = [gym.make("HalfCheetah-v5", max_episode_steps=limit) for _ in range(2)]
    vector_envs = [gym.vector.SyncVectorEnv, functools.partial(gym.vector.AsyncVectorEnv, context="fork")]
    for vector_env, in_worker in zip(vector_envs, (False, True)):
        envs = vector_env([ours(i, in_worker) for i in range(2)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
        obs, _ = envs.reset(seed=[3, 4])
        np.testing.assert_array_equal(obs, np.stack([env.reset(seed=s)[0] for env, s in zip(plain, (3, 4))]))
        for t in range(limit):
            obs, reward, terminated, truncated, infos = envs.step(actions[t])
            steps = [env.step(a) for env, a in zip(plain, actions[t])]
            assert all("x_velocity" in info for *_, info in steps)
            np.testing.assert_array_equal(reward, [r for _, r, *_ in steps])
            np.testing.assert_array_equal(terminated, [te for *_, te, _, _ in steps])
            np.testing.assert_array_equal(truncated, [tr for *_, tr, _ in steps])
            if t < limit - 1:
                np.testing.assert_array_equal(obs, np.stack([o for o, *_ in steps]))
                assert infos == {}  # no step info at all between episode ends
        assert truncated.all() and infos["_final_obs"].all() and infos["_episode"].all()
        np.testing.assert_array_equal(np.stack(infos["final_obs"]), np.stack([o for o, *_ in steps]))
        assert (infos["episode"]["l"] == limit).all() and "x_velocity" not in infos["final_info"]
        envs.close()


# ---------------------------------------------------------------------------------------------------------------------
# The CLI: smoke runs, checkpoint, resume, evaluation, bad input


@pytest.mark.smoke
@pytest.mark.parametrize(
    "env_id, steps, extra",
    [
        ("Pendulum-v1", 100, []),  # 2 envs x 100 steps x 2 iterations: every env finishes its first 200-step episode
        ("BipedalWalker-v3", 32, ["--state-dependent-std", "--actor-hidden-sizes", "32", "--critic-hidden-sizes", "32", "16"]),
        ("HalfCheetah-v5", 32, ["--no-norm-reward"]),
    ],
)
def test_cli_smoke_checkpoint_resume_and_evaluation(tmp_path, env_id, steps, extra):
    cwd = str(tmp_path)
    flags = [*TINY, "--env-id", env_id, "--num-steps", str(steps), *extra]
    batch = 2 * steps
    result = run_script(SCRIPT, *flags, "--total-timesteps", str(2 * batch), "--save-model", "--save-interval", "1", cwd=cwd)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(cwd)
    scalars = read_scalars(run_dir)
    assert ITERATION_TAGS <= set(scalars), set(scalars)
    if env_id == "Pendulum-v1":
        assert EPISODE_TAGS <= set(scalars), set(scalars)
    assert [step for step, _ in scalars["charts/SPS"]] == [batch, 2 * batch]

    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    assert checkpoint["script"] == "ppo_continuous"
    assert (checkpoint["iteration"], checkpoint["global_step"]) == (2, 2 * batch)
    assert {"args", "model", "optimizer", "rng_states", "run_name"} <= set(checkpoint)
    assert {"obs_norm.mean", "obs_norm.var", "obs_norm.count", "return_norm.var"} <= set(checkpoint["model"])
    assert checkpoint["args"]["env_id"] == env_id
    assert not glob.glob(os.path.join(run_dir, "*.tmp"))

    result = run_script(
        SCRIPT, *flags, "--total-timesteps", str(3 * batch), "--save-model", "--resume", checkpoint_path, cwd=cwd
    )
    assert result.returncode == 0, result.stderr
    assert run_dirs(cwd) == [run_dir]
    assert [step for step, _ in read_scalars(run_dir)["charts/SPS"]] == [batch, 2 * batch, 3 * batch]
    assert torch.load(checkpoint_path, weights_only=True)["global_step"] == 3 * batch

    result = run_script(SCRIPT, "--eval-checkpoint", checkpoint_path, "--eval-episodes", "1", cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert "eval: 1 episodes, mean return" in result.stdout


def test_periodic_evaluation_logs_and_keeps_the_best_policy_across_a_resume(in_tmp, monkeypatch):
    """--eval-interval: charts/eval_return at every evaluated iteration; best.pt holds the policy of the best one, and
    evaluating best.pt as the evaluation mode does gives exactly its logged return (here sampling actions: evaluation
    draws from its own seeded generator); training is the same as without evaluation; after --resume the best so far
    still counts (a best.pt no evaluation can beat stays)."""
    args = dict(num_envs=2, num_steps=100, num_minibatches=2, eval_episodes=2, progress=False, cuda=False)
    p.main(p.Args(**args, total_timesteps=1600, eval_interval=2, eval_deterministic=False, save_model=True))
    (run_dir,) = run_dirs(".")  # 8 iterations of 200 steps, evaluated at 2, 4, 6 and 8
    logged = read_scalars(run_dir)["charts/eval_return"]
    assert [step for step, _ in logged] == [400, 800, 1200, 1600]
    best_path = os.path.join(run_dir, "best.pt")
    best = torch.load(best_path, weights_only=True)
    best_step, best_return = max(logged, key=lambda x: x[1])  # max keeps the first of equal values
    assert best["global_step"] == best_step and best["eval_return"] == pytest.approx(best_return, rel=1e-6)
    replay = p.evaluate(best_path, episodes=2, deterministic=False, device=torch.device("cpu"), seed=1)
    assert float(np.mean(replay)) == best["eval_return"]

    os.mkdir("plain")
    monkeypatch.chdir("plain")
    p.main(p.Args(**args, total_timesteps=1600))
    for tag in ("losses/value_loss", "losses/approx_kl", "charts/episodic_return"):
        assert read_scalars(run_dirs(".")[0])[tag] == read_scalars(os.path.join("..", run_dir))[tag], tag
    monkeypatch.chdir("..")

    torch.save({**best, "eval_return": 0.0}, best_path)  # Pendulum's returns are below 0
    resume = os.path.join(run_dir, "checkpoint.pt")
    p.main(p.Args(**args, total_timesteps=2800, eval_interval=2, eval_deterministic=False, save_model=True, resume=resume))
    assert [step for step, _ in read_scalars(run_dir)["charts/eval_return"]] == [400, 800, 1200, 1600, 2000, 2400, 2800]
    kept = torch.load(best_path, weights_only=True)
    assert (kept["eval_return"], kept["global_step"]) == (0.0, best_step)


@pytest.mark.smoke
def test_async_envs_run_exactly_as_sync_envs(tmp_path):
    """--async-envs steps the same seeded envs in worker processes: the same episodes and losses, bit for bit."""
    flags = [*TINY, "--env-id", "BipedalWalker-v3", "--num-steps", "64", "--total-timesteps", "512"]
    scalars = []
    for name, extra in (("sync", []), ("async", ["--async-envs"])):
        result = run_script(SCRIPT, *flags, *extra, "--exp-name", name, cwd=str(tmp_path))
        assert result.returncode == 0, result.stderr
        (run_dir,) = glob.glob(os.path.join(tmp_path, "runs", f"*__{name}__*"))
        scalars.append({tag: values for tag, values in read_scalars(run_dir).items() if tag != "charts/SPS"})
    assert EPISODE_TAGS <= set(scalars[0]) and len(scalars[0]["losses/value_loss"]) == 4
    assert scalars[0] == scalars[1]


@pytest.mark.smoke
def test_ctrl_c_with_async_envs_keeps_logs_and_a_checkpoint(tmp_path):
    flags = [*TINY, "--env-id", "BipedalWalker-v3", "--num-steps", "64", "--async-envs"]
    assert_ctrl_c_keeps_logs_and_a_checkpoint(SCRIPT, flags, str(tmp_path))


@pytest.mark.smoke
def test_capture_video_writes_an_mp4(tmp_path):
    flags = [*TINY, "--num-steps", "100", "--total-timesteps", "400", "--capture-video"]
    result = run_script(SCRIPT, *flags, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert glob.glob(os.path.join(tmp_path, "videos", "*", "*.mp4"))


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "NoSuchEnv-v0"], ["--env-id=NoSuchEnv-v0", "pprint_registry"]),
        (["--env-id", "CartPole-v1"], ["--env-id=CartPole-v1", "Discrete", "Box"]),
        (["--num-minibatches", "3"], ["--num-minibatches=3", "num_envs * num_steps = 2048"]),
        (["--log-std-min", "1", "--log-std-max", "0"], ["--log-std-min=1.0", "--log-std-max=0.0"]),
        (["--actor-hidden-sizes", "64", "0"], ["--actor-hidden-sizes=(64, 0)"]),
        (["--resume", "missing.pt"], ["--resume=missing.pt"]),
        (["--rollout-threads", "-1"], ["--rollout-threads=-1", "0"]),
        (["--eval-interval", "-1"], ["--eval-interval=-1", "0 (never)"]),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, flags, fragments):
    assert_one_line_error(run_script(SCRIPT, *flags, cwd=str(tmp_path)), *fragments)


@pytest.mark.parametrize("flag", ["--resume", "--eval-checkpoint"])
def test_checkpoint_of_another_script_is_refused(tmp_path, flag):
    path = os.path.join(tmp_path, "other.pt")
    torch.save({"script": "ppo_fsmn_cartpole", "model": {}}, path)
    result = run_script(SCRIPT, flag, path, cwd=str(tmp_path))
    assert_one_line_error(result, f"{flag}={path}", "ppo_fsmn_cartpole", "ppo_continuous.py")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_trains_on_cuda_and_the_checkpoint_evaluates_on_cpu(in_tmp):
    args = p.Args(num_envs=2, num_steps=64, total_timesteps=2 * 64 * 3, num_minibatches=2, progress=False)
    args.save_model = True
    p.main(args)
    (path,) = glob.glob("runs/*/checkpoint.pt")
    model = torch.load(path, weights_only=True)["model"]
    assert model["obs_norm.mean"].is_cuda and float(model["obs_norm.count"]) > 100
    on_cpu = p.evaluate(path, episodes=2, deterministic=True, device=torch.device("cpu"), seed=0)
    on_cuda = p.evaluate(path, episodes=2, deterministic=True, device=torch.device("cuda"), seed=0)
    np.testing.assert_allclose(on_cpu, on_cuda, rtol=1e-2)


# ---------------------------------------------------------------------------------------------------------------------
# Learning


@pytest.mark.learning
def test_default_settings_learn_pendulum_within_150k_steps(tmp_path):
    """Default flags, seed 1: the mean return of the last 20 episodes reaches -250 within 150k steps."""
    result = run_script(SCRIPT, "--seed", "1", "--total-timesteps", "150000", "--no-progress", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    returns = read_scalars(run_dirs(str(tmp_path))[0])["charts/episodic_return"]
    reached = first_step_reaching(returns, -250.0)
    assert reached is not None and reached <= 150_000, (
        f"best mean of 20: {max(np.convolve([r for _, r in returns], np.ones(20) / 20, 'valid'))}"
    )
