"""ppo_transformer_pong.py: cached step-by-step attention against the windowed one-pass sequence and a plain loop,
episode isolation, the replay of a rollout in training, finite losses, the CLI and bad input."""

import glob
import math
import os

import numpy as np
import pytest
import torch
from conftest import (
    EPISODE_TAGS,
    ITERATION_TAGS,
    assert_evaluation_fires_after_a_lost_life,
    assert_logged_losses,
    assert_one_line_error,
    assert_training_replays_the_rollout,
    copy_alone,
    import_script,
    read_scalars,
    run_dirs,
    run_script,
)

SCRIPT = "ppo_transformer_pong.py"
p = import_script("ppo_transformer_pong")
TINY = ["--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1", "--no-progress"]


def random_agent(lookback: int, n_layers: int, n_heads: int, seed: int = 0) -> "p.Agent":
    """A small agent whose distance biases are random (they start at zero, which would hide a wrong distance) and
    whose actor head has weights of std 1/sqrt(d_model) (not 0.01), so that any difference in the features shows in
    the logits, which are of unit scale: the tests' absolute 1e-5 is then float32 rounding, not a tenth of it."""
    torch.manual_seed(seed)
    agent = p.Agent(6, p.Args(lookback=lookback, n_layers=n_layers, n_heads=n_heads, d_model=16))
    with torch.no_grad():
        for layer in agent.layers:
            layer.distance_bias.normal_(0.0, 1.0)
        agent.actor.weight.normal_(0.0, 16**-0.5)
    return agent


def random_frames(steps: int, num_envs: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (steps, num_envs, 1, 84, 84), dtype=torch.uint8, generator=generator)


def random_starts(steps: int, num_envs: int, reset_prob: float, seed: int = 0) -> torch.Tensor:
    starts = torch.rand(steps, num_envs, generator=torch.Generator().manual_seed(seed + 1)) < reset_prob
    starts[0] = True  # every env begins an episode
    return starts


def copy(memory: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: x.clone() for name, x in memory.items()}


def heads(agent, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return agent.actor(hidden), agent.critic(hidden).squeeze(-1)


@torch.no_grad()
def run_steps(agent, frames: torch.Tensor, starts: torch.Tensor, memory=None):
    """The rollout's way: one step at a time with the KV cache. Returns logits (T, B, A), values (T, B), and copies of
    the memory before every step and after the last (a step writes into the cache in place)."""
    memory = copy(memory or agent.initial_memory(frames.shape[1], torch.device("cpu")))
    logits, values, memories = [], [], [copy(memory)]
    for t in range(frames.shape[0]):
        hidden, memory = agent.get_states(frames[t], memory, starts[t])
        logit, value = heads(agent, hidden)
        logits.append(logit)
        values.append(value)
        memories.append(copy(memory))
    return torch.stack(logits), torch.stack(values), memories


@torch.no_grad()
def run_sequence(agent, frames: torch.Tensor, memory: dict[str, torch.Tensor], starts: torch.Tensor):
    """The training's way: the whole sequence in one pass. Returns logits (T, B, A) and values (T, B)."""
    return heads(agent, agent.get_states_sequence(frames, memory, starts))


@torch.no_grad()
def reference_outputs(agent, frames: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A plain loop over every env, layer, step and head, from the first step of the data: step t attends, in every
    layer, to the steps s of its own episode with t - lookback <= s <= t, with scores q.k / sqrt(d) + bias[h, t - s].
    It shares only the weights with the script (no cache, no masks, no scaled_dot_product_attention)."""
    steps, num_envs = starts.shape
    tokens = agent.encode(frames.flatten(0, 1)).view(steps, num_envs, -1)
    all_logits, all_values = torch.zeros(steps, num_envs, 6), torch.zeros(steps, num_envs)
    for b in range(num_envs):
        episode_start = [0] * steps
        for t in range(steps):
            episode_start[t] = t if starts[t, b] or t == 0 else episode_start[t - 1]
        x = tokens[:, b]  # (T, D)
        for layer in agent.layers:
            n_heads, d = layer.n_heads, x.shape[1] // layer.n_heads
            q, k, v = layer.qkv(layer.norm1(x)).view(steps, 3, n_heads, d).unbind(1)  # (T, H, d) each
            out = torch.zeros(steps, n_heads, d)
            for t in range(steps):
                for h in range(n_heads):
                    keys = range(max(episode_start[t], t - agent.lookback), t + 1)
                    scores = torch.stack([q[t, h] @ k[s, h] / math.sqrt(d) + layer.distance_bias[h, t - s] for s in keys])
                    out[t, h] = (torch.softmax(scores, 0).unsqueeze(1) * v[list(keys), h]).sum(0)
            x = x + layer.proj(out.flatten(1))
            x = x + layer.mlp(layer.norm2(x))
        all_logits[:, b], all_values[:, b] = heads(agent, agent.norm(x))
    return all_logits, all_values


# ---------------------------------------------------------------------------------------------------------------------
# The transformer: cached steps, the windowed one-pass sequence and a plain loop agree; nothing crosses an episode


@pytest.mark.parametrize("lookback", [0, 1, 5, 16])
@pytest.mark.parametrize("n_layers, n_heads", [(1, 1), (2, 4), (3, 2)])
@pytest.mark.parametrize("lengths", [(1, 1), (6, 9), (24, 24)])
@pytest.mark.parametrize("reset_prob", [0.0, 0.2])
def test_cached_steps_equal_windowed_one_pass(lookback, n_layers, n_heads, lengths, reset_prob):
    """Two rollouts back to back, as in training: each rollout's one-pass sequence, started from the memory saved at
    its start, equals the cached step-by-step outputs to 1e-5, across the boundary between the two rollouts. The
    cache keeps its size whatever the step (the per-step cost does not grow with the episode)."""
    agent = random_agent(lookback, n_layers, n_heads)
    first, second = lengths
    frames, starts = random_frames(first + second, 3), random_starts(first + second, 3, reset_prob)
    logits, values, memories = run_steps(agent, frames, starts)
    assert {tuple(memory["kv"].shape) for memory in memories} == {(n_layers, 2, 3, n_heads, lookback + 1, 16 // n_heads)}
    for begin, end in ((0, first), (first, first + second)):
        seq_logits, seq_values = run_sequence(agent, frames[begin:end], memories[begin], starts[begin:end])
        torch.testing.assert_close(seq_logits, logits[begin:end], rtol=0, atol=1e-5)
        torch.testing.assert_close(seq_values, values[begin:end], rtol=0, atol=1e-5)


@pytest.mark.parametrize("lookback", [0, 4])
def test_rollout_and_training_calls_agree(lookback):
    """What the rollout stores and what the loss recomputes: get_action_and_value, step by step, gives its sampled
    actions' log-probabilities and the entropies of softmax(logits), the values and the next memory of the cached
    steps; the one-pass get_action_and_value_sequence gives the same log-probabilities, entropies and values."""
    agent = random_agent(lookback, 2, 2)
    frames, starts = random_frames(12, 3, seed=4), random_starts(12, 3, 0.2, seed=4)
    logits, values, memories = run_steps(agent, frames, starts)
    torch.manual_seed(0)
    memory, outputs = copy(memories[0]), []
    with torch.no_grad():
        for t in range(12):
            *step_outputs, memory = agent.get_action_and_value(frames[t], memory, starts[t])
            outputs.append(step_outputs)
        actions, logprobs, entropies, step_values = (torch.stack(x) for x in zip(*outputs))
        reference = torch.distributions.Categorical(logits=logits)
        torch.testing.assert_close(logprobs, reference.log_prob(actions), rtol=0, atol=1e-5)
        torch.testing.assert_close(entropies, reference.entropy(), rtol=0, atol=1e-5)
        torch.testing.assert_close(step_values, values, rtol=0, atol=1e-5)
        torch.testing.assert_close(memory["kv"], memories[-1]["kv"], rtol=0, atol=0)
        sequence = agent.get_action_and_value_sequence(frames, memories[0], starts, actions)
    assert sequence[0] is actions
    for got, expected in zip(sequence[1:], (logprobs, entropies, step_values)):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("lookback, n_layers, n_heads", [(0, 1, 1), (3, 2, 2), (6, 1, 4)])
def test_cached_steps_equal_a_plain_loop(lookback, n_layers, n_heads):
    agent = random_agent(lookback, n_layers, n_heads)
    frames, starts = random_frames(20, 2, seed=3), random_starts(20, 2, 0.15, seed=3)
    logits, values, _ = run_steps(agent, frames, starts)
    ref_logits, ref_values = reference_outputs(agent, frames, starts)
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(values, ref_values, rtol=0, atol=1e-5)


@pytest.mark.parametrize("n_layers", [1, 2])
def test_nothing_crosses_an_episode_start(n_layers):
    """Changing every frame before an episode start changes nothing from the start on, in the cached steps and in the
    one-pass sequence; changing a frame after it does change the outputs (the test can fail)."""
    agent = random_agent(8, n_layers, 2)
    frames, starts = random_frames(16, 2, seed=5), torch.zeros(16, 2, dtype=torch.bool)
    starts[0], starts[9, 0] = True, True
    other = frames.clone()
    other[:9, 0] = random_frames(9, 1, seed=6)[:, 0]
    logits, _, _ = run_steps(agent, frames, starts)
    other_logits, _, _ = run_steps(agent, other, starts)
    torch.testing.assert_close(other_logits[9:, 0], logits[9:, 0], rtol=0, atol=0)
    assert (other_logits[:9, 0] != logits[:9, 0]).any()
    memory = agent.initial_memory(2, torch.device("cpu"))
    seq_logits, _ = run_sequence(agent, frames, memory, starts)
    other_seq_logits, _ = run_sequence(agent, other, memory, starts)
    torch.testing.assert_close(other_seq_logits[9:, 0], seq_logits[9:, 0], rtol=0, atol=0)


@pytest.mark.parametrize("lookback", [0, 3])
def test_a_step_whose_memory_is_dropped_changes_nothing(lookback):
    """The rollout peeks (the value of a truncated game's final observation, the bootstrap value) with a step whose
    returned memory it drops. The step writes into the cache in place (no copy of it), but only into the slot the
    next step overwrites: the outputs that follow are those of a rollout without the peeks, bit for bit, whether the
    next outputs come from steps or, after a peek with episode starts and a copy of the memory (the end of a
    rollout), from the one-pass sequence of the next rollout."""
    agent = random_agent(lookback, 2, 2)
    frames, starts = random_frames(16, 2, seed=8), random_starts(16, 2, 0.2, seed=8)
    logits, values, _ = run_steps(agent, frames, starts)
    peek_frames = random_frames(1, 2, seed=9)[0]
    with torch.no_grad():
        memory = agent.initial_memory(2, torch.device("cpu"))
        for t in range(10):
            if t in (4, 5, 9):
                agent.get_value(peek_frames, memory, torch.zeros(2, dtype=torch.bool))  # its memory is dropped
            kv = memory["kv"]
            hidden, memory = agent.get_states(frames[t], memory, starts[t])
            assert memory["kv"].data_ptr() == kv.data_ptr()  # written in place
            logit, value = heads(agent, hidden)
            torch.testing.assert_close(logit, logits[t], rtol=0, atol=0)
            torch.testing.assert_close(value, values[t], rtol=0, atol=0)
        agent.get_value(peek_frames, memory, starts[10])  # the bootstrap value at a rollout's end
    seq_logits, seq_values = run_sequence(agent, frames[10:], copy(memory), starts[10:])
    torch.testing.assert_close(seq_logits, logits[10:], rtol=0, atol=1e-5)
    torch.testing.assert_close(seq_values, values[10:], rtol=0, atol=1e-5)


def test_bf16_keeps_a_float32_memory_and_the_layout_follows_it():
    """Under --bf16 the network computes in bfloat16 in the default layout (channels-last in float32); its memory stays
    float32, written in place, and the cached steps still match the one-pass sequence to bfloat16's precision."""
    torch.manual_seed(0)
    agent = p.Agent(6, p.Args(lookback=4, n_layers=2, n_heads=2, d_model=16, bf16=True))
    bf16_conv, float32_conv = agent.network[2].weight, p.Agent(6, p.Args(d_model=16)).network[2].weight  # (64, 32, 4, 4)
    assert bf16_conv.is_contiguous() and not bf16_conv.is_contiguous(memory_format=torch.channels_last)
    assert float32_conv.is_contiguous(memory_format=torch.channels_last)
    frames, starts = random_frames(10, 2, seed=2), random_starts(10, 2, 0.2, seed=2)
    memory = agent.initial_memory(2, torch.device("cpu"))
    with torch.no_grad():
        hidden, next_memory = agent.get_states(frames[0], memory, starts[0])
    assert hidden.dtype == next_memory["kv"].dtype == torch.float32
    assert next_memory["kv"].data_ptr() == memory["kv"].data_ptr()
    logits, values, memories = run_steps(agent, frames, starts)
    seq_logits, seq_values = run_sequence(agent, frames, memories[0], starts)
    torch.testing.assert_close(seq_logits, logits, rtol=0, atol=0.05)
    torch.testing.assert_close(seq_values, values, rtol=0, atol=0.05)


def test_one_layer_attends_exactly_lookback_steps_back():
    """With one layer, the output at step t depends on frame t - lookback and not on frame t - lookback - 1."""
    lookback, t = 4, 10
    agent = random_agent(lookback, 1, 2)
    frames, starts = random_frames(t + 1, 1, seed=7), random_starts(t + 1, 1, 0.0)
    logits, _, _ = run_steps(agent, frames, starts)
    for back, changes in ((lookback, True), (lookback + 1, False)):
        other = frames.clone()
        other[t - back] = 255 - other[t - back]
        other_logits, _, _ = run_steps(agent, other, starts)
        assert bool((other_logits[t] != logits[t]).any()) == changes, back


# ---------------------------------------------------------------------------------------------------------------------
# Training: it replays the rollout exactly; advantage normalisation stays finite


def test_training_replays_the_rollout_exactly(in_tmp, monkeypatch):
    """Training sees the frames, the memory at the rollout's start and the episode masks that the rollout saw: at a
    learning rate of 0, KL 0 in every minibatch."""
    assert_training_replays_the_rollout(p, monkeypatch, num_envs=4, num_steps=32, num_minibatches=2)


def test_logged_losses_are_the_last_minibatchs_their_means_and_the_loss_returned(in_tmp, monkeypatch):
    """losses/<name> is the iteration's last minibatch's (clipfrac: the mean), as CleanRL logs them, losses/mean/<name>
    the mean, and a term a forker adds to the loss after its stats were made is in losses/loss."""
    assert_logged_losses(p, monkeypatch, num_envs=2, num_steps=16, num_minibatches=2)


def test_truncated_games_bootstrap_from_their_final_frame_with_their_memory(in_tmp, monkeypatch):
    """Games cut at a small frame limit: the value stored for a truncated step must be the value of the game's final
    observation seen after the game's own frames, as a plain one-pass sequence over those frames computes it."""
    original_env = p.AtariVectorEnv
    monkeypatch.setattr(p, "AtariVectorEnv", lambda **settings: original_env(**settings | {"max_num_frames_per_episode": 200}))
    seen, captured = [], []  # every env step's (observations the agent saw next, final observations); GAE's inputs
    original_step, original_reset = p.RecordGameStatistics.step, p.RecordGameStatistics.reset

    def reset(self, **kwargs):
        obs, info = original_reset(self, **kwargs)
        seen.append((obs.copy(), None, np.zeros(self.num_envs, dtype=bool)))
        return obs, info

    def step(self, actions):
        obs, rewards, terminations, truncations, info = original_step(self, actions)
        seen.append((obs.copy(), info["final_obs"].copy() if truncations.any() else None, terminations | truncations))
        return obs, rewards, terminations, truncations, info

    original_gae = p.compute_gae

    def spy(rewards, values, terminations, truncations, final_values, *args, **kwargs):
        captured.append((truncations.clone(), final_values.clone()))
        return original_gae(rewards, values, terminations, truncations, final_values, *args, **kwargs)

    monkeypatch.setattr(p.RecordGameStatistics, "reset", reset)
    monkeypatch.setattr(p.RecordGameStatistics, "step", step)
    monkeypatch.setattr(p, "compute_gae", spy)
    args = p.Args(num_envs=2, num_steps=64, total_timesteps=2 * 64 * 2, num_minibatches=2, learning_rate=0.0, progress=False)
    args.save_model = True
    p.main(args)
    agent, _ = p.build_agent_from_checkpoint(torch.load(glob.glob("runs/*/checkpoint.pt")[0], weights_only=True), "cpu")
    truncations = torch.cat([t for t, _ in captured])  # (steps, envs)
    final_values = torch.cat([v for _, v in captured])
    assert truncations.sum() >= 2
    for t, b in truncations.nonzero().tolist():
        start = max(i for i in range(t + 1) if i == 0 or seen[i][2][b])  # seen[i][0] is what the agent saw at step i
        frames = [seen[i][0][b] for i in range(start, t + 1)] + [seen[t + 1][1][b]]  # the game's frames, then the final one
        frames = torch.as_tensor(np.stack(frames)).unsqueeze(1)  # (n, 1, 1, 84, 84)
        starts = torch.zeros(len(frames), 1, dtype=torch.bool)
        starts[0] = True
        _, values = run_sequence(agent, frames, agent.initial_memory(1, torch.device("cpu")), starts)
        torch.testing.assert_close(final_values[t, b], values[-1, 0], rtol=0, atol=1e-5)


@pytest.mark.filterwarnings("ignore:std\\(\\)")
def test_the_seeds_nan_cause_cannot_occur():
    """The seed project normalised advantages over minibatches that ended at every episode end, so a minibatch could
    hold a single sample, and torch's (unbiased) std of one sample is NaN: (a - mean) / (NaN + 1e-8) is NaN. Here
    every minibatch is num_steps x (num_envs / num_minibatches) samples, and a minibatch of one sample is refused."""
    one = torch.tensor([0.7])
    assert torch.isnan((one - one.mean()) / (one.std() + 1e-8)).all()  # the cause, as it was
    args = p.Args(num_envs=8, num_steps=1, num_minibatches=4)
    assert args.minibatch_size == 2
    with pytest.raises(SystemExit, match="--norm-adv"):
        p.Args(num_envs=8, num_steps=1, num_minibatches=8)


def test_a_run_stays_finite(in_tmp):
    """Advantage normalisation on, smallest minibatches allowed (one env sequence of 2 steps), short episodes of
    lives lost in Breakout: every loss of every iteration is finite."""
    args = p.Args(env_id="BreakoutNoFrameskip-v4", num_envs=2, num_steps=2, num_minibatches=2, total_timesteps=2 * 2 * 60)
    args.progress, args.exp_name = False, "finite"
    p.main(args)
    (run_dir,) = glob.glob("runs/*__finite__*")
    scalars = read_scalars(run_dir)
    assert len(scalars["losses/policy_loss"]) == 60
    for tag in ITERATION_TAGS:
        assert all(math.isfinite(v) for _, v in scalars[tag]), tag


def test_evaluation_presses_fire_after_a_lost_life(tmp_path, monkeypatch):
    assert_evaluation_fires_after_a_lost_life(p, tmp_path, monkeypatch)


# ---------------------------------------------------------------------------------------------------------------------
# The CLI


@pytest.mark.smoke
@pytest.mark.parametrize("extra", [[], ["--bf16", "--lookback", "0", "--n-layers", "1"]])
def test_cli_smoke_checkpoint_resume_and_evaluation(tmp_path, extra):
    """A tiny run: every tag, a checkpoint; then a resume to more steps in the same run, and an evaluation of one game,
    on Breakout, whose games end in a few hundred steps (Pong's take a thousand)."""
    cwd = str(tmp_path)
    script = copy_alone(SCRIPT, cwd)  # alone in an empty folder: it needs no other file of the project
    flags = [*TINY, "--env-id", "BreakoutNoFrameskip-v4", *extra]
    result = run_script(script, *flags, "--total-timesteps", "96", "--save-model", "--save-interval", "1", cwd=cwd)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(cwd)
    assert ITERATION_TAGS <= set(read_scalars(run_dir))
    path = os.path.join(run_dir, "checkpoint.pt")
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["script"] == "ppo_transformer_pong" and checkpoint["global_step"] == 96
    assert checkpoint["args"]["lookback"] == (0 if extra else 16)

    result = run_script(script, *flags, "--total-timesteps", "160", "--save-model", "--resume", path, cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert run_dirs(cwd) == [run_dir]
    assert [s for s, _ in read_scalars(run_dir)["charts/SPS"]][-2:] == [128, 160]

    result = run_script(script, "--eval-checkpoint", path, "--eval-episodes", "1", "--no-eval-deterministic", cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert "eval: 1 episodes, mean return" in result.stdout


@pytest.mark.smoke
def test_games_are_logged_and_videos_written(tmp_path):
    cwd = str(tmp_path)
    flags = ["--num-envs", "2", "--num-steps", "128", "--num-minibatches", "2", "--update-epochs", "1", "--no-progress"]
    result = run_script(SCRIPT, *flags, "--total-timesteps", "2304", "--capture-video", cwd=cwd)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(cwd)
    scalars = read_scalars(run_dir)
    assert EPISODE_TAGS <= set(scalars)
    assert all(-21 <= v <= 21 for _, v in scalars["charts/episodic_return"])
    assert len(glob.glob(os.path.join(cwd, "videos", "*", "*.mp4"))) == 1


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "NoSuchGame-v4"], ["--env-id=NoSuchGame-v4", "pprint_registry"]),
        (["--env-id", "Pendulum-v1"], ["--env-id=Pendulum-v1", "Box"]),
        (["--num-minibatches", "3"], ["--num-minibatches=3", "--num-envs=8"]),
        (["--n-heads", "3"], ["--n-heads=3", "--d-model=128"]),
        (["--lookback", "-1"], ["--lookback=-1"]),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, flags, fragments):
    assert_one_line_error(run_script(SCRIPT, *flags, cwd=str(tmp_path)), *fragments)


def test_a_checkpoint_that_names_the_convolutions_encoder_loads():
    torch.manual_seed(0)
    saved = p.Agent(6, p.Args(lookback=2, n_layers=1, n_heads=2, d_model=16)).state_dict()
    old_names = {k.replace("network.", "encoder.", 1) if k.startswith("network.") else k: v for k, v in saved.items()}
    agent = p.Agent(6, p.Args(lookback=2, n_layers=1, n_heads=2, d_model=16))
    agent.load_state_dict(old_names)
    for name, tensor in agent.state_dict().items():
        assert torch.equal(tensor, saved[name]), name
