"""ppo_fsmn_cartpole.py: the FSMN against plain references, GAE, autoreset handling, the CLI, POPGym tasks, learning."""

import glob
import math
import os
import pickle
import signal
from dataclasses import replace
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import popgym
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

SCRIPT = "ppo_fsmn_cartpole.py"
p = import_script("ppo_fsmn_cartpole")
TINY = ["--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "2", "--no-progress"]
PENDULUM = "popgym-NoisyPositionOnlyPendulumEasy-v0"  # POPGym's continuous-action task


# --long-memory, the episode-long memory of every block: none, fixed learned decays, or input-gated ones
LONG_MEMORIES = ["none", "decay", "gate"]


def randomize_long_memory(block) -> None:
    """Random read-out weights d (they start at zero, which would hide a wrong memory); --long-memory decay's decays spread
    wider than the initial ones, from a horizon of 1 step to 400; --long-memory gate's forget gate made input-dependent
    (W_f starts at zero) around the same spread of biases."""
    dim = block.taps.shape[1]
    with torch.no_grad():
        if block.long_memory == "decay":
            block.decay_weights.normal_(0.0, 0.5)
            block.decay_logits.copy_(torch.linspace(-3.0, 6.0, dim)[torch.randperm(dim)])
        if block.long_memory == "gate":
            block.gate_weights.normal_(0.0, 0.5)
            block.gate.weight[:dim].normal_(0.0, 1.0)
            block.gate.bias[:dim].copy_(torch.linspace(-3.0, 6.0, dim)[torch.randperm(dim)])


def random_agent(
    memory_order: int,
    num_blocks: int,
    obs_dim: int = 3,
    seed: int = 0,
    memory_stride: int = 1,
    long_memory: str = "none",
    separate_critic: bool = False,
) -> "p.Agent":
    """An agent whose memory taps and long-memory weights are random (`randomize_long_memory`); by default one trunk
    for both heads, 16 channels wide (a --separate-critic's two parts 16 each)."""
    torch.manual_seed(seed)
    # prev_action off: these tests feed the network its input directly (the script builds it with `observe`)
    args = p.Args(
        memory_order=memory_order,
        memory_stride=memory_stride,
        long_memory=long_memory,
        num_blocks=num_blocks,
        hidden_dim=16 * (1 + separate_critic),  # 16 channels a part
        prev_action=False,
        separate_critic=separate_critic,
    )
    agent = p.Agent(obs_dim, 2, args)
    with torch.no_grad():
        for block in agent.blocks:
            block.taps.normal_(0.0, 0.5)
            randomize_long_memory(block)
    return agent


def run_steps(agent, obs: torch.Tensor, memory: torch.Tensor, starts: torch.Tensor):
    """The rollout's way: one cached step at a time, the memory carried along. Returns logits, values, memories."""
    logits, values, memories = [], [], [memory]
    for t in range(obs.shape[0]):
        hidden, memory = agent.get_states(obs[t], memory, starts[t])
        logits.append(agent.actor(hidden))
        values.append(agent.critic(hidden).squeeze(-1))
        memories.append(memory)
    return torch.stack(logits), torch.stack(values), memories


def run_sequence(agent, obs: torch.Tensor, memory: torch.Tensor, starts: torch.Tensor):
    """Training's way: the whole sequence in one pass from the memory at its start. Returns logits and values."""
    hidden = agent.get_states_sequence(obs, memory, starts)
    return agent.actor(hidden), agent.critic(hidden).squeeze(-1)


# ---------------------------------------------------------------------------------------------------------------------
# The FSMN: cached step-by-step inference equals the one-pass sequence, memory taps, episode isolation


def reference_block(block, xs: list[torch.Tensor], starts: torch.Tensor) -> list[torch.Tensor]:
    """One FSMN block written as the paper's formula with a plain Python loop over time, for B environments at once:
    h_t = tanh(W_in x_t); m_t = h_t + sum_{i=0..N} a_i h_{t-iS} (only steps of the same episode) [+ d e_t, with
    e_t = lambda e_{t-1} + sqrt(1 - lambda^2) h_t, e = 0 before the episode, lambda = sigmoid(decay_logits); or with
    y_t = LayerNorm(x_t + W_out m_t) [+ d e_t with the gate, e_t = f_t e_{t-1} + i_t v_t, f_t = sigmoid(W_f x_t + b_f),
    i_t = sigmoid(W_i x_t + b_i), v_t = W_v x_t]. xs: T tensors (B, H); starts: (T, B) bool, episode starts."""
    hs, outputs, episode_begin = [], [], torch.zeros(starts.shape[1], dtype=torch.long)
    e = torch.zeros_like(xs[0])
    for t, x in enumerate(xs):
        episode_begin = torch.where(starts[t], t, episode_begin)  # (B,)
        h = torch.tanh(x @ block.proj_in.weight.T + block.proj_in.bias)
        hs.append(h)
        m = h.clone()
        for i in range(block.memory_order + 1):
            lag = i * block.memory_stride
            if t - lag >= 0:
                m = m + block.taps[i] * hs[t - lag] * (t - lag >= episode_begin).unsqueeze(-1)
        if block.long_memory == "decay":
            decay = 1 / (1 + torch.exp(-block.decay_logits))
            e = torch.where(starts[t].unsqueeze(-1), 0.0, decay * e) + torch.sqrt(1 - decay**2) * h
            m = m + block.decay_weights * e
        if block.long_memory == "gate":
            w_f, w_i, w_v = block.gate.weight.chunk(3)  # (H, H) each
            b_f, b_i, b_v = block.gate.bias.chunk(3)
            forget, write = 1 / (1 + torch.exp(-(x @ w_f.T + b_f))), 1 / (1 + torch.exp(-(x @ w_i.T + b_i)))
            e = torch.where(starts[t].unsqueeze(-1), 0.0, forget * e) + write * (x @ w_v.T + b_v)
        y = x + m @ block.proj_out.weight.T + block.proj_out.bias
        y = torch.nn.functional.layer_norm(y, (y.shape[-1],), block.norm.weight, block.norm.bias)
        outputs.append(y + block.gate_weights * e if block.long_memory == "gate" else y)
    return outputs


def reference_agent(agent, obs: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole network through `reference_block`, from empty memories. obs: (T, B, obs_dim). Returns logits, values."""
    xs = [torch.tanh(agent.embed(o)) for o in obs]
    for block in agent.blocks:
        xs = reference_block(block, xs, starts)
    hidden = torch.stack(xs)  # (T, B, H)
    return agent.actor(hidden), agent.critic(hidden).squeeze(-1)


@pytest.mark.parametrize("memory_order", [0, 1, 4, 8])
@pytest.mark.parametrize("memory_stride", [1, 2, 3])
@pytest.mark.parametrize("num_blocks", [1, 3])
@pytest.mark.parametrize("lengths", [(1, 1), (5, 12), (20, 20)])
@pytest.mark.parametrize("reset_prob", [0.0, 0.15, 0.5])
@pytest.mark.parametrize("long_memory", LONG_MEMORIES)
def test_cached_steps_equal_one_pass_sequence(memory_order, memory_stride, num_blocks, lengths, reset_prob, long_memory):
    """Two consecutive rollouts run step by step equal the training pass over each, started from the memory
    the rollout saved at its start (so the test crosses the boundary between two rollouts), and both equal the plain
    loop of `reference_block`; the memory holds the last N*S hidden states of every block [and its decayed sum]."""
    agent = random_agent(memory_order, num_blocks, memory_stride=memory_stride, long_memory=long_memory)
    t1, t2 = lengths
    num_envs = 5
    generator = torch.Generator().manual_seed(memory_order * 1000 + memory_stride * 100 + num_blocks * 10 + t1)
    obs = torch.randn(t1 + t2, num_envs, 3, generator=generator)
    starts = torch.rand(t1 + t2, num_envs, generator=generator) < reset_prob
    starts[0] = True  # the very first step begins every episode, as in the script
    with torch.no_grad():
        step_logits, step_values, memories = run_steps(agent, obs, agent.initial_memory(num_envs, "cpu"), starts)
        logits1, values1 = run_sequence(agent, obs[:t1], memories[0], starts[:t1])
        logits2, values2 = run_sequence(agent, obs[t1:], memories[t1], starts[t1:])
        reference_logits, reference_values = reference_agent(agent, obs, starts)
    # (L, B, N*S [+1], H)
    assert memories[-1].shape == (num_blocks, num_envs, memory_order * memory_stride + (long_memory != "none"), 16)
    torch.testing.assert_close(torch.cat([logits1, logits2]), step_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.cat([values1, values2]), step_values, rtol=0, atol=1e-5)
    torch.testing.assert_close(step_logits, reference_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(step_values, reference_values, rtol=0, atol=1e-5)


def part_of(separate: torch.Tensor, shape: torch.Size, part: int, hidden: int = 16) -> torch.Tensor:
    """The slice of a --separate-critic parameter that one part's own network would hold: every dimension that is
    twice the plain network's is read as (chunks, 2 parts, hidden) and that part kept (the gate's rows: 3 chunks)."""
    for dim, size in enumerate(shape):
        if separate.shape[dim] != size:
            assert separate.shape[dim] == 2 * size
            split = separate.unflatten(dim, (size // hidden, 2, hidden))
            separate = split.select(dim + 1, part).flatten(dim, dim + 1)
    return separate


@pytest.mark.parametrize("long_memory", LONG_MEMORIES)
@pytest.mark.parametrize("memory_order", [0, 3])
def test_separate_critic_is_two_networks_side_by_side(long_memory, memory_order):
    """--separate-critic's one wide network gives the policy's logits of a plain network built from its first half of
    channels and the values of one built from its second, stepwise and in one pass; the weights between the halves
    start at zero and stay zero through Adam steps on both heads' losses, and the value's loss reaches no policy
    weight."""
    sep = random_agent(memory_order, 2, long_memory=long_memory, separate_critic=True)
    with torch.no_grad():
        for block in sep.blocks:
            if long_memory == "gate":
                block.gate.weight.mul_(block.gate.kept)  # randomize_long_memory filled W_f whole
    assert sep.initial_memory(5, "cpu").shape[-1] == 32
    plain = [random_agent(memory_order, 2, long_memory=long_memory) for _ in range(2)]
    for part, agent in enumerate(plain):
        agent.load_state_dict({name: part_of(sep.state_dict()[name], x.shape, part) for name, x in agent.state_dict().items()})
    obs, starts = torch.randn(10, 5, 3), torch.rand(10, 5) < 0.2
    starts[0] = True
    with torch.no_grad():
        for run in (run_steps, run_sequence):
            logits, values = run(sep, obs, sep.initial_memory(5, "cpu"), starts)[:2]
            torch.testing.assert_close(logits, run(plain[0], obs, plain[0].initial_memory(5, "cpu"), starts)[0])
            torch.testing.assert_close(values, run(plain[1], obs, plain[1].initial_memory(5, "cpu"), starts)[1])
    masked = {name: layer.kept for name, layer in sep.named_modules() if hasattr(layer, "kept")}
    expected = {"actor", "critic"} | {f"blocks.{i}.{layer}" for i in (0, 1) for layer in ("proj_in", "proj_out")}
    assert set(masked) == expected | ({"blocks.0.gate", "blocks.1.gate"} if long_memory == "gate" else set())
    assert all(torch.all(sep.get_submodule(name).weight[~kept] == 0) for name, kept in masked.items())
    optimizer = torch.optim.Adam(sep.parameters(), lr=1e-2, eps=1e-5, fused=True)
    for _ in range(5):
        logits, values = run_sequence(sep, obs, sep.initial_memory(5, "cpu"), starts)
        optimizer.zero_grad()
        (logits.square().mean() + (values - 1).square().mean()).backward()
        optimizer.step()
    for name, kept in masked.items():
        weight = sep.get_submodule(name).weight
        assert torch.all(weight[~kept] == 0) and torch.all(weight[kept] != 0), name
    optimizer.zero_grad()
    run_sequence(sep, obs, sep.initial_memory(5, "cpu"), starts)[1].sum().backward()  # the values alone
    policy_params = [(name, x) for name, x in sep.named_parameters() if not name.startswith("critic.")]
    shapes = dict(plain[0].named_parameters())
    assert all(x.grad is None or torch.all(part_of(x.grad, shapes[name].shape, 0) == 0) for name, x in policy_params)
    assert any(x.grad is not None and torch.any(part_of(x.grad, shapes[name].shape, 1) != 0) for name, x in policy_params)


def test_a_separate_critic_takes_half_of_hidden_dim_and_an_odd_one_is_refused():
    """--separate-critic splits --hidden-dim's channels between the policy and the critic (--no-split-hidden: each
    takes --hidden-dim, the trunk twice as wide); an odd --hidden-dim is refused in one line naming the flag, unless
    the trunk is not split."""
    for flags, width, policy in (({}, 64, 32), ({"split_hidden": False}, 128, 64), ({"separate_critic": False}, 64, 64)):
        agent = p.Agent(4, 2, p.Args(**flags))
        assert (agent.width, int(agent.policy_channels.sum()), agent.embed.out_features) == (width, policy, width), flags
    with pytest.raises(SystemExit, match=r"^error: --hidden-dim=63 must be at least 1, and even with --separate-critic"):
        p.Args(hidden_dim=63)
    for flags in ({"split_hidden": False}, {"separate_critic": False}):  # nothing split: accepted
        assert p.Args(hidden_dim=63, **flags).hidden_dim == 63


@pytest.mark.parametrize("separate_critic", [True, False])
@pytest.mark.parametrize("preserving", [True, False])
def test_obs_norm_update_preserving_leaves_the_policys_outputs_as_they_were(preserving, separate_critic):
    """--norm-obs-preserving: after the statistics take in a batch far from the earlier ones, the policy's logits for
    the same raw observations are what they were (its embedding absorbed the change), and so are the values where the
    critic shares the policy's trunk; a critic of its own (--separate-critic) reads the new statistics, so its values
    move, as everything does without the flag. Either way the statistics are the batch's, as RunningNorm makes them."""
    torch.manual_seed(0)
    agent = p.Agent(4, 2, p.Args(norm_obs_preserving=preserving, separate_critic=separate_critic))
    reference = p.RunningNorm(4)
    first, second = torch.randn(300, 4) * 0.1, torch.randn(200, 4) * torch.tensor([3.0, 0.5, 1.0, 20.0]) + 2.0
    probe, prev_actions = torch.randn(7, 4) * 0.1, torch.randint(0, 2, (7,))  # within the clip before and after
    starts = torch.zeros(7, dtype=torch.bool)

    def outputs():
        with torch.no_grad():
            x = agent.observe(probe, prev_actions, starts)
            hidden, _ = agent.get_states(x, agent.initial_memory(7, "cpu"), ~starts)
            return agent.actor(hidden), agent.critic(hidden)

    agent.update_obs_norm(first), reference.update(first)
    (logits, values) = outputs()
    agent.update_obs_norm(second), reference.update(second)
    (new_logits, new_values) = outputs()
    torch.testing.assert_close(agent.obs_norm.mean, reference.mean)
    torch.testing.assert_close(agent.obs_norm.var, reference.var)
    close = {
        name: torch.allclose(new, old, rtol=1e-4, atol=1e-5)
        for name, new, old in (("logits", new_logits, logits), ("values", new_values, values))
    }
    assert close == {"logits": preserving, "values": preserving and not separate_critic}


@pytest.mark.parametrize("memory_order", [0, 2, 6])
@pytest.mark.parametrize("memory_stride", [1, 2, 3])
@pytest.mark.parametrize("long_memory", LONG_MEMORIES)
def test_block_matches_the_formula(memory_order, memory_stride, long_memory):
    """Tap a_0 weights the current step and a_i the step i*S back; d weights the decayed sum e."""
    torch.manual_seed(1)
    block, span = p.FSMNBlock(8, memory_order, memory_stride, long_memory), memory_order * memory_stride
    with torch.no_grad():
        block.taps.copy_(torch.randn_like(block.taps))
        randomize_long_memory(block)
        xs = [torch.randn(1, 8) for _ in range(15)]
        starts = torch.tensor([t in (0, 4, 5, 11) for t in range(15)]).unsqueeze(1)  # (T, 1)
        expected = torch.cat(reference_block(block, xs, starts))
        ids = torch.cat([torch.zeros(span, 1, dtype=torch.long), torch.cumsum(starts.long(), 0)])  # (N*S+T, 1)
        lagged = torch.stack([ids[span - i * memory_stride :][:15] for i in reversed(range(memory_order + 1))])  # (N+1, T, 1)
        same = (lagged == ids[span:]).unsqueeze(-1).float()  # (N+1, T, 1, 1): oldest tap first, as the Agent builds it
        got = block.sequence(torch.stack(xs), torch.zeros(1, span + (long_memory != "none"), 8), same, starts).squeeze(1)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("memory_stride", [1, 2, 3])
def test_memory_reaches_exactly_memory_order_steps_back(memory_stride):
    """With one block, an observation k steps back changes the output iff k is one of the taps' lags 0, S, ..., N*S."""
    agent = random_agent(memory_order=3, num_blocks=1, memory_stride=memory_stride)
    obs = torch.randn(16, 1, 3)
    starts = torch.zeros(16, 1, dtype=torch.bool)
    starts[0] = True
    memory = agent.initial_memory(1, "cpu")
    with torch.no_grad():
        base, _ = run_sequence(agent, obs, memory, starts)
        for k in range(3 * memory_stride + 3):
            changed = obs.clone()
            changed[15 - k] += 1.0
            logits, _ = run_sequence(agent, changed, memory, starts)
            assert bool((logits[15] - base[15]).abs().max() > 1e-6) == (k % memory_stride == 0 and k <= 3 * memory_stride), k


@pytest.mark.parametrize("memory_order", [0, 1, 8])
@pytest.mark.parametrize("memory_stride", [1, 3])
@pytest.mark.parametrize("long_memory", LONG_MEMORIES)
def test_nothing_crosses_an_episode_start(memory_order, memory_stride, long_memory):
    """Changing the observations of a finished episode changes nothing from the next episode's first step on,
    in the rollout (cached steps) and in training (one pass), while it does change the finished episode."""
    agent = random_agent(memory_order, num_blocks=2, memory_stride=memory_stride, long_memory=long_memory)
    obs = torch.randn(24, 2, 3)
    starts = torch.zeros(24, 2, dtype=torch.bool)
    starts[0] = True
    starts[10, 0] = starts[14, 1] = True  # env 0's second episode begins at step 10, env 1's at 14
    changed = obs.clone()
    changed[:10, 0] += torch.randn(10, 3)
    changed[:14, 1] += torch.randn(14, 3)
    memory = agent.initial_memory(2, "cpu")
    with torch.no_grad():
        for run in (lambda o: run_steps(agent, o, memory, starts)[:2], lambda o: run_sequence(agent, o, memory, starts)):
            (logits_a, values_a), (logits_b, values_b) = run(obs), run(changed)
            torch.testing.assert_close(logits_a[10:, 0], logits_b[10:, 0], rtol=0, atol=0)
            torch.testing.assert_close(values_a[14:, 1], values_b[14:, 1], rtol=0, atol=0)
            assert (values_a[:10, 0] - values_b[:10, 0]).abs().max() > 1e-4


@pytest.mark.parametrize("per_step", [False, True])
def test_decayed_sum_matches_a_plain_loop(per_step):
    """The parallel scan against the recurrence step by step: decays from 0.05 to 0.999 per channel (H,), or drawn
    per step (T, B, H) in [0, 1) as --long-memory gate's are; a carried e, episode starts anywhere (the first step's too),
    lengths around powers of two."""
    generator = torch.Generator().manual_seed(0)
    for length in (1, 2, 7, 64, 100):
        u, e0 = torch.randn(length, 3, 6, generator=generator), torch.randn(3, 6, generator=generator)
        decay = torch.rand(length, 3, 6, generator=generator) if per_step else torch.linspace(0.05, 0.999, 6)
        starts = torch.rand(length, 3, generator=generator) < 0.1
        starts[0, 1] = True
        expected, e = [], e0
        for t in range(length):
            e = torch.where(starts[t].unsqueeze(-1), 0.0, (decay[t] if per_step else decay) * e) + u[t]
            expected.append(e)
        torch.testing.assert_close(p.decayed_sum(u, e0, decay, starts), torch.stack(expected), rtol=0, atol=1e-5)


def test_recall_loss_matches_a_plain_loop():
    """--recall-lags's loss against a loop over every step, env and lag: the squared error of the lag-k prediction
    against the input k steps back, counted only where that step exists and no episode started after it; sequences
    shorter than the lags and an episode start at the first step included."""
    generator = torch.Generator().manual_seed(0)
    for length, lags in ((1, 3), (4, 6), (37, 5)):
        predicted, x = torch.randn(length, 3, lags, 4, generator=generator), torch.randn(length, 3, 4, generator=generator)
        starts = torch.rand(length, 3, generator=generator) < 0.15
        starts[0, 1] = True
        total, count = 0.0, 0
        for t in range(length):
            for b in range(3):
                for k in range(1, lags + 1):
                    if t - k >= 0 and not starts[t - k + 1 : t + 1, b].any():
                        total += ((predicted[t, b, k - 1] - x[t - k, b]) ** 2).sum().item()
                        count += 4
        expected = torch.tensor(total / max(count, 1), dtype=torch.float32)
        torch.testing.assert_close(p.recall_loss(predicted, x, starts), expected, rtol=1e-5, atol=1e-6)


def test_recall_loss_trains_the_memory_to_keep_past_inputs():
    """Trained on --recall-lags 3's loss alone over random inputs for 60 steps, taps 4 steps back predict the last
    three inputs far better than their mean does (the best prediction without memory: an error of about 1 per
    dimension); the memoryless network stays at that error."""
    losses = {}
    for memory_order in (4, 0):
        torch.manual_seed(0)
        args = p.Args(memory_order=memory_order, num_blocks=1, hidden_dim=64, prev_action=False, norm_obs=False)
        agent = p.Agent(4, 2, replace(args, recall_lags=3))
        optimizer = torch.optim.Adam(agent.parameters(), lr=1e-2)
        starts = torch.zeros(16, 8, dtype=torch.bool)
        starts[0] = True
        for _ in range(60):
            x = torch.randn(16, 8, 4)
            features = agent.get_states_sequence(x, agent.initial_memory(8, "cpu"), starts)
            loss = p.recall_loss(agent.recall(features).unflatten(-1, (3, -1)), x, starts)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        losses[memory_order] = loss.item()
    assert losses[4] < 0.4 and losses[0] > 0.8, losses


@pytest.mark.parametrize("memory_order", [0, 2])
@pytest.mark.parametrize("long_memory", ["decay", "gate"])
def test_decayed_memory_reaches_past_the_taps_until_the_episode_ends(memory_order, long_memory):
    """With a --long-memory and d non-zero, an observation at step 0 still changes the output 60 steps
    later, far past the taps' N*S = 2, in the rollout and in training; after an episode start it changes nothing."""
    agent = random_agent(memory_order, num_blocks=1, long_memory=long_memory)
    with torch.no_grad():  # the initial decays
        if long_memory == "decay":
            agent.blocks[0].decay_logits.copy_(torch.log(torch.logspace(math.log10(2), math.log10(200), 16) - 1))
        else:
            agent.blocks[0].gate.weight[:16] = 0.0
            agent.blocks[0].gate.bias[:16] = torch.log(torch.logspace(math.log10(2), math.log10(1000), 16) - 1)
    obs, changed = torch.randn(64, 1, 3), torch.randn(64, 1, 3)
    changed[1:] = obs[1:]  # only step 0 differs
    starts = torch.zeros(64, 1, dtype=torch.bool)
    starts[0] = True
    memory = agent.initial_memory(1, "cpu")
    with torch.no_grad():
        # values: the critic's head has unit scale (the actor's 0.01 would shrink the differences)
        for run in (lambda o, s: run_steps(agent, o, memory, s)[1], lambda o, s: run_sequence(agent, o, memory, s)[1]):
            assert (run(obs, starts)[60] - run(changed, starts)[60]).abs().max() > 1e-4
            restarted = starts.clone()
            restarted[30] = True
            torch.testing.assert_close(run(obs, restarted)[30:], run(changed, restarted)[30:], rtol=0, atol=0)


def test_memory_decay_starts_memoryless():
    """d starts at zero: at initialisation --long-memory decay gives the same outputs as the taps alone (the same seed gives
    the same weights), and its decays are log-uniform horizons 1/(1-lambda) from 2 to 200 steps."""
    obs, starts = torch.randn(12, 2, 3), torch.rand(12, 2) < 0.2
    starts[0] = True
    outputs = []
    for long_memory in ("none", "decay"):
        torch.manual_seed(3)
        agent = p.Agent(3, 2, p.Args(long_memory=long_memory, hidden_dim=16, prev_action=False, separate_critic=False))
        with torch.no_grad():
            outputs.append(run_steps(agent, obs, agent.initial_memory(2, "cpu"), starts)[:2])
    torch.testing.assert_close(outputs[1], outputs[0], rtol=0, atol=0)
    horizons = 1 / (1 - agent.blocks[0].decay()[0].detach().double())
    torch.testing.assert_close(horizons, torch.logspace(math.log10(2), math.log10(200), 16).double(), rtol=1e-4, atol=0)


def test_memory_gate_starts_memoryless_with_forget_horizons_from_2_to_1000_steps():
    """d starts at zero: given the taps-only agent's weights, --long-memory gate gives its outputs; W_f starts at zero, so the
    forget gate is the same at every step, with log-uniform horizons 1/(1-f) from 2 to 1000 steps."""
    obs, starts = torch.randn(12, 2, 3), torch.rand(12, 2) < 0.2
    starts[0] = True
    flags = dict(hidden_dim=16, prev_action=False, separate_critic=False)
    plain, gated = p.Agent(3, 2, p.Args(**flags)), p.Agent(3, 2, p.Args(long_memory="gate", **flags))
    missing, unexpected = gated.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and all(".gate" in name for name in missing), missing
    with torch.no_grad():
        outputs = [run_steps(agent, obs, agent.initial_memory(2, "cpu"), starts)[:2] for agent in (plain, gated)]
        forget, _ = gated.blocks[0].gates(torch.randn(5, 16))  # (5, H)
    torch.testing.assert_close(outputs[1], outputs[0], rtol=0, atol=0)
    horizons = 1 / (1 - forget.double())
    expected = torch.logspace(math.log10(2), math.log10(1000), 16).double().expand(5, 16)
    torch.testing.assert_close(horizons, expected, rtol=1e-3, atol=0)


@pytest.mark.parametrize("long_memory", ["decay", "gate"])
def test_long_memory_stays_finite_and_exact_over_1024_steps(long_memory):
    """One episode of 1,024 steps with the longest horizons the initialisation gives (the gate's forget biases of 2 to
    1000 steps, W_f zero, every write at its largest, i = 1): the memory and outputs stay finite, and the cached steps
    equal the one pass."""
    agent = random_agent(memory_order=2, num_blocks=2, long_memory=long_memory)
    with torch.no_grad():
        for block in agent.blocks:
            if long_memory == "gate":
                block.gate.weight[:32] = 0.0
                block.gate.bias[:16] = torch.log(torch.logspace(math.log10(2), math.log10(1000), 16) - 1)
                block.gate.bias[16:32] = 20.0  # i = sigmoid(20) = 1: every step writes all of v
        obs, starts = torch.randn(1024, 2, 3), torch.zeros(1024, 2, dtype=torch.bool)
        starts[0] = True
        step_logits, step_values, memories = run_steps(agent, obs, agent.initial_memory(2, "cpu"), starts)
        logits, values = run_sequence(agent, obs, agent.initial_memory(2, "cpu"), starts)
    assert all(torch.isfinite(x).all() for x in (step_logits, step_values, logits, values, memories[-1]))
    torch.testing.assert_close(logits, step_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(values, step_values, rtol=1e-4, atol=1e-4)


def test_running_norm_matches_sb3_running_mean_std():
    """Against SB3's RunningMeanStd (float64, the same 1e-4 prior count), and the normalised values against numpy."""
    from stable_baselines3.common.running_mean_std import RunningMeanStd

    rng = np.random.default_rng(0)
    norm, reference = p.RunningNorm(3), RunningMeanStd(epsilon=1e-4, shape=(3,))
    batches = [rng.normal(loc=[5.0, -2.0, 0.0], scale=[0.01, 3.0, 1.0], size=(n, 3)) for n in (1, 7, 64, 3)]
    for batch in batches:
        norm.update(torch.as_tensor(batch, dtype=torch.float32))
        reference.update(batch)
    np.testing.assert_allclose(norm.mean.numpy(), reference.mean, rtol=1e-5)
    np.testing.assert_allclose(norm.var.numpy(), reference.var, rtol=1e-3)
    x = np.concatenate(batches)[:5]
    expected = np.clip((x - reference.mean) / np.sqrt(reference.var + 1e-8), -10, 10)
    np.testing.assert_allclose(norm(torch.as_tensor(x, dtype=torch.float32)).numpy(), expected, rtol=1e-3, atol=1e-3)


def test_running_norm_given_statistics_by_load_state_dict_normalises_by_them():
    """The std a RunningNorm keeps beside its statistics follows them: one given another's by load_state_dict (a
    checkpoint resumed or evaluated) normalises as that one does, by sqrt(var + epsilon) of the loaded variance; and
    the module pickles (its load hook a function of the script's, not a lambda), as torch.save(agent) needs."""
    torch.manual_seed(0)
    trained, loaded = p.RunningNorm(3), p.RunningNorm(3)
    trained.update(torch.randn(50, 3) * torch.tensor([4.0, 0.1, 1.0]) + 2.0)
    loaded.load_state_dict(trained.state_dict())
    x = torch.randn(7, 3) * 3.0
    expected = torch.clamp((x - trained.mean) / torch.sqrt(trained.var + trained.epsilon), -10.0, 10.0)
    torch.testing.assert_close(trained(x), expected)
    torch.testing.assert_close(loaded(x), expected)
    torch.testing.assert_close(pickle.loads(pickle.dumps(loaded))(x), expected)


def test_reward_scale_divides_by_the_std_of_every_discounted_return_so_far():
    """--norm-reward against a plain loop: each env's discounted return, restarted after every episode end and
    carried from one rollout to the next; a rollout's rewards divided by the std of all those returns up to its end
    (the prior count of 1e-4 is negligible here), then clipped."""
    rng = np.random.default_rng(0)
    scale, returns, running, clipped = p.RewardScale(gamma=0.9, clip=0.5), [], np.zeros(3), 0
    for _ in range(3):  # rollouts of 5 steps in 3 envs
        rewards, dones = rng.normal(1.0, 2.0, size=(5, 3)).astype(np.float32), rng.random((5, 3)) < 0.3
        for t in range(5):
            for env in range(3):
                running[env] = running[env] * 0.9 + rewards[t, env]
                returns.append(running[env])
                running[env] = 0.0 if dones[t, env] else running[env]
        scaled = scale(rewards.copy(), dones)
        np.testing.assert_allclose(scaled, np.clip(rewards / np.std(returns), -0.5, 0.5), rtol=1e-4)
        assert scaled.dtype == np.float32
        clipped += (np.abs(scaled) == 0.5).sum()
    assert 0 < clipped < 45  # the clip was met, not everywhere


def test_a_checkpoint_from_before_norm_reward_loads_its_statistics_afresh():
    """An agent with --norm-reward takes a state dict without reward statistics (a checkpoint of an earlier
    version): the rest loads, the statistics keep their initial values; any other missing key is still refused."""
    args = p.Args()
    agent = p.Agent(4, 2, args)
    old = {k: v for k, v in p.Agent(4, 2, replace(args, norm_reward=False)).state_dict().items()}
    assert not any(k.startswith("reward_scale.") for k in old)
    agent.load_state_dict(old)
    assert torch.equal(agent.actor.weight, old["actor.weight"])
    assert agent.reward_scale.returns.count.item() == pytest.approx(1e-4)
    with pytest.raises(RuntimeError, match="actor.weight"):
        agent.load_state_dict({k: v for k, v in old.items() if k != "actor.weight"})


def test_checkpoint_carries_normalisation_and_evaluation_freezes_it(in_tmp, monkeypatch):
    args = p.Args(num_envs=4, num_steps=16, total_timesteps=4 * 16 * 2, num_minibatches=2, progress=False)
    args.save_model = True
    p.main(args)
    (path,) = glob.glob("runs/*/checkpoint.pt")
    checkpoint = torch.load(path, weights_only=True)
    # updated once per rollout from its raw observations: 2 rollouts x 4 envs x 16 steps, after a prior count of 1e-4
    assert float(checkpoint["model"]["obs_norm.count"]) == pytest.approx(1e-4 + 2 * 4 * 16)
    agent, _ = p.build_agent_from_checkpoint(checkpoint, torch.device("cpu"))
    for name in ("mean", "var", "count"):
        torch.testing.assert_close(getattr(agent.obs_norm, name), checkpoint["model"][f"obs_norm.{name}"], rtol=0, atol=0)

    def no_update(self, x):
        raise AssertionError("evaluation must not update the normalisation statistics")

    monkeypatch.setattr(p.RunningNorm, "update", no_update)
    loaded = p.load_checkpoint(path, "--eval-checkpoint")
    assert len(p.evaluate(loaded, episodes=2, deterministic=True, device=torch.device("cpu"), seed=0)) == 2


class RandomMemoryBlock(p.FSMNBlock):
    """An FSMN block whose memory weights (taps and d) start random, not at zero, so that a wrong memory shows."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        with torch.no_grad():
            self.taps.normal_(0.0, 0.5)
        randomize_long_memory(self)


@pytest.mark.parametrize(
    "prev_action, memory_order, memory_stride, long_memory",
    [
        (False, 4, 1, "none"),
        (True, 4, 1, "none"),
        (True, 4, 3, "none"),
        (True, 4, 3, "decay"),
        (True, 0, 1, "decay"),
        (True, 4, 3, "gate"),
        (True, 0, 1, "gate"),
    ],
)
def test_training_replays_the_rollout_exactly(in_tmp, monkeypatch, prev_action, memory_order, memory_stride, long_memory):
    """Training sees the observations (normalised by the same frozen statistics), the previous actions, the memory and
    the episode masks that the rollout saw: at a learning rate of 0, KL 0 in every minibatch."""
    monkeypatch.setattr(p, "FSMNBlock", RandomMemoryBlock)
    flags = dict(prev_action=prev_action, memory_order=memory_order, memory_stride=memory_stride)
    flags |= dict(long_memory=long_memory)
    assert_training_replays_the_rollout(p, monkeypatch, num_envs=4, num_steps=48, num_minibatches=2, **flags)


def test_logged_losses_are_the_last_minibatchs_their_means_and_the_loss_returned(in_tmp, monkeypatch):
    """losses/<name> is the iteration's last minibatch's (clipfrac: the mean), as CleanRL logs them, losses/mean/<name>
    the mean, and a term a forker adds to the loss after its stats were made is in losses/loss."""
    assert_logged_losses(p, monkeypatch, num_envs=4, num_steps=32, num_minibatches=2, recall_lags=2)


@pytest.mark.parametrize("context_steps, long_memory", [(5, "none"), (30, "gate"), (48, "decay")])
def test_training_with_context_replays_the_rollout_exactly(in_tmp, monkeypatch, context_steps, long_memory):
    """--context-steps: training recomputes the memory from that many steps before the rollout, from the memory
    saved then, over the previous rollout's own inputs and episode masks. At a learning rate of 0, without the
    observation statistics (which change between rollouts, so a recompute would differ), that recompute equals the
    memory the rollout carried: KL 0 in every minibatch, whatever the context's length (less than the taps' reach,
    more, all of the rollout). Autoencode's episodes (103 steps) run across rollouts of 48: a context off by one
    step, or started from the wrong memory, gives KL > 0."""
    monkeypatch.setattr(p, "FSMNBlock", RandomMemoryBlock)
    flags = dict(env_id="popgym-AutoencodeEasy-v0", memory_order=8, memory_stride=2, norm_obs=False)
    flags |= dict(context_steps=context_steps, long_memory=long_memory)
    assert_training_replays_the_rollout(p, monkeypatch, num_envs=4, num_steps=48, num_minibatches=2, **flags)


def test_observe_appends_the_previous_action_one_hot_except_at_episode_starts():
    agent = p.Agent(2, 3, p.Args(norm_obs=False))
    obs, prev_action, starts = torch.randn(4, 2), torch.tensor([0, 2, 1, 2]), torch.tensor([False, False, True, False])
    expected = torch.cat([obs, torch.tensor([[1.0, 0, 0], [0, 0, 1], [0, 0, 0], [0, 0, 1]])], dim=-1)
    torch.testing.assert_close(agent.observe(obs, prev_action, starts), expected, rtol=0, atol=0)
    assert agent.embed.in_features == 5
    torch.testing.assert_close(p.Agent(2, 3, p.Args(prev_action=False, norm_obs=False)).observe(obs, prev_action, starts), obs)


@pytest.mark.parametrize(
    "flags, compiled",
    [
        (dict(), False),
        (dict(long_memory="decay", memory_stride=2), False),
        (dict(long_memory="gate", separate_critic=False), False),
        (dict(prev_action=False, norm_obs=False), False),
        (dict(), True),
    ],
)
def test_the_rollout_step_bound_once_equals_observe_and_get_action_and_value_after_updates_in_place(flags, compiled):
    """The rollout's step, bound once as main binds it, gives exactly what `observe` and `get_action_and_value`
    give with the same Gumbel noise: at first, and after the updates a run makes in place (Adam steps, --norm-obs's
    statistics with --norm-obs-preserving, a checkpoint's load_state_dict), which reach it without binding it again;
    compiled once (--compile), the same up to rounding."""
    torch.manual_seed(0)
    args = p.Args(hidden_dim=16, memory_order=3, **flags)
    agent, other = p.Agent(3, 4, args), p.Agent(3, 4, args)
    rollout_step = agent.bound_rollout_step()
    rollout_step = torch.compile(rollout_step) if compiled else rollout_step

    def assert_equal_to_the_modules():
        obs, prev_action, starts = torch.randn(5, 3) * 3, torch.randint(0, 4, (5,)), torch.tensor([1, 0, 0, 1, 0]).bool()
        memory = torch.randn_like(agent.initial_memory(5, "cpu"))
        with torch.inference_mode():
            torch.manual_seed(1)
            bound = rollout_step(obs, prev_action, starts, memory, p.gumbel_noise((5, 4), "cpu"))
            torch.manual_seed(1)  # the same noise, drawn by get_action_and_value's sample
            x = agent.observe(obs, prev_action, starts)
            action, logprob, _, value, next_memory = agent.get_action_and_value(x, memory, starts)
        for got, expected in zip(bound, (action, logprob, value, next_memory), strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-5 if compiled else 0, atol=1e-5 if compiled else 0)

    assert_equal_to_the_modules()
    optimizer = torch.optim.Adam(agent.parameters(), lr=0.05)
    for _ in range(3):
        starts, actions = torch.rand(6, 5) < 0.2, torch.randint(0, 4, (6, 5))
        x = agent.observe(torch.randn(6, 5, 3), actions, starts)
        _, logprob, entropy, value, _ = agent.get_action_and_value_sequence(x, agent.initial_memory(5, "cpu"), starts, actions)
        optimizer.zero_grad()
        (logprob.mean() + value.square().mean() - 0.1 * entropy.mean()).backward()
        optimizer.step()
    if args.norm_obs:
        agent.update_obs_norm(torch.randn(64, 3) * 5.0 + 1.0)
    assert_equal_to_the_modules()
    agent.load_state_dict(other.state_dict())
    assert_equal_to_the_modules()


def test_compiled_network_equals_eager_and_training_replays_the_rollout(in_tmp, monkeypatch):
    """--compile: the compiled step and one-pass sequence equal the eager ones (1e-5) on random memory taps, episode
    starts and a memory carried from an earlier rollout; and a compiled run replays its rollout (KL 0 at a learning
    rate of 0), so the compiled step and the compiled sequence agree with each other."""
    agent = random_agent(memory_order=4, num_blocks=2)
    obs, starts, memory = torch.randn(12, 3, 3), torch.rand(12, 3) < 0.2, torch.randn(2, 3, 4, 16)
    compiled_agent = SimpleNamespace(
        get_states=torch.compile(agent.get_states),
        get_states_sequence=torch.compile(agent.get_states_sequence),
        actor=agent.actor,
        critic=agent.critic,
    )
    with torch.no_grad():
        eager = [*run_steps(agent, obs, memory, starts)[:2], *run_sequence(agent, obs, memory, starts)]
        compiled = [*run_steps(compiled_agent, obs, memory, starts)[:2], *run_sequence(compiled_agent, obs, memory, starts)]
    for eager_output, compiled_output in zip(eager, compiled, strict=True):
        torch.testing.assert_close(compiled_output, eager_output, atol=1e-5, rtol=1e-5)
    assert_training_replays_the_rollout(p, monkeypatch, num_envs=4, num_steps=48, num_minibatches=2, compile=True)


def test_step_and_sequence_give_the_same_log_probabilities_and_entropies():
    """The rollout's get_action_and_value (a Gumbel-max sample and its log-probability, no entropy), the same call given
    those actions, and the loss's get_action_and_value_sequence score the actions alike, and agree with softmax
    probabilities computed by hand."""
    agent = random_agent(memory_order=3, num_blocks=2)
    obs, starts = torch.randn(9, 4, 3), torch.rand(9, 4) < 0.2
    starts[0] = True
    with torch.no_grad():
        memory, sampled = agent.initial_memory(4, "cpu"), []
        for t in range(9):
            action, logprob, entropy, value, memory = agent.get_action_and_value(obs[t], memory, starts[t])
            assert entropy is None
            sampled.append((action, logprob, value))
        actions, logprobs, values = (torch.stack(x) for x in zip(*sampled))
        memory, given = agent.initial_memory(4, "cpu"), []
        for t in range(9):
            *scored, memory = agent.get_action_and_value(obs[t], memory, starts[t], actions[t])
            given.append(scored[1:])
        given_logprobs, given_entropies, given_values = (torch.stack(x) for x in zip(*given))
        _, seq_logprob, seq_entropy, seq_value, _ = agent.get_action_and_value_sequence(
            obs, agent.initial_memory(4, "cpu"), starts, actions
        )
        probs = torch.softmax(run_sequence(agent, obs, agent.initial_memory(4, "cpu"), starts)[0], dim=-1)
    for got in (given_logprobs, seq_logprob):
        torch.testing.assert_close(got, logprobs, rtol=0, atol=1e-5)
    for got in (given_values, seq_value):
        torch.testing.assert_close(got, values, rtol=0, atol=1e-5)
    torch.testing.assert_close(seq_entropy, given_entropies, rtol=0, atol=1e-5)
    torch.testing.assert_close(seq_logprob, probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1).log(), rtol=0, atol=1e-5)
    torch.testing.assert_close(seq_entropy, -(probs * probs.log()).sum(-1), rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------------
# GAE and episode boundaries


def test_vector_env_same_step_autoreset():
    """The contract the rollout relies on: with SAME_STEP, a done step returns the next episode's first
    observation and keeps the finished one's last observation in info['final_obs']."""
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1", max_episode_steps=5)] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    obs, _ = envs.reset(seed=0)
    last = obs
    for _ in range(5):
        obs, _, terminated, truncated, infos = envs.step(np.zeros(2, dtype=np.int64))
        if not (terminated | truncated).any():
            last = obs
    assert truncated.all() and not terminated.any()
    final_obs = np.stack(infos["final_obs"])
    assert np.all(np.abs(obs) <= 0.05)  # CartPole resets uniformly in [-0.05, 0.05]
    assert not np.allclose(final_obs, obs) and not np.allclose(final_obs, last)
    envs.close()


def episode_ends_of_run(monkeypatch, args) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run `main` and return the terminations, truncations and final values that its rollouts gave GAE, (T, B) each."""
    seen = []
    original = p.compute_gae

    def spy(rewards, values, terminations, truncations, final_values, next_value, gamma, gae_lambda):
        seen.append([x.clone() for x in (terminations, truncations, final_values)])
        return original(rewards, values, terminations, truncations, final_values, next_value, gamma, gae_lambda)

    monkeypatch.setattr(p, "compute_gae", spy)
    p.main(args)
    return tuple(torch.cat(x) for x in zip(*seen))


def test_rollout_bootstraps_truncations_only(in_tmp, monkeypatch):
    """Inside the script's own loop: final values are filled exactly at truncated steps, each the critic's value
    of that episode's final observation with that episode's memory, and episode starts follow the dones."""
    gym.register("CartPoleShort-v1", entry_point="gymnasium.envs.classic_control:CartPoleEnv", max_episode_steps=12)
    args = p.Args(env_id="CartPoleShort-v1", num_envs=4, num_steps=40, total_timesteps=320, num_minibatches=2, progress=False)
    terminations, truncations, final_values = episode_ends_of_run(monkeypatch, args)
    assert truncations.any() and terminations.any()
    assert (final_values[~truncations] == 0).all()
    assert (final_values[truncations & ~terminations] != 0).all()


# ---------------------------------------------------------------------------------------------------------------------
# Determinism and a non-finite loss


def test_same_seed_same_losses(in_tmp):
    assert_same_seed_same_losses(p, num_envs=4, num_steps=32, num_minibatches=2)


def test_rng_states_restore_every_generator_exactly():
    import random

    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    np.random.normal()  # leaves a cached Gaussian in numpy's state
    states = p.rng_states()
    draws = (random.random(), np.random.normal(size=3).tolist(), np.random.rand(), torch.rand(3).tolist())
    p.set_rng_states(states)
    assert (random.random(), np.random.normal(size=3).tolist(), np.random.rand(), torch.rand(3).tolist()) == draws


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(in_tmp, monkeypatch):
    assert_non_finite_loss_stops_and_keeps_last_good_checkpoint(p, monkeypatch, num_envs=4, num_steps=16, num_minibatches=2)


# ---------------------------------------------------------------------------------------------------------------------
# The CLI: smoke run, checkpoint, resume, evaluation, tracking, Ctrl-C, bad input


@pytest.mark.smoke
def test_cli_smoke_checkpoint_resume_and_evaluation(tmp_path):
    cwd = str(tmp_path)
    script = copy_alone(SCRIPT, cwd)  # alone in an empty folder: it needs no other file of the project
    result = run_script(script, *TINY, "--total-timesteps", "512", "--save-model", "--save-interval", "2", cwd=cwd)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(cwd)
    scalars = read_scalars(run_dir)
    assert ITERATION_TAGS <= set(scalars), set(scalars)
    assert EPISODE_TAGS <= set(scalars), set(scalars)
    assert [step for step, _ in scalars["charts/SPS"]] == [128, 256, 384, 512]

    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    assert checkpoint["script"] == "ppo_fsmn_cartpole"
    assert (checkpoint["iteration"], checkpoint["global_step"]) == (4, 512)
    assert {"args", "model", "optimizer", "rng_states", "run_name"} <= set(checkpoint)
    assert not glob.glob(os.path.join(run_dir, "*.tmp"))

    # resume: the same run directory goes on from step 512 to 1024
    result = run_script(script, *TINY, "--total-timesteps", "1024", "--save-model", "--resume", checkpoint_path, cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert run_dirs(cwd) == [run_dir]
    steps = [step for step, _ in read_scalars(run_dir)["charts/SPS"]]
    assert steps == [128, 256, 384, 512, 640, 768, 896, 1024]
    assert torch.load(checkpoint_path, weights_only=True)["global_step"] == 1024

    # nothing left to do is refused, not silently accepted
    result = run_script(script, *TINY, "--total-timesteps", "512", "--resume", checkpoint_path, cwd=cwd)
    assert_one_line_error(result, "--total-timesteps=512", "1024")

    # evaluation: N whole episodes with the saved policy, mean and std printed
    result = run_script(script, "--eval-checkpoint", checkpoint_path, "--eval-episodes", "3", cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert "eval: 3 episodes, mean return" in result.stdout


@pytest.mark.smoke
def test_the_end_of_training_plays_the_saved_policy_as_eval_checkpoint_does(tmp_path):
    """--final-eval-episodes: the run's last policy played greedily, its mean printed right before the summary line
    (whose training mean samples) and logged as charts/eval_return; the same returns as --eval-checkpoint gives the
    checkpoint written at that step. 0 plays nothing."""
    cwd = str(tmp_path)
    result = run_script(SCRIPT, *TINY, "--total-timesteps", "256", "--save-model", "--final-eval-episodes", "3", cwd=cwd)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith("eval (most likely action): 3 episodes, mean return")]
    assert lines[at + 1].startswith("step 256: mean return")
    (run_dir,) = run_dirs(cwd)
    (logged,) = read_scalars(run_dir)["charts/eval_return"]
    replayed = run_script(SCRIPT, "--eval-checkpoint", os.path.join(run_dir, "checkpoint.pt"), "--eval-episodes", "3", cwd=cwd)
    assert replayed.returncode == 0, replayed.stderr
    returns = [float(line.split()[-1]) for line in replayed.stdout.splitlines() if line.startswith("episode ")]
    assert len(returns) == 3 and logged[0] == 256 and logged[1] == pytest.approx(np.mean(returns))
    assert lines[at].split(": ", 1)[1] in replayed.stdout  # "3 episodes, mean return M +/- S", to the digit

    result = run_script(SCRIPT, *TINY, "--total-timesteps", "128", "--final-eval-episodes", "0", cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert "eval" not in result.stdout
    assert "charts/eval_return" not in read_scalars(run_dirs(cwd)[-1])


def test_a_stop_signal_during_the_end_of_training_evaluation_ends_the_run_as_stopped(in_tmp, monkeypatch, capsys):
    """Ctrl-C while the last policy plays: the run exits 130 once the episodes end, with the logs and the last
    checkpoint kept and no eval line (the signal is sent from inside the evaluation: no clock involved)."""
    played = []

    def interrupted_evaluation(*args, **kwargs):
        played.append(kwargs["quiet"])
        os.kill(os.getpid(), signal.SIGINT)  # the run's handler notes it, as it does a Ctrl-C
        return [500.0]

    monkeypatch.setattr(p, "evaluate", interrupted_evaluation)
    args = p.Args(num_envs=4, num_steps=32, num_minibatches=2, update_epochs=1, total_timesteps=256, progress=False)
    args.save_model = True
    with pytest.raises(SystemExit) as stopped:
        p.main(args)
    assert stopped.value.code == 130 and played == [True]
    out = capsys.readouterr().out
    assert "eval (" not in out and "interrupted during iteration" in out
    assert torch.load(glob.glob("runs/*/checkpoint.pt")[0], weights_only=True)["global_step"] == 256


@pytest.mark.smoke
def test_track_and_capture_video_put_the_videos_in_the_wandb_run(tmp_path):
    flags = [*TINY, "--total-timesteps", "256", "--track", "--capture-video"]
    result = run_script(SCRIPT, *flags, cwd=str(tmp_path), env={**WANDB_OFFLINE, **NO_DISPLAY})
    assert result.returncode == 0, result.stderr
    assert "XDG_RUNTIME_DIR" not in result.stderr  # SDL's complaint without a display: pygame renders off-screen
    assert_videos_reached_the_wandb_run(str(tmp_path))


@pytest.mark.smoke
def test_ctrl_c_keeps_logs_and_a_checkpoint(tmp_path):
    assert_ctrl_c_keeps_logs_and_a_checkpoint(SCRIPT, TINY, str(tmp_path))


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "NoSuchEnv-v0"], ["--env-id=NoSuchEnv-v0", "pprint_registry"]),
        (["--env-id", "Pendulum-v1"], ["--env-id=Pendulum-v1", "Discrete"]),
        (["--env-id", "popgym-NoSuchTaskEasy-v0"], ["--env-id=popgym-NoSuchTaskEasy-v0", "not a POPGym id"]),
        (["--env-id", PENDULUM], [f"--env-id={PENDULUM}", "Box(-2.0, 2.0, (1,), float32) actions", "ppo_continuous.py"]),
        pytest.param(
            ["--env-id", "popgym-LabyrinthEscapeEasy-v0"],
            ["--env-id=popgym-LabyrinthEscapeEasy-v0", "mazelib"],
            marks=pytest.mark.skipif(popgym.envs.has_mazelib(), reason="mazelib is installed: popgym registers its mazes"),
        ),
        (["--env-id", "popgym-RepeatPreviousEasy-v0", "--capture-video"], ["--capture-video", "draws none"]),
        (["--num-minibatches", "3"], ["--num-minibatches=3", "--num-envs=8"]),
        (["--env-id", "Acrobot-v1", "--mask-velocity"], ["--mask-velocity", "CartPole"]),
        (["--resume", "missing.pt"], ["--resume=missing.pt"]),
        (["--save-interval", "0"], ["--save-interval=0"]),
        (["--recall-lags", "-1"], ["--recall-lags=-1", "at least 0"]),
        (["--long-memory", "lstm"], ["--long-memory=lstm", "one of none, decay, gate"]),
        (["--long_memory=gates"], ["--long-memory=gates", "one of none, decay, gate"]),
        (
            ["--num-envs", "2", "--num-minibatches", "2", "--num-steps", "1", "--norm-adv"],
            ["--num-minibatches=2", "--norm-adv"],
        ),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, flags, fragments):
    assert_one_line_error(run_script(SCRIPT, *flags, cwd=str(tmp_path)), *fragments)
    assert os.listdir(tmp_path) == []  # refused before anything is written: no runs/, no videos/


# ---------------------------------------------------------------------------------------------------------------------
# POPGym tasks: one-hot observations, grid actions, episodes that end inside the env, the CLI


def one_hot(space: gym.Space, value) -> np.ndarray:
    """The concatenated one-hot of a Discrete, MultiDiscrete or Tuple observation, written out here."""
    if isinstance(space, gym.spaces.Discrete):
        return np.eye(space.n)[int(value) - space.start]
    if isinstance(space, gym.spaces.MultiDiscrete):
        return np.concatenate([np.eye(n)[v] for n, v in zip(space.nvec, value)])
    assert isinstance(space, gym.spaces.Tuple), space
    return np.concatenate([one_hot(part, v) for part, v in zip(space.spaces, value)])


@pytest.mark.parametrize(
    "env_id, raw_space",
    [
        ("popgym-RepeatPreviousEasy-v0", gym.spaces.Discrete(4)),
        ("popgym-CountRecallEasy-v0", gym.spaces.MultiDiscrete([2, 2])),
        ("popgym-AutoencodeEasy-v0", gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Discrete(4)])),
    ],
)
def test_popgym_observations_reach_the_network_as_their_one_hot_in_float32(env_id, raw_space):
    """Step the script's env and the raw POPGym env side by side, seeded alike: every observation of the script's env is
    the one-hot of the raw one, float32, in a flat Box."""
    env, raw = p.make_env(env_id, 0, False, "", False)(), gym.make(env_id)
    assert raw.observation_space == raw_space
    obs, _ = env.reset(seed=0)
    raw_obs, _ = raw.reset(seed=0)
    assert env.observation_space == gym.spaces.Box(0.0, 1.0, one_hot(raw_space, raw_obs).shape, np.float32)
    seen = set()
    for step in range(40):
        assert obs.dtype == np.float32
        np.testing.assert_array_equal(obs, one_hot(raw_space, raw_obs))
        seen.add(obs.tobytes())
        obs, *_ = env.step(step % env.action_space.n)
        raw_obs, *_ = raw.step(step % env.action_space.n)
    assert len(seen) > 1  # the observations changed: the comparison is not of one constant


@pytest.mark.parametrize("env_id", ["CartPole-v1", "popgym-PositionOnlyCartPoleEasy-v0"])
def test_flat_box_observations_are_not_wrapped(env_id):
    env = p.make_env(env_id, 0, False, "", False)()
    added = (gym.wrappers.FlattenObservation, gym.wrappers.DtypeObservation, popgym.wrappers.DiscreteAction)
    assert not isinstance(env, added)  # they would be the outermost wrappers
    assert env.observation_space == gym.make(env_id).observation_space


def test_popgym_grid_actions_become_one_discrete_action_row_by_row():
    """Battleship's MultiDiscrete([8, 8]) shots become Discrete(64): action 8 r + c fires at row r, column c of the raw
    env, seeded alike (the same observations and rewards, hits and misses both)."""
    env_id = "popgym-BattleshipEasy-v0"
    env, raw = p.make_env(env_id, 0, False, "", False)(), gym.make(env_id)
    rows, cols = raw.action_space.nvec
    assert env.action_space == gym.spaces.Discrete(rows * cols)
    env.reset(seed=0)
    raw.reset(seed=0)
    rewards, rng = set(), np.random.default_rng(0)
    for _ in range(40):
        row, col = rng.integers(rows), rng.integers(cols)
        obs, reward, *_ = env.step(row * cols + col)
        raw_obs, raw_reward, *_ = raw.step(np.array([row, col]))
        np.testing.assert_array_equal(obs, one_hot(raw.observation_space, raw_obs))
        assert reward == raw_reward
        rewards.add(reward)
    assert len(rewards) > 1


@pytest.mark.parametrize(
    "env_id, ending", [("popgym-RepeatPreviousEasy-v0", "terminated"), ("popgym-BattleshipEasy-v0", "truncated")]
)
def test_popgym_episodes_end_inside_the_env_and_only_truncations_bootstrap(in_tmp, monkeypatch, env_id, ending):
    """POPGym has no TimeLimit: RepeatPrevious terminates its episodes (the deck runs out after 51 steps), Battleship
    truncates them (64 shots). In the script's loop a terminated step gets no final value, a truncated one its own."""
    args = p.Args(env_id=env_id, num_envs=2, num_steps=70, total_timesteps=140, num_minibatches=2, progress=False)
    terminations, truncations, final_values = episode_ends_of_run(monkeypatch, args)
    assert (terminations if ending == "terminated" else truncations).any()
    assert not (truncations if ending == "terminated" else terminations).any()
    assert (final_values[~truncations] == 0).all()
    assert (final_values[truncations] != 0).all()


def test_an_observation_gymnasium_cannot_flatten_is_one_line():
    class SequenceObservations(gym.Env):  # a variable-length observation: no fixed-size vector holds it
        observation_space, action_space = gym.spaces.Sequence(gym.spaces.Discrete(2)), gym.spaces.Discrete(2)

    gym.register("SequenceObservations-v0", entry_point=SequenceObservations)
    with pytest.raises(
        SystemExit, match=r"^error: --env-id=SequenceObservations-v0 has Sequence\(.*\) observations; [^\n]*flatten"
    ):
        p.check_env_args("SequenceObservations-v0", mask_velocity=False)


@pytest.mark.smoke
@pytest.mark.parametrize(
    "env_id, memory",
    [
        ("popgym-RepeatPreviousEasy-v0", ""),
        ("popgym-CountRecallEasy-v0", ""),
        ("popgym-CountRecallEasy-v0", "--long-memory gate"),
        ("popgym-AutoencodeEasy-v0", "--memory-gate --context-steps 40 --recall-lags 4"),
        ("popgym-BattleshipEasy-v0", ""),
    ],
)
def test_cli_smoke_on_popgym_tasks_logs_checkpoints_and_evaluates(tmp_path, env_id, memory):
    """Discrete, MultiDiscrete and Tuple observations, Battleship's grid actions: 128 steps per env end an episode in
    each (Autoencode's takes 103). CountRecall with --long-memory gate too, Autoencode with its older spelling
    --memory-gate: their checkpoints evaluate with the gated memory."""
    cwd = str(tmp_path)
    flags = ["--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "1", "--no-progress"]
    flags += memory.split()
    result = run_script(SCRIPT, *flags, "--env-id", env_id, "--total-timesteps", "256", "--save-model", cwd=cwd)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(cwd)
    assert ITERATION_TAGS | EPISODE_TAGS <= set(read_scalars(run_dir))
    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
    assert torch.load(checkpoint_path, weights_only=True)["global_step"] == 256
    result = run_script(SCRIPT, "--eval-checkpoint", checkpoint_path, "--eval-episodes", "1", cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert "eval: 1 episodes, mean return" in result.stdout


@pytest.mark.smoke
@pytest.mark.parametrize("long_memory", ["decay", "gate"])
def test_a_checkpoint_with_the_older_memory_flags_resumes_and_evaluates(tmp_path, long_memory):
    """Checkpoints written before --long-memory hold its older spellings, memory_decay or memory_gate, as booleans:
    they evaluate and resume with that memory."""
    cwd = str(tmp_path)
    flags = [*TINY, "--long-memory", long_memory, "--save-model"]
    result = run_script(SCRIPT, *flags, "--total-timesteps", "128", cwd=cwd)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(cwd)
    path = os.path.join(run_dir, "checkpoint.pt")
    checkpoint = torch.load(path, weights_only=True)
    del checkpoint["args"]["long_memory"]
    checkpoint["args"] |= dict(memory_decay=long_memory == "decay", memory_gate=long_memory == "gate")
    torch.save(checkpoint, path)
    result = run_script(SCRIPT, "--eval-checkpoint", path, "--eval-episodes", "1", cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert "eval: 1 episodes, mean return" in result.stdout
    result = run_script(SCRIPT, "--total-timesteps", "256", "--resume", path, cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert "--memory-" not in result.stdout and "--long-memory" not in result.stdout  # no memory flag differs
    resumed = torch.load(path, weights_only=True)
    assert (resumed["global_step"], resumed["args"]["long_memory"]) == (256, long_memory)


# ---------------------------------------------------------------------------------------------------------------------
# Envs that a package registers on import (--env-id package:Env-v0); observation parts gymnasium cannot flatten

# A package of its own, as third-party gymnasium envs ship: importing it registers its env
TINY_PACKAGE = """
import gymnasium as gym
import numpy as np


class TinyMemory(gym.Env):
    \"\"\"One of two cues at the first step, blanks after; the fourth and last step pays 1 for naming the cue.\"\"\"

    observation_space, action_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32), gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.cue, self.t = int(self.np_random.integers(2)), 0
        return np.eye(2, dtype=np.float32)[self.cue], {}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), float(self.t == 4 and action == self.cue), self.t == 4, False, {}


gym.register("TinyMemory-v0", entry_point="tinypkg:TinyMemory")
"""


@pytest.mark.smoke
def test_an_env_that_a_package_registers_on_import_trains_saves_and_evaluates(tmp_path):
    """--env-id tinypkg:TinyMemory-v0, with tinypkg on sys.path beside a copy of the script (a researcher's project)
    and imported by nothing else: two iterations, the run folder named after the id (its colon included), a
    checkpoint that evaluates in a process of its own."""
    cwd = str(tmp_path)
    script = copy_alone(SCRIPT, cwd)
    (tmp_path / "tinypkg").mkdir()
    (tmp_path / "tinypkg" / "__init__.py").write_text(TINY_PACKAGE)
    flags = ["--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1", "--no-progress"]
    flags += ["--env-id", "tinypkg:TinyMemory-v0", "--total-timesteps", "64", "--threads", "1", "--save-model"]
    result = run_script(script, *flags, cwd=cwd)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(cwd)
    assert os.path.basename(run_dir).startswith("tinypkg:TinyMemory-v0__ppo_fsmn_cartpole__1__")
    assert ITERATION_TAGS | EPISODE_TAGS <= set(read_scalars(run_dir))
    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    assert (checkpoint["global_step"], checkpoint["args"]["env_id"]) == (64, "tinypkg:TinyMemory-v0")
    result = run_script(script, "--eval-checkpoint", checkpoint_path, "--eval-episodes", "2", cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert "eval: 2 episodes, mean return" in result.stdout


@pytest.mark.parametrize(
    "env_id, fragments",
    [
        ("nosuchpackage:TinyMemory-v0", ["cannot import nosuchpackage (ModuleNotFoundError", "package:Env-v0"]),
        ("json:TinyMemory-v0", ["not an id that importing json registers", "pprint_registry"]),
        ("TinyMemory-v0", ["not a registered gymnasium id", "package:TinyMemory-v0"]),
    ],
)
def test_a_package_that_cannot_be_imported_or_registers_no_such_id_is_one_line(tmp_path, env_id, fragments):
    assert_one_line_error(run_script(SCRIPT, "--env-id", env_id, cwd=str(tmp_path)), f"--env-id={env_id}", *fragments)
    assert os.listdir(tmp_path) == []  # refused before anything is written


def test_a_package_that_fails_in_its_own_code_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "brokenpkg.py").write_text("raise RuntimeError('needs a display\\nand more')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    refused = r"^error: --env-id=brokenpkg:X-v0: cannot import brokenpkg \(RuntimeError: needs a display\); it takes [^\n]*$"
    with pytest.raises(SystemExit, match=refused):
        p.check_env_args("brokenpkg:X-v0", mask_velocity=False)


class MissionSpace(gym.spaces.Space):
    """A mission string, as MiniGrid's: a plain Space[str], which does not say whether gymnasium can flatten it."""

    def __init__(self):
        super().__init__(dtype=str)

    def sample(self, mask=None, probability=None):
        return "get the ball"

    def contains(self, x):
        return isinstance(x, str)

    def __repr__(self):
        return "MissionSpace()"


class PartsEnv(gym.Env):
    """Random observations of the space it is given, episodes of 5 steps."""

    def __init__(self, observation_space):
        self.observation_space, self.action_space = observation_space, gym.spaces.Discrete(3)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), float(action == 0), self.t == 5, False, {}


def register_parts_env(env_id: str, observation_space: gym.spaces.Space) -> None:
    gym.register(env_id, entry_point=PartsEnv, kwargs=dict(observation_space=observation_space))


def test_a_dict_observation_trains_on_its_parts_gymnasium_can_flatten(in_tmp, capsys):
    """A gridworld's observation, an image, a direction and a mission string: the mission is left out, with one line
    that names it, and the network's input is the flattened image and direction."""
    kept = dict(image=gym.spaces.Box(0, 10, (3, 3, 2), np.uint8), direction=gym.spaces.Discrete(4))
    register_parts_env("MissionGrid-v0", gym.spaces.Dict(kept, mission=MissionSpace()))
    args = p.Args(env_id="MissionGrid-v0", num_envs=2, num_steps=8, total_timesteps=16, num_minibatches=2, progress=False)
    args.save_model, args.update_epochs = True, 1
    p.main(args)
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    gone = "observation part 'mission' (MissionSpace()) left out: gymnasium cannot flatten it"
    assert notes == [f"note: --env-id=MissionGrid-v0: {gone}"]
    model = torch.load(glob.glob("runs/*/checkpoint.pt")[0], weights_only=True)["model"]
    obs_dim = gym.spaces.flatdim(gym.spaces.Dict(kept))  # 18 + 4
    assert model["obs_norm.mean"].shape == (obs_dim,)
    assert model["embed.weight"].shape[1] == obs_dim + 3  # and the previous action, one-hot

    # the network's input is gymnasium's flattening of those parts, the mission aside
    env, raw = p.make_env("MissionGrid-v0", 0, False, "", False)(), gym.make("MissionGrid-v0")
    obs, _ = env.reset(seed=0)
    raw_obs, _ = raw.reset(seed=0)
    expected = gym.spaces.flatten(gym.spaces.Dict(kept), {key: raw_obs[key] for key in kept}).astype(np.float32)
    np.testing.assert_array_equal(obs, expected)


def test_a_tuple_observation_loses_only_its_parts_gymnasium_cannot_flatten(capsys):
    """A Tuple's parts by index; a Text part stays (gymnasium flattens it to its character codes), a Sequence
    goes; a Dict with no part gymnasium can flatten is refused in one line."""
    parts = [gym.spaces.Discrete(3), gym.spaces.Sequence(gym.spaces.Discrete(2)), gym.spaces.Text(4)]
    register_parts_env("PartsTuple-v0", gym.spaces.Tuple(parts))
    p.check_env_args("PartsTuple-v0", mask_velocity=False)
    gone = f"observation part 1 ({parts[1]}) left out: gymnasium cannot flatten it"
    assert capsys.readouterr().out == f"note: --env-id=PartsTuple-v0: {gone}\n"
    env = p.make_env("PartsTuple-v0", 0, False, "", False)()
    assert env.observation_space.shape == (gym.spaces.flatdim(gym.spaces.Tuple([parts[0], parts[2]])),)  # 3 + 4
    assert env.reset(seed=0)[0].shape == env.observation_space.shape

    register_parts_env("OnlyMission-v0", gym.spaces.Dict(mission=MissionSpace()))
    with pytest.raises(SystemExit, match=r"^error: --env-id=OnlyMission-v0 has Dict\(.*\) observations; .*such a part$"):
        p.check_env_args("OnlyMission-v0", mask_velocity=False)


# ---------------------------------------------------------------------------------------------------------------------
# Learning


@pytest.mark.learning
def test_default_settings_solve_cartpole_within_150k_steps(tmp_path):
    """Default flags, seed 1, one thread (the free cores would make the run depend on the machine's load): the mean
    return of the last 20 episodes reaches 475 within 150k steps."""
    flags = ["--seed", "1", "--total-timesteps", "150000", "--no-progress", "--threads", "1"]
    returns = run_until_reached(SCRIPT, *flags, cwd=str(tmp_path), threshold=475.0)
    reached = first_step_reaching(returns, 475.0)
    assert reached is not None and reached <= 150_000, (
        f"best mean of 20: {max(np.convolve([r for _, r in returns], np.ones(20) / 20, 'valid'))}"
    )
