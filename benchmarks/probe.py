"""Can the FSMN hold the answer? Its policy network trained by supervised learning on recorded episodes.

    python benchmarks/probe.py --env-id popgym-CountRecallEasy-v0                  # every memory kind, 1500 steps
    python benchmarks/probe.py --env-id popgym-AutoencodeEasy-v0 --kinds gate --steps 3000

PPO asks a network to find an answer from a reward alone. This asks it with the answer given: on a POPGym card task
(RepeatPrevious, RepeatFirst, CountRecall, Autoencode: an action changes nothing but its own reward), every step's
best action is found by trying each action on a copy of the env (as benchmarks/levels.py does), and
`ppo_fsmn_cartpole.py`'s Agent, built from the script's own flags, is trained on whole episodes by cross-entropy
against it. Each kind is trained twice: with the previous action fed as the previous answer (what a policy that
answers right gives itself, and itself a memory of one step that a policy can lean on) and with
`--no-prev-action` (the cards alone). Steps where every action scores alike (Autoencode's watching) carry no answer
and no loss. It reports, on episodes it never trained on, the accuracy and the return those answers would earn. A
kind that scores well here can hold the answer, and PPO's failure to find it is the learning's; one that cannot is
the network's.

Writes <out-dir>/probe_<task>.md (and benchmarks/results/probe_<task>.md with --results).
"""

import copy
import os
import shlex
import sys
import warnings
from dataclasses import dataclass, replace
from importlib.metadata import version

import numpy as np
import torch
import torch.nn as nn
import tyro

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")  # the project's results, tracked: written only with --results
sys.path.insert(0, ROOT)
from report import machine  # noqa: E402

import ppo_fsmn_cartpole as fsmn  # noqa: E402  (the network probed is the script's own)

# the memory kinds of ppo_fsmn_cartpole.py, as its flags
KINDS = {
    "none": ["--memory-order", "0"],
    "taps": ["--memory-order", "16"],
    "decay": ["--memory-order", "16", "--long-memory", "decay"],
    "gate": ["--memory-order", "16", "--long-memory", "gate"],
}


@dataclass
class Args:
    env_id: str = "popgym-CountRecallEasy-v0"
    """a POPGym card task (an action changes nothing but its own reward)"""
    kinds: tuple[str, ...] = tuple(KINDS)
    """the memory kinds to probe: none (memory order 0), taps (order 16), decay, gate (both with order 16)"""
    flags: str = ""
    """more flags of ppo_fsmn_cartpole.py for every kind, e.g. "--hidden-dim 128" """
    episodes: int = 512
    """recorded episodes to train on (as many again, other seeds, a quarter of them, to score on)"""
    steps: int = 1500
    """gradient steps"""
    batch: int = 32
    """episodes per gradient step"""
    learning_rate: float = 3e-3
    """Adam's learning rate"""
    seed: int = 0
    """seeds the network and the minibatches; the episodes are recorded from seeds 0.. and 1,000,000.."""
    out_dir: str = os.path.join("benchmark_runs", "probe")
    """where probe_<task>.md is written"""
    results: bool = False
    """also write benchmarks/results/probe_<task>.md"""


def record(env_id: str, seeds: range) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Episodes of `env_id`, every step's answer found by trying each action on a copy of the env. Returns the
    observations (T, N, obs_dim) as the script's env wrappers give them, the answers (T, N), whether a step has one
    (T, N) and every action's reward (T, N, A). All episodes of a card task last the same number of steps."""
    env = fsmn.make_env(env_id, 0, False, "", False)()
    raw = env.unwrapped
    observations, answers, rewards = [], [], []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        episode_obs, episode_rewards, done = [], [], False
        while not done:
            trials = []
            for action in range(env.action_space.n):
                trial = copy.deepcopy(raw)  # the env's own code: the same cards come next whatever the action
                trials.append(float(trial.step(action)[1]))
            episode_obs.append(obs)
            episode_rewards.append(trials)
            obs, _, terminated, truncated, _ = env.step(int(np.argmax(trials)))
            done = terminated or truncated
        observations.append(np.stack(episode_obs))
        rewards.append(np.array(episode_rewards))
    lengths = {len(o) for o in observations}
    if len(lengths) != 1:
        raise SystemExit(f"error: --env-id={env_id} has episodes of different lengths ({sorted(lengths)}): not a card task")
    obs_t = torch.tensor(np.stack(observations, axis=1), dtype=torch.float32)  # (T, N, obs_dim)
    rewards_t = torch.tensor(np.stack(rewards, axis=1), dtype=torch.float32)  # (T, N, A)
    answers = rewards_t.argmax(-1)
    has_answer = rewards_t.max(-1).values > rewards_t.min(-1).values
    return obs_t, answers, has_answer, rewards_t


def logits_of(agent: "fsmn.Agent", obs: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """The policy's logits (T, N, A) over whole episodes, in one pass from an empty memory, the previous answer
    as the previous action."""
    steps, n = answers.shape
    starts = torch.zeros(steps, n, dtype=torch.bool)
    starts[0] = True
    previous = torch.cat([torch.zeros_like(answers[:1]), answers[:-1]])
    x = agent.observe(obs, previous, starts)
    return agent.actor(agent.get_states_sequence(x, agent.initial_memory(n, obs.device), starts))


def probe(args: Args, flags: list[str], train: tuple, test: tuple) -> dict:
    # one trunk of --hidden-dim channels, as measured (a --separate-critic's policy has half); the flags override
    script_args, _ = fsmn.cli(["--env-id", args.env_id, "--no-separate-critic", *flags])
    script_args = replace(script_args, norm_obs=False)  # one-hot cards: nothing to normalise
    torch.manual_seed(args.seed)
    obs, answers, has_answer, _ = train
    agent = fsmn.Agent(obs.shape[-1], test[3].shape[-1], script_args)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate)
    for _ in range(args.steps):
        pick = torch.randint(0, obs.shape[1], (args.batch,))
        logits = logits_of(agent, obs[:, pick], answers[:, pick])
        mask = has_answer[:, pick]
        loss = nn.functional.cross_entropy(logits[mask], answers[:, pick][mask])
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
        optimizer.step()
    with torch.no_grad():
        obs, answers, has_answer, rewards = test
        chosen = logits_of(agent, obs, answers).argmax(-1)  # (T, N)
        accuracy = (chosen == answers)[has_answer].float().mean().item()
        returns = rewards.gather(-1, chosen.unsqueeze(-1)).squeeze(-1).sum(0)  # (N,): what the answers earn
    return dict(accuracy=accuracy, ret=returns.mean().item())


def main(args: Args) -> str:
    for kind in args.kinds:
        if kind not in KINDS:
            raise SystemExit(f"error: --kinds: {kind} is not one of {', '.join(KINDS)}")
    if min(args.episodes, args.steps, args.batch) < 1:
        raise SystemExit("error: --episodes, --steps and --batch must be at least 1")
    fsmn.check_env_args(args.env_id, mask_velocity=False)
    with warnings.catch_warnings():  # popgym's envs share one info dict between reset and step: make warns
        warnings.simplefilter("ignore")
        train = record(args.env_id, range(args.episodes))
        test = record(args.env_id, range(1_000_000, 1_000_000 + max(args.episodes // 4, 1)))
    rows = []
    for kind in args.kinds:
        cells = [kind, f"`{' '.join(KINDS[kind] + args.flags.split())}`"]
        for feed in ([], ["--no-prev-action"]):
            result = probe(args, [*KINDS[kind], *args.flags.split(), *feed], train, test)
            cells += [f"{result['accuracy']:.3f}", f"{result['ret']:.3f}"]
            print(f"{kind} {feed}: accuracy {cells[-2]}, return {cells[-1]}", file=sys.stderr, flush=True)
        rows.append("| " + " | ".join(cells) + " |")
    task = args.env_id.removeprefix("popgym-").removesuffix("-v0")
    text = "\n".join(
        [
            f"# Can the FSMN hold the answer? {task}, trained on the env's own answers",
            "",
            "`ppo_fsmn_cartpole.py`'s policy network of each memory kind, trained by supervised learning on whole "
            "recorded episodes to give every step's best action (found by trying each action on a copy of the env), "
            "with the previous answer fed as the previous action and without the previous action; scored on "
            "episodes it never trained on (the method: the docstring of `benchmarks/probe.py`). A kind that scores "
            "well here can hold the answer; whether PPO finds it is another question.",
            "",
            f"{args.env_id}: {args.steps} steps of {args.batch} episodes ({args.episodes} recorded), learning rate "
            f"{args.learning_rate}, scored on {test[0].shape[1]} other episodes. Machine: {machine()}, popgym "
            f"{version('popgym')}. Generated by `python benchmarks/probe.py {shlex.join(sys.argv[1:])}`.",
            "",
            "| memory | flags | accuracy, previous answer fed | return of its answers | accuracy, no previous action "
            "| return of its answers |",
            "|---|---|---|---|---|---|",
            *rows,
        ]
    )
    print(text)
    os.makedirs(args.out_dir, exist_ok=True)
    targets = [os.path.join(args.out_dir, f"probe_{task}.md")]
    targets += [os.path.join(RESULTS, f"probe_{task}.md")] if args.results else []
    for path in targets:
        with open(path, "w") as f:
            f.write(text + "\n")
    return text


if __name__ == "__main__":
    main(tyro.cli(Args))
