"""Where ppo_atari.py's time goes: the emulator alone, the network's compute alone, and the fraction of that compute
ceiling that the full training loop reaches, for each precision and layout the script offers.

    python benchmarks/atari_ceiling.py            # writes benchmarks/results/atari_ceiling.md

- Emulator: the training vector env (make_envs of the script) stepped with random actions, agent steps per second.
- Compute ceiling of a config: the steps per second the network alone allows at the script's default settings:
  one rollout forward per sample (batch num_envs, no grad) plus update_epochs forward+backward+Adam passes per
  sample (batch minibatch_size), each timed as the median of repeated calls on random frames.
- Loop: the script itself, run through its CLI with the same flags, measured after a burn-in as in sps.py.
Each config's ceiling and loop run one after the other in this one command.
"""

import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import tyro
from report import machine, write_result
from sps import run

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ppo_atari as p  # noqa: E402  (the script under test, imported as a module: it starts nothing)

CONFIGS = {  # name: (bf16, channels_last, the script's flags)
    "float32, default layout": (False, False, ["--no-channels-last"]),
    "float32, channels-last (default)": (False, True, []),
    "bf16, default layout": (True, False, ["--bf16", "--no-channels-last"]),
    "bf16, channels-last": (True, True, ["--bf16"]),
}


@dataclass
class Args:
    env_id: str = "PongNoFrameskip-v4"
    loop_steps: int = 10_240
    """environment steps of each run of the script (the first --burn-in fraction left out)"""
    burn_in: float = 0.2
    calls: int = 30
    """timed calls per network measurement (after 5 warm-up calls)"""
    configs: tuple[str, ...] = tuple(CONFIGS)
    """configs whose compute ceiling is measured"""
    loop_configs: tuple[str, ...] = tuple(CONFIGS)
    """configs whose training loop is run too (a slow config, e.g. bf16 on a CPU without bf16 instructions, can be
    left to its ceiling)"""


def cpu_flags() -> str:
    """What the CPU offers for bfloat16: without avx512_bf16 or amx_bf16, bf16 convolutions are emulated and slow."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(line for line in f if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return "CPU flags unknown."
    vector = [f for f in flags if f.startswith(("avx", "amx"))]
    return f"CPU vector flags: {' '.join(vector) or 'none'}."


def median_time(fn, calls: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def emulator_steps_per_second(env_id: str, num_envs: int, steps: int = 500) -> float:
    envs = p.make_envs(env_id, num_envs, training=True)
    envs.reset(seed=0)
    rng = np.random.default_rng(0)
    actions = rng.integers(envs.single_action_space.n, size=(steps + 50, num_envs))
    for a in actions[:50]:
        envs.step(a)
    start = time.perf_counter()
    for a in actions[50:]:
        envs.step(a)
    elapsed = time.perf_counter() - start
    envs.close()
    return steps * num_envs / elapsed


def compute_ceiling(bf16: bool, channels_last: bool, defaults: p.Args, calls: int) -> float:
    torch.manual_seed(0)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    agent = p.Agent(6).to(memory_format=memory_format)
    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-4, eps=1e-5, fused=True)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)
    rollout_obs = torch.randint(0, 256, (defaults.num_envs, 4, 84, 84), dtype=torch.uint8)
    batch_obs = torch.randint(0, 256, (defaults.minibatch_size, 4, 84, 84), dtype=torch.uint8)

    def rollout_forward():
        with torch.no_grad(), autocast:
            agent(rollout_obs, memory_format)

    def train_step():
        with autocast:
            logits, values = agent(batch_obs, memory_format)
        loss = -torch.log_softmax(logits, -1)[:, 0].mean() + values.square().mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
        optimizer.step()

    per_sample = median_time(rollout_forward, calls) / defaults.num_envs
    per_sample += defaults.update_epochs * median_time(train_step, calls) / defaults.minibatch_size
    return 1.0 / per_sample


def main(args: Args) -> None:
    defaults = p.Args(env_id=args.env_id)
    emulator = emulator_steps_per_second(args.env_id, defaults.num_envs)
    print(f"emulator: {emulator:.0f} steps/s")
    rows = []
    for name in args.configs:
        bf16, channels_last, flags = CONFIGS[name]
        ceiling = compute_ceiling(bf16, channels_last, defaults, args.calls)
        loop, memory = float("nan"), float("nan")
        if name in args.loop_configs:
            command = ["ppo_atari.py", "--env-id", args.env_id, "--no-progress", *flags]
            loop, memory = run(command, args.loop_steps, args.burn_in)
        rows.append((name, ceiling, loop, loop / ceiling, memory))
        print(f"{name}: ceiling {ceiling:.0f} steps/s, loop {loop:.0f} steps/s ({loop / ceiling:.0%}), {memory:.0f} MiB")
    storage = defaults.num_steps * defaults.num_envs * 4 * 84 * 84
    lines = [
        "# ppo_atari.py: emulator, compute ceiling and the training loop",
        "",
        f"{args.env_id}, the script's defaults (8 envs x 128 steps, 4 epochs, minibatch 256). Machine: {machine()}.",
        f"Generated by `python benchmarks/atari_ceiling.py` (loop runs of {args.loop_steps} steps, the first "
        f"{args.burn_in:.0%} left out). {cpu_flags()}",
        "",
        f"Emulator alone (ale-py vector env, 8 envs, random actions): **{emulator:.0f} steps/s**.",
        "",
        "| config | compute ceiling steps/s | training loop steps/s | loop / ceiling | peak memory MiB |",
        "|---|---|---|---|---|",
        *[
            f"| {n} | {c:.0f} | {lp:.0f} | {f:.0%} | {m:.0f} |" if lp == lp else f"| {n} | {c:.0f} | not run | | |"
            for n, c, lp, f, m in rows
        ],
        "",
        f"Rollout storage of the frames: {storage / 2**20:.1f} MiB as uint8 ({4 * storage / 2**20:.1f} MiB as float32).",
        "",
    ]
    print(write_result("atari_ceiling", lines))


if __name__ == "__main__":
    main(tyro.cli(Args))
