"""ppo_continuous.py: the tanh-squashed Gaussian against torch.distributions, normalisation that survives a
checkpoint, GAE and truncations, the CLI on Pendulum, BipedalWalker and HalfCheetah, and learning on Pendulum."""

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
    NO_DISPLAY,
    WANDB_OFFLINE,
    assert_ctrl_c_keeps_logs_and_a_checkpoint,
    assert_logged_losses,
    assert_non_finite_loss_stops_and_keeps_last_good_checkpoint,
    assert_one_line_error,
    assert_same_seed_same_losses,
    assert_training_replays_the_rollout,
    assert_videos_reached_the_wandb_run,
    copy_alone,
    first_step_reaching,
    import_script,
    read_scalars,
    run_dirs,
    run_script,
    run_until_reached,
)
from torch.distributions import AffineTransform, Normal, TanhTransform, TransformedDistribution

SCRIPT = "ppo_continuous.py"
p = import_script("ppo_continuous")
TINY = ["--num-envs", "2", "--num-minibatches", "2", "--update-epochs", "2", "--no-progress", "--threads", "1"]


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


def gaussian_agent(low: torch.Tensor, high: torch.Tensor) -> "p.Agent":
    """A float64 agent whose actor reads its input x = [mean, log_std] (B, 2A) as the pre-squash Gaussian's mean and
    log-std (no hidden layer, identity heads, the log-std clamp wide open), with action bounds low and high (A,)."""
    act_dim = low.shape[0]
    args = p.Args(actor_hidden_sizes=(), state_dependent_std=True, log_std_min=-30.0, log_std_max=30.0)
    agent = p.Agent(2 * act_dim, gym.spaces.Box(-1.0, 1.0, (act_dim,)), args).double()
    eye, zero = torch.eye(act_dim, dtype=torch.float64), torch.zeros(act_dim, act_dim, dtype=torch.float64)
    with torch.no_grad():
        agent.actor_mean.weight.copy_(torch.cat([eye, zero], 1))
        agent.actor_logstd.weight.copy_(torch.cat([zero, eye], 1))
        agent.actor_mean.bias.zero_()
        agent.actor_logstd.bias.zero_()
    agent.action_low, agent.action_high = low, high
    return agent


# ---------------------------------------------------------------------------------------------------------------------
# The tanh-squashed Gaussian


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("spread", [1.0, 4.0])  # 4: samples deep in the tails, actions within float eps of the bounds
def test_log_prob_and_squash_match_torch_distributions(seed, spread):
    """get_action_and_value's log-prob of a given u equals torch's TransformedDistribution(Normal, [tanh, affine]) at
    the squashed action, in float64, and squash_action is that distribution's transform."""
    mean, log_std, low, high, _ = random_params(seed)
    mean = mean * spread
    reference = reference_distribution(mean, log_std, low, high)
    torch.manual_seed(seed)
    u = reference.base_dist.sample()
    action = reference.transforms[1](reference.transforms[0](u))  # both transforms now cache their input
    torch.testing.assert_close(p.squash_action(u, low, high), action, rtol=0, atol=1e-12)
    expected = reference.log_prob(action).sum(-1)
    with torch.no_grad():
        same_u, got, _, _ = gaussian_agent(low, high).get_action_and_value(torch.cat([mean, log_std], 1), u)
    assert torch.equal(same_u, u) and torch.isfinite(got).all()
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-8)


def test_log_prob_matches_the_naive_formula_where_it_is_finite():
    """Independent of torch's TanhTransform: log N(u) - log(1 - tanh(u)^2) - log((high - low) / 2) in float64."""
    mean, log_std, low, high, g = random_params(7)
    u = torch.randn(mean.shape, generator=g, dtype=torch.float64) * 4
    naive = Normal(mean, log_std.exp()).log_prob(u) - torch.log(1 - torch.tanh(u) ** 2) - torch.log((high - low) / 2)
    with torch.no_grad():
        _, got, _, _ = gaussian_agent(low, high).get_action_and_value(torch.cat([mean, log_std], 1), u)
    torch.testing.assert_close(got, naive.sum(-1), rtol=1e-9, atol=1e-9)


def test_sampling_distribution_matches_torch_distributions():
    """get_action_and_value's own samples, squashed, are drawn from the same distribution as torch's: equal quantiles
    of 200k actions per dimension."""
    mean = torch.tensor([[0.3, -2.0, 1.5]], dtype=torch.float64)
    log_std = torch.tensor([[0.0, -1.0, 0.7]], dtype=torch.float64)
    low, high = torch.tensor([-2.0, 0.0, -0.5], dtype=torch.float64), torch.tensor([2.0, 1.0, 3.0], dtype=torch.float64)
    torch.manual_seed(0)
    with torch.no_grad():
        u, _, _, _ = gaussian_agent(low, high).get_action_and_value(torch.cat([mean, log_std], 1).expand(200_000, 6))
    ours = p.squash_action(u, low, high)
    theirs = reference_distribution(mean, log_std, low, high).sample((200_000,))[:, 0]
    q = torch.tensor([0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99], dtype=torch.float64)
    scale = high - low
    torch.testing.assert_close(
        torch.quantile(ours, q, dim=0) / scale, torch.quantile(theirs, q, dim=0) / scale, atol=0.01, rtol=0
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_no_nan_or_inf_for_large_pre_squash_values(dtype):
    """|u| up to 20 (tanh(u) == +-1 in float32 from |u| ~ 9), means there too, so that the entropy estimate's fresh
    samples are in the tails as well: log-prob, entropy, log-det and gradients stay finite."""
    u = torch.linspace(-20, 20, 401, dtype=dtype).unsqueeze(-1)
    x = torch.cat([u, torch.ones_like(u)], 1).requires_grad_()  # mean u, log-std 1
    low, high = torch.tensor([-2.0], dtype=dtype), torch.tensor([2.0], dtype=dtype)
    agent = gaussian_agent(low.double(), high.double()).to(dtype)
    given = u.clone().requires_grad_()
    _, logprob, entropy, _ = agent.get_action_and_value(x, given)
    (logprob.sum() + entropy.sum()).backward()
    log_det = p.squash_log_abs_det(u, low, high)
    for t in (log_det, logprob, entropy, given.grad, x.grad):
        assert torch.isfinite(t).all()
    # log |da/du| = log(1 - tanh(u)^2) + log 2 ~ -2|u| + 2 log 2 + log 2 in the tails
    torch.testing.assert_close(log_det[[0, -1], 0], torch.full((2,), -2 * 20 + 3 * math.log(2), dtype=dtype))
    action = p.squash_action(u, low, high)
    assert ((action >= low) & (action <= high)).all()


def test_entropy_estimate_is_unbiased():
    """Averaged over many draws, the one-sample estimate equals -E[log p(a)] under torch's distribution (Monte Carlo)."""
    mean, log_std = torch.tensor([[0.5, -1.0]], dtype=torch.float64), torch.tensor([[0.3, -0.5]], dtype=torch.float64)
    low, high = torch.tensor([-1.0, 0.0], dtype=torch.float64), torch.tensor([1.0, 5.0], dtype=torch.float64)
    torch.manual_seed(0)
    with torch.no_grad():
        x, any_u = torch.cat([mean, log_std], 1).expand(400_000, 4), torch.zeros(400_000, 2, dtype=torch.float64)
        _, _, entropy, _ = gaussian_agent(low, high).get_action_and_value(x, any_u)  # the estimate draws its own sample
    reference = reference_distribution(mean, log_std, low, high)
    monte_carlo = -reference.log_prob(reference.sample((400_000,))).sum(-1).mean()
    assert abs(entropy.mean() - monte_carlo) < 0.02, (entropy.mean(), monte_carlo)


def test_entropy_estimate_draws_its_own_reparameterised_sample():
    """Given the stored u, the estimate still draws a fresh u' = mean + std * eps: it varies from sample to sample and
    its gradient reaches the mean (the Gaussian entropy alone does not depend on it)."""
    low, high = torch.tensor([-1.0], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    x = torch.tensor([[1.5, 0.0]], dtype=torch.float64).repeat(1000, 1).requires_grad_()  # mean 1.5, log-std 0
    _, _, entropy, _ = gaussian_agent(low, high).get_action_and_value(x, torch.zeros(1000, 1, dtype=torch.float64))
    entropy.sum().backward()
    assert entropy.std() > 0 and (x.grad[:, 0] != 0).all()


def make_agent(state_dependent_std: bool, seed: int = 0, log_std_init: float = 0.0):
    torch.manual_seed(seed)
    args = p.Args(state_dependent_std=state_dependent_std, log_std_init=log_std_init, actor_hidden_sizes=(16,))
    space = gym.spaces.Box(np.array([-3.0, 0.5, -0.01], np.float32), np.array([-1.0, 0.6, 0.01], np.float32))
    return p.Agent(5, space, args), space


@pytest.mark.parametrize("state_dependent_std", [False, True])
def test_actions_within_bounds_and_the_stored_sample_is_evaluated_exactly(state_dependent_std):
    agent, space = make_agent(state_dependent_std, log_std_init=2.0)  # wide: many samples saturate tanh
    with torch.no_grad():
        agent.actor_mean.weight.normal_(0, 3)  # means far in the tails too
        x = torch.randn(4096, 5) * 3
        u, logprob, no_entropy, value = agent.get_action_and_value(x)  # the rollout's call: no entropy estimate
        assert u.shape == (4096, 3) and logprob.shape == value.shape == (4096,) and no_entropy is None
        action = p.squash_action(u, agent.action_low, agent.action_high)
        assert all(space.contains(a) for a in action.numpy())
        # the log-prob of a given u (training's, from torch.distributions) is the one the rollout stored (written out by
        # sample_squashed_gaussian), up to float32 rounding
        _, again, entropy, _ = agent.get_action_and_value(x, u)
        torch.testing.assert_close(again, logprob, rtol=1e-5, atol=1e-4)
        assert entropy.shape == (4096,) and torch.isfinite(logprob).all() and torch.isfinite(entropy).all()


@pytest.mark.parametrize("state_dependent_std", [False, True])
def test_log_std_is_the_state_dependent_head_or_the_parameter_clamped(state_dependent_std):
    """The log-density at u = mean is sum(-log_std - log sqrt(2 pi) - log |da/du|): log_std is the actor's head
    (per state) or the free parameter, and beyond [--log-std-min, --log-std-max] it is the bound."""
    agent, _ = make_agent(state_dependent_std, log_std_init=-0.5)
    x = torch.randn(8, 5)
    low, high = agent.action_low, agent.action_high
    with torch.no_grad():
        hidden = agent.actor_trunk(x)
        mean = agent.actor_mean(hidden)
        log_std = agent.actor_logstd(hidden) if state_dependent_std else agent.actor_logstd.expand_as(mean)
        if state_dependent_std:
            assert log_std.std(0).max() > 0 and abs(log_std.mean() + 0.5) < 0.1
        else:
            assert (log_std == -0.5).all()
        log_det = torch.log(1 - torch.tanh(mean) ** 2) + torch.log((high - low) / 2)  # means near 0: the naive form
        for shift, expected_log_std in ((0.0, log_std), (50.0, agent.log_std_max), (-100.0, agent.log_std_min)):
            bias = agent.actor_logstd.bias if state_dependent_std else agent.actor_logstd
            bias += shift
            _, logprob, _, _ = agent.get_action_and_value(x, mean)
            expected = (-expected_log_std - 0.5 * math.log(2 * math.pi) - log_det).sum(1)
            torch.testing.assert_close(logprob, expected)
            bias -= shift


def test_evaluation_plays_the_rescaled_tanh_mean_or_a_seeded_sample(monkeypatch):
    """play: deterministic, the env gets low + (tanh(mean) + 1) / 2 * (high - low) of the observation normalised with
    the agent's statistics; sampling, actions inside the bounds, the same for the same seed."""
    steps, original = [], p.make_env

    class Recorder(gym.Wrapper):
        def reset(self, **kwargs):
            obs, info = self.env.reset(**kwargs)
            self.last_obs = obs
            return obs, info

        def step(self, action):
            steps.append((self.last_obs, np.array(action)))
            self.last_obs, *rest = self.env.step(action)
            return self.last_obs, *rest

    monkeypatch.setattr(p, "make_env", lambda *args: lambda: Recorder(original(*args)()))
    torch.manual_seed(0)
    agent = p.Agent(3, gym.make("Pendulum-v1").action_space, p.Args())
    with torch.no_grad():
        agent.actor_mean.weight.normal_(0, 3)
        agent.obs_norm.mean.fill_(0.5)
        agent.obs_norm.var.fill_(0.25)
    with torch.no_grad():
        p.play(agent, "Pendulum-v1", 1, True, torch.device("cpu"), 0)
    obs, actions = (torch.as_tensor(np.stack(x)) for x in zip(*steps))
    with torch.no_grad():
        mean = agent.actor_mean(agent.actor_trunk(((obs - 0.5) / torch.sqrt(torch.tensor(0.25 + 1e-8))).clamp(-10, 10)))
    torch.testing.assert_close(actions, -2 + (torch.tanh(mean) + 1) / 2 * 4, rtol=0, atol=1e-5)
    assert len(steps) == 200 and actions.abs().max() > 1.0  # the means reach far from 0

    with torch.no_grad():
        sampled = [p.play(agent, "Pendulum-v1", 2, False, torch.device("cpu"), 3) for _ in range(2)]
    assert sampled[0] == sampled[1]
    actions = np.stack([a for _, a in steps[200:]])
    assert (np.abs(actions) <= 2).all() and len(np.unique(actions)) > 100


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
    args = p.Args(num_envs=2, num_steps=64, total_timesteps=2 * 64 * 3, num_minibatches=2, progress=False, threads=1)
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
        loaded = p.load_checkpoint(path, "--eval-checkpoint")
        returns = p.evaluate(loaded, episodes=2, deterministic=True, device=torch.device("cpu"), seed=0)
    assert len(returns) == 2 and all(-3300 < r <= 0 for r in returns)

    # evaluation with frozen statistics is reproducible: same returns on a second load
    loaded = p.load_checkpoint(path, "--eval-checkpoint")
    assert p.evaluate(loaded, episodes=2, deterministic=True, device=torch.device("cpu"), seed=0) == returns

    # --resume starts from the saved statistics: after 2 more iterations the count is the saved one plus the new samples
    args = p.Args(num_envs=2, num_steps=64, total_timesteps=2 * 64 * 5, num_minibatches=2, progress=False, threads=1)
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


def test_logged_losses_are_the_last_minibatchs_their_means_and_the_loss_returned(in_tmp, monkeypatch):
    """losses/<name> is the iteration's last minibatch's (clipfrac: the mean), as CleanRL logs them, losses/mean/<name>
    the mean, and a term a forker adds to the loss after its stats were made is in losses/loss."""
    assert_logged_losses(p, monkeypatch, num_envs=2, num_steps=32, num_minibatches=2)


def test_compiled_loss_equals_eager_and_training_replays_the_rollout(in_tmp, monkeypatch):
    """--compile: the compiled minibatch loss equals the eager one (1e-5), the loss, its gradients and every statistic
    but the entropy estimate, whose noise inductor draws from its own generator; and a compiled run replays its rollout
    (KL 0 at a learning rate of 0), so the compiled rollout call and the compiled loss agree on log-probabilities."""
    torch.manual_seed(0)
    agent, args = p.Agent(3, gym.spaces.Box(-2.0, 2.0, (2,)), p.Args()), p.Args(ent_coef=0.0)
    with torch.no_grad():
        agent.actor_mean.weight.normal_()
    minibatch = dict(obs=torch.randn(16, 3), actions=torch.randn(16, 2), logprobs=-torch.rand(16))
    minibatch.update(advantages=torch.randn(16), returns=torch.randn(16), values=torch.randn(16))
    results = []
    for loss_fn in (p.minibatch_loss, torch.compile(p.minibatch_loss)):
        agent.zero_grad()
        loss, stats = loss_fn(agent, args, minibatch)
        loss.backward()  # --ent-coef 0: the entropy estimate's noise does not reach the gradients
        results.append([loss.detach()] + [x for name, x in stats.items() if name != "entropy"])
        results[-1] += [param.grad.clone() for param in agent.parameters()]
    for compiled, eager in zip(results[1], results[0]):
        torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-4)
    assert_training_replays_the_rollout(p, monkeypatch, num_envs=4, num_steps=48, num_minibatches=2, compile=True)


def test_the_env_gets_the_squash_of_the_stored_sample(in_tmp, monkeypatch):
    """In the script's loop, every env action is squash_action of the pre-squash sample u drawn by get_action_and_value,
    inside the bounds, and the minibatches train on exactly those u."""
    drawn, stepped, trained = [], [], []
    original_gav, original_step, original_loss = p.Agent.get_action_and_value, gym.vector.SyncVectorEnv.step, p.minibatch_loss

    def spy_gav(self, x, action=None):
        out = original_gav(self, x, action)
        if action is None:
            drawn.append(out[0].clone())
        return out

    def spy_step(self, actions):
        stepped.append(np.array(actions))
        return original_step(self, actions)

    def spy_loss(agent, args, mb):
        trained.append(mb["actions"].clone())
        return original_loss(agent, args, mb)

    monkeypatch.setattr(p.Agent, "get_action_and_value", spy_gav)
    monkeypatch.setattr(gym.vector.SyncVectorEnv, "step", spy_step)
    monkeypatch.setattr(p, "minibatch_loss", spy_loss)
    p.main(p.Args(num_envs=2, num_steps=32, total_timesteps=64, num_minibatches=2, update_epochs=1, progress=False, threads=1))
    u = torch.stack(drawn)  # (T, B, A)
    assert u.shape == (32, 2, 1) and len(stepped) == 32
    low, high = torch.tensor([-2.0]), torch.tensor([2.0])
    torch.testing.assert_close(torch.as_tensor(np.stack(stepped)), p.squash_action(u, low, high), rtol=0, atol=0)
    assert (np.abs(np.stack(stepped)) <= 2).all()
    trained = torch.cat(trained)  # one epoch: every sample once, shuffled
    torch.testing.assert_close(trained.flatten().sort().values, u.flatten().sort().values, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------------------------
# GAE and truncations


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
    args = p.Args(
        env_id="PendulumShort-v1", num_envs=3, num_steps=20, total_timesteps=180, num_minibatches=2, progress=False, threads=1
    )
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
    script = copy_alone(SCRIPT, cwd)  # alone in an empty folder: it needs no other file of the project
    flags = [*TINY, "--env-id", env_id, "--num-steps", str(steps), *extra]
    batch = 2 * steps
    result = run_script(script, *flags, "--total-timesteps", str(2 * batch), "--save-model", "--save-interval", "1", cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("settotalmass") <= 1 and "MUJOCO_LOG.TXT" not in os.listdir(cwd), result.stderr
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
        script, *flags, "--total-timesteps", str(3 * batch), "--save-model", "--resume", checkpoint_path, cwd=cwd
    )
    assert result.returncode == 0, result.stderr
    assert run_dirs(cwd) == [run_dir]
    assert [step for step, _ in read_scalars(run_dir)["charts/SPS"]] == [batch, 2 * batch, 3 * batch]
    assert torch.load(checkpoint_path, weights_only=True)["global_step"] == 3 * batch

    result = run_script(script, "--eval-checkpoint", checkpoint_path, "--eval-episodes", "1", "--threads", "1", cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert "eval: 1 episodes, mean return" in result.stdout


def test_periodic_evaluation_logs_and_keeps_the_best_policy_across_a_resume(in_tmp, monkeypatch, capsys):
    """--eval-interval: charts/eval_return at every evaluated iteration; best.pt holds the policy of the best one, and
    evaluating best.pt as the evaluation mode does gives exactly its logged return (here sampling actions: evaluation
    draws from its own seeded generator); training is the same as without evaluation; after --resume the best so far
    still counts (a best.pt no evaluation can beat stays)."""
    args = dict(num_envs=2, num_steps=100, num_minibatches=2, eval_episodes=2, progress=False, cuda=False, threads=1)
    p.main(p.Args(**args, total_timesteps=1600, eval_interval=2, eval_deterministic=False, save_model=True))
    (run_dir,) = run_dirs(".")  # 8 iterations of 200 steps, evaluated at 2, 4, 6 and 8
    logged = read_scalars(run_dir)["charts/eval_return"]
    assert [step for step, _ in logged] == [400, 800, 1200, 1600]
    best_path = os.path.join(run_dir, "best.pt")
    best = torch.load(best_path, weights_only=True)
    best_step, best_return = max(logged, key=lambda x: x[1])  # max keeps the first of equal values
    assert best["global_step"] == best_step and best["eval_return"] == pytest.approx(best_return, rel=1e-6)
    improved = [line for line in capsys.readouterr().out.splitlines() if "the best so far" in line]
    said = f"eval return {best['eval_return']:.2f}, the best so far: {os.path.normpath(best_path)}"
    assert improved[-1] == f"step {best_step}: {said}", improved
    loaded = p.load_checkpoint(best_path, "--eval-checkpoint")
    replay = p.evaluate(loaded, episodes=2, deterministic=False, device=torch.device("cpu"), seed=1)
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
    assert "the best so far" not in capsys.readouterr().out
    kept = torch.load(best_path, weights_only=True)
    assert (kept["eval_return"], kept["global_step"]) == (0.0, best_step)


@pytest.mark.smoke
def test_ctrl_c_keeps_logs_and_a_checkpoint(tmp_path):
    assert_ctrl_c_keeps_logs_and_a_checkpoint(SCRIPT, [*TINY, "--num-steps", "64"], str(tmp_path))


def test_a_checkpoint_with_flags_of_an_earlier_version_still_evaluates(in_tmp):
    """Checkpoints hold their run's args: flags this script no longer has (--rollout-threads, --async-envs) are dropped."""
    p.main(
        p.Args(num_envs=2, num_steps=64, total_timesteps=128, num_minibatches=2, progress=False, save_model=True, threads=1)
    )
    (path,) = glob.glob("runs/*/checkpoint.pt")
    checkpoint = torch.load(path, weights_only=True)
    torch.save({**checkpoint, "args": {**checkpoint["args"], "rollout_threads": 1, "async_envs": False}}, path)
    loaded = p.load_checkpoint(path, "--eval-checkpoint")
    expected = p.evaluate(loaded, episodes=1, deterministic=True, device=torch.device("cpu"), seed=0)
    torch.save(checkpoint, path)
    loaded = p.load_checkpoint(path, "--eval-checkpoint")
    assert p.evaluate(loaded, episodes=1, deterministic=True, device=torch.device("cpu"), seed=0) == expected


@pytest.mark.smoke
def test_track_and_capture_video_put_the_videos_in_the_wandb_run(tmp_path):
    flags = [*TINY, "--num-steps", "100", "--total-timesteps", "400", "--capture-video", "--track"]
    result = run_script(SCRIPT, *flags, cwd=str(tmp_path), env={**WANDB_OFFLINE, **NO_DISPLAY})
    assert result.returncode == 0, result.stderr
    assert "XDG_RUNTIME_DIR" not in result.stderr  # SDL's complaint without a display: pygame renders off-screen
    assert_videos_reached_the_wandb_run(str(tmp_path))


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "NoSuchEnv-v0"], ["--env-id=NoSuchEnv-v0", "pprint_registry"]),
        (["--env-id", "CartPole-v1"], ["--env-id=CartPole-v1", "Discrete", "Box"]),
        (["--env-id", "Blackjack-v1"], ["--env-id=Blackjack-v1", "flat Box observation"]),
        (["--num-minibatches", "3"], ["--num-minibatches=3", "divisor of the batch, 512"]),
        (["--log-std-min", "1", "--log-std-max", "0"], ["--log-std-min=1.0", "--log-std-max=0.0"]),
        (["--actor-hidden-sizes", "64", "0"], ["--actor-hidden-sizes=(64, 0)"]),
        (["--resume", "missing.pt"], ["--resume=missing.pt"]),
        (["--eval-interval", "-1"], ["--eval-interval=-1", "at least 0"]),
        (["--eval-episodes", "0"], ["--eval-episodes=0", "at least 1"]),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, flags, fragments):
    assert_one_line_error(run_script(SCRIPT, *flags, cwd=str(tmp_path)), *fragments)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_trains_on_cuda_and_the_checkpoint_evaluates_on_cpu(in_tmp):
    args = p.Args(num_envs=2, num_steps=64, total_timesteps=2 * 64 * 3, num_minibatches=2, progress=False, threads=1)
    args.save_model = True
    p.main(args)
    (path,) = glob.glob("runs/*/checkpoint.pt")
    model = torch.load(path, weights_only=True)["model"]
    assert model["obs_norm.mean"].is_cuda and float(model["obs_norm.count"]) > 100
    loaded = p.load_checkpoint(path, "--eval-checkpoint")
    on_cpu = p.evaluate(loaded, episodes=2, deterministic=True, device=torch.device("cpu"), seed=0)
    loaded = p.load_checkpoint(path, "--eval-checkpoint")
    on_cuda = p.evaluate(loaded, episodes=2, deterministic=True, device=torch.device("cuda"), seed=0)
    np.testing.assert_allclose(on_cpu, on_cuda, rtol=1e-2)


# ---------------------------------------------------------------------------------------------------------------------
# Learning


@pytest.mark.learning
def test_default_settings_learn_pendulum_within_150k_steps(tmp_path):
    """Default flags, seed 1, one thread (the free cores would make the run depend on the machine's load): the mean
    return of the last 20 episodes reaches -250 within 150k steps."""
    flags = ["--seed", "1", "--total-timesteps", "150000", "--no-progress", "--threads", "1"]
    returns = run_until_reached(SCRIPT, *flags, cwd=str(tmp_path), threshold=-250.0)
    reached = first_step_reaching(returns, -250.0)
    assert reached is not None and reached <= 150_000, (
        f"best mean of 20: {max(np.convolve([r for _, r in returns], np.ones(20) / 20, 'valid'))}"
    )
