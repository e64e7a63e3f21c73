"""PPO with a causal FSMN (feedforward sequential memory network) on CartPole: CleanRL's `ppo.py`, plus memory.

Every DFSMN block (Zhang et al. 2015, arXiv 1512.08301; arXiv 1803.05030) adds a learned per-channel weighted
sum of `--memory-order` past hidden states, `--memory-stride` steps apart, to the current one. Rollouts run it
step by step with a per-env memory; training replays each env's rollout in one pass from the memory saved at
its start, episode boundaries masked. POPGym's tasks with discrete actions run too (Morad et al. 2023, arXiv
2303.01859): observations one-hot, grid actions numbered.

    python ppo_fsmn_cartpole.py                     # CartPole-v1 on the CPU
    python ppo_fsmn_cartpole.py --mask-velocity     # observation [x, theta]: memory is required
    python ppo_fsmn_cartpole.py --env-id popgym-RepeatPreviousEasy-v0   # a POPGym memory task
    python ppo_fsmn_cartpole.py --env-id mypackage:MyTask-v0   # an env that importing mypackage registers
    python ppo_fsmn_cartpole.py --save-model        # then --resume or --eval-checkpoint runs/<run>/checkpoint.pt
    python ppo_fsmn_cartpole.py --final-eval-episodes 0   # no greedy episodes at the end (10 by default)
    python ppo_fsmn_cartpole.py --compile           # torch.compile the rollout step and the minibatch loss
Results: README.md and benchmarks/results/fsmn_cartpole.md."""

import atexit
import contextlib
import copy
import glob
import hashlib
import importlib
import math
import os
import random
import re
import shlex
import shutil
import signal
import sys
import time
import typing
import warnings
from dataclasses import asdict, dataclass, field, fields, replace

# Ctrl-C; SIGTERM, what a scheduler sends at a time limit or a preemption (as do `docker stop` and `kill`);
# SIGUSR1, what SLURM's --signal sends ahead of a time limit (Windows has none): each stops a run as Ctrl-C
# does
STOP_SIGNALS = tuple(getattr(signal, s) for s in ("SIGINT", "SIGTERM", "SIGUSR1") if hasattr(signal, s))


def interrupted(signum, frame):
    """A stop signal outside the training loop's own handler (loading, start-up, evaluation): one line, and
    the shell's status for the signal, 128 + its number (130 for Ctrl-C, 143 for SIGTERM)."""
    print("interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}")
    raise SystemExit(128 + signum)


if __name__ == "__main__":  # set before the libraries below load, which takes seconds
    for stop_signal in STOP_SIGNALS:
        signal.signal(stop_signal, interrupted)

import gymnasium as gym
import numpy as np
import popgym  # registers the POPGym ids, popgym-<Task><Easy|Medium|Hard>-v0, with gymnasium
import torch
import torch.nn as nn
import tyro
from popgym.core.env import POPGymEnv
from popgym.wrappers import DiscreteAction
from torch.distributions.categorical import Categorical
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

SCRIPT = "ppo_fsmn_cartpole"
# torch's default, before any run sets it: one per core, or OMP_NUM_THREADS
TORCH_THREADS = torch.get_num_threads()
PLAIN_LINE_SECONDS = 30.0  # with --no-progress, a plain line of progress at least this often


@dataclass
class Args:
    # TRY NOT TO MODIFY: experiment arguments
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, cuda will be used when available"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "cleanRL"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    wandb_group: str | None = None
    """the W&B group of the run (W&B groups and averages runs by it)"""
    wandb_tags: tuple[str, ...] = ()
    """W&B tags of the run"""
    capture_video: bool = False
    """whether to capture videos of the agent performances (check out `videos` folder)"""
    save_model: bool = False
    """whether to save checkpoints to `runs/{run_name}/checkpoint.pt`"""
    save_interval: int = 50
    """with --save-model, write a checkpoint every this many iterations (and at the end)"""
    keep_checkpoints: int = 3
    """with --save-model, also keep the newest this many checkpoints by step, checkpoint-<step>.pt"""
    resume: str | None = None
    """a checkpoint of this script to continue in its own run folder, with its flags unless given; `auto`:
    this run's newest (this env, exp name and seed, under runs/), or a new run where there is none"""
    eval_checkpoint: str | None = None
    """if set, do not train: play --eval-episodes episodes with this checkpoint, print the returns"""
    eval_episodes: int = 10
    """number of episodes played by the evaluation mode"""
    eval_deterministic: bool = True
    """the evaluation mode takes the most likely action (otherwise it samples)"""
    progress: bool = True
    """show a progress bar (`--no-progress` to turn it off)"""

    # ALGO LOGIC: algorithm arguments
    env_id: str = "CartPole-v1"
    """the id of the environment (Discrete actions): gymnasium's, POPGym's, or package:Env-v0 (imports package)"""
    mask_velocity: bool = False
    """hide the cart and pole velocities (CartPole only): the observation becomes [x, theta]"""
    total_timesteps: int = 150_000
    """total timesteps of the experiments"""
    learning_rate: float = 1e-3
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments"""
    num_steps: int = 64
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    anneal_clip: bool = True
    """anneal the surrogate clipping coefficient (and the value clip) linearly to 0 as well: late updates stay small"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches (formed over environments: it must divide num_envs)"""
    update_epochs: int = 10
    """the K epochs to update the policy"""
    norm_adv: bool = False
    """Toggles advantages normalization (off: with --norm-reward the advantages are already on a steady scale, and
    normalising a minibatch whose advantages are all near zero, a solved CartPole's, would blow its noise up)"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float = 0.0
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold (stop the epochs of an iteration early past it)"""
    norm_reward: bool = True
    """scale rewards by the running std of the discounted return (saved in checkpoints)"""
    reward_clip: float = 10.0
    """clip scaled rewards to [-reward_clip, reward_clip]"""
    context_steps: int = 0
    """training replays this many steps before each rollout too (at most --num-steps), with gradient through
    the memory, from the memory of that earlier step: an episode begun that far back is trained from its start"""

    # ALGO LOGIC: network arguments
    hidden_dim: int = 64
    """width of every FSMN block (--separate-critic --split-hidden: half the policy's, half the critic's)"""
    num_blocks: int = 2
    """number of FSMN blocks"""
    memory_order: int = 4
    """past hidden states each block weighs, --memory-stride steps apart (0: the memoryless ablation)"""
    memory_stride: int = 1
    """look-back stride S of the taps (DFSMN, arXiv 1803.05030): lags 0, S, ..., N*S; the blocks reach blocks x N x S steps"""
    long_memory: typing.Literal["none", "decay", "gate"] = "none"
    """an episode-long memory in each block: none, decay (learned per-channel decays) or gate (input-gated)"""
    memory_decay: bool = False
    """the older spelling of --long-memory decay"""
    memory_gate: bool = False
    """the older spelling of --long-memory gate"""
    recall_lags: int = 0
    """an auxiliary loss for the memory: every step's features predict the network's input 1 to this many steps
    back in the same episode (0: none); it asks the memory to keep what it saw before any reward asks for it"""
    recall_coef: float = 1.0
    """the weight of --recall-lags's loss (a squared error, averaged over the lags, steps and input dimensions)"""
    prev_action: bool = True
    """give the network the previous action (one-hot, zero at an episode start) beside the observation"""
    norm_obs: bool = True
    """normalise observations by their running mean and std (saved in checkpoints, frozen in evaluation)"""
    norm_obs_preserving: bool = True
    """each update of --norm-obs's statistics leaves the policy's outputs as they were: its embedding's weights
    and bias absorb the new mean and std (Pop-Art's "preserving outputs precisely", arXiv 1602.07714, done on
    the inputs); a --separate-critic reads the new statistics as they are"""
    separate_critic: bool = True
    """the critic on an embedding and FSMN blocks of its own, beside the policy's, as CleanRL's ppo.py and
    SB3's RecurrentPPO (enable_critic_lstm) keep theirs apart (False: one trunk shared by both heads)"""
    split_hidden: bool = True
    """with --separate-critic, the policy and the critic take half of --hidden-dim's channels each (False: each
    takes --hidden-dim, in a trunk twice as wide)"""
    # a checkpoint saved before these flags existed holds the network they build when off (--resume, evaluation);
    # one saved before --split-hidden, a separate critic of --hidden-dim channels beside the policy's
    OLD_CHECKPOINT_FLAGS: typing.ClassVar[dict] = dict(separate_critic=False, norm_obs_preserving=False, split_hidden=False)

    # ENGINEERING: evaluation at the end of training
    final_eval_episodes: int = 10
    """at the end of training, play this many episodes with the policy as it stands, as --eval-checkpoint
    would, and print their mean beside the training mean, whose episodes sample their actions (0: none)"""

    # ENGINEERING: speed and threads
    compile: bool = False
    """compile the network with torch.compile (opt-in: compiling takes time at the start)"""
    threads: int = 1
    """CPU threads of torch (0: the cores that other processes leave free, re-checked every iteration)"""

    # to be filled in runtime
    batch_size: int = field(init=False)
    """the batch size (computed in runtime)"""
    minibatch_size: int = field(init=False)
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = field(init=False)
    """the number of iterations (computed in runtime)"""

    def __post_init__(self):
        self.batch_size = self.num_envs * self.num_steps
        self.minibatch_size = self.batch_size // max(self.num_minibatches, 1)
        self.num_iterations = self.total_timesteps // max(self.batch_size, 1)
        older = "decay" if self.memory_decay else "gate" if self.memory_gate else None  # older spellings
        halves = "at least 1, and even with --separate-critic --split-hidden (a half for each)"
        parts = 1 + (self.separate_critic and self.split_hidden)  # the parts --hidden-dim is split in
        # the flags every script has are checked below the banner (check_flags), then these rows, this
        # script's own (flag, accepted, what it must be): one line names the first refused, before anything
        # is written
        check_flags(
            self,
            (
                "num_minibatches",
                self.num_envs % max(self.num_minibatches, 1) == 0,
                f"a divisor of --num-envs={self.num_envs}",
            ),
            ("final_eval_episodes", self.final_eval_episodes >= 0, "at least 0 (0: none)"),
            ("update_epochs", self.update_epochs >= 1, "at least 1"),
            ("reward_clip", 0 < self.reward_clip < math.inf, "a positive number"),
            ("context_steps", 0 <= self.context_steps <= self.num_steps, "in [0, --num-steps]"),
            ("hidden_dim", self.hidden_dim >= 1 and self.hidden_dim % parts == 0, halves),
            ("num_blocks", self.num_blocks >= 1, "at least 1"),
            ("memory_order", self.memory_order >= 0, "at least 0"),
            ("memory_stride", self.memory_stride >= 1, "at least 1"),
            ("recall_lags", self.recall_lags >= 0, "at least 0"),
            ("recall_coef", 0 <= self.recall_coef < math.inf, "a number >= 0"),
            ("long_memory", self.long_memory in ("none", "decay", "gate"), "one of none, decay, gate"),
            ("memory_decay", not (self.memory_decay and self.memory_gate), "False with --memory-gate (it replaces it)"),
            ("long_memory", older is None or self.long_memory in ("none", older), f"{older} with --memory-{older}"),
        )
        self.long_memory = older or self.long_memory


def make_env(env_id: str, idx: int, capture_video: bool, video_path: str, mask_velocity: bool):
    """env_id: as gymnasium.make takes it, package:Env-v0 included (it imports package, which registers Env-v0).
    video_path: the videos' folder and the start of their names, videos/<run_name>/rl-video."""

    def thunk():
        if capture_video and idx == 0:
            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame renders off-screen: no window needed
            env = gym.make(env_id, render_mode="rgb_array")
            with warnings.catch_warnings():  # a resumed run adds videos of other names to its folder
                warnings.filterwarnings("ignore", message=".*Overwriting existing videos")
                folder, prefix = os.path.split(video_path)
                env = gym.wrappers.RecordVideo(env, folder, name_prefix=prefix)
        else:
            env = gym.make(env_id)
        if mask_velocity:  # [x, x_dot, theta, theta_dot] -> [x, theta], the RL Zoo's "CartPoleNoVel"
            space = gym.spaces.Box(env.observation_space.low[[0, 2]], env.observation_space.high[[0, 2]], dtype=np.float32)
            env = gym.wrappers.TransformObservation(env, lambda obs: obs[[0, 2]], observation_space=space)
        # POPGym's Battleship, MineSweeper shoot at a grid cell: MultiDiscrete([8, 8]) -> Discrete(64).
        # popgym's wrapper takes its own env class, so it wraps the env itself (`make`'s passive checker
        # is dropped; these tasks draw no frames, so no video is lost)
        if isinstance(env.action_space, gym.spaces.MultiDiscrete):
            env = DiscreteAction(env.unwrapped)
        kept, left_out = observation_parts(env.observation_space)
        if left_out:  # a mission string beside a grid, say: the network sees the rest (check_env_args says so)
            env = gym.wrappers.FilterObservation(env, kept)
        observations = env.observation_space
        flat = isinstance(observations, gym.spaces.Box) and len(observations.shape) == 1
        if not flat:  # POPGym's cards, counts, grids
            env = gym.wrappers.FlattenObservation(env)  # Discrete and MultiDiscrete parts one-hot, as int64
            env = gym.wrappers.DtypeObservation(env, np.float32)
        return env

    return thunk


def can_flatten(space: gym.spaces.Space) -> bool:
    """gymnasium's `is_np_flattenable`; False where a space of a package's own does not say, as MiniGrid's mission
    string (a plain Space[str]) does not."""
    try:
        return space.is_np_flattenable
    except NotImplementedError:
        return False


def observation_parts(observations: gym.spaces.Space) -> tuple[list, list]:
    """A Dict's keys or a Tuple's indices: those of the parts gymnasium can flatten, and those of the others,
    which make_env leaves out. One level: a Dict or Tuple inside that holds such a part is left out whole. Any
    other space has no parts: ([], [])."""
    keys = []
    if isinstance(observations, gym.spaces.Dict):
        keys = list(observations.keys())
    elif isinstance(observations, gym.spaces.Tuple):
        keys = list(range(len(observations)))
    flattenable = {key: can_flatten(observations[key]) for key in keys}
    return [key for key in keys if flattenable[key]], [key for key in keys if not flattenable[key]]


def check_env_args(env_id: str, mask_velocity: bool, capture_video: bool = False) -> None:
    """One clear line for an env this script cannot run: an unknown id, a package that cannot be imported,
    actions neither Discrete nor POPGym's MultiDiscrete, observations with no part gymnasium can flatten, a video
    of an env that draws no frames. One line more names the observation's parts left out (observation_parts)."""
    # gymnasium's package:Env-v0: gymnasium.make imports package (importlib, as here), which registers Env-v0;
    # imported here first, so that a package that fails to import is one line, not make's traceback
    module, colon, name = env_id.rpartition(":")
    if colon:
        try:
            importlib.import_module(module)
        except Exception as e:  # missing, or failing in its own code
            first_line = str(e).partition("\n")[0]
            why = f"cannot import {module} ({type(e).__name__}: {first_line})"
            accepted = "a gymnasium id, or package:Env-v0 where importing package registers Env-v0"
            raise SystemExit(f"error: --env-id={env_id}: {why}; it takes {accepted}") from None
    if name not in gym.registry:
        if colon:
            why = f"not an id that importing {module} registers (see gymnasium.pprint_registry())"
        elif name.startswith("popgym-Labyrinth") and not popgym.envs.has_mazelib():
            why = "a POPGym maze, registered only where the package mazelib is installed"
        elif name.startswith("popgym-"):
            why = "not a POPGym id, popgym-<Task><Easy|Medium|Hard>-v0 (see gymnasium.pprint_registry())"
        else:
            registered = "not a registered gymnasium id (see gymnasium.pprint_registry())"
            why = f"{registered}; one that a package registers on import is spelled package:{name}"
        raise SystemExit(f"error: --env-id={env_id} is {why}")
    env = gym.make(env_id)
    env.close()
    actions, observations = env.action_space, env.observation_space
    popgym_cells = isinstance(actions, gym.spaces.MultiDiscrete) and isinstance(env.unwrapped, POPGymEnv)
    if not (isinstance(actions, gym.spaces.Discrete) or popgym_cells):
        raise SystemExit(
            f"error: --env-id={env_id} has {actions} actions; "
            f"{SCRIPT}.py needs Discrete actions or POPGym's MultiDiscrete ones (Box: ppo_continuous.py)"
        )
    kept, left_out = observation_parts(observations)
    if not (can_flatten(observations) or kept):
        raise SystemExit(
            f"error: --env-id={env_id} has {observations} observations; {SCRIPT}.py needs one gymnasium can "
            "flatten (Box, Discrete, MultiDiscrete, Tuple, Dict), or a Dict or Tuple with such a part"
        )
    if mask_velocity and not name.startswith("CartPole"):
        raise SystemExit(f"error: --mask-velocity applies to CartPole ids only, not --env-id={env_id}")
    modes = env.metadata.get("render_modes", [])
    if capture_video and "rgb_array" not in modes:
        raise SystemExit(f"error: --capture-video needs frames; --env-id={env_id} draws none (modes: {modes})")
    if left_out:
        parts = ", ".join(f"{key!r} ({observations[key]})" for key in left_out)
        several = len(left_out) > 1
        left = f"observation part{'s' * several} {parts} left out"
        print(f"note: --env-id={env_id}: {left}: gymnasium cannot flatten {'them' if several else 'it'}")


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class RunningNorm(nn.Module):
    """Normalisation by a running mean and variance (Chan et al.'s parallel update, as SB3's VecNormalize),
    clipped to +-clip. Checkpoints carry its buffers; evaluation never calls `update`: frozen. Its std,
    sqrt(var + epsilon), is kept beside them, set where the variance changes (the rollout's step reads it)."""

    def __init__(self, dim: int, clip: float = 10.0, epsilon: float = 1e-8):
        super().__init__()
        self.clip, self.epsilon = clip, epsilon
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))
        self.register_buffer("count", torch.tensor(1e-4))
        self.register_buffer("std", torch.sqrt(self.var + epsilon), persistent=False)
        self.register_load_state_dict_post_hook(set_std_after_loading)

    @torch.no_grad()
    def set_std(self) -> None:
        self.std.copy_(torch.sqrt(self.var + self.epsilon))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """x: (B, dim), a batch of raw observations."""
        batch_mean, batch_var, batch_count = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        delta, total = batch_mean - self.mean, self.count + batch_count
        self.mean += delta * batch_count / total
        var = self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total
        self.var.copy_(var / total)
        self.count.copy_(total)
        self.set_std()

    def bound(self) -> typing.Callable:
        """forward as a function over the statistics this module keeps (updated in place, they reach it)."""
        mean, std, clip = self.mean, self.std, self.clip
        return lambda x: torch.clamp((x - mean) / std, -clip, clip)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bound()(x)


def set_std_after_loading(module: RunningNorm, keys) -> None:
    """load_state_dict's post hook: the std kept beside the statistics it loaded."""
    module.set_std()


class RewardScale(nn.Module):
    """--norm-reward: rewards divided by the running std of the discounted return, not of the reward (Engstrom et
    al. 2020, arXiv 2005.12729; gymnasium's NormalizeReward), then clipped to +-clip. The statistics are buffers,
    saved in checkpoints; the running episodes' discounted returns go on from one rollout to the next."""

    def __init__(self, gamma: float, clip: float):
        super().__init__()
        self.gamma, self.clip, self.discounted = gamma, clip, None
        self.returns = RunningNorm(1)

    def forward(self, rewards: np.ndarray, dones: np.ndarray) -> np.ndarray:
        """rewards, dones: (T, B), a rollout's; its discounted returns join the statistics first."""
        self.discounted = np.zeros(rewards.shape[1]) if self.discounted is None else self.discounted
        returns = np.zeros_like(rewards)
        for t in range(len(rewards)):
            self.discounted = self.discounted * self.gamma + rewards[t]
            returns[t] = self.discounted
            self.discounted = self.discounted * ~dones[t]  # a new episode's return starts from 0
        self.returns.update(torch.as_tensor(returns, device=self.returns.mean.device).reshape(-1, 1))
        std = np.float32(self.returns.std.item())
        return np.clip(rewards / std, -self.clip, self.clip)


def decayed_sum(u: torch.Tensor, e: torch.Tensor, decay: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """e_t = a_t * e_{t-1} + u_t over a sequence from e_{-1} = e, where a_t = decay (decay_t, per step), or 0 at
    an episode start. A linear recurrence, run as a parallel prefix scan (Hillis & Steele 1986) in log2(T) passes
    over the whole sequence instead of T steps: products of decays only, no exponent that could overflow.
    u: (T, B, H); e: (B, H); decay: (H,) or (T, B, H), in [0, 1]; starts: (T, B) bool. Returns e_t, (T, B, H)."""
    a = decay * ~starts.unsqueeze(-1)  # (T, B, H): a_t, 0 where an episode starts
    u = torch.cat([u[:1] + a[:1] * e, u[1:]])  # e_{-1} enters through step 0
    # after the pass of lag k: u_t = sum over s in (t-2k, t] of a_{s+1}...a_t u_s (s >= 0),
    # and a_t = a_{t-2k+1}...a_t
    #   lag 1:  u_t += a_t u_{t-1}                 a_t *= a_{t-1}
    #   lag 2:  u_t += (a_t a_{t-1}) u_{t-2}       a_t *= a_{t-2}      then lag 4, 8, ... up to T
    lag = 1
    while lag < len(u):
        u = torch.cat([u[:lag], torch.addcmul(u[lag:], a[lag:], u[:-lag])])
        a = torch.cat([a[:lag], a[lag:] * a[:-lag]])
        lag *= 2
    return u


def keep_blocks(layer: nn.Linear, rows: torch.Tensor, cols: torch.Tensor | None, std=2**0.5) -> nn.Linear:
    """--separate-critic's networks side by side in one layer: output i reads input j only where rows[i] ==
    cols[j], their parts (cols None: every input, shared by the parts). Each part's block starts as layer_init
    would start a layer of its own; the weights between parts start at zero and stay zero (their gradient is
    masked, so Adam never moves them). A layer whose channels are all in one part is left as it is."""
    if len(rows.unique()) == 1 and (cols is None or len(cols.unique()) == 1):
        return layer
    with torch.no_grad():
        layer.weight.zero_()
        for part in rows.unique():
            r = (rows == part).nonzero()  # (n, 1): this part's outputs, and below its inputs (m,)
            c = torch.arange(layer.in_features) if cols is None else (cols == part).nonzero()[:, 0]
            layer.weight[r, c] = nn.init.orthogonal_(torch.empty(len(r), len(c)), std)
    if cols is not None:  # (out, in): True where the weight is kept
        layer.register_buffer("kept", rows[:, None] == cols, persistent=False)
        layer.weight.register_hook(lambda grad: grad * layer.kept)
    return layer


class PartLayerNorm(nn.LayerNorm):
    """LayerNorm on each of `parts` equal parts of the last dimension (--separate-critic), with an affine map of
    all of it: layer_norm on (..., parts, C/parts) (GroupNorm, the same map, is slower: sps_fsmn_cartpole.md)."""

    def __init__(self, parts: int, dim: int):
        super().__init__(dim)
        self.parts = parts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return part_layer_norm(x, self.parts, self.weight, self.bias, self.eps)


def part_layer_norm(x: torch.Tensor, parts: int, weight: torch.Tensor, bias: torch.Tensor, eps: float):
    split = x.unflatten(-1, (parts, -1))  # (..., parts, C/parts)
    normalised = nn.functional.layer_norm(split, split.shape[-1:], eps=eps)
    return torch.addcmul(bias, normalised.flatten(-2), weight)


def bound_norm(norm: nn.LayerNorm) -> typing.Callable:
    """norm's forward (a LayerNorm's, a PartLayerNorm's) over its weights, read once: FSMNBlock.bound_step."""
    weight, bias, eps, parts = norm.weight, norm.bias, norm.eps, getattr(norm, "parts", 1)
    if parts == 1:
        return lambda x: nn.functional.layer_norm(x, weight.shape, weight, bias, eps)
    return lambda x: part_layer_norm(x, parts, weight, bias, eps)


class FSMNBlock(nn.Module):
    """One DFSMN block, run one step at a time (with a memory of past steps) or over a whole sequence:

        h_t = tanh(W_in x_t)                        linear projection of the input
        m_t = h_t + sum_{i=0..N} a_i * h_{t-iS}     memory: causal depthwise conv, 0 before the episode
            [ + d * e_t,  e_t = lambda * e_{t-1} + g * h_t ]    --long-memory decay; e = 0 before the episode
        y_t = LayerNorm(x_t + W_out m_t)            output projection, skip, normalisation
            [ + d * e_t,  e_t = f_t * e_{t-1} + i_t * v_t ]     --long-memory gate; e = 0 before the episode

    S is DFSMN's look-back stride (arXiv 1803.05030): N taps reach N*S steps back. e, per channel, sums the
    whole episode with a learned decay lambda in (0, 1) (FFM, Morad et al. 2023, arXiv 2310.04128). With the
    gate the input decides, step by step, how much e forgets and what it writes: f_t = sigmoid(W_f x_t +
    b_f), i_t = sigmoid(W_i x_t + b_i), v_t = W_v x_t (minGRU's and HGRN's input-dependent decay, Feng et al.
    2024, arXiv 2410.01201; Qin et al. 2023, arXiv 2311.04823), still a linear recurrence: one scan over a
    sequence. Its e is read after the normalisation: inside it, a growing e would be divided by its own size, and
    a count would lose what it counts (CountRecall's answer; benchmarks/results/popgym.md). The taps and d start
    at zero: the block starts memoryless and learns how much of the past to use. With parts > 1 it is that
    many blocks side by side, each on its own dim/parts channels (keep_blocks; the LayerNorm is per part)."""

    def __init__(self, dim: int, memory_order: int, memory_stride: int = 1, long_memory: str = "none", parts=1):
        super().__init__()
        self.memory_order, self.memory_stride, self.long_memory = memory_order, memory_stride, long_memory
        part = torch.arange(parts).repeat_interleave(dim // parts)  # channel c's part (keep_blocks)
        self.proj_in = keep_blocks(layer_init(nn.Linear(dim, dim)), part, part)
        self.taps = nn.Parameter(torch.zeros(memory_order + 1, dim))  # (N+1, H): taps[i] weights h_{t-iS}
        if long_memory == "decay":
            # lambda = sigmoid(decay_logits), always in (0, 1); horizons 1/(1-lambda) from 2 to 200 steps,
            # log-uniform over the channels: lambda = 1 - 1/horizon, sigmoid's inverse log(horizon - 1)
            horizons = torch.logspace(math.log10(2), math.log10(200), dim // parts).repeat(parts)
            self.decay_logits = nn.Parameter(torch.log(horizons - 1))
            self.decay_weights = nn.Parameter(torch.zeros(dim))  # (H,): d
        if long_memory == "gate":
            # W_f, W_i, W_v in one projection (3H, H). W_f starts at zero, so the forget gate starts as fixed
            # decays whose horizons 1/(1-f) span 2 to 1000 steps (a whole episode), log-uniform over the channels
            self.gate = keep_blocks(layer_init(nn.Linear(dim, 3 * dim)), part.repeat(3), part)
            horizons = torch.logspace(math.log10(2), math.log10(1000), dim // parts).repeat(parts)
            with torch.no_grad():
                self.gate.weight[:dim] = 0.0
                self.gate.bias[:dim] = torch.log(horizons - 1)
            self.gate_weights = nn.Parameter(torch.zeros(dim))  # (H,): d
        self.proj_out = keep_blocks(layer_init(nn.Linear(dim, dim)), part, part)
        self.norm = nn.LayerNorm(dim) if parts == 1 else PartLayerNorm(parts, dim)

    def decay(self) -> tuple[torch.Tensor, torch.Tensor]:
        """lambda and the input gain g, (H,) each. g = sqrt(1 - lambda^2) is LRU's normalisation (Orvieto et
        al. 2023, arXiv 2303.06349): e keeps the scale of h for uncorrelated inputs at every horizon, where a
        plain sum (g = 1) would grow a steady input 1/(1-lambda)-fold (up to 200) and an average (g = 1-lambda)
        shrink one step's trace as much."""
        # 1 - lambda^2 = (1 - lambda)(1 + lambda), with 1 - lambda = sigmoid(-logits) exact near lambda = 1
        gain = torch.sqrt(torch.sigmoid(-self.decay_logits) * (1 + torch.sigmoid(self.decay_logits)))
        return torch.sigmoid(self.decay_logits), gain

    def gates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The gate's forget gate f_t and write i_t * v_t, (..., H) each, from x (..., H)."""
        forget, write, value = self.gate(x).chunk(3, dim=-1)
        return torch.sigmoid(forget), torch.sigmoid(write) * value

    def step(self, x: torch.Tensor, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (B, H); memory: (B, N*S [+1], H) with memory[:, j] = h_{t-1-j} for j < N*S and, with a
        --long-memory, memory[:, N*S] = e_{t-1}; already zeroed at episode starts."""
        return self.bound_step()(x, memory)

    def bound_step(self) -> typing.Callable:
        """`step` as a function over this block's weights, read here once (`step` binds it at every call: the
        math is written once). A rollout binds it once, and its steps make no nn.Module calls or attribute
        lookups (but a --long-memory's decays and gates), which cost more than a step's arithmetic on a few
        envs (sps_fsmn_cartpole.md). It reads the parameters themselves: an update in place (Adam's,
        load_state_dict's) reaches it."""
        stride, long_memory, taps = self.memory_stride, self.long_memory, self.taps
        span = self.memory_order * stride  # the oldest tap's lag
        w_in, b_in, w_out, b_out = self.proj_in.weight, self.proj_in.bias, self.proj_out.weight, self.proj_out.bias
        norm = bound_norm(self.norm)

        def step(x: torch.Tensor, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = torch.tanh(nn.functional.linear(x, w_in, b_in))  # (B, H)
            window = torch.cat([h.unsqueeze(1), memory[:, :span]], dim=1)  # (B, N*S+1, H): h_t ... h_{t-N*S}
            m = h + (taps * window[:, ::stride]).sum(dim=1)  # (B, H): taps on h_t, h_{t-S}, ..., h_{t-N*S}
            new_memory = window[:, :-1]  # the memory drops h_{t-N*S}
            if long_memory == "decay":
                decay, gain = self.decay()
                e = decay * memory[:, span] + gain * h  # (B, H)
                m = m + self.decay_weights * e
                new_memory = torch.cat([new_memory, e.unsqueeze(1)], dim=1)  # (B, N*S+1, H)
            y = norm(x + nn.functional.linear(m, w_out, b_out))
            if long_memory == "gate":
                forget, write = self.gates(x)  # (B, H) each
                e = forget * memory[:, span] + write  # (B, H)
                y = y + self.gate_weights * e  # after the normalisation (see the class's docstring)
                new_memory = torch.cat([new_memory, e.unsqueeze(1)], dim=1)  # (B, N*S+1, H)
            return y, new_memory

        return step

    def sequence(
        self, x: torch.Tensor, memory: torch.Tensor, same_episode: torch.Tensor, episode_starts: torch.Tensor
    ) -> torch.Tensor:
        """x: (T, B, H); memory (B, N*S [+1], H) at the sequence start; same_episode (N+1, T, B, 1): see
        Agent; episode_starts (T, B) bool."""
        stride, span = self.memory_stride, self.memory_order * self.memory_stride  # span: oldest tap's lag
        # h (T, B, H) is read back from the history (N*S+T, B, H), oldest first: concatenated as a tensor of
        # its own and then used again, it is miscompiled by torch 2.13's inductor under no_grad (tested)
        history = torch.cat([memory[:, :span].flip(1).transpose(0, 1), torch.tanh(self.proj_in(x))], dim=0)
        h = history[span:]  # h_t = tanh(W_in x_t)
        # stacked lag first, as unfold's view (T, B, H, N+1) is slower on the CPU (benchmarks/results/fsmn_cartpole.md)
        # lag k of N+1 holds h_{t-(N-k)S}
        lagged = [history[k * stride : k * stride + len(x)] for k in range(self.memory_order + 1)]
        windows = torch.stack(lagged)  # (N+1, T, B, H)
        m = h + (windows * same_episode * self.taps.flip(0)[:, None, None]).sum(0)  # (T, B, H), taps reversed
        if self.long_memory == "decay":
            decay, gain = self.decay()
            m = m + self.decay_weights * decayed_sum(gain * h, memory[:, span], decay, episode_starts)
        y = self.norm(x + self.proj_out(m))
        if self.long_memory == "gate":
            forget, write = self.gates(x)  # (T, B, H) each: a decay per step
            y = y + self.gate_weights * decayed_sum(write, memory[:, span], forget, episode_starts)
        return y


class Agent(nn.Module):
    """An observation embedding and `num_blocks` FSMN blocks, a policy head (std 0.01) and a value head
    (std 1) on them; with --separate-critic two such trunks side by side in H = --hidden-dim channels (twice
    that with --no-split-hidden), the first half the policy's and the second the critic's (keep_blocks). Its
    memory: every block's last N*S hidden states, (L, B, N*S, H) (N*S = 0: none), and with a --long-memory one
    more slot at the end for every block's e: (L, B, N*S+1, H)."""

    def __init__(self, obs_dim: int, n_actions: int, args: Args):
        super().__init__()
        parts = 1 + args.separate_critic
        width = args.hidden_dim if args.split_hidden else args.hidden_dim * parts
        # n_actions a Python int: torch.compile takes a numpy int for a tensor
        self.memory_order, self.width, self.n_actions = args.memory_order, width, int(n_actions)
        self.memory_stride, self.long_memory = args.memory_stride, args.long_memory
        self.prev_action, self.norm_obs_preserving = args.prev_action, args.norm_obs_preserving
        part = torch.arange(parts).repeat_interleave(width // parts)  # channel c's part: 0 policy, 1 critic
        self.register_buffer("policy_channels", part == 0, persistent=False)
        one_hot_rows = torch.cat([torch.eye(n_actions), torch.zeros(1, n_actions)])  # (A + 1, A)
        self.register_buffer("one_hot_rows", one_hot_rows, persistent=False)
        embed = layer_init(nn.Linear(obs_dim + n_actions * args.prev_action, width))
        self.embed = keep_blocks(embed, part, None)  # every part reads the whole input
        block = dict(memory_order=args.memory_order, memory_stride=args.memory_stride, long_memory=args.long_memory)
        self.blocks = nn.ModuleList(FSMNBlock(width, **block, parts=parts) for _ in range(args.num_blocks))
        policy, critic = part.new_zeros(n_actions), part[-1:]  # the parts the heads read
        self.actor = keep_blocks(layer_init(nn.Linear(width, n_actions), std=0.01), policy, part, std=0.01)
        self.critic = keep_blocks(layer_init(nn.Linear(width, 1), std=1.0), critic, part, std=1.0)
        self.obs_norm = RunningNorm(obs_dim) if args.norm_obs else nn.Identity()
        self.reward_scale = RewardScale(args.gamma, args.reward_clip) if args.norm_reward else None
        # a checkpoint from before --norm-reward has no reward statistics: they start afresh
        self.register_load_state_dict_post_hook(keep_missing_statistics)
        # --recall-lags's head: the input 1..K steps back, (K * input_dim), from the features; not in the policy
        self.recall_lags, input_dim = args.recall_lags, obs_dim + n_actions * args.prev_action
        self.recall = None
        if args.recall_lags:
            recall = layer_init(nn.Linear(width, args.recall_lags * input_dim))
            self.recall = keep_blocks(recall, part.new_zeros(recall.out_features), part)  # the policy's part

    def observe(self, obs: torch.Tensor, prev_action: torch.Tensor, episode_starts: torch.Tensor) -> torch.Tensor:
        """The network's input (..., obs_dim [+ n_actions]): the normalised observation and, with
        --prev-action, the previous action one-hot, zero at an episode start. obs: (..., obs_dim) raw;
        prev_action, episode_starts: (...)."""
        return self.bound_observe()(obs, prev_action, episode_starts)

    def bound_observe(self) -> typing.Callable:
        """`observe` as a function over the statistics, read here once (FSMNBlock.bound_step says why)."""
        normalise = self.obs_norm.bound() if isinstance(self.obs_norm, RunningNorm) else self.obs_norm
        rows, n_actions, prev_action_input = self.one_hot_rows, self.n_actions, self.prev_action

        def observe(obs: torch.Tensor, prev_action: torch.Tensor, episode_starts: torch.Tensor):
            x = normalise(obs)
            if not prev_action_input:
                return x
            # one_hot's rows, or the zero row below them at a start: one index (faster: sps_fsmn_cartpole.md)
            return torch.cat([x, rows[prev_action.masked_fill(episode_starts, n_actions)]], dim=-1)

        return observe

    @torch.no_grad()
    def update_obs_norm(self, obs: torch.Tensor) -> None:
        """--norm-obs's statistics take in obs (B, obs_dim), raw. With --norm-obs-preserving the policy's
        embedding absorbs the change, so that its embedding of every observation is what it was (clip aside):
        W' = W diag(s'/s) and b' = b + W (m' - m)/s, for the old and new means m, m' and stds s, s'; with
        --separate-critic the critic's reads the new statistics as they are (benchmarks/results/fsmn_cartpole.md)."""
        norm, d, rows = self.obs_norm, self.obs_norm.mean.shape[0], self.policy_channels
        mean, std = norm.mean.clone(), norm.std.clone()
        norm.update(obs)
        if self.norm_obs_preserving:
            self.embed.bias[rows] += self.embed.weight[rows, :d] @ ((norm.mean - mean) / std)
            self.embed.weight[rows, :d] *= norm.std / std

    def initial_memory(self, num_envs: int, device: torch.device) -> torch.Tensor:
        # N*S, the oldest tap's lag [+1: e]
        slots = self.memory_order * self.memory_stride + (self.long_memory != "none")
        return torch.zeros(len(self.blocks), num_envs, slots, self.width, device=device)  # (L, B, slots, H)

    def get_states(self, x, memory, episode_starts):
        """One step for every env. x: (B, input_dim) from `observe`; memory: (L, B, N*S [+1], H);
        episode_starts: (B,). Returns the features (B, H) and the next memory."""
        return self.bound_states()(x, memory, episode_starts)

    def bound_states(self) -> typing.Callable:
        """`get_states` as a function over the weights, read here once (FSMNBlock.bound_step says why)."""
        w_embed, b_embed, blocks = self.embed.weight, self.embed.bias, [block.bound_step() for block in self.blocks]

        def get_states(x: torch.Tensor, memory: torch.Tensor, episode_starts: torch.Tensor) -> tuple:
            memory = memory.masked_fill(episode_starts.view(1, -1, 1, 1), 0.0)  # MEMORY RESET at starts
            x, new_memory = torch.tanh(nn.functional.linear(x, w_embed, b_embed)), []
            for block_step, block_memory in zip(blocks, memory):
                x, block_memory = block_step(x, block_memory)
                new_memory.append(block_memory)
            return x, torch.stack(new_memory)

        return get_states

    def get_value(self, x, memory, episode_starts):
        hidden, _ = self.get_states(x, memory, episode_starts)
        return self.critic(hidden).squeeze(-1)

    def get_action_and_value(self, x, memory, episode_starts, action=None):
        hidden, memory = self.get_states(x, memory, episode_starts)
        logits, value = self.actor(hidden), self.critic(hidden).squeeze(-1)
        if action is None:  # a sample and its log-probability, without the entropy
            return *sample_categorical(logits), None, value, memory
        return action, *categorical_log_prob_entropy(logits, action), value, memory

    def bound_rollout_step(self) -> typing.Callable:
        """The rollout's step, `observe` then `get_action_and_value`'s sample, as one function over the
        weights and statistics, read here once (FSMNBlock.bound_step says why): updates in place reach it;
        bind it after the agent's last move to a device. (obs, prev_action, episode_starts, memory, gumbel)
        -> (action, its log-probability, value, next memory); gumbel: the step's noise for sample_categorical."""
        observe, get_states = self.bound_observe(), self.bound_states()
        w_actor, b_actor, w_value, b_value = self.actor.weight, self.actor.bias, self.critic.weight, self.critic.bias

        def step(obs, prev_action, episode_starts, memory, gumbel) -> tuple:
            hidden, memory = get_states(observe(obs, prev_action, episode_starts), memory, episode_starts)
            logits = nn.functional.linear(hidden, w_actor, b_actor)
            value = nn.functional.linear(hidden, w_value, b_value).squeeze(-1)
            return *sample_categorical(logits, gumbel), value, memory

        return step

    def get_states_sequence(self, x, memory, episode_starts):
        """A whole rollout in one pass. x: (T, B, input_dim); memory (L, B, N*S [+1], H) at the rollout's start;
        episode_starts: (T, B) bool. Returns the features (T, B, H), equal to running `get_states` T times."""
        # Episode ids: the N*S remembered steps are episode 0 and every start begins a new id; tap i of
        # step t is used only if step t-iS has step t's id. N=3, S=1, T=5, an episode starts at t=2:
        #   position        h-3 h-2 h-1 | h0  h1 | h2  h3  h4
        #   episode id       0   0   0  | 0   0  | 1   1   1
        #   step t=3 reads the window h0 h1 h2 h3 (N+1 = 4 positions) and keeps h2 h3, the ones with id 1
        # S=2: the window spans N*S+1 = 7 positions, the taps every second one: t=3 reads h-3 h-1 h1 h3
        span, stride = self.memory_order * self.memory_stride, self.memory_stride
        ids = torch.cumsum(episode_starts.long(), dim=0)  # (T, B)
        ids = torch.cat([ids.new_zeros(span, ids.shape[1]), ids])  # (N*S+T, B)
        windows = ids.unfold(0, span + 1, 1)[..., ::stride]  # (T, B, N+1): ids of steps t-N*S, ..., t-S, t
        # (N+1, T, B, 1): 1 where tap i of step t reads step t's own episode
        same_episode = (windows == ids[span:].unsqueeze(-1)).permute(2, 0, 1).unsqueeze(-1).float()
        x = torch.tanh(self.embed(x))
        for block, block_memory in zip(self.blocks, memory):
            x = block.sequence(x, block_memory, same_episode, episode_starts)
        return x

    def get_action_and_value_sequence(self, x, memory, episode_starts, action, context: int = 0):
        """x, episode_starts: (context + T, B, ...), from the memory at the context's start; action: (T, B),
        the steps after the context, the only ones with policy and value outputs. Also returns the features of
        every step, context included, (context + T, B, H)."""
        features = self.get_states_sequence(x, memory, episode_starts)
        hidden = features[context:]
        logprob, entropy = categorical_log_prob_entropy(self.actor(hidden), action)  # (T, B) each
        return action, logprob, entropy, self.critic(hidden).squeeze(-1), features


def keep_missing_statistics(module: nn.Module, keys) -> None:
    """load_state_dict's post hook: reward statistics a checkpoint lacks keep their initial values."""
    keys.missing_keys[:] = [key for key in keys.missing_keys if not key.startswith("reward_scale.")]


def recall_loss(predicted: torch.Tensor, x: torch.Tensor, episode_starts: torch.Tensor) -> torch.Tensor:
    """--recall-lags's loss: the mean squared error of predicted[t, b, k-1] against x[t-k, b], the input k steps
    back, over k = 1..K and the steps whose step t-k is in the sequence and in the same episode.
    predicted: (T, B, K, D); x: (T, B, D); episode_starts: (T, B) bool."""
    ids = torch.cumsum(episode_starts.long(), dim=0)  # (T, B): a new id at every episode start
    total, count = predicted.new_zeros(()), predicted.new_zeros(())
    for k in range(1, min(predicted.shape[2], len(x) - 1) + 1):
        same = (ids[k:] == ids[:-k]).unsqueeze(-1).to(x.dtype)  # (T-k, B, 1): t-k in t's episode
        total = total + (((predicted[k:, :, k - 1] - x[:-k]) ** 2) * same).sum()
        count = count + same.sum() * x.shape[-1]
    return total / count.clamp_min(1.0)


def compute_gae(
    rewards,
    values,
    terminations,
    truncations,
    final_values,
    next_value,
    gamma: float,
    gae_lambda: float,
):
    """Generalized advantage estimation (Schulman et al. 2016) over (T, B) tensors. Step t's successor value
    is values[t + 1] (next_value after the last step) unless the episode ended at t: a terminated step has
    none (0), a truncated one bootstraps from final_values[t], its final observation's value (the next one is
    the new episode's)."""
    dones = torch.logical_or(terminations, truncations).to(rewards.dtype)
    bootstrap_final = torch.logical_and(truncations, ~terminations).to(rewards.dtype)
    next_values = torch.cat([values[1:], next_value.unsqueeze(0)])  # (T, B)
    next_values = next_values * (1.0 - dones) + final_values * bootstrap_final
    deltas = rewards + gamma * next_values - values
    discounts = gamma * gae_lambda * (1.0 - dones)  # the recursion stops at the end of an episode
    advantages, lastgaelam = torch.zeros_like(rewards), torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        lastgaelam = deltas[t] + discounts[t] * lastgaelam
        advantages[t] = lastgaelam
    return advantages, advantages + values


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
    """1 - Var(returns - values) / Var(returns), as a tensor (no host sync): how much of the returns' variance
    the value function explains (1 at best); NaN where the returns do not vary."""
    var_y = torch.var(returns)
    return torch.where(var_y == 0, torch.nan, 1 - torch.var(returns - values) / var_y)


def gumbel_noise(shape: tuple, device: torch.device) -> torch.Tensor:
    """Gumbel(0, 1) noise for sample_categorical, -log of Exp(1) draws (never log(0)); a rollout's drawn at
    once are, on the CPU, the draws it would make step by step, in fewer calls."""
    return -torch.empty(shape, device=device).exponential_().clamp_min_(torch.finfo().tiny).log()


def sample_categorical(logits: torch.Tensor, gumbel: torch.Tensor | None = None) -> tuple:
    """A sample of Categorical(logits=logits) and its log-probability by the Gumbel-max trick, argmax(logits +
    Gumbel noise): the rollout's sampler (benchmarks/results/sps_rollout_sampling.md: faster). gumbel: the
    noise, drawn ahead by gumbel_noise, or None (drawn here)."""
    gumbel = gumbel_noise(logits.shape, logits.device) if gumbel is None else gumbel
    action = torch.argmax(logits + gumbel, dim=-1)
    return action, torch.log_softmax(logits, dim=-1).gather(-1, action.unsqueeze(-1)).squeeze(-1)


def categorical_log_prob_entropy(logits: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Categorical(logits=logits)'s log-probability of action and its entropy, from one log_softmax: the
    update's (torch.distributions' Categorical is slower forward and backward: sps_fsmn_cartpole.md)."""
    log_probs = torch.log_softmax(logits, dim=-1)
    # the entropy's log-probabilities clamped as Categorical's are: a zero probability adds 0, not 0 * -inf
    entropy = -(log_probs.exp() * log_probs.clamp_min(torch.finfo(logits.dtype).min)).sum(-1)
    return log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1), entropy


def minibatch_loss(agent: Agent, args: Args, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    """The PPO loss of whole env sequences (T, mb_envs, ...) named in `mb`, replayed in one pass from
    --context-steps before the rollout's start; mb["clip_coef"] (1, mb_envs) is the iteration's clip coefficient.
    Returns the loss and its stats by name, without a host sync."""
    _, newlogprob, entropy, newvalue, features = agent.get_action_and_value_sequence(
        x=mb["obs"], memory=mb["memory"], episode_starts=mb["starts"], action=mb["actions"], context=args.context_steps
    )
    logratio = newlogprob - mb["logprobs"]
    ratio = logratio.exp()
    with torch.no_grad():
        # calculate approx_kl http://joschu.net/blog/kl-approx.html
        old_approx_kl = (-logratio).mean()
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > mb["clip_coef"]).float().mean()
    mb_advantages, mb_returns, mb_values = mb["advantages"], mb["returns"], mb["values"]
    if args.norm_adv:
        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
    # Policy loss
    pg_loss1 = -mb_advantages * ratio
    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - mb["clip_coef"], 1 + mb["clip_coef"])
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()
    # Value loss
    if args.clip_vloss:
        v_loss_unclipped = (newvalue - mb_returns) ** 2
        v_clipped = mb_values + torch.clamp(newvalue - mb_values, -mb["clip_coef"], mb["clip_coef"])
        v_loss_clipped = (v_clipped - mb_returns) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
    else:
        v_loss = 0.5 * ((newvalue - mb_returns) ** 2).mean()
    entropy_loss = entropy.mean()
    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
    stats = dict(value_loss=v_loss, policy_loss=pg_loss, entropy=entropy_loss, old_approx_kl=old_approx_kl)
    if agent.recall is not None:  # the memory's auxiliary loss: earlier steps' inputs from each step's features
        predicted = agent.recall(features).unflatten(-1, (agent.recall_lags, -1))  # (T, B, lags, input)
        stats["recall_loss"] = recall_loss(predicted, mb["obs"], mb["starts"])
        loss = loss + args.recall_coef * stats["recall_loss"]
    stats.update(approx_kl=approx_kl, clipfrac=clipfrac)
    # the loss logged is the one returned, so that a term added to it anywhere above is in losses/loss
    return loss, {name: x.detach() for name, x in dict(stats, loss=loss).items()}


def main(args: Args, checkpoint: dict | None = None) -> None:
    # TRY NOT TO MODIFY: --eval-checkpoint plays a saved policy instead of training
    if args.eval_checkpoint is not None:
        return run_evaluation(args)

    # ENGINEERING: the env's flags, checked before anything is written
    check_env_args(args.env_id, args.mask_velocity, args.capture_video)

    # TRY NOT TO MODIFY: the run (threads, device, the checkpoint to resume, its name and folders); seeding
    run = Run(args, checkpoint)
    device = run.device
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    # ALGO LOGIC: env setup (autoreset SAME_STEP, https://farama.org/Vector-Autoreset-Mode), agent, optimizer
    # a done step returns the next episode's first observation; the finished one's last is in info["final_obs"]
    envs = gym.vector.SyncVectorEnv(
        [make_env(args.env_id, i, args.capture_video, run.video_path, args.mask_velocity) for i in range(args.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    obs_dim, n_actions = envs.single_observation_space.shape[0], envs.single_action_space.n
    agent = Agent(obs_dim, n_actions, args).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    rollout_step, loss_fn = agent.bound_rollout_step(), minibatch_loss
    if args.compile:  # the same parameters, compiled; `agent` is what gets saved
        rollout_step, loss_fn = torch.compile(rollout_step), torch.compile(loss_fn)

    # TRY NOT TO MODIFY: resume
    global_step = run.restore(agent, optimizer)  # 0, or the checkpoint's; iterations() goes on from its next

    # ALGO LOGIC: storage setup, (num_steps, num_envs, ...); what the env returns stays in numpy until the rollout ends
    obs = torch.zeros((args.num_steps, args.num_envs) + envs.single_observation_space.shape, device=device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    prev_actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)  # a[t-1]
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    rewards_np = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    terminations_np = np.zeros((args.num_steps, args.num_envs), dtype=bool)
    truncations_np = np.zeros((args.num_steps, args.num_envs), dtype=bool)
    episode_starts = torch.zeros((args.num_steps, args.num_envs), dtype=torch.bool, device=device)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)
    memory = agent.initial_memory(args.num_envs, device)  # (L, num_envs, N*S [+1], H): running episodes'
    # the previous rollout's last --context-steps steps (trained first) and the memory before them
    context = dict(obs=obs, prev_actions=prev_actions, starts=torch.ones_like(episode_starts))
    context, context_memory = {name: x[: args.context_steps].clone() for name, x in context.items()}, memory
    next_obs, _ = envs.reset(seed=args.seed + global_step)
    next_obs = torch.as_tensor(next_obs, dtype=torch.float32, device=device)
    next_done = torch.ones(args.num_envs, dtype=torch.bool, device=device)  # every env begins an episode
    action = torch.zeros(args.num_envs, dtype=torch.long, device=device)  # a[t-1], unused at a start

    # TRY NOT TO MODIFY: start the game (loggers, Ctrl-C flag; at its end, the logs and last checkpoint kept)
    with run.start(envs):
        for iteration in run.iterations():
            # ALGO LOGIC: annealing the rate (and the clip coefficient) if instructed to do so
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate
            clip_coef = torch.full((1, args.num_envs), args.clip_coef * (frac if args.anneal_clip else 1.0), device=device)

            # ALGO LOGIC: rollout
            initial_memory = memory.clone()  # training replays each sequence from here (or its context)
            final_values = torch.zeros_like(values)  # V(final obs) at truncated steps, 0 elsewhere
            gumbel = gumbel_noise((args.num_steps, args.num_envs, n_actions), device)  # its sampling noise
            for step in range(args.num_steps):
                run.check_interrupt()
                if step == args.num_steps - args.context_steps:  # the next rollout's context starts here
                    next_context_memory = memory.clone()
                global_step += args.num_envs
                obs[step] = next_obs
                episode_starts[step] = next_done
                prev_actions[step] = action

                with torch.inference_mode():  # no autograd records (faster than no_grad); statistics frozen
                    action, logprob, value, memory = rollout_step(next_obs, action, next_done, memory, gumbel[step])
                values[step], actions[step], logprobs[step] = value, action, logprob

                next_obs_np, reward, termination, truncation, infos = envs.step(action.cpu().numpy())
                rewards_np[step] = reward
                terminations_np[step], truncations_np[step] = termination, truncation
                if truncation.any():
                    # bootstrap a truncated episode from the value of its final observation
                    zeros = np.zeros(obs_dim)
                    final_obs = np.stack([o if t else zeros for o, t in zip(infos["final_obs"], truncation)])
                    with torch.inference_mode():
                        final_obs = torch.as_tensor(final_obs, dtype=torch.float32, device=device)
                        no_start = torch.zeros_like(next_done)  # seen with that episode's memory
                        final_value = agent.get_value(agent.observe(final_obs, action, no_start), memory, no_start)
                    final_values[step] = final_value * torch.as_tensor(truncation, device=device)
                next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32, device=device)
                next_done = torch.as_tensor(termination | truncation, device=device)
                run.log_episodes(infos, global_step)

            # ALGO LOGIC: rewards divided by the running std of the discounted return (its statistics updated first)
            if args.norm_reward:
                rewards_np = agent.reward_scale(rewards_np, terminations_np | truncations_np)

            # ALGO LOGIC: bootstrap value and advantages
            rewards, terminations, truncations = (
                torch.as_tensor(x, device=device) for x in (rewards_np, terminations_np, truncations_np)
            )
            with torch.no_grad():
                next_value = agent.get_value(agent.observe(next_obs, action, next_done), memory, next_done)
                advantages, returns = compute_gae(
                    rewards=rewards,
                    values=values,
                    terminations=terminations,
                    truncations=truncations,
                    final_values=final_values,
                    next_value=next_value,
                    gamma=args.gamma,
                    gae_lambda=args.gae_lambda,
                )
                rollout = dict(obs=obs, prev_actions=prev_actions, starts=episode_starts)
                seen = {name: torch.cat([context[name], x]) for name, x in rollout.items()}
                seen_obs = agent.observe(obs=seen["obs"], prev_action=seen["prev_actions"], episode_starts=seen["starts"])
                if args.context_steps:
                    initial_memory, context_memory = context_memory, next_context_memory
                context = {name: x[len(x) - args.context_steps :].clone() for name, x in rollout.items()}

            # ALGO LOGIC: optimizing the policy and value network over minibatches of whole env sequences
            batch = dict(obs=seen_obs, actions=actions, logprobs=logprobs, values=values, clip_coef=clip_coef)
            batch.update(advantages=advantages, returns=returns, memory=initial_memory, starts=seen["starts"])
            env_inds, envs_per_minibatch = np.arange(args.num_envs), args.num_envs // args.num_minibatches
            parameters = list(agent.parameters())  # a list: clip_grad_norm_ walks a generator more slowly
            stats = []
            for epoch in range(args.update_epochs):
                np.random.shuffle(env_inds)
                for start in range(0, args.num_envs, envs_per_minibatch):
                    mb_envs = torch.as_tensor(env_inds[start : start + envs_per_minibatch], device=device)
                    minibatch = {name: x[:, mb_envs] for name, x in batch.items()}  # dim 1: envs
                    loss, mb_stats = loss_fn(agent, args, minibatch)
                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(parameters, args.max_grad_norm)
                    optimizer.step()
                    stats.append(mb_stats)

                if args.target_kl is not None and stats[-1]["approx_kl"].item() > args.target_kl:
                    break
            if args.norm_obs:
                agent.update_obs_norm(obs.flatten(0, 1))  # then the statistics take in this rollout

            # TRY NOT TO MODIFY: record and keep the iteration (losses as CleanRL logs them, and their means)
            run.record(iteration, global_step, agent, optimizer, stats, explained_variance(values, returns))
        # ENGINEERING: the policy as it stands, played as --eval-checkpoint plays it, beside the training mean
        evaluate_at_end(run, agent)


# ----------------------------------------------------------------------------------------------------------
# Below main, what a reader of the algorithm needs last: the run's handling (the same in every script: its
# life, the flags every script has, torch threads, checkpoints, the run's helpers), then evaluation.
# ----------------------------------------------------------------------------------------------------------


# TRY NOT TO MODIFY: the run's life around the algorithm
class Run:
    """A training run's handling, one call for each moment of its life. `Run(args, checkpoint)` sets torch's
    threads and the device and names the run and its folders: a resumed run goes on in its checkpoint's, from
    any folder; a new run claims its own at once. `restore(agent, optimizer)` loads the checkpoint into them.
    `with start(envs):` opens the loggers and the stop flag (Ctrl-C, SIGTERM, SIGUSR1) and, however the run
    ends (done, an error, a stop signal), keeps the logs and the last good checkpoint. Inside it come
    `iterations()`, at every env step `check_interrupt()` and `log_episodes(...)`, and once an iteration is
    complete `record(...)`, which also keeps its checkpoint."""

    def __init__(self, args: Args, checkpoint: dict | None = None):
        """checkpoint: the one --resume names, as cli() loaded it (loaded here when main gets args alone)."""
        if checkpoint is None and args.resume is not None:
            checkpoint = load_checkpoint(args.resume, "--resume")
        self.args, self.checkpoint, self.cpu_reading = args, checkpoint, []  # free_cores' last reading
        self.device = torch_device(args, self.cpu_reading)
        check_names(args)
        self.unclaim, video_name = None, "rl-video"
        if checkpoint is None:  # a new run: runs/<name> is its own from here on (claim_run_name)
            name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
            self.name, self.unclaim = claim_run_name(name)
            self.dir, self.root = os.path.join("runs", self.name), "."
            self.video_dir = os.path.join("videos", self.name)
            self.start_iteration, self.global_step = 1, 0
        else:  # the checkpoint's folder; where that is <root>/runs/<name>, the videos/ and wandb/ in <root>
            self.name = checkpoint["run_name"]
            if ".." in re.split(r"[\\/]", self.name) or os.path.isabs(self.name):
                why = f"holds the run name {self.name}, which leaves runs/"
                raise SystemExit(f"error: --resume={args.resume} {why}")
            self.dir = os.path.dirname(args.resume) or "."
            tail = os.sep + os.path.join("runs", os.path.normpath(self.name))
            absolute = os.path.abspath(self.dir)
            self.root = absolute[: -len(tail)] or os.sep if absolute.endswith(tail) else "."
            self.video_dir = os.path.join(self.root, "videos", self.name)
            self.start_iteration = checkpoint.get("iteration", 0) + 1
            self.global_step = checkpoint.get("global_step", 0)
            if self.start_iteration > args.num_iterations:
                refused = f"--total-timesteps={args.total_timesteps}"
                raise SystemExit(f"error: {refused} must exceed the checkpoint's {self.global_step}")
            # a resumed run's videos are named from its first step: the earlier part's stay as they are
            video_name = f"rl-video-step-{self.global_step}"
        self.checkpoint_path = os.path.join(self.dir, "checkpoint.pt")
        self.video_path = os.path.join(self.video_dir, video_name)

    def restore(self, agent: nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """Load the checkpoint's weights, optimizer and RNG states, where the run resumes one; the global step
        to start from (0, or the checkpoint's: iterations() goes on from its next iteration)."""
        args, checkpoint = self.args, self.checkpoint
        if checkpoint is not None:
            # cli() took the checkpoint's flags as the defaults: a flag given that differs is named
            saved = checkpoint["args"]
            differing = [
                f"--{flag.replace('_', '-')}={getattr(args, flag)} differs from the checkpoint's {saved[flag]}"
                for flag in (f.name for f in fields(Args) if f.init and f.name != "resume" and f.name in saved)
                if saved[flag] != getattr(args, flag)
            ]
            try:
                agent.load_state_dict(checkpoint["model"])
            except RuntimeError:
                why = "; ".join(differing) or "no flag differs (another version?)"
                refused = f"--resume={args.resume} holds a network of another shape"
                raise SystemExit(f"error: {refused}; {why}") from None
            try:  # the checkpoint's moments and steps, in the settings (rate included) that this run's flags built
                settings = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
                optimizer.load_state_dict(checkpoint["optimizer"])
                for group, own in zip(optimizer.param_groups, settings):
                    group.update(own)
                set_rng_states(checkpoint["rng_states"])
            except (KeyError, TypeError, ValueError):
                why = "lacks an optimizer, step or RNG state"
                raise SystemExit(f"error: --resume={args.resume} {why}") from None
            for line in differing:
                print(f"note: {line}")
        return self.global_step

    @contextlib.contextmanager
    def start(self, envs):
        """TensorBoard, W&B, the progress bar and the stop flag, opened once every check has passed (a refused
        run writes nothing). On leaving, however the run ended, the last good checkpoint is written, the logs
        closed and the run summed up in three lines, with stop signals ignored: interrupting the save or W&B's
        last sync would lose them."""
        args = self.args
        # the rounding of a budget the user gave; a default never warns
        if args.total_timesteps % args.batch_size and args.total_timesteps != Args.total_timesteps:
            trained, batches = args.num_iterations * args.batch_size, f"whole batches of {args.batch_size}"
            warn(f"--total-timesteps={args.total_timesteps} trains {trained}, {batches}")
        self.wandb_run = start_wandb(args, self.name, self.root, "train", self.dir) if args.track else None
        # an earlier part's videos, logged then
        self.logged_videos = set(glob.glob(os.path.join(glob.escape(self.video_dir), "*.mp4")))
        self.writer = SummaryWriter(self.dir)
        if self.unclaim is not None:  # the folder holds the run's events: it stays whatever happens next
            atexit.unregister(self.unclaim)
        table = "\n".join(f"|{k}|{v}|" for k, v in vars(args).items())
        self.writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
        print(f"logging to {self.dir}")

        self.start_time, self.start_step = time.time(), self.global_step
        self.next_line = time.time() + PLAIN_LINE_SECONDS
        self.recent_returns, self.done_iteration, self.last_good = [], self.start_iteration - 1, None
        self.progress = tqdm(range(self.start_iteration, args.num_iterations + 1), disable=not args.progress)
        # A stop signal (Ctrl-C, SIGTERM, SIGUSR1) is honoured at the next env step (a KeyboardInterrupt
        # raised where it lands, in a finalizer, can be swallowed; a flag cannot); a second stops at once. An
        # OSError after one is named and taken as the stop: Ctrl-C also reaches ffmpeg encoding a video.
        self.interrupts, stopped = [], False

        def on_interrupt(signum, frame):
            self.interrupts.append(signum)
            if len(self.interrupts) > 1:
                raise KeyboardInterrupt

        previous_handlers = {s: signal.signal(s, on_interrupt) for s in STOP_SIGNALS}
        try:
            yield self
        except (KeyboardInterrupt, OSError) if self.interrupts else KeyboardInterrupt as stop:  # noqa: B030
            stopped = stop  # true; an OSError's first line is said below
        finally:
            for s in STOP_SIGNALS:
                signal.signal(s, signal.SIG_IGN)
            signum = (self.interrupts or [signal.SIGINT])[0]
            if stopped:
                why = "no iteration completed" if args.save_model else "no --save-model"
                kept = f"the logs; no checkpoint: {why}"
                if self.last_good is not None:
                    kept = f"the logs and the checkpoint of iteration {self.last_good['iteration']}"
                stopped_by = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
                stopped_by += f" ({str(stopped).split(chr(10))[0]})" if isinstance(stopped, OSError) else ""
                print(f"{stopped_by} during iteration {self.done_iteration + 1}; keeping {kept}")
            seconds = time.time() - self.start_time
            self.progress.close()
            not_saved = None
            if self.last_good is not None:
                try:
                    save_checkpoint(self.checkpoint_path, self.last_good, args.keep_checkpoints)
                except SystemExit as e:  # a full disk: said once the logs are closed
                    not_saved = e
            self.writer.close()
            envs.close()
            if self.wandb_run is not None:
                log_new_videos(self.wandb_run, self.video_dir, self.logged_videos)
                self.wandb_run.finish()
            # run as a program (the top-level handler was in place), the process only exits from here: a
            # late signal (a sweep's runner passes on the scheduler's, which the run got too) must not change
            # its status
            for s, handler in previous_handlers.items():
                signal.signal(s, signal.SIG_IGN if handler is interrupted else handler)
            # where the run got and how fast, its checkpoint, its curves
            sps = int((self.global_step - self.start_step) / seconds)
            print(f"step {self.global_step}: {status(self.recent_returns, sps)}, {seconds:.0f} s")
            if self.last_good is not None and not_saved is None:
                iteration, step = self.last_good["iteration"], self.last_good["global_step"]
                print(f"checkpoint: {self.checkpoint_path} (iteration {iteration}, step {step})")
            print(f"tensorboard --logdir {shlex.quote(self.dir)}")
            if not_saved is not None:
                raise not_saved
            if stopped:  # not finished: the shell's exit status for the signal (130 Ctrl-C, 143 SIGTERM)
                raise SystemExit(128 + signum)

    def iterations(self):
        """The iterations to run, torch's threads set before each to the cores other processes leave free:
        runs side by side share them."""
        for iteration in self.progress:
            if not self.args.threads and self.device.type == "cpu":
                torch.set_num_threads(min(TORCH_THREADS, free_cores(self.cpu_reading)))
            yield iteration

    def check_interrupt(self) -> None:
        """At every env step: a stop signal since the last one ends the run here."""
        if self.interrupts:
            raise KeyboardInterrupt

    def sps(self) -> int:
        return int((self.global_step - self.start_step) / (time.time() - self.start_time))

    def log_episodes(self, infos: dict, global_step: int) -> None:
        """After every env step: each finished episode's return and length; without a progress bar, a plain
        line of progress at least every PLAIN_LINE_SECONDS."""
        self.global_step = global_step
        if "episode" in infos:
            finished = infos["_episode"]
            for r, length in zip(infos["episode"]["r"][finished], infos["episode"]["l"][finished]):
                self.writer.add_scalar("charts/episodic_return", r, global_step)
                self.writer.add_scalar("charts/episodic_length", length, global_step)
                self.recent_returns = (self.recent_returns + [float(r)])[-20:]
        if not self.args.progress and time.time() >= self.next_line:  # a plain line in logs without a bar
            self.next_line = time.time() + PLAIN_LINE_SECONDS
            print(f"step {global_step}: {status(self.recent_returns, self.sps())}", flush=True)

    def record(
        self,
        iteration: int,
        global_step: int,
        agent: nn.Module,
        optimizer: torch.optim.Optimizer,
        stats: list[dict[str, torch.Tensor]],
        explained_var: torch.Tensor,
    ) -> None:
        """The iteration's stats, read in one host sync: losses/<name> as CleanRL logs its losses, the value of the
        iteration's last minibatch (losses/clipfrac: the mean over its minibatches); losses/mean/<name>, every stat's
        mean over its minibatches; the explained variance, the learning rate and SPS. A non-finite loss (in any
        minibatch) or weight stops the run. Then a snapshot of this complete iteration, what a stop or an error
        saves later, written every --save-interval iterations."""
        self.global_step = global_step
        weights_finite = torch.stack([p.isfinite().all() for p in agent.parameters()]).all()
        names = list(stats[0])  # every minibatch's stats have the same names: a table (minibatches, names)
        table = torch.stack([torch.stack([mb_stats[name] for name in names]) for mb_stats in stats])
        once = torch.stack([explained_var, weights_finite.float()])
        *values, explained_var, weights_finite = torch.cat([table[-1], table.mean(0), once]).tolist()
        losses = dict(zip(names + [f"mean/{name}" for name in names], values), explained_variance=explained_var)
        losses["clipfrac"] = losses["mean/clipfrac"]
        if not (np.isfinite(losses["mean/loss"]) and weights_finite):
            kept = "; the last complete iteration's checkpoint is kept" if self.args.save_model else ""
            advice = f"lower --learning-rate or --max-grad-norm{kept}"
            raise SystemExit(f"error: the loss diverged at iteration {iteration}: {advice}")
        sps = self.sps()
        self.writer.add_scalar("charts/learning_rate", float(optimizer.param_groups[0]["lr"]), global_step)
        for name, value in losses.items():
            self.writer.add_scalar(f"losses/{name}", value, global_step)
        self.writer.add_scalar("charts/SPS", sps, global_step)
        self.progress.set_postfix_str(status(self.recent_returns, sps), refresh=False)
        if self.wandb_run is not None:  # each video as soon as it is written: a run killed later keeps them
            log_new_videos(self.wandb_run, self.video_dir, self.logged_videos)
        self.done_iteration = iteration
        if self.args.save_model:
            snapshot = make_checkpoint(self.args, self.name, agent, optimizer, iteration, global_step)
            self.last_good = copy.deepcopy(snapshot)
            if iteration % self.args.save_interval == 0:
                save_checkpoint(self.checkpoint_path, self.last_good, self.args.keep_checkpoints)


# TRY NOT TO MODIFY: the flags every script has
def check_flags(args: Args, *own: tuple) -> None:
    """Every numeric flag's accepted values, checked as Args is made, before anything is written: one line
    names the first one refused. `own`: the script's own (flag, accepted, what) rows, checked after these."""
    for flag, accepted, what in (
        ("seed", 0 <= args.seed < 2**32, "in [0, 2**32)"),
        ("threads", args.threads >= 0, "at least 0 (0: the free cores)"),
        ("save_interval", args.save_interval >= 1, "at least 1"),
        ("keep_checkpoints", args.keep_checkpoints >= 0, "at least 0"),
        ("eval_episodes", args.eval_episodes >= 1, "at least 1"),
        ("num_envs", args.num_envs >= 1, "at least 1"),
        ("num_steps", args.num_steps >= 1, "at least 1"),
        ("total_timesteps", args.num_iterations >= 1, f"at least one batch, {args.batch_size} steps"),
        ("learning_rate", 0 <= args.learning_rate < math.inf, "a number >= 0"),
        ("gamma", 0 <= args.gamma <= 1, "in [0, 1]"),
        ("gae_lambda", 0 <= args.gae_lambda <= 1, "in [0, 1]"),
        ("num_minibatches", args.num_minibatches >= 1, "at least 1"),
        ("num_minibatches", args.minibatch_size >= 2 or not args.norm_adv, "at most half the batch with --norm-adv"),
        ("clip_coef", 0 < args.clip_coef < math.inf, "a positive number"),
        ("ent_coef", 0 <= args.ent_coef < math.inf, "a number >= 0"),
        ("vf_coef", 0 <= args.vf_coef < math.inf, "a number >= 0"),
        ("max_grad_norm", 0 < args.max_grad_norm < math.inf, "a positive number"),
        ("target_kl", args.target_kl is None or 0 < args.target_kl < math.inf, "a positive number"),
        *own,
    ):
        if not accepted:
            raise SystemExit(f"error: --{flag.replace('_', '-')}={getattr(args, flag)} must be {what}")


# TRY NOT TO MODIFY: torch threads
def torch_device(args: Args, cpu_reading: list[float]) -> torch.device:
    """Set torch's threads (--threads, or with 0 the cores that other processes leave free) and return the
    device."""
    torch.set_num_threads(args.threads or min(TORCH_THREADS, free_cores(cpu_reading)))
    return torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")


def free_cores(last: list[float]) -> int:
    """Cores of this process's CPUs that other processes left idle since the previous call, whose reading
    `last` keeps (Linux's /proc/stat; every core elsewhere). Torch threads beyond them would spin against the
    other processes."""
    try:
        cpus = {f"cpu{i}" for i in os.sched_getaffinity(0)}
        # per CPU: user, nice, system, idle, iowait, irq, softirq, ... in clock ticks
        with open("/proc/stat") as f:
            rows = [line.split() for line in f]
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1
    busy = sum(int(r[1]) + int(r[2]) + int(r[3]) + int(r[6]) + int(r[7]) for r in rows if r[0] in cpus)
    now, busy, own = time.perf_counter(), busy / os.sysconf("SC_CLK_TCK"), sum(os.times()[:2])
    others = (busy - last[1] - (own - last[2])) / (now - last[0]) if last else 0.0
    last[:] = now, busy, own
    return max(1, round(len(cpus) - others))


# TRY NOT TO MODIFY: checkpoint helpers
def save_checkpoint(path: str, checkpoint: dict, keep: int = 0) -> None:
    """Write atomically: a crash or a full disk mid-write leaves the previous checkpoint intact, and a failed
    write is one line. With keep > 0, the newest `keep` checkpoints stay beside it as <name>-<step>.pt (hard
    links where the file system has them)."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    tmp_path = f"{path}.tmp"
    try:
        torch.save(checkpoint, tmp_path)
        os.replace(tmp_path, path)
        if keep:
            numbered = f"{path[: -len('.pt')]}-{checkpoint['global_step']}.pt"
            if os.path.exists(numbered):
                os.remove(numbered)
            try:
                os.link(path, numbered)
            except OSError:  # a file system without hard links
                shutil.copyfile(path, numbered)
    except (OSError, RuntimeError) as e:  # torch's zip writer reports a full disk as a RuntimeError
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
        free = shutil.disk_usage(folder).free // 1024
        why = e.strerror if isinstance(e, OSError) and e.strerror else "the write failed"
        raise SystemExit(
            f"error: cannot write {path}: {why} ({free} KiB free on its disk); the previous one is kept"
        ) from None
    pattern = re.compile(re.escape(os.path.basename(path[: -len(".pt")])) + r"-(\d+)\.pt")
    steps = sorted(int(m.group(1)) for m in map(pattern.fullmatch, os.listdir(folder)) if m)
    for step in steps[: max(len(steps) - keep, 0)]:
        os.remove(f"{path[: -len('.pt')]}-{step}.pt")


def load_checkpoint(path: str, flag: str) -> dict:
    """Load tensors and plain values only (`weights_only=True`) and refuse another script's checkpoint."""
    if os.path.isdir(path):
        why = f"is a folder; pass the checkpoint file in it (e.g. {path}/checkpoint.pt)"
        raise SystemExit(f"error: {flag}={path} {why}")
    if not os.path.isfile(path):
        raise SystemExit(f"error: {flag}={path} does not exist")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        why = f"is not a checkpoint of {SCRIPT}.py ({type(e).__name__})"
        raise SystemExit(f"error: {flag}={path} {why}") from None
    script = checkpoint.get("script") if isinstance(checkpoint, dict) else None
    if script != SCRIPT:
        why = f"is a checkpoint of {script or 'an unknown script'}, not of {SCRIPT}.py"
        raise SystemExit(f"error: {flag}={path} {why}")
    return checkpoint


def rng_states() -> dict:
    """Python's, numpy's and torch's generators (CUDA's where there is one), as plain values and tensors."""
    kind, key, *rest = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [kind, key.tolist(), *rest],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all(),  # [] without a GPU
    }


def set_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    kind, key, *rest = states["numpy"]
    np.random.set_state((kind, np.array(key, dtype=np.uint32), *rest))
    torch.set_rng_state(states["torch"])
    torch.cuda.set_rng_state_all(states.get("cuda", []))  # none where there is no GPU, or none was saved


def make_checkpoint(args: Args, run_name: str, agent: nn.Module, optimizer, iteration: int, global_step: int) -> dict:
    return {
        "script": SCRIPT,
        "args": asdict(args),
        "run_name": run_name,
        "model": agent.state_dict(),
        "optimizer": optimizer.state_dict(),
        "iteration": iteration,
        "global_step": global_step,
        "rng_states": rng_states(),
    }


# TRY NOT TO MODIFY: run helpers
def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def cli(argv: list[str] | None = None) -> tuple[Args, dict | None]:
    """The command line's arguments and the checkpoint to resume, loaded once: with --resume, the checkpoint's
    flags are the defaults and only flags given change. `--resume auto` is this run's newest checkpoint
    (own_checkpoint), or a new run where there is none; a run it finds complete is said in one line, and
    nothing starts."""
    argv = sys.argv[1:] if argv is None else argv
    given = {}  # the value after each --flag, the last one given (the one tyro keeps)
    for i, arg in enumerate(argv):
        flag, equals, value = arg.partition("=")
        if flag.startswith("--") and (equals or i + 1 < len(argv)):
            given[flag.replace("_", "-")] = value if equals else argv[i + 1]
    for f in fields(Args):  # a choice tyro would refuse in a box of several lines: one line instead
        flag, choices = f"--{f.name.replace('_', '-')}", tuple(map(str, typing.get_args(f.type)))
        if typing.get_origin(f.type) is typing.Literal and given.get(flag, choices[0]) not in choices:
            raise SystemExit(f"error: {flag}={given[flag]} must be one of {', '.join(choices)}")
    resume = given.get("--resume")
    path, checkpoint = resume, None
    if resume == "auto":
        path, checkpoint = own_checkpoint(tyro.cli(Args, args=argv))
    elif resume is not None:
        checkpoint = load_checkpoint(resume, "--resume")
    default = None
    if checkpoint is not None:
        saved = {**getattr(Args, "OLD_CHECKPOINT_FLAGS", {}), **checkpoint["args"]}  # flags added since: as saved
        default = Args(**{f.name: saved[f.name] for f in fields(Args) if f.init and f.name in saved})
    args = replace(tyro.cli(Args, args=argv, default=default))  # the sizes derived from the merged flags
    if resume == "auto":
        args.resume = path  # from here on, as if it had been given
        if checkpoint is None:
            print("--resume auto found no checkpoint of this run under runs/: starting a new run")
        elif checkpoint.get("iteration", 0) >= args.num_iterations:
            done = f"at step {checkpoint['global_step']} of --total-timesteps={args.total_timesteps}"
            print(f"{os.path.dirname(path)} already finished {done}; nothing to do")
            raise SystemExit(0)  # a job started again after its run completed is done, not failed
        else:
            print(f"resuming {path} at step {checkpoint.get('global_step', 0)}")
    return args, checkpoint


def own_checkpoint(args: Args) -> tuple[str | None, dict | None]:
    """`--resume auto`: the newest (by modification time) runs/<run>/checkpoint.pt of this script whose env
    id, experiment name and seed are this run's, and what it holds, or (None, None); never another run's."""
    if not args.save_model:
        why = "needs --save-model: without checkpoints there is nothing to continue from"
        raise SystemExit(f"error: --resume=auto {why}")
    check_names(args)  # the names below stay inside runs/
    run = glob.escape(f"{args.env_id}__{args.exp_name}__{args.seed}__")
    paths = sorted(glob.glob(os.path.join("runs", f"{run}*", "checkpoint.pt")), key=os.path.getmtime)
    for path in reversed(paths):
        try:
            checkpoint = load_checkpoint(path, "--resume")
        except SystemExit:  # not a checkpoint of this script, so not this run's either
            continue
        saved = checkpoint.get("args", {})
        if all(saved.get(flag) == getattr(args, flag) for flag in ("env_id", "exp_name", "seed")):
            return path, checkpoint
    return None, None


def check_names(args: Args) -> None:
    """Names that become folders stay inside runs/ and videos/; W&B's names hold no character it refuses."""
    for flag in ("exp_name", "env_id"):
        value = getattr(args, flag)
        if ".." in re.split(r"[\\/]", value) or value.startswith(("/", "\\")):
            raise SystemExit(
                f"error: --{flag.replace('_', '-')}={value} must not start with / or hold a .. part: "
                "it names folders in runs/ and videos/"
            )
    for flag in ("wandb_project_name", "wandb_entity", "wandb_group", "wandb_tags"):
        value = getattr(args, flag)
        for name in value if isinstance(value, tuple) else [] if value is None else [value]:
            if not name or set(name) & set("/\\#?%:") or len(name) > 64:
                refused = f"--{flag.replace('_', '-')}={name}"
                raise SystemExit(f"error: {refused} must be 1 to 64 characters, none of /\\#?%:")


def claim_run_name(name: str):
    """The new run's name, `name` or, where runs/<name> exists, <name>-2, <name>-3, ...: os.mkdir makes its
    folder or fails where another process made it first, so that runs started in the same second never share
    a folder, a checkpoint, event files or a W&B id. Returns the name and `unclaim`, run at exit until the run
    starts: it removes the folders the claim made while they are empty, so that a run refused later leaves
    nothing."""
    parent = os.path.dirname(os.path.join("runs", name))
    made, folder = [], parent  # the folders the claim makes, deepest first
    while folder and not os.path.isdir(folder):
        made.append(os.path.abspath(folder))
        folder = os.path.dirname(folder)
    claimed, n = name, 1
    try:
        os.makedirs(parent, exist_ok=True)
        while True:
            try:
                os.mkdir(os.path.join("runs", claimed))
                break
            except FileExistsError:  # another run's, maybe started in the same second
                n += 1
                claimed = f"{name}-{n}"
    except OSError as e:
        where = os.path.join("runs", claimed)
        why = f"cannot create {where} ({e.strerror}); run from a folder you can write to"
        raise SystemExit(f"error: {why}") from None
    made.insert(0, os.path.abspath(os.path.join("runs", claimed)))

    def unclaim():
        with contextlib.suppress(OSError):  # a folder no longer empty stays, and those above it
            for folder in made:
                os.rmdir(folder)

    atexit.register(unclaim)
    return claimed, unclaim


def start_wandb(args: Args, name: str, root: str, job_type: str, events: str | None = None):
    """A W&B run with the config and the code (wherever the script runs from), syncing the TensorBoard events
    written in the folder `events` where one is given (training's); a resumed run goes on in its first part's
    W&B run, whose id comes from the run name."""
    import wandb

    wandb.tensorboard.unpatch()  # a run earlier in this process may have patched it for its own folder
    if events is not None:  # told the folder, W&B need not wait at the run's end to guess it
        wandb.tensorboard.patch(root_logdir=os.path.abspath(events))
    run = wandb.init(
        project=args.wandb_project_name,
        entity=args.wandb_entity,
        group=args.wandb_group,
        tags=list(args.wandb_tags) or None,
        job_type=job_type,
        sync_tensorboard=events is not None,
        config=vars(args),
        name=name,
        id=hashlib.sha256(name.encode()).hexdigest()[:16],
        resume="allow",
        dir=root,
        save_code=True,
    )
    # save_code alone skips a script outside the working folder's repository
    script = os.path.abspath(__file__)
    run.log_code(os.path.dirname(script), include_fn=lambda path, root: os.path.abspath(path) == script)
    return run


def log_new_videos(wandb_run, video_dir: str, logged: set[str]) -> None:
    """Send W&B the videos written since the last call (a file appears once its video is complete)."""
    import wandb

    for video in sorted(glob.glob(os.path.join(glob.escape(video_dir), "*.mp4"))):
        if video not in logged:  # wandb's own gym hook fails on gymnasium 1.x
            logged.add(video)
            wandb_run.log({"videos": wandb.Video(video)})


def status(recent_returns: list[float], sps: int) -> str:
    if not recent_returns:
        return f"no episode finished yet, {sps} steps/s"
    return f"mean return {np.mean(recent_returns):.2f} (last {len(recent_returns)} episodes), {sps} steps/s"


# ENGINEERING: evaluation
def run_evaluation(args: Args) -> None:
    """--eval-checkpoint: each episode's return, then the mean and std; --capture-video records the episodes
    to videos/<run_name>__eval__<time>/ and --track sends the returns and videos to a W&B run of their own."""
    device = torch_device(args, [])
    check_names(args)
    checkpoint = load_checkpoint(args.eval_checkpoint, "--eval-checkpoint")  # the one load
    name = f"{os.path.basename(checkpoint['run_name'])}__eval__{int(time.time())}"
    video_dir = os.path.join("videos", name)
    wandb_run = start_wandb(args, name, ".", "eval") if args.track else None
    video_path = os.path.join(video_dir, "eval") if args.capture_video else ""
    episodes, deterministic = args.eval_episodes, args.eval_deterministic
    returns = evaluate(checkpoint, episodes, deterministic, device, args.seed, video_path)
    print(f"eval: {len(returns)} episodes, mean return {np.mean(returns):.2f} +/- {np.std(returns):.2f}")
    if args.capture_video:
        print(f"videos: {video_dir}")
    if wandb_run is not None:
        for episode, episodic_return in enumerate(returns):
            wandb_run.log({"eval/episodic_return": episodic_return, "eval/episode": episode + 1})
        wandb_run.summary["eval/mean_return"] = float(np.mean(returns))
        log_new_videos(wandb_run, video_dir, set())
        wandb_run.finish()


def build_agent_from_checkpoint(
    checkpoint: dict,
    device: torch.device,
    quiet: bool = False,
) -> tuple[Agent, Args]:
    """quiet: the env was checked already (the end of a training run): no second check, no second note."""
    # a flag an earlier version had and this one has not is dropped
    flags = {f.name for f in fields(Args) if f.init}
    args = Args(**{k: v for k, v in {**Args.OLD_CHECKPOINT_FLAGS, **checkpoint["args"]}.items() if k in flags})
    if not quiet:
        check_env_args(args.env_id, args.mask_velocity)
    env = make_env(args.env_id, 0, False, "", args.mask_velocity)()
    agent = Agent(env.observation_space.shape[0], env.action_space.n, args).to(device)
    env.close()
    try:
        agent.load_state_dict(checkpoint["model"])
    except RuntimeError:
        refused = "--eval-checkpoint holds a network of another shape (from another version?)"
        raise SystemExit(f"error: {refused}") from None
    return agent, args


@torch.no_grad()
def evaluate(
    checkpoint: dict,
    episodes: int,
    deterministic: bool,
    device: torch.device,
    seed: int,
    video_path: str = "",
    quiet: bool = False,
) -> list[float]:
    """Play `episodes` whole episodes with a saved policy (and its memory), print each return as it ends (not
    when quiet) and return them; with a video_path (folder/name start), record those that RecordVideo's
    schedule picks."""
    agent, saved_args = build_agent_from_checkpoint(checkpoint, device, quiet)
    env = make_env(saved_args.env_id, 0, bool(video_path), video_path, saved_args.mask_velocity)()
    torch.manual_seed(seed)  # a sampling evaluation (--no-eval-deterministic) repeats
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        memory, start = agent.initial_memory(1, device), torch.ones(1, dtype=torch.bool, device=device)
        action = torch.zeros(1, dtype=torch.long, device=device)  # a[t-1], unused at a start
        done, total = False, 0.0
        while not done:
            obs_t = torch.as_tensor(obs, dtype=torch.float32, device=device).unsqueeze(0)
            # frozen statistics
            hidden, memory = agent.get_states(agent.observe(obs_t, action, start), memory, start)
            logits = agent.actor(hidden)
            action = logits.argmax(-1) if deterministic else Categorical(logits=logits).sample()
            obs, reward, terminated, truncated, _ = env.step(action.item())
            start[:] = False
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
        if not quiet:
            print(f"episode {episode + 1}: return {total:.2f}")
    env.close()
    return returns


def evaluate_at_end(run: Run, agent: Agent) -> None:
    """--final-eval-episodes: the trained policy, played as --eval-checkpoint would play its checkpoint,
    logged as charts/eval_return and printed right before the run's summary line (whose mean is of sampled
    episodes). Its seconds are left out of the summary's; a stop signal during it ends the run as stopped."""
    args, started = run.args, time.time()
    if args.final_eval_episodes:
        checkpoint = dict(args=asdict(args), model=agent.state_dict())  # what evaluate() reads of one
        episodes, deterministic = args.final_eval_episodes, args.eval_deterministic
        played = evaluate(checkpoint, episodes, deterministic, device=run.device, seed=args.seed, quiet=True)
        run.check_interrupt()
        run.writer.add_scalar("charts/eval_return", np.mean(played), run.global_step)
        how = "most likely action" if deterministic else "sampled actions"
        mean = f"mean return {np.mean(played):.2f} +/- {np.std(played):.2f}"
        run.progress.write(f"eval ({how}): {len(played)} episodes, {mean}")
        run.start_time += time.time() - started


if __name__ == "__main__":
    main(*cli())  # tyro.cli(Args), with a --resume checkpoint's flags as the defaults; and that checkpoint
