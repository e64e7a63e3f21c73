"""The levels a trivial policy reaches on POPGym's tasks, computed from the environments themselves.

    python benchmarks/levels.py                                  # the popgym-one preset's tasks, 400 + 400 episodes
    python benchmarks/levels.py --env-ids popgym-CountRecallEasy-v0 --episodes 100

A learning result means something only beside what a policy without the skill it claims reaches. For each task:
- random: actions drawn uniformly, the mean episode return.
- memoryless: the best policy that sees the step number t and the current observation and remembers nothing else.
  In the card tasks (RepeatPrevious, RepeatFirst, CountRecall, Autoencode, ...) an action changes neither what is
  shown next nor any later reward, so that policy answers, at every (t, observation), the action with the highest
  expected reward there. Two ways to its level:
  exact: where the env's family has a formula (`count_recall_exact`, `repeat_previous_exact`, ... below, chosen by
  the env's class, so Easy, Medium and Hard alike), its expected return from the env's deck, and the policy
  that reaches it (tests/test_benchmarks.py plays that policy in the env and checks the two agree);
  fitted: every action tried on a copy of the env at every step of `--episodes` episodes (the same cards dealt
  next), the best action of each (t, observation) kept, and that table scored on `--episodes` other episodes
  (seeds apart). A fitted table is a lower bound: with many (t, observation) pairs and few episodes each, it
  falls short of the best memoryless policy.
  The level is the higher of the two (the fitted one may land above the exact by the luck of its episodes). A
  memory that scores below it has learned the clock at most.
- perfect: every step's best action (the answer with everything remembered), the ceiling.
- In an env where actions change what follows (the CartPoles), no table is fitted: 'memoryless' is then the best of
  a few fixed reactive policies on the current observation [x, theta] (push toward the side the pole leans to,
  corrected by the cart's position), a floor under the true memoryless level, and says so.
MMER, the maximum over training of a 100-episode mean, sits above a policy's mean by chance alone: the table gives
the level plus two standard deviations of a 100-episode mean beside it (of the exact policy's returns or the fitted
table's, whichever spread wider: a learner at the level need not answer its chance steps the exact policy's way).

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
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import version
from math import comb
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import popgym  # noqa: F401  (registers popgym-<Task><Easy|Medium|Hard>-v0)
import tyro
from popgym.envs.autoencode import Autoencode
from popgym.envs.count_recall import CountRecall
from popgym.envs.repeat_first import RepeatFirst
from popgym.envs.repeat_previous import RepeatPrevious

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

# the popgym-one preset's tasks (benchmarks/run.py)
DEFAULT_TASKS = [f"popgym-{t}Easy-v0" for t in ("PositionOnlyCartPole", "RepeatPrevious", "RepeatFirst", "CountRecall")]
DEFAULT_TASKS += ["popgym-AutoencodeEasy-v0", "popgym-RepeatPreviousMedium-v0", "popgym-NoisyPositionOnlyCartPoleEasy-v0"]
DEFAULT_TASKS += ["popgym-RepeatFirstMedium-v0"]


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


class Exact(NamedTuple):
    """A memoryless level computed from the env's deck, and the policy that reaches it."""

    level: float
    """the policy's expected episode return"""
    answer: Callable[[int, tuple], int]
    """its action at step t (0 at reset) for the observation key(obs)"""
    how: str
    """the policy in words, for the table"""


def guess_another_card(suits: np.ndarray) -> tuple[float, Callable[[int, int], int]]:
    """The best guess of the suit of a card that is not the one on screen (suit s), drawn without replacement from
    the deck `suits` (each card's suit): a suit a with the most cards left, count[a] - [a == s], right with
    probability that over N - 1. For a full deck, any suit but s, right with probability (N/4)/(N - 1). Returns
    that probability averaged over s (as frequent as its cards) and the guess guess(t, s): the suits tied for best
    taken in turn with t, as good as any one of them, and an episode's return then hangs on no single suit."""
    counts = np.bincount(suits, minlength=4)
    left = counts[None, :] - np.eye(len(counts), dtype=int)  # (s on screen, a guessed): the cards of suit a left
    chance = counts / len(suits) @ left.max(axis=1) / (len(suits) - 1)
    tied = [np.flatnonzero(row == row.max()) for row in left]
    return float(chance), lambda t, s: int(tied[s][t % len(tied[s])])


def count_recall_exact(env: CountRecall) -> Exact:
    """CountRecall deals a value card v and a query card q at reset and at every step, from two decks of N cards
    shuffled apart; the action at step t (v_t, q_t on screen) is rewarded +-1/(N - 1) for the count of q_t's kind
    among the t + 1 value cards dealt so far, v_t included, over the N - 1 steps of an episode. Without memory:
    that count is [v == q] plus the count among the t other value cards dealt, a uniform draw of t from the
    N - 1 cards less the one on screen, of which K = cards of q's kind - [v == q] are of q's kind: hypergeometric
    (N - 1, K, t). Its mode is the best answer, right with probability p(t, K) = max_c C(K, c) C(N-1-K, t-c) /
    C(N-1, t), and the level is sum_t sum_{v,q} P(v) P(q) (2 p(t, K) - 1) / (N - 1), P(v) the share of v's kind
    in the deck (1/kinds in popgym's decks)."""
    n = env.value_deck.num_cards
    kinds = np.bincount(env.deck_idx_type)  # the cards of each kind (color, suit or rank) in a deck
    share = kinds / n
    best: dict[tuple[int, int], tuple[int, float]] = {}

    def likeliest(t: int, alike: int) -> tuple[int, float]:
        """The likeliest count of a kind with `alike` cards among N - 1 in t draws, and its probability."""
        if (t, alike) not in best:
            pmf = [comb(alike, c) * comb(n - 1 - alike, t - c) / comb(n - 1, t) for c in range(t + 1)]
            best[t, alike] = int(np.argmax(pmf)), max(pmf)
        return best[t, alike]

    def answer(t: int, obs: tuple) -> int:
        value, query = obs
        same = int(value == query)
        return same + likeliest(t, kinds[query] - same)[0]

    kind_pairs = [(v, q) for v in range(len(kinds)) for q in range(len(kinds))]
    expected = sum(
        share[v] * share[q] * (2 * likeliest(t, kinds[q] - (v == q))[1] - 1) for t in range(n - 1) for v, q in kind_pairs
    )
    how = "exact: [v == q] + the likeliest count among the t other cards dealt (hypergeometric)"
    return Exact(float(expected) / (n - 1), answer, how)


def repeat_previous_exact(env: RepeatPrevious) -> Exact | None:
    """RepeatPrevious deals N cards without replacement, one at reset and one a step; the action at step t is
    rewarded +-1/(N - k) for the suit of the card k - 1 steps back (the k-th last dealt), once k cards are dealt
    (t >= k - 1; the first k - 1 steps give 0), N - k rewarded steps in an episode of N - 1. With k = 1 that card
    is on screen: level 1. With k >= 2 it is another card than the one on screen, uniform over the N - 1 others
    whatever t: the best guess (guess_another_card) is right with probability p = (N/4)/(N - 1), and the level is
    2p - 1. k = 0 (the first card) is left to the fitted table."""
    k = env.k
    if k < 1:
        return None
    if k == 1:
        return Exact(1.0, lambda t, obs: obs[0], "exact: the suit on screen")
    chance, guess = guess_another_card(env.deck.suits_idx)
    return Exact(2 * chance - 1, lambda t, obs: guess(t, obs[0]), "exact: a suit other than the one on screen")


def repeat_first_exact(env: RepeatFirst) -> Exact:
    """RepeatFirst deals N cards without replacement, one at reset and one a step; the action at every one of the
    N - 1 steps is rewarded +-1/(N - 1) for the suit of the first card. At step 0 that card is on screen (right);
    later the card on screen is another one, and the first is uniform over the N - 1 others: the best guess
    (guess_another_card) is right with probability p = (N/4)/(N - 1). Level: (1 + (N - 2)(2p - 1)) / (N - 1)."""
    n = env.deck.num_cards
    chance, guess = guess_another_card(env.deck.suits_idx)

    def answer(t: int, obs: tuple) -> int:
        return obs[0] if t == 0 else guess(t, obs[0])

    return Exact((1 + (n - 2) * (2 * chance - 1)) / (n - 1), answer, "exact: the suit on screen at t = 0, else another")


def autoencode_exact(env: Autoencode) -> Exact:
    """Autoencode deals N cards, one at reset and one a step (watch: N - 1 steps rewarded 0), then asks for them
    backwards over N steps, each rewarded +-1/N. The first play step (t = N - 1) shows the last card dealt, the
    first asked for: right. Every later observation is (play, suit 0), no card; the card asked for is uniform over
    the deck: the suit with the most cards is right with probability 1/4. Level: (1 + (N - 1)(2/4 - 1)) / N."""
    n = env.deck.num_cards
    chance = float(np.bincount(env.deck.suits_idx).max() / n)
    guess = int(np.bincount(env.deck.suits_idx).argmax())

    def answer(t: int, obs: tuple) -> int:
        _, suit = obs
        return suit[0] if t == n - 1 else guess

    return Exact((1 + (n - 1) * (2 * chance - 1)) / n, answer, "exact: the suit on screen at the first recital, else chance")


# the families with an exact level; isinstance, so that Easy, Medium and Hard (subclasses) all find theirs
EXACT = {
    CountRecall: count_recall_exact,
    RepeatPrevious: repeat_previous_exact,
    RepeatFirst: repeat_first_exact,
    Autoencode: autoencode_exact,
}


def exact_level(env: gym.Env) -> Exact | None:
    """The exact memoryless level of a popgym env whose family (Easy, Medium, Hard alike) has a formula; else None."""
    for family, exact in EXACT.items():
        if isinstance(env.unwrapped, family):
            return exact(env.unwrapped)
    return None


def card_task_levels(env_id: str, episodes: int, seed: int) -> dict | None:
    """The fitted table's level and, where the env's family has one, the exact level: the higher of the two is the
    memoryless level (a fitted table can only fall short of the best memoryless policy, but its score on
    `episodes` episodes may land above the exact level by chance)."""
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
    fitted, exact_returns, random, perfect = [], [], [], []
    exact = exact_level(gym.make(env_id))
    for steps in scored:
        fitted.append(sum(rewards[best.get(state, int(np.argmax(by_step[state[0]])))] for state, rewards in steps))
        if exact is not None:
            exact_returns.append(sum(rewards[exact.answer(*state)] for state, rewards in steps))
        random.append(sum(rewards.mean() for _, rewards in steps))
        perfect.append(sum(rewards.max() for _, rewards in steps))
    row = dict(random=random, perfect=perfect, exact=None, fitted=float(np.mean(fitted)))
    row.update(memoryless=row["fitted"], spread=float(np.std(fitted)), how="fitted: the best action per (t, observation)")
    if exact is not None:
        row["exact"] = exact.level
        if exact.level >= row["fitted"]:
            row.update(memoryless=exact.level, how=exact.how)
        else:  # the fitted policy's expected return is at most the exact: its score is above it by chance
            row["how"] = "fitted, above the exact by its scored episodes' luck: the best action per (t, observation)"
        # the MMER noise: the wider spread of the two policies, both at the level or near it. The exact one answers
        # its chance steps one fixed way (Autoencode's few returns), where a learner at the level need not.
        row["spread"] = max(row["spread"], float(np.std(exact_returns)))
    return row


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
    return dict(
        random=random,
        perfect=None,
        exact=None,
        fitted=None,
        memoryless=float(np.mean(memoryless)),
        spread=float(np.std(memoryless)),
        how=how,
    )


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
        f"Random, fitted and perfect: mean episode returns over {episodes} episodes. 'exact': the best memoryless "
        "policy's expected return, computed from the env's deck where its family has a formula "
        f"({', '.join(family.__name__ for family in EXACT)}); 'fitted': a table of the best action per "
        f"(t, observation) fitted on {episodes} other episodes, a lower bound of the best memoryless policy that "
        "falls short of it where the pairs are many, and whose score can land above the exact only by the luck of "
        "the episodes it is scored on. 'memoryless' is the higher of the two (the 'memoryless policy' column says "
        "which). On the CartPoles, whose actions change what follows, no table is fitted: 'memoryless' "
        "there is the best of a few reactive policies, a floor under the memoryless level, not the level itself. "
        "'MMER noise': the memoryless level plus two standard deviations of a 100-episode mean of a memoryless "
        "policy's returns (the wider of the exact policy's and the fitted table's), what a maximum over training's "
        "100-episode windows can reach by chance alone.",
        "",
        "| task | random | memoryless | MMER noise | perfect | exact | fitted | memoryless policy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for env_id, r in rows.items():
        noise = r["memoryless"] + 2 * r["spread"] / np.sqrt(100)
        cells = [env_id, f"{np.mean(r['random']):.3f}", f"{r['memoryless']:.3f}", f"{noise:.3f}"]
        cells += ["" if r[name] is None else f"{np.mean(r[name]):.3f}" for name in ("perfect", "exact", "fitted")]
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
        print(f"{env_id}: memoryless {rows[env_id]['memoryless']:.3f}", file=sys.stderr, flush=True)
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
