"""What the KV cache and the windowed one-pass attention of ppo_transformer_pong.py buy, side by side in one command.

    python benchmarks/transformer_speed.py              # writes benchmarks/results/transformer_speed.md
    python benchmarks/transformer_speed.py --compile    # the per-step comparison with both sides torch.compile'd
    python benchmarks/transformer_speed.py --cuda       # on the GPU: writes benchmarks/results/transformer_speed_gpu.md

- Per-step inference (the rollout's policy step, 8 envs, no grad), at lookback 16, 64 and 256:
  - cached: the script's `Agent.step`: the new frame's token, its query/key/value, attention to the cached keys;
  - recompute window: the seed project's way: the new frame's token, then every layer over the window of the last
    lookback + 1 tokens (the tokens of past frames kept, so the CNN does not run again), no cache;
  - re-encode window: as recompute window, but the window's frames go through the CNN again at every step.
  With one layer all three compute the same outputs. With n_layers > 1 the two baselines compute less: their
  receptive field is one window, the cached step's is n_layers windows; so the ratios are conservative.
- One update (one minibatch of 2 env sequences x 128 steps = 256 samples: forward, PPO loss, backward, Adam), at
  lookback 16 and 64:
  - windowed one pass: the script's `Agent.sequence`: 128 new tokens per env, band-and-episode-masked attention over
    lookback + 128 keys;
  - per-sample windows: the seed project's way: every sample re-encodes its window of lookback + 1 frames and runs
    the transformer over it, reading the last token;
  - per-sample windows over tokens: every frame encoded once, the transformer run over every sample's window.
Each figure is the median of timed calls after warm-up calls, all in this process, the functions compared called in turn
round after round (so that the machine's slow and fast spells fall on all of them alike).
With --compile (the script's --compile compiles `Agent.step` the same way), the cached step and the recompute are
each one torch.compile'd function (the warm-up calls compile them); re-encoding stays eager, and the update
comparison is left out. Written to benchmarks/results/transformer_speed_compiled.md.
With --cuda everything runs on the GPU with PyTorch's default precision settings, as the script does; each timed call
ends with a synchronize.
"""

import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import tyro
from report import machine, write_result

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ppo_transformer_pong as p  # noqa: E402  (the script under test, imported as a module: it starts nothing)

FORMAT = torch.channels_last  # the script's default layout
N_ACTIONS = 6


@dataclass
class Args:
    step_lookbacks: tuple[int, ...] = (16, 64, 256)
    """lookbacks of the per-step inference comparison"""
    update_lookbacks: tuple[int, ...] = (16, 64)
    """lookbacks of the update comparison"""
    num_envs: int = 8
    """envs stepped together (the script's default)"""
    num_steps: int = 128
    """steps per env sequence in an update (the script's default)"""
    envs_per_minibatch: int = 2
    """env sequences per minibatch (the script's default: 8 envs / 4 minibatches)"""
    calls: int = 40
    """rounds of timed calls of the per-step comparison (after 3 warm-up calls each; re-encoding runs in every 4th);
    the update comparison runs a quarter of it, at least 3 (per-sample windows in every 3rd)"""
    compile: bool = False
    """compile the cached step and the recompute (per-step comparison only)"""
    cuda: bool = False
    """run on the GPU (results in transformer_speed_gpu.md, or transformer_speed_gpu_compiled.md with --compile)"""


def synchronize() -> None:
    """Wait for the GPU's queued work (a no-op on the CPU), so that a timed call is the work, not its launch."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def median_times(fns: dict, rounds: int, every: dict | None = None, warmup: int = 3) -> dict[str, float]:
    """The median wall time of each function, the functions called in turn, round after round, so that the machine's
    slow and fast spells fall on all of them alike; a function with every[name] = k runs in every k-th round only."""
    every = every or {}
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for round_ in range(rounds):
        for name, fn in fns.items():
            if round_ % every.get(name, 1) == 0:
                synchronize()
                start = time.perf_counter()
                fn()
                synchronize()
                times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}


def window_masks(lookback: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention over one window of lookback + 1 tokens: visible (1, W+1, W+1) and distance (W+1, W+1)."""
    positions = torch.arange(lookback + 1, device=device)
    distance = positions.unsqueeze(1) - positions.unsqueeze(0)
    return (distance >= 0).unsqueeze(0), distance


def transformer_over_windows(agent, tokens: torch.Tensor, visible: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
    """tokens: (N, W+1, D) -> the last token's features (N, D), every layer run over the window, with no cache."""
    n, _, d = tokens.shape
    empty = tokens.new_zeros(2, n, agent.n_heads, 0, d // agent.n_heads)
    x = tokens
    for layer in agent.layers:
        x, _ = layer(x, empty, visible, distance)
    return x[:, -1]


def step_figures(lookback: int, args: Args, device: torch.device) -> dict[str, float]:
    torch.manual_seed(0)
    agent = p.Agent(N_ACTIONS, p.Args(lookback=lookback)).to(device, memory_format=FORMAT)
    frames = torch.randint(0, 256, (args.num_envs, 1, 84, 84), dtype=torch.uint8, device=device)
    window_frames = torch.randint(0, 256, (args.num_envs, lookback + 1, 1, 84, 84), dtype=torch.uint8, device=device)
    starts = torch.zeros(args.num_envs, dtype=torch.bool, device=device)
    kv, valid, slot = agent.initial_memory(args.num_envs, device)
    valid[:] = True  # a full cache: the steady state deep into an episode
    tokens = torch.randn(args.num_envs, lookback, agent.d_model, device=device)
    visible, distance = window_masks(lookback, device)

    @torch.no_grad()
    def cached():
        return agent.step(frames, kv, valid, slot, starts, FORMAT)  # token, its key and value into the cache, attention

    @torch.no_grad()
    def recompute():
        window = torch.cat([tokens, agent.encode(frames, FORMAT).unsqueeze(1)], dim=1)  # (B, W+1, D)
        return agent.heads(transformer_over_windows(agent, window, visible, distance))

    if args.compile:
        torch._dynamo.reset()  # each lookback compiles afresh
        cached, recompute = torch.compile(cached), torch.compile(recompute)

    @torch.no_grad()
    def reencode():
        window = agent.encode(window_frames.flatten(0, 1), FORMAT).view(args.num_envs, lookback + 1, -1)
        agent.heads(transformer_over_windows(agent, window, visible, distance))

    fns = {"cached": cached, "recompute window": recompute, "re-encode window": reencode}
    return median_times(fns, args.calls, every={"re-encode window": 4})


def ppo_loss(logits: torch.Tensor, values: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """The script's loss shape on made-up targets (what is timed is the network's forward and backward)."""
    probs = torch.distributions.Categorical(logits=logits)
    ratio = (probs.log_prob(actions) - np.log(1.0 / N_ACTIONS)).exp()
    advantages = torch.linspace(-1, 1, ratio.shape[0], device=ratio.device)
    pg_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(0.9, 1.1)).mean()
    return pg_loss + 0.5 * (values**2).mean() - 0.01 * probs.entropy().mean()


def update_figures(lookback: int, args: Args, device: torch.device) -> dict[str, float]:
    torch.manual_seed(0)
    agent = p.Agent(N_ACTIONS, p.Args(lookback=lookback)).to(device, memory_format=FORMAT)
    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-9, eps=1e-5, fused=True)
    T, B, W = args.num_steps, args.envs_per_minibatch, lookback
    # W frames before the rollout, then T
    frames = torch.randint(0, 256, (W + T, B, 1, 84, 84), dtype=torch.uint8, device=device)
    starts = torch.zeros(T, B, dtype=torch.bool, device=device)
    actions = torch.randint(0, N_ACTIONS, (T * B,), device=device)
    kv, valid, slot = agent.initial_memory(B, device)
    with torch.no_grad():  # the cache at the rollout's start, from the W frames before it
        for t in range(W):
            _, _, kv, valid, slot = agent.step(frames[t], kv, valid, slot, starts[0], FORMAT)
    visible, distance = window_masks(W, device)
    windows = torch.arange(T, device=device).unsqueeze(1) + torch.arange(W + 1, device=device).unsqueeze(0)  # (T, W+1)

    def gradient_step(logits: torch.Tensor, values: torch.Tensor) -> None:
        optimizer.zero_grad()
        ppo_loss(logits, values, actions).backward()
        optimizer.step()

    def windowed():
        logits, values = agent.sequence(frames[W:], kv, valid, slot, starts, FORMAT)  # (T, B, A), (T, B)
        gradient_step(logits.flatten(0, 1), values.flatten())

    def per_sample_frames():
        window_frames = frames[windows]  # (T, W+1, B, 1, 84, 84)
        tokens = agent.encode(window_frames.transpose(1, 2).flatten(0, 2), FORMAT).view(T * B, W + 1, -1)
        logits, values = agent.heads(transformer_over_windows(agent, tokens, visible, distance))
        gradient_step(logits, values)

    def per_sample_tokens():
        tokens = agent.encode(frames.flatten(0, 1), FORMAT).view(W + T, B, -1)
        window_tokens = tokens[windows].transpose(1, 2).flatten(0, 1)  # (T * B, W+1, D)
        logits, values = agent.heads(transformer_over_windows(agent, window_tokens, visible, distance))
        gradient_step(logits, values)

    fns = {
        "windowed one pass": windowed,
        "per-sample windows": per_sample_frames,
        "per-sample windows over tokens": per_sample_tokens,
    }
    return median_times(fns, max(3, args.calls // 4), every={"per-sample windows": 3}, warmup=1)


def main(args: Args) -> None:
    torch.set_grad_enabled(True)
    if args.cuda and not torch.cuda.is_available():
        raise SystemExit("error: --cuda: no CUDA device is available (leave --cuda out to run on the CPU)")
    device = torch.device("cuda" if args.cuda else "cpu")
    flags = (" --cuda" if args.cuda else "") + (" --compile" if args.compile else "")
    name = "transformer_speed" + ("_gpu" if args.cuda else "") + ("_compiled" if args.compile else "")
    lines = [
        "# ppo_transformer_pong.py: KV cache and windowed attention against recomputation"
        + (", compiled" if args.compile else ""),
        "",
        f"Machine: {machine()}. Generated by `python benchmarks/transformer_speed.py{flags}` "
        f"(on the {'GPU' if args.cuda else 'CPU'}, float32, channels-last, the script's default network: d_model 128, "
        "2 layers, 4 heads). Median wall time of repeated calls in one process, the functions compared called in turn."
        + (" The cached step and the recompute are each torch.compile'd; re-encoding is eager." if args.compile else ""),
        "",
        f"## Per-step inference ({args.num_envs} envs, no grad)",
        "",
        "| lookback | cached (ms) | recompute window (ms) | re-encode window (ms) | recompute / cached | re-encode / cached |",
        "|---|---|---|---|---|---|",
    ]
    for lookback in args.step_lookbacks:
        f = step_figures(lookback, args, device)
        row = (
            f"| {lookback} | {1e3 * f['cached']:.2f} | {1e3 * f['recompute window']:.2f} | "
            f"{1e3 * f['re-encode window']:.1f} | **{f['recompute window'] / f['cached']:.1f}x** | "
            f"{f['re-encode window'] / f['cached']:.0f}x |"
        )
        lines.append(row)
        print(row, flush=True)
    if args.compile:
        lines.append("")
        print(write_result(name, lines))
        return
    lines += [
        "",
        f"## One update ({args.envs_per_minibatch} env sequences x {args.num_steps} steps = "
        f"{args.envs_per_minibatch * args.num_steps} samples: forward, loss, backward, Adam)",
        "",
        "| lookback | windowed one pass (ms) | per-sample windows (ms) | per-sample windows over tokens (ms) | "
        "per-sample / windowed | over tokens / windowed |",
        "|---|---|---|---|---|---|",
    ]
    for lookback in args.update_lookbacks:
        f = update_figures(lookback, args, device)
        row = (
            f"| {lookback} | {1e3 * f['windowed one pass']:.1f} | {1e3 * f['per-sample windows']:.0f} | "
            f"{1e3 * f['per-sample windows over tokens']:.1f} | **{f['per-sample windows'] / f['windowed one pass']:.1f}x** | "
            f"{f['per-sample windows over tokens'] / f['windowed one pass']:.1f}x |"
        )
        lines.append(row)
        print(row, flush=True)
    lines.append("")
    print(write_result(name, lines))


if __name__ == "__main__":
    main(tyro.cli(Args))
