"""ppg_lunarlander.py: the auxiliary phase against its definition, its learning rate and its ablation, the CLI, learning."""

import glob
import os

import pytest
import torch
from conftest import (
    EPISODE_TAGS,
    ITERATION_TAGS,
    NO_DISPLAY,
    assert_ctrl_c_keeps_logs_and_a_checkpoint,
    assert_logged_losses,
    assert_non_finite_loss_stops_and_keeps_last_good_checkpoint,
    assert_one_line_error,
    assert_same_seed_same_losses,
    assert_training_replays_the_rollout,
    copy_alone,
    first_step_reaching,
    import_script,
    read_scalars,
    run_dirs,
    run_script,
    run_until_reached,
)

SCRIPT = "ppg_lunarlander.py"
p = import_script("ppg_lunarlander")
CARTPOLE = dict(env_id="CartPole-v1", num_envs=4, num_steps=16, num_minibatches=2, n_iteration=2, num_aux_rollouts=2)
TINY = ["--env-id", "CartPole-v1", "--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2", "--n-iteration", "2"]
TINY += ["--num-aux-rollouts", "2", "--no-progress", "--threads", "1"]


def agent_with_a_phase(seed: int = 0, **overrides) -> tuple["p.Agent", "p.Args"]:
    """An agent on CartPole's shapes whose stored phase holds random observations and learnable returns."""
    torch.manual_seed(seed)
    args = p.Args(**{**CARTPOLE, "hidden_dim": 16, **overrides})
    agent = p.Agent(4, 2, args)
    with torch.no_grad():
        for layer in (agent.actor,):  # a policy far from uniform, so that a moved policy shows in the KL
            layer.weight.normal_(0.0, 1.0)
        agent.phase_obs.normal_()
        agent.phase_returns.copy_(agent.phase_obs.sum(-1).tanh() * 2.0)  # (N, T, E): a function of the observation
    return agent, args


def all_weights(agent: "p.Agent") -> list[torch.Tensor]:
    return [x.detach().clone() for x in agent.parameters()]


def phase_kl_and_aux_error(agent: "p.Agent", old_logits: torch.Tensor) -> tuple[float, float]:
    """KL(pi_old || pi) and the auxiliary value head's squared error over every stored observation."""
    with torch.no_grad():
        probs, aux_value = agent.get_pi_and_aux_value(agent.phase_obs)
        kl = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=old_logits), probs).mean()
        return float(kl), float(((aux_value - agent.phase_returns) ** 2).mean())


# ---------------------------------------------------------------------------------------------------------------------
# The auxiliary phase


def test_auxiliary_phase_at_learning_rate_0_changes_no_weight():
    agent, args = agent_with_a_phase()
    optimizer = torch.optim.Adam(agent.parameters(), lr=0.0, eps=1e-5)
    before = all_weights(agent)
    stats = p.auxiliary_phase(agent, optimizer, args)
    names = ("kl_loss", "aux_value_loss", "real_value_loss", "loss")  # the last minibatch's, and their means
    assert set(stats) == {*names, *(f"mean/{name}" for name in names)}
    assert stats["aux_value_loss"] > 0  # it ran, with a real auxiliary value error
    for x, y in zip(before, all_weights(agent), strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_the_kl_term_and_its_gradient_are_zero_at_the_start_of_the_phase():
    """With pi_old the current policy, the auxiliary loss's KL is 0, and the gradients of the whole loss are the same
    with --beta-clone 1 and 1000: the KL term contributes nothing (in float64, where rounding stays far below that)."""
    agent, args = agent_with_a_phase()
    agent = agent.double()
    obs, returns = agent.phase_obs[0], agent.phase_returns[0]  # (T, E, obs_dim), (T, E)
    with torch.no_grad():
        old_logits = agent.get_pi_and_aux_value(obs)[0].logits
    grads = []
    for beta_clone in (1.0, 1000.0):
        agent.zero_grad()
        args.beta_clone = beta_clone
        loss, stats = p.auxiliary_loss(agent, args, dict(obs=obs, old_logits=old_logits, returns=returns))
        loss.backward()
        assert abs(float(stats["kl_loss"])) < 1e-12
        grads.append([x.grad.clone() for x in agent.parameters() if x.grad is not None])
    for g1, g2 in zip(*grads, strict=True):
        torch.testing.assert_close(g1, g2, rtol=0, atol=1e-9)


def test_a_large_beta_clone_holds_the_policy_while_the_auxiliary_value_error_falls():
    agent, args = agent_with_a_phase(beta_clone=1000.0, e_auxiliary=20)
    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-3, eps=1e-5)
    with torch.no_grad():
        old_logits = agent.get_pi_and_aux_value(agent.phase_obs)[0].logits
    _, error_before = phase_kl_and_aux_error(agent, old_logits)
    p.auxiliary_phase(agent, optimizer, args)
    kl, error_after = phase_kl_and_aux_error(agent, old_logits)
    assert kl < 1e-3, kl
    assert error_after < 0.8 * error_before, (error_before, error_after)
    # without the KL term the same phase moves the policy: the bound above is the term's doing
    agent, args = agent_with_a_phase(beta_clone=0.0, e_auxiliary=20)
    p.auxiliary_phase(agent, torch.optim.Adam(agent.parameters(), lr=1e-3, eps=1e-5), args)
    assert phase_kl_and_aux_error(agent, old_logits)[0] > 1e-3


def test_the_auxiliary_phase_runs_at_the_learning_rate_of_its_iteration(in_tmp, monkeypatch):
    """Annealed over 4 iterations with N_pi = 2: phases after iterations 2 and 4, at 3/4 and 1/4 of the rate (never 0)."""
    rates, original = [], p.auxiliary_phase

    def spy(agent, optimizer, args):
        rates.append(float(optimizer.param_groups[0]["lr"]))
        return original(agent, optimizer, args)

    monkeypatch.setattr(p, "auxiliary_phase", spy)
    p.main(p.Args(**CARTPOLE, total_timesteps=4 * 4 * 16, learning_rate=1e-3, progress=False, threads=1))
    assert rates == pytest.approx([0.75e-3, 0.25e-3])


@pytest.mark.parametrize("e_auxiliary", [0, 3])
def test_e_auxiliary_counts_the_auxiliary_steps(in_tmp, monkeypatch, e_auxiliary):
    """--e-auxiliary 0 runs no auxiliary step; 3 runs 3 epochs of (N_pi * num_envs / num_aux_rollouts) minibatches in each
    of the 2 phases of 4 iterations; the aux metrics are logged once per phase."""
    calls, original = [], p.auxiliary_loss
    monkeypatch.setattr(p, "auxiliary_loss", lambda *a: calls.append(1) or original(*a))
    p.main(p.Args(**CARTPOLE, total_timesteps=4 * 4 * 16, e_auxiliary=e_auxiliary, progress=False, threads=1))
    assert len(calls) == 2 * e_auxiliary * (2 * 4 // 2)
    scalars = read_scalars(run_dirs(".")[0])
    assert len(scalars.get("losses/aux/kl_loss", [])) == (2 if e_auxiliary else 0)


def test_resume_restores_the_stored_phase(in_tmp, monkeypatch):
    """A run stopped mid-phase (N_pi = 2, stopped after iteration 3) resumes with that phase's stored rollouts: the
    auxiliary phase after iteration 4 sees iteration 3's observations from the checkpoint."""
    args = p.Args(**CARTPOLE, total_timesteps=3 * 4 * 16, progress=False, threads=1)
    args.save_model, args.save_interval = True, 1
    p.main(args)
    (path,) = glob.glob("runs/*/checkpoint.pt")
    saved = torch.load(path, weights_only=True)["model"]["phase_obs"]
    seen, original = [], p.auxiliary_phase
    monkeypatch.setattr(p, "auxiliary_phase", lambda agent, *a: seen.append(agent.phase_obs.clone()) or original(agent, *a))
    resumed = p.Args(**CARTPOLE, total_timesteps=4 * 4 * 16, progress=False, threads=1)
    resumed.resume = path
    p.main(resumed)
    (phase_obs,) = seen
    torch.testing.assert_close(phase_obs[0], saved[0], rtol=0, atol=0)  # iteration 3, from the checkpoint
    assert not torch.equal(phase_obs[1], saved[1])  # iteration 4, new


# ---------------------------------------------------------------------------------------------------------------------
# The policy phase, determinism and a non-finite loss


def test_training_replays_the_rollout_exactly(in_tmp, monkeypatch):
    assert_training_replays_the_rollout(p, monkeypatch, **CARTPOLE)


def test_logged_losses_are_the_last_minibatchs_their_means_and_the_loss_returned(in_tmp, monkeypatch):
    """Both phases' stats are logged as CleanRL logs its losses, the last minibatch's, with their means under mean/
    (2 iterations: one auxiliary phase, losses/aux/...), and a term a forker adds to either loss after its stats were
    made is in its logged total, losses/loss or losses/aux/loss."""
    assert_logged_losses(p, monkeypatch, {"minibatch_loss": "losses/", "auxiliary_loss": "losses/aux/"}, **CARTPOLE)


def test_same_seed_same_losses(in_tmp):
    assert_same_seed_same_losses(p, **CARTPOLE)


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(in_tmp, monkeypatch):
    assert_non_finite_loss_stops_and_keeps_last_good_checkpoint(p, monkeypatch, **CARTPOLE)


# ---------------------------------------------------------------------------------------------------------------------
# The CLI


@pytest.mark.smoke
def test_cli_smoke_checkpoint_resume_and_evaluation(tmp_path):
    cwd = str(tmp_path)
    script = copy_alone(SCRIPT, cwd)  # alone in an empty folder: it needs no other file of the project
    result = run_script(script, *TINY, "--total-timesteps", "512", "--save-model", "--save-interval", "2", cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert "the auxiliary phase keeps 2 x 32 x 4 steps" in result.stdout
    (run_dir,) = run_dirs(cwd)
    scalars = read_scalars(run_dir)
    assert ITERATION_TAGS | EPISODE_TAGS | {"losses/aux/kl_loss", "losses/aux/aux_value_loss"} <= set(scalars)
    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
    assert torch.load(checkpoint_path, weights_only=True)["global_step"] == 512
    result = run_script(script, *TINY, "--total-timesteps", "1024", "--resume", checkpoint_path, "--save-model", cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert [step for step, _ in read_scalars(run_dir)["charts/SPS"]][-1] == 1024
    result = run_script(script, "--eval-checkpoint", checkpoint_path, "--eval-episodes", "3", "--threads", "1", cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("episode 1: return ")
    assert "\neval: 3 episodes, mean return" in result.stdout


@pytest.mark.smoke
def test_lunarlander_smoke_with_video(tmp_path):
    flags = [
        "--num-envs",
        "4",
        "--num-steps",
        "64",
        "--n-iteration",
        "2",
        "--num-aux-rollouts",
        "4",
        "--no-progress",
        "--threads",
        "1",
    ]
    result = run_script(SCRIPT, *flags, "--total-timesteps", "1024", "--capture-video", cwd=str(tmp_path), env=NO_DISPLAY)
    assert result.returncode == 0, result.stderr
    assert glob.glob(str(tmp_path / "videos" / "*" / "*.mp4")) and "XDG_RUNTIME_DIR" not in result.stderr
    assert "losses/aux/real_value_loss" in read_scalars(run_dirs(str(tmp_path))[0])


@pytest.mark.smoke
def test_ctrl_c_keeps_logs_and_a_checkpoint(tmp_path):
    assert_ctrl_c_keeps_logs_and_a_checkpoint(SCRIPT, TINY, str(tmp_path))


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "NoSuchEnv-v0"], ["--env-id=NoSuchEnv-v0", "pprint_registry"]),
        (["--env-id", "Pendulum-v1"], ["--env-id=Pendulum-v1", "Discrete"]),
        (["--env-id", "Blackjack-v1"], ["--env-id=Blackjack-v1", "flat Box observation"]),
        (["--n-iteration", "0"], ["--n-iteration=0", "at least 1"]),
        (["--e-auxiliary", "-1"], ["--e-auxiliary=-1", "at least 0"]),
        (["--e-policy", "0", "--e-value", "0"], ["--e-value=0", "--e-policy + --e-value"]),
        (["--num-aux-rollouts", "3"], ["--num-aux-rollouts=3", "divisor of --n-iteration * --num-envs = 512"]),
        (["--beta-clone", "-1"], ["--beta-clone=-1"]),
        (["--num-minibatches", "3"], ["--num-minibatches=3", "divisor of the batch, 4096"]),
        (["--resume", "nowhere.pt"], ["--resume=nowhere.pt", "does not exist"]),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, flags, fragments):
    result = run_script(SCRIPT, *flags, "--total-timesteps", "8192", "--no-progress", cwd=str(tmp_path))
    assert_one_line_error(result, *fragments)
    assert not os.path.exists(tmp_path / "runs")


# ---------------------------------------------------------------------------------------------------------------------
# Learning


@pytest.mark.learning
def test_solves_cartpole_within_150k_steps(tmp_path):
    flags = ["--env-id", "CartPole-v1", "--gamma", "0.99", "--num-envs", "8", "--num-steps", "128", "--n-iteration", "4"]
    flags += ["--num-minibatches", "16"]
    flags += ["--total-timesteps", "150000", "--seed", "1", "--no-progress", "--threads", "1"]
    returns = run_until_reached(SCRIPT, *flags, cwd=str(tmp_path), threshold=475.0)
    step = first_step_reaching(returns, 475.0)
    assert step is not None and step <= 150_000, returns[-20:]
