"""The levels a trivial policy reaches on POPGym's tasks, computed from the environments themselves.

    python benchmarks/levels.py                                  # the popgym preset's tasks, 400 + 400 episodes
    python benchmarks/levels.py --env-ids popgym-CountRecallEasy-v0 --episodes 100

A learning result means something only beside what a policy without the skill it claims reaches. For each task:
- random: actions drawn uniformly, the mean episode return.
- memoryless: the best policy that sees the step number t and the current observation and remembers nothing else.
  In the card tasks (RepeatPrevious, RepeatFirst, CountRecall, Autoencode, ...) an action changes neither what is
  shown next nor any later reward, so that policy answers, at every (t, observation), the action with the highest
  mean reward there. The tool finds it by trying every action on a copy of the env at every step of `--episodes`
  episodes (the reward of each action, the same cards dealt next), keeps the best action of each (t,
  observation), and scores that table on `--episodes` other episodes (seeds apart), so that the table's luck on
  the episodes it was fitted on does not flatter it. A policy that knows the time step can do no better
  without memory; a memory that scores below it has learned the clock at most.
- perfect: every step's best action (the answer with everything remembered), the ceiling.
- In an env where actions change what follows (PositionOnlyCartPole), no table is fitted: 'memoryless' is then the
  best of a few fixed reactive policies on the current observation (push toward the side the pole leans to,
  corrected by the cart's position), a floor under the true memoryless level, and says so.
MMER, the maximum over training of a 100-episode mean, sits above a policy's mean by chance alone: the table gives
the memoryless policy's mean plus two standard deviations of a 100-episode mean beside it.

The table is printed as Markdown, and written to <out-dir>/levels.md (and to benchmarks/results/levels.md only with
--results). `--annotate` marks a report's table (`report.py --mmer`) with them instead:

    python benchmarks/levels.py --levels-file benchmarks/results/levels.md --annotate benchmarks/results/popgym.md

adds to every row `| <env_id>__<config> | ... | MMER | ...` of a task in the levels file two columns, the task's
memoryless level and where the row's MMER median stands against it: 'clears it' above its MMER noise, 'within its
noise' between the level and that, 'below it' under the level (the columns are replaced where present).
"""

import copy
import os
import shlex
import sys
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from importlib.metadata import version

import gymnasium as gym
import numpy as np
import popgym  # noqa: F401  (registers popgym-<Task><Easy|Medium|Hard>-v0)
import tyro

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")  # the project's results, tracked: written only with --results


@dataclass
class Args:
    env_ids: list[str] = field(default_factory=lambda: list(DEFAULT_TASKS))
    """the POPGym ids to measure"""
    episodes: int = 400
    """episodes to fit the memoryless table on, and as many other ones (other seeds) to score it and the others"""
    seed: int = 0
    """the first seed: the table is fitted on seeds seed..seed+episodes-1 and scored on the next `episodes`"""
    out_dir: str = os.path.join("benchmark_runs", "levels")
    """where levels.md is written"""
    results: bool = False
    """also write benchmarks/results/levels.md (the project's results file)"""
    levels_file: str | None = None
    """read the levels from this table (an earlier levels.md) instead of computing them"""
    annotate: tuple[str, ...] = ()
    """report tables to mark with the levels, in place (then nothing else is written)"""


LOOK_AHEAD = 3  # steps after an action over which it must change nothing for the env to count as a card task

# the popgym preset's five Easy tasks and RepeatPreviousMedium, the FSMN's 32-steps-back recall
DEFAULT_TASKS = [f"popgym-{t}Easy-v0" for t in ("PositionOnlyCartPole", "RepeatPrevious", "RepeatFirst", "CountRecall")]
DEFAULT_TASKS += ["popgym-AutoencodeEasy-v0", "popgym-RepeatPreviousMedium-v0"]


def key(obs) -> tuple:
    """A hashable form of an observation (an int, an array, a tuple of them)."""
    if isinstance(obs, tuple):
        return tuple(key(o) for o in obs)
    return tuple(np.asarray(obs).ravel().tolist())


def actions_of(env: gym.Env) -> list:
    space = env.action_space
    if isinstance(space, gym.spaces.Discrete):
        return list(range(space.start, space.start + space.n))
    raise SystemExit(f"error: levels.py needs Discrete actions; {env.spec.id} has {space}")


def action_rewards(env: gym.Env, actions: list) -> tuple[np.ndarray, bool, object, bool]:
    """Every action's reward from the env's current state, each tried on a copy of it; the env then steps with
    the first action. Returns the rewards, whether every copy showed the same observations for LOOK_AHEAD + 1
    steps and ended alike (the action changed nothing but its reward), the next observation and whether the
    episode ended."""
    rewards, outcomes = [], set()
    for action in actions:
        trial = copy.deepcopy(env)
        obs, reward, terminated, truncated, _ = trial.step(action)
        rewards.append(float(reward))
        # an action may show only later (a push moves the cart at the step after): a few more steps, alike
        future = [(key(obs), terminated, truncated)]
        for _ in range(LOOK_AHEAD):
            if terminated or truncated:
                break
            obs, _, terminated, truncated, _ = trial.step(actions[0])
            future.append((key(obs), terminated, truncated))
        outcomes.add(tuple(future))
    obs, _, terminated, truncated, _ = env.step(actions[0])
    return np.array(rewards), len(outcomes) == 1, obs, terminated or truncated


def card_task_episodes(env_id: str, seeds: range) -> list[list[tuple[tuple, np.ndarray]]] | None:
    """Per episode, every step's (t, observation) key and all actions' rewards; None where an action changed what
    followed (not a card task)."""
    env = gym.make(env_id).unwrapped  # the env's own code, no checker or wrapper between
    actions, episodes = actions_of(env), []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        steps, done, t = [], False, 0
        while not done:
            rewards, independent, next_obs, done = action_rewards(env, actions)
            if not independent:
                return None
            steps.append(((t, key(obs)), rewards))
            obs, t = next_obs, t + 1
        episodes.append(steps)
    return episodes


def card_task_levels(env_id: str, episodes: int, seed: int) -> dict | None:
    fit = card_task_episodes(env_id, range(seed, seed + episodes))
    if fit is None:
        return None
    scored = card_task_episodes(env_id, range(seed + episodes, seed + 2 * episodes))
    totals: dict[tuple, np.ndarray] = defaultdict(float)
    for steps in fit:
        for state, rewards in steps:
            totals[state] = totals[state] + rewards
    best = {state: int(np.argmax(total)) for state, total in totals.items()}
    # a (t, observation) never met while fitting: the action best on average over that step's observations
    by_step: dict[int, np.ndarray] = defaultdict(float)
    for (t, _), total in totals.items():
        by_step[t] = by_step[t] + total
    memoryless, random, perfect = [], [], []
    for steps in scored:
        chosen = [rewards[best.get(state, int(np.argmax(by_step[state[0]])))] for state, rewards in steps]
        memoryless.append(sum(chosen))
        random.append(sum(rewards.mean() for _, rewards in steps))
        perfect.append(sum(rewards.max() for _, rewards in steps))
    return dict(random=random, memoryless=memoryless, perfect=perfect, how="the best action per (t, observation)")


def reactive_levels(env_id: str, episodes: int, seed: int) -> dict:
    """An env where actions matter (a CartPole): random actions, and the best of a few reactive policies on the
    current observation, push right when theta + c * x > 0 (obs [x, theta]), a floor under the memoryless level."""
    env = gym.make(env_id)
    rng = np.random.default_rng(seed)

    def play(policy, seeds) -> list[float]:
        returns = []
        for s in seeds:
            obs, _ = env.reset(seed=int(s))
            total, done = 0.0, False
            while not done:
                obs, reward, terminated, truncated, _ = env.step(policy(np.asarray(obs, dtype=np.float64)))
                total, done = total + float(reward), terminated or truncated
            returns.append(total)
        return returns

    fit_seeds, scored_seeds = range(seed, seed + episodes), range(seed + episodes, seed + 2 * episodes)
    random = play(lambda obs: int(rng.integers(env.action_space.n)), scored_seeds)
    gains = np.linspace(-2.0, 2.0, 21)
    means = [np.mean(play(lambda obs, c=c: int(obs[1] + c * obs[0] > 0), fit_seeds[:50])) for c in gains]
    c = gains[int(np.argmax(means))]
    memoryless = play(lambda obs: int(obs[1] + c * obs[0] > 0), scored_seeds)
    how = f"floor: the best reactive policy, right when theta {c:+.1f} x > 0"
    return dict(random=random, memoryless=memoryless, perfect=None, how=how)


def levels(env_id: str, episodes: int, seed: int) -> dict:
    with warnings.catch_warnings():  # popgym's envs share one info dict between reset and step: make warns
        warnings.simplefilter("ignore")
        return card_task_levels(env_id, episodes, seed) or reactive_levels(env_id, episodes, seed)


def table(rows: dict[str, dict], episodes: int) -> str:
    lines = [
        "# POPGym: the levels of trivial policies",
        "",
        "What a policy reaches on each task without the skill the task tests: at random, and without memory (it "
        "sees the step number and the current observation, remembers nothing else), beside what a perfect one "
        "reaches. A learning result on these tasks means something only above its task's memoryless level (how "
        "each is computed: the docstring of `benchmarks/levels.py`). Results files mark their rows against these "
        "levels with `python benchmarks/levels.py --levels-file benchmarks/results/levels.md --annotate <file>`.",
        "",
        f"Generated by `python benchmarks/levels.py {shlex.join(sys.argv[1:])}` with popgym {version('popgym')} and "
        f"gymnasium {gym.__version__}: the levels depend on the envs' code and seeds, not on the machine.",
        "",
        f"Mean episode return over {episodes} episodes (the memoryless table fitted on {episodes} others). "
        "'MMER noise': the memoryless mean plus two standard deviations of a 100-episode mean, what a maximum "
        "over training's 100-episode windows can reach by chance alone.",
        "",
        "| task | random | memoryless | MMER noise | perfect | memoryless policy |",
        "|---|---|---|---|---|---|",
    ]
    for env_id, r in rows.items():
        noise = np.mean(r["memoryless"]) + 2 * np.std(r["memoryless"]) / np.sqrt(100)
        perfect = "" if r["perfect"] is None else f"{np.mean(r['perfect']):.3f}"
        cells = [env_id, f"{np.mean(r['random']):.3f}", f"{np.mean(r['memoryless']):.3f}", f"{noise:.3f}", perfect]
        lines.append("| " + " | ".join([*cells, r["how"]]) + " |")
    return "\n".join(lines) + "\n"


LEVEL_COLUMNS = ["memoryless level", "MMER against it"]


def read_levels(path: str) -> dict[str, tuple[float, float]]:
    """A levels.md table: each task's memoryless level and its MMER noise."""
    levels = {}
    with open(path) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("| popgym-") and len(cells) >= 4:
                levels[cells[0]] = float(cells[2]), float(cells[3])
    if not levels:
        raise SystemExit(f"error: --levels-file={path} holds no row '| popgym-<task> | random | memoryless | ...'")
    return levels


def against(mmer: float, level: float, noise: float) -> str:
    if mmer > noise:
        return f"clears it ({mmer - level:+.3f})"
    return f"within its noise ({mmer - level:+.3f})" if mmer >= level else f"below it ({mmer - level:+.3f})"


def annotate(path: str, levels: dict[str, tuple[float, float]]) -> int:
    """Mark every row of a report's table whose task has a level; returns how many rows it marked."""
    with open(path) as f:
        lines = f.read().split("\n")
    header, marked = None, 0
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells is None:
            header = None
            continue
        if "MMER" in cells and cells[0] == "config":
            header = cells if LEVEL_COLUMNS[0] in cells else cells + LEVEL_COLUMNS
            lines[i] = "| " + " | ".join(header) + " |"
            continue
        if header is None:
            continue
        if set(line) <= set("|- "):
            lines[i] = "|" + "---|" * len(header)
            continue
        cells = cells[: header.index(LEVEL_COLUMNS[0])] if len(cells) >= len(header) else cells
        env_id = cells[0].split("__")[0]
        if env_id in levels:
            level, noise = levels[env_id]
            mmer = float(cells[header.index("MMER")].split()[0])
            cells += [f"{level:.3f}", against(mmer, level, noise)]
            marked += 1
        else:
            cells += ["", ""]
        lines[i] = "| " + " | ".join(cells) + " |"
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return marked


def main(args: Args) -> str:
    if args.annotate:
        if args.levels_file is None:
            raise SystemExit("error: --annotate needs --levels-file (a levels.md this tool wrote)")
        marks = read_levels(args.levels_file)
        for path in args.annotate:
            print(f"{path}: {annotate(path, marks)} rows marked")
        return ""
    if args.episodes < 1:
        raise SystemExit(f"error: --episodes={args.episodes} must be at least 1")
    for env_id in args.env_ids:
        if env_id not in gym.registry:
            raise SystemExit(f"error: --env-ids: {env_id} is not a registered id (popgym-<Task><Easy|...>-v0)")
    rows = {}
    for env_id in args.env_ids:
        rows[env_id] = levels(env_id, args.episodes, args.seed)
        print(f"{env_id}: memoryless {np.mean(rows[env_id]['memoryless']):.3f}", file=sys.stderr, flush=True)
    text = table(rows, args.episodes)
    print(text)
    os.makedirs(args.out_dir, exist_ok=True)
    targets = [os.path.join(args.out_dir, "levels.md")] + ([os.path.join(RESULTS, "levels.md")] if args.results else [])
    for path in targets:
        with open(path, "w") as f:
            f.write(text)
    return text


if __name__ == "__main__":
    main(tyro.cli(Args))
