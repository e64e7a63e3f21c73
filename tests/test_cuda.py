"""The CUDA path of every script: skipped on machines without a GPU (CI has none); run where one is lent."""

import copy
import dataclasses
import glob
from functools import partial

import pytest
import torch
from conftest import import_script, read_scalars, run_dirs, run_script

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
p = import_script("ppo_fsmn_cartpole")
transformer = import_script("ppo_transformer_pong")
atari = import_script("ppo_atari")


def test_fsmn_cached_steps_equal_one_pass_on_cuda():
    torch.manual_seed(0)
    agent = p.Agent(2, 2, p.Args(memory_order=8, num_blocks=2, prev_action=False)).cuda()  # fed observations directly
    with torch.no_grad():
        for block in agent.blocks:
            block.taps.normal_(0.0, 0.5)
        obs = torch.randn(40, 6, 2, device="cuda")
        starts = torch.rand(40, 6, device="cuda") < 0.1
        starts[0] = True
        memory, logits, values = agent.initial_memory(6, torch.device("cuda")), [], []
        for t in range(40):
            hidden, memory = agent.get_states(obs[t], memory, starts[t])
            logits.append(agent.actor(hidden)), values.append(agent.critic(hidden).squeeze(-1))
        hidden = agent.get_states_sequence(obs, agent.initial_memory(6, torch.device("cuda")), starts)
        seq_logits, seq_values = agent.actor(hidden), agent.critic(hidden).squeeze(-1)
    torch.testing.assert_close(seq_logits, torch.stack(logits), rtol=0, atol=1e-5)
    torch.testing.assert_close(seq_values, torch.stack(values), rtol=0, atol=1e-5)


def test_fsmn_trains_on_cuda_and_checkpoints_load_on_cpu(in_tmp, monkeypatch):
    devices = []
    original = p.Agent.to

    def spy(self, *args, **kwargs):
        devices.append(torch.device(args[0]) if args else kwargs.get("device"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(p.Agent, "to", spy)
    args = p.Args(num_envs=4, num_steps=32, total_timesteps=4 * 32 * 4, num_minibatches=2, progress=False)
    args.save_model = True
    p.main(args)
    assert devices[0].type == "cuda"
    (path,) = glob.glob("runs/*/checkpoint.pt")
    loaded = p.load_checkpoint(path, "--eval-checkpoint")
    returns = p.evaluate(loaded, episodes=2, deterministic=True, device=torch.device("cpu"), seed=0)
    assert len(returns) == 2


def test_transformer_cached_steps_equal_windowed_one_pass_on_cuda(monkeypatch):
    """In full float32: TF32 convolutions (cuDNN's default) round differently for 3 frames than for 90."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    torch.manual_seed(0)
    device = torch.device("cuda")
    agent = transformer.Agent(6, transformer.Args(lookback=8, n_layers=2, n_heads=4, d_model=32)).to(device)
    with torch.no_grad():
        for layer in agent.layers:
            layer.distance_bias.normal_()
        frames = torch.randint(0, 256, (30, 3, 1, 84, 84), dtype=torch.uint8, device=device)
        starts = torch.rand(30, 3, device=device) < 0.1
        starts[0] = True
        memory, steps = agent.initial_memory(3, device), []
        for t in range(30):
            if t == 13:  # a second rollout starts here, from a copy of the memory (the ring's slot is not 0)
                second_rollout_memory = {name: x.clone() for name, x in memory.items()}
            hidden, memory = agent.get_states(frames[t], memory, starts[t])
            steps.append(hidden)
        first = agent.get_states_sequence(frames[:13], agent.initial_memory(3, device), starts[:13])
        second = agent.get_states_sequence(frames[13:], second_rollout_memory, starts[13:])
        sequence, steps = torch.cat([first, second]), torch.stack(steps)
    torch.testing.assert_close(sequence, steps, rtol=0, atol=1e-5)  # hidden states of unit scale (a LayerNorm's)


def atari_minibatch(n: int, device: torch.device) -> dict[str, torch.Tensor]:
    minibatch = dict(obs=torch.randint(0, 256, (n, 4, 84, 84), dtype=torch.uint8, device=device))
    minibatch.update(actions=torch.randint(0, 6, (n,), device=device), logprobs=-2 * torch.rand(n, device=device))
    return minibatch | dict(zip(("advantages", "returns", "values"), torch.randn(3, n, device=device)))


@pytest.mark.parametrize("bf16", [False, True])
def test_atari_cudagraphs_replay_the_eager_update(bf16):
    """The captured update is the eager one, the same function: same losses, weights and Adam state after several
    minibatches and a learning-rate change; the warm-up steps of the capture (at the first call) leave no trace, and
    each call's stats are its own."""
    torch.manual_seed(0)
    torch.backends.cudnn.deterministic = True
    device, args = torch.device("cuda"), atari.Args(bf16=bf16)
    eager_agent = atari.Agent(6, args).to(device)
    graph_agent = copy.deepcopy(eager_agent)
    eager_opt = torch.optim.Adam(eager_agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    graph_opt = torch.optim.Adam(graph_agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    eager = partial(atari.minibatch_update, eager_agent, eager_opt, atari.minibatch_loss, args)
    graph = partial(atari.minibatch_update, graph_agent, graph_opt, atari.minibatch_loss, args)
    graph = atari.cuda_graph(graph, graph_agent, graph_opt)
    assert graph_opt.param_groups[0]["capturable"] and graph_opt.param_groups[0]["lr"].is_cuda
    eager_stats, graph_stats = [], []
    for i in range(4):
        if i == 2:  # annealing: a float for the eager optimizer, the captured tensor set in place for the graph
            for optimizer in (eager_opt, graph_opt):
                atari.set_learning_rate(optimizer, args.learning_rate / 2)
        minibatch = atari_minibatch(64, device)
        graph_stats.append(graph(minibatch))
        eager_stats.append(eager(minibatch))
        if i == 0:  # captured, then replayed once: the warm-up steps were undone
            for a, b in zip(eager_agent.parameters(), graph_agent.parameters()):
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    assert float(graph_opt.param_groups[0]["lr"]) == pytest.approx(eager_opt.param_groups[0]["lr"])  # a float32 tensor
    for graph_mb, eager_mb in zip(graph_stats, eager_stats):  # each replay's stats kept, not overwritten
        assert graph_mb.keys() == eager_mb.keys() == set(atari.minibatch_loss(eager_agent, args, minibatch)[1])
        for name in eager_mb:
            torch.testing.assert_close(graph_mb[name], eager_mb[name], rtol=1e-4, atol=1e-5)
    for a, b in zip(eager_agent.parameters(), graph_agent.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(graph_opt.state[b]["exp_avg_sq"], eager_opt.state[a]["exp_avg_sq"], rtol=1e-3, atol=1e-10)
    assert float(graph_opt.state[next(graph_agent.parameters())]["step"]) == 4


def test_atari_cudagraphs_rollout_step_is_the_policy():
    """The captured rollout call: values and log-probabilities of the network's own outputs, actions from its
    softmax (fresh noise at every replay)."""
    torch.manual_seed(0)
    device = torch.device("cuda")
    agent = atari.Agent(6, atari.Args()).to(device)
    with torch.no_grad():
        agent.actor.weight.mul_(300)  # far from uniform
    frames = torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8, device=device)
    step = atari.cuda_graph(torch.no_grad()(agent.get_action_and_value))  # as the script's: captured at its first call
    with torch.no_grad():
        logits, values = agent(frames)
    counts = torch.zeros_like(logits)
    for _ in range(2000):
        action, logprob, _, value = step(frames)
        torch.testing.assert_close(value, values, rtol=1e-5, atol=1e-5)
        expected = torch.log_softmax(logits, -1).gather(-1, action[:, None]).squeeze(-1)
        torch.testing.assert_close(logprob, expected, rtol=1e-5, atol=1e-5)
        counts[torch.arange(8), action] += 1
    torch.testing.assert_close(counts / 2000, torch.softmax(logits, -1), rtol=0, atol=0.05)


def test_atari_cudagraphs_trains_resumes_and_evaluates(tmp_path):
    cwd = str(tmp_path)
    flags = ["--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "2", "--no-progress"]
    flags += ["--cudagraphs", "--save-model", "--save-interval", "2"]
    result = run_script("ppo_atari.py", *flags, "--total-timesteps", "512", cwd=cwd)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(cwd)
    scalars = read_scalars(run_dir)
    learning_rates = [v for _, v in scalars["charts/learning_rate"]]
    assert learning_rates[0] > learning_rates[-1]  # annealed through the captured tensor
    assert all(torch.isfinite(torch.tensor([v for _, v in scalars["losses/value_loss"]])))
    checkpoint = f"{run_dir}/checkpoint.pt"
    result = run_script("ppo_atari.py", *flags, "--total-timesteps", "768", "--resume", checkpoint, cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert torch.load(checkpoint, weights_only=True)["global_step"] == 768
    eager = ["--no-cudagraphs", "--total-timesteps", "1024"]  # the captured run's optimizer, resumed eagerly
    result = run_script("ppo_atari.py", *flags, *eager, "--resume", checkpoint, cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert torch.load(checkpoint, weights_only=True)["optimizer"]["param_groups"][0]["capturable"] is False
    result = run_script("ppo_atari.py", "--eval-checkpoint", checkpoint, "--eval-episodes", "1", "--no-cuda", cwd=cwd)
    assert result.returncode == 0 and "eval: 1 episodes" in result.stdout, result.stderr


def test_ppg_trains_on_cuda_with_its_auxiliary_phase_and_evaluates_on_cpu(in_tmp):
    ppg = import_script("ppg_lunarlander")
    args = ppg.Args(env_id="CartPole-v1", num_envs=4, num_steps=32, num_minibatches=2, n_iteration=2, num_aux_rollouts=2)
    args = dataclasses.replace(args, total_timesteps=4 * 4 * 32, progress=False, save_model=True)  # 4 iterations
    ppg.main(args)
    (run_dir,) = run_dirs(".")
    assert len(read_scalars(run_dir)["losses/aux/kl_loss"]) == 2
    loaded = ppg.load_checkpoint(f"{run_dir}/checkpoint.pt", "--eval-checkpoint")
    returns = ppg.evaluate(loaded, episodes=2, deterministic=True, device=torch.device("cpu"), seed=0)
    assert len(returns) == 2
