"""The CUDA path of every script: skipped on machines without a GPU (CI has none); run where one is lent."""

import glob

import pytest
import torch
from conftest import import_script

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
p = import_script("ppo_fsmn_cartpole")
transformer = import_script("ppo_transformer_pong")


def test_fsmn_cached_steps_equal_one_pass_on_cuda():
    torch.manual_seed(0)
    agent = p.Agent(2, 2, p.Args(memory_order=8, num_blocks=2)).cuda()
    with torch.no_grad():
        for trunk in agent.trunks:
            for block in trunk.blocks:
                block.taps.normal_(0.0, 0.5)
        obs = torch.randn(40, 6, 2, device="cuda")
        starts = torch.rand(40, 6, device="cuda") < 0.1
        starts[0] = True
        cache, logits, values = agent.initial_cache(6, torch.device("cuda")), [], []
        for t in range(40):
            logit, value, cache = agent.step(obs[t], cache, starts[t])
            logits.append(logit), values.append(value)
        seq_logits, seq_values = agent.sequence(obs, agent.initial_cache(6, torch.device("cuda")), starts)
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
    returns = p.evaluate(path, episodes=2, deterministic=True, device=torch.device("cpu"), seed=0)
    assert len(returns) == 2


def test_transformer_cached_steps_equal_windowed_one_pass_on_cuda():
    torch.manual_seed(0)
    device = torch.device("cuda")
    agent = transformer.Agent(6, transformer.Args(lookback=8, n_layers=2, n_heads=4, d_model=32)).to(device)
    with torch.no_grad():
        for layer in agent.layers:
            layer.distance_bias.normal_()
        frames = torch.randint(0, 256, (30, 3, 1, 84, 84), dtype=torch.uint8, device=device)
        starts = torch.rand(30, 3, device=device) < 0.1
        starts[0] = True
        memory, logits, values = agent.initial_memory(3, device), [], []
        for t in range(30):
            logit, value, *memory = agent.step(frames[t], *memory, starts[t], torch.contiguous_format)
            logits.append(logit), values.append(value)
        seq_logits, seq_values = agent.sequence(frames, *agent.initial_memory(3, device), starts, torch.contiguous_format)
    torch.testing.assert_close(seq_logits, torch.stack(logits), rtol=0, atol=1e-4)
    torch.testing.assert_close(seq_values, torch.stack(values), rtol=0, atol=1e-4)
