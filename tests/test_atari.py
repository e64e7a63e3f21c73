"""ppo_atari.py: the vector env against the classic wrapper stack, whole-game statistics, the network's layouts and
precisions, the CLI, and bad input."""

import dataclasses
import glob
import os

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import (
    EPISODE_TAGS,
    ITERATION_TAGS,
    WANDB_OFFLINE,
    assert_evaluation_fires_after_a_lost_life,
    assert_logged_losses,
    assert_one_line_error,
    assert_training_replays_the_rollout,
    assert_videos_reached_the_wandb_run,
    copy_alone,
    import_script,
    read_scalars,
    run_dirs,
    run_script,
)

SCRIPT = "ppo_atari.py"
p = import_script("ppo_atari")
TINY = ["--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1", "--no-progress"]
TINY += ["--threads", "1"]


# ---------------------------------------------------------------------------------------------------------------------
# The environment pipeline


@pytest.mark.parametrize("env_id", ["PongNoFrameskip-v4", "BreakoutNoFrameskip-v4"])
def test_vector_env_observations_equal_the_classic_wrapper_stack(env_id):
    """ale-py's vector env (noop resets and FIRE reset off, life losses signalled without a reset) against gymnasium's
    AtariPreprocessing + FrameStackObservation on the same ROM, seed and actions: pixel-identical frames once the
    stack has filled; the stack's padding right after the reset is the one difference (the two pad differently)."""
    envs = p.make_envs(env_id, 1, training=True, threads=1, noop_max=0, fire_reset=False)
    reference = gym.make(env_id)
    reference = gym.wrappers.AtariPreprocessing(reference, noop_max=0, frame_skip=4, screen_size=84, grayscale_obs=True)
    reference = gym.wrappers.FrameStackObservation(reference, 4)
    obs, _ = envs.reset(seed=7)
    ref_obs, _ = reference.reset(seed=7)
    np.testing.assert_array_equal(obs[0, -1], ref_obs[-1])  # the newest frame already agrees
    rng = np.random.default_rng(0)
    life_losses, compared = 0, 0
    for t in range(600):
        action = int(rng.integers(envs.single_action_space.n))
        obs, reward, termination, truncation, _ = envs.step(np.array([action]))
        ref_obs, ref_reward, ref_terminated, ref_truncated, _ = reference.step(action)
        assert reward[0] == ref_reward
        if ref_terminated or ref_truncated:
            break
        life_losses += int(termination[0])  # a life lost ends an episode for training but not the game
        if t >= 3:
            np.testing.assert_array_equal(obs[0], ref_obs)
            compared += 1
    assert compared > 100
    if env_id.startswith("Breakout"):
        assert life_losses > 0  # the comparison went on across life losses: the game was not reset
    envs.close()
    reference.close()


def test_game_statistics_cover_whole_games_and_raw_scores():
    """Training envs end an episode at every life lost; RecordGameStatistics must still report one entry per whole
    game, with its raw score. Reference: the same seed and actions in an env that only ends games (no life signal)."""
    steps, rng = 800, np.random.default_rng(1)  # 8 games of this random play, 3 or more in each env
    actions = rng.integers(4, size=(steps, 2))
    training = p.RecordGameStatistics(p.make_envs("BreakoutNoFrameskip-v4", 2, training=True, threads=1))
    whole = p.make_envs("BreakoutNoFrameskip-v4", 2, training=False, threads=1)
    training.reset(seed=3)
    whole.reset(seed=3)
    logged, expected, running, life_terminations = [], [], np.zeros(2), 0
    for t in range(steps):
        _, _, termination, _, info = training.step(actions[t])
        _, reward, ref_termination, ref_truncation, _ = whole.step(actions[t])
        running += reward
        life_terminations += int(termination.sum())
        if "episode" in info:
            logged += [(t, i, info["episode"]["r"][i], info["episode"]["l"][i]) for i in np.flatnonzero(info["_episode"])]
        for i in np.flatnonzero(ref_termination | ref_truncation):
            expected.append((t, i, running[i]))
            running[i] = 0
    assert len(expected) >= 2 and life_terminations > 2 * len(expected)
    assert [(t, i, r) for t, i, r, _ in logged] == expected
    assert all(length > 0 for *_, length in logged)


def test_reward_clipping_and_unknown_settings(monkeypatch):
    monkeypatch.setattr(p, "AtariVectorEnv", dict)  # make_envs returns the vector env's settings
    assert p.make_envs("ALE/Pong-v5", 1, training=False)["repeat_action_probability"] == 0.25
    settings = p.make_envs("PongNoFrameskip-v4", 1, training=False)
    expected = dict(game="pong", repeat_action_probability=0.0, full_action_space=False)
    expected |= dict(max_num_frames_per_episode=108_000)
    assert {k: settings[k] for k in expected} == expected


# ---------------------------------------------------------------------------------------------------------------------
# The network: layouts and precisions


def random_batch(batch: int = 6, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (batch, 4, 84, 84), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_layout_follows_bf16_and_computes_the_same_function():
    """Channels-last in float32, the default layout under --bf16: the same weights give the same outputs in either."""
    torch.manual_seed(0)
    agent = p.Agent(6, p.Args())
    assert agent.memory_format == torch.channels_last
    assert agent.network[0].weight.is_contiguous(memory_format=torch.channels_last)
    other = p.Agent(6, p.Args(bf16=True))
    assert other.memory_format == torch.contiguous_format and other.network[0].weight.is_contiguous()
    other.load_state_dict(agent.state_dict())
    other.bf16 = False  # float32 in the default layout
    obs = random_batch()
    with torch.no_grad():
        logits, values = agent(obs)
        other_logits, other_values = other(obs)
    torch.testing.assert_close(other_logits, logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(other_values, values, rtol=1e-5, atol=1e-5)
    assert logits.dtype == torch.float32 and values.shape == (6,)


def test_bf16_autocast_stays_close_and_returns_float32():
    """bf16 has an 8-bit mantissa: outputs agree with float32 to about 1e-2 relative, and come back as float32."""
    torch.manual_seed(0)
    agent = p.Agent(6, p.Args())
    low = p.Agent(6, p.Args(bf16=True))
    with torch.no_grad():
        agent.actor.weight.mul_(100)  # logits of order 1, so that the comparison means something
        low.load_state_dict(agent.state_dict())
        logits, values = agent(random_batch())
        low_logits, low_values = low(random_batch())
    assert low_logits.dtype == torch.float32 and low_values.dtype == torch.float32
    torch.testing.assert_close(low_logits, logits, rtol=0.05, atol=0.05)
    torch.testing.assert_close(low_values, values, rtol=0.05, atol=0.05)
    assert (low_logits != logits).any()  # autocast did run in bf16


@pytest.mark.parametrize("bf16", [False, True])
def test_get_action_and_value_is_the_categorical_of_the_logits(bf16):
    """CleanRL's API: sampled actions, their log-probabilities and entropies from Categorical(logits), the critic's
    values; given actions are scored, not resampled; get_value is the same value."""
    torch.manual_seed(0)
    agent = p.Agent(6, p.Args(bf16=bf16))
    obs = random_batch()
    with torch.no_grad():
        agent.actor.weight.mul_(100)
        logits, values = agent(obs)
        action, logprob, entropy, value = agent.get_action_and_value(obs)
        given = torch.arange(6)
        _, given_logprob, _, _ = agent.get_action_and_value(obs, given)
        reference = torch.distributions.Categorical(logits=logits)
        torch.testing.assert_close(logprob, reference.log_prob(action))
        torch.testing.assert_close(given_logprob, reference.log_prob(given))
        torch.testing.assert_close(entropy, reference.entropy())
        torch.testing.assert_close(value, values)
        torch.testing.assert_close(agent.get_value(obs), values)
    assert action.shape == (6,) and action.dtype == torch.long


def test_checkpoints_naming_the_removed_channels_last_flag_still_load():
    torch.manual_seed(0)
    agent = p.Agent(6, p.Args())
    saved_args = {**dataclasses.asdict(p.Args()), "channels_last": False}
    loaded, args = p.build_agent_from_checkpoint({"args": saved_args, "model": agent.state_dict()}, torch.device("cpu"))
    assert loaded.memory_format == torch.channels_last and not args.bf16
    torch.testing.assert_close(loaded(random_batch())[0], agent(random_batch())[0], rtol=0, atol=0)


def test_training_replays_the_rollout(in_tmp, monkeypatch):
    """At a learning rate of 0 the minibatch loss gives back the rollout's own log-probabilities (KL 0): the frames and
    actions reach it as the rollout saw them."""
    assert_training_replays_the_rollout(p, monkeypatch, num_envs=2, num_steps=16, num_minibatches=2)


def test_logged_losses_are_the_last_minibatchs_their_means_and_the_loss_returned(in_tmp, monkeypatch):
    """losses/<name> is the iteration's last minibatch's (clipfrac: the mean), as CleanRL logs them, losses/mean/<name>
    the mean, and a term a forker adds to the loss after its stats were made is in losses/loss."""
    assert_logged_losses(p, monkeypatch, num_envs=2, num_steps=16, num_minibatches=2)


def test_evaluation_presses_fire_after_a_lost_life(tmp_path, monkeypatch):
    assert_evaluation_fires_after_a_lost_life(p, tmp_path, monkeypatch)


# ---------------------------------------------------------------------------------------------------------------------
# The CLI


@pytest.mark.smoke
@pytest.mark.parametrize("extra", [[], ["--bf16"]])
def test_cli_smoke_checkpoint_resume_and_evaluation(tmp_path, extra):
    """A tiny run: every tag, a checkpoint; then a resume to more steps in the same run, and an evaluation of one game,
    on Breakout, whose games end in a few hundred steps (Pong's take a thousand)."""
    cwd = str(tmp_path)
    script = copy_alone(SCRIPT, cwd)  # alone in an empty folder: it needs no other file of the project
    flags = [*TINY, "--env-id", "BreakoutNoFrameskip-v4", *extra]
    result = run_script(script, *flags, "--total-timesteps", "96", "--save-model", "--save-interval", "1", cwd=cwd)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(cwd)
    scalars = read_scalars(run_dir)
    assert ITERATION_TAGS <= set(scalars)
    assert len(scalars["charts/SPS"]) == 3
    path = os.path.join(run_dir, "checkpoint.pt")
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["script"] == "ppo_atari" and checkpoint["global_step"] == 96 and checkpoint["iteration"] == 3
    assert checkpoint["args"]["bf16"] == ("--bf16" in extra)

    result = run_script(script, *flags, "--total-timesteps", "160", "--save-model", "--resume", path, cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert run_dirs(cwd) == [run_dir]
    assert [s for s, _ in read_scalars(run_dir)["charts/SPS"]][-2:] == [128, 160]
    assert torch.load(path, weights_only=True)["global_step"] == 160

    result = run_script(
        script, "--eval-checkpoint", path, "--eval-episodes", "1", "--no-eval-deterministic", "--threads", "1", cwd=cwd
    )
    assert result.returncode == 0, result.stderr
    assert "eval: 1 episodes, mean return" in result.stdout


def test_a_resumed_run_steps_in_its_own_optimizer_settings(in_tmp):
    """A --cudagraphs run saves its optimizer in the captured form (the rate a device tensor, a capturable step); a
    run resumed from it without --cudagraphs steps as its own flags built it, at the rate it was given."""
    flags = [*TINY, "--env-id", "BreakoutNoFrameskip-v4", "--save-model"]
    p.main(p.cli([*flags, "--total-timesteps", "32"])[0])
    (path,) = glob.glob("runs/*/checkpoint.pt")
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["optimizer"]["param_groups"][0].update(lr=torch.tensor(2.5e-4), capturable=True)
    torch.save(checkpoint, path)
    p.main(*p.cli([*flags, "--total-timesteps", "64", "--resume", path, "--no-anneal-lr", "--learning-rate", "1e-4"]))
    group = torch.load(path, weights_only=True)["optimizer"]["param_groups"][0]
    assert (group["lr"], group["capturable"]) == (1e-4, False)
    assert read_scalars(os.path.dirname(path))["charts/learning_rate"][-1] == (64, pytest.approx(1e-4))


@pytest.mark.smoke
def test_games_are_logged_with_raw_scores_and_videos_written(tmp_path):
    """Long enough for whole Pong games of a random policy: raw scores in [-21, 21], not clipped per step; one video
    of env 0's first game, which --track puts in the W&B run."""
    cwd = str(tmp_path)
    flags = ["--num-envs", "2", "--num-steps", "128", "--num-minibatches", "2", "--update-epochs", "1", "--no-progress"]
    flags += ["--threads", "1"]
    result = run_script(SCRIPT, *flags, "--total-timesteps", "2304", "--capture-video", "--track", cwd=cwd, env=WANDB_OFFLINE)
    assert result.returncode == 0, result.stderr
    assert_videos_reached_the_wandb_run(cwd)
    (run_dir,) = run_dirs(cwd)
    scalars = read_scalars(run_dir)
    assert EPISODE_TAGS <= set(scalars)
    scores = [v for _, v in scalars["charts/episodic_return"]]
    assert all(-21 <= s <= 21 for s in scores) and min(scores) < -1  # whole games, not single clipped points
    assert len(glob.glob(os.path.join(cwd, "videos", "*", "*.mp4"))) == 1


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "NoSuchGame-v4"], ["--env-id=NoSuchGame-v4", "pprint_registry"]),
        (["--env-id", "Pendulum-v1"], ["--env-id=Pendulum-v1", "Box", "ppo_continuous.py"]),
        (["--env-id", "CartPole-v1"], ["--env-id=CartPole-v1", "not an Atari game"]),
        (["--num-minibatches", "3"], ["--num-minibatches=3", "divisor of the batch, 1024"]),
        (["--num-envs", "0"], ["--num-envs=0"]),
        (["--cudagraphs", "--no-cuda"], ["--cudagraphs", "CUDA device"]),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, flags, fragments):
    assert_one_line_error(run_script(SCRIPT, *flags, cwd=str(tmp_path)), *fragments)
