"""PPO with an exact tanh-squashed Gaussian policy, for any gymnasium env with a Box action space.

The env gets a = low + (tanh(u) + 1) / 2 * (high - low) of a Gaussian sample u, inside its bounds with no
clipping; the log-probability is exact (change of variables on the stored u) and the entropy a one-sample
estimate. Observations and rewards are normalised by running statistics kept in the agent, so checkpoints
carry them.

    python ppo_continuous.py                          # Pendulum-v1
    python ppo_continuous.py --env-id LunarLanderContinuous-v3 --total-timesteps 500000    # the same defaults
    python ppo_continuous.py --eval-interval 4        # evaluate every 4 iterations, keep the best in runs/<run>/best.pt
    python ppo_continuous.py --save-model             # then --resume or --eval-checkpoint runs/<run>/checkpoint.pt
    python ppo_continuous.py --compile                # torch.compile the rollout step and the minibatch loss
Results: README.md and benchmarks/results/continuous_pendulum.md, continuous_fresh_*.md, continuous_mujoco.md,
continuous_bipedal.md."""

import atexit
import contextlib
import copy
import glob
import hashlib
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
import torch
import torch.nn as nn
import tyro
from torch.distributions import Normal, TanhTransform
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

SCRIPT = "ppo_continuous"
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
    env_id: str = "Pendulum-v1"
    """the id of the environment (a gymnasium id with a bounded Box action space and a flat Box observation)"""
    total_timesteps: int = 200_000
    """total timesteps of the experiments"""
    learning_rate: float = 1.13e-3  # tuned with the values below: tune_continuous_carry.md's best trial
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments"""
    num_steps: int = 64
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.929
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 16
    """the number of mini-batches (formed over samples: it must divide num_envs * num_steps)"""
    update_epochs: int = 10
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization"""
    clip_coef: float = 0.157
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float = 8.3e-3
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.986
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = 0.02
    """the target KL divergence threshold (stop the epochs of an iteration early past it)"""
    norm_reward: bool = True
    """scale rewards by the running std of the discounted return (saved in checkpoints)"""
    reward_clip: float = 10.0
    """clip scaled rewards to [-reward_clip, reward_clip]"""
    eval_interval: int = 0
    """every this many iterations (0: never): play --eval-episodes, log them, keep the best in runs/{run_name}/best.pt"""

    # ALGO LOGIC: network arguments
    actor_hidden_sizes: tuple[int, ...] = (64, 64)
    """widths of the actor's tanh MLP layers"""
    critic_hidden_sizes: tuple[int, ...] = (64, 64)
    """widths of the critic's tanh MLP layers"""
    state_dependent_std: bool = False
    """make the log-std a head of the actor (otherwise one free parameter per action dimension)"""
    log_std_init: float = 0.142
    """initial log-std of the pre-squash Gaussian"""
    log_std_min: float = -5.0
    """lower clamp of the log-std"""
    log_std_max: float = 2.0
    """upper clamp of the log-std"""
    norm_obs: bool = True
    """normalise observations by their running mean and std (saved in checkpoints, frozen in evaluation)"""
    obs_clip: float = 10.0
    """clip normalised observations to [-obs_clip, obs_clip]"""

    # ENGINEERING: speed and threads
    compile: bool = False
    """compile the network with torch.compile (opt-in: compiling takes time at the start)"""
    threads: int = 0
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
        # the flags every script has are checked below the banner (check_flags), then these rows, this
        # script's own (flag, accepted, what it must be): one line names the first refused, before anything
        # is written
        check_flags(
            self,
            (
                "num_minibatches",
                self.batch_size % max(self.num_minibatches, 1) == 0,
                f"a divisor of the batch, {self.batch_size}",
            ),
            ("update_epochs", self.update_epochs >= 1, "at least 1"),
            ("obs_clip", 0 < self.obs_clip < math.inf, "a positive number"),
            ("reward_clip", 0 < self.reward_clip < math.inf, "a positive number"),
            ("eval_interval", self.eval_interval >= 0, "at least 0 (0: never)"),
            ("actor_hidden_sizes", min(self.actor_hidden_sizes, default=1) >= 1, "widths of at least 1"),
            ("critic_hidden_sizes", min(self.critic_hidden_sizes, default=1) >= 1, "widths of at least 1"),
            ("log_std_init", math.isfinite(self.log_std_init), "a finite number"),
            (
                "log_std_max",
                -math.inf < self.log_std_min < self.log_std_max < math.inf,
                f"above --log-std-min={self.log_std_min}",
            ),
        )


def make_env(env_id: str, idx: int, capture_video: bool, video_path: str):
    """video_path: the videos' folder and the start of their names, videos/<run_name>/rl-video."""

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
        return env

    return thunk


def check_env_args(env_id: str) -> None:
    """One clear line for an env this script cannot run: unknown id, unbounded or non-Box actions, a non-flat
    observation. MuJoCo's own warnings go through Python's (each shown once), not to stderr for every env and
    to ./MUJOCO_LOG.TXT; its deprecation warnings, about gymnasium's model files, are dropped."""
    if env_id not in gym.registry:
        raise SystemExit(f"error: --env-id={env_id} is not a registered gymnasium id (see gymnasium.pprint_registry())")
    if "mujoco" in str(gym.spec(env_id).entry_point):
        if not os.environ.get("DISPLAY"):  # no screen: videos render by EGL, unless another backend is set
            os.environ.setdefault("MUJOCO_GL", "egl")
        import mujoco

        def warn_once(message: str) -> None:  # deprecations are in gymnasium's model files, not the user's
            if "is deprecated" not in message:
                warnings.warn(f"MuJoCo: {message}", stacklevel=1)

        mujoco.set_mju_user_warning(warn_once)
    env = gym.make(env_id)
    env.close()
    actions, observations = env.action_space, env.observation_space
    bounded = isinstance(actions, gym.spaces.Box) and np.isfinite(actions.low).all() and np.isfinite(actions.high).all()
    flat = isinstance(observations, gym.spaces.Box) and len(observations.shape) == 1
    if not (bounded and len(actions.shape) == 1 and flat):
        raise SystemExit(
            f"error: --env-id={env_id} has {actions} actions and {observations} observations; "
            f"{SCRIPT}.py needs bounded flat Box actions and a flat Box observation (ppo_fsmn_cartpole.py takes Discrete)"
        )


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class RunningNorm(nn.Module):
    """Normalisation by a running mean and variance (Chan et al.'s parallel update, as SB3's VecNormalize),
    clipped to +-clip. Checkpoints carry its buffers; evaluation never calls `update`: frozen."""

    def __init__(self, dim: int, clip: float = 10.0, epsilon: float = 1e-8):
        super().__init__()
        self.clip, self.epsilon = clip, epsilon
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))
        self.register_buffer("count", torch.tensor(1e-4))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """x: (B, dim), a batch of raw observations."""
        batch_mean, batch_var, batch_count = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        delta, total = batch_mean - self.mean, self.count + batch_count
        self.mean += delta * batch_count / total
        var = self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total
        self.var.copy_(var / total)
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp((x - self.mean) / torch.sqrt(self.var + self.epsilon), -self.clip, self.clip)


def mlp(in_dim: int, hidden_sizes: tuple[int, ...]) -> nn.Sequential:
    """Linear + tanh layers of the given widths (CleanRL's MLP trunk)."""
    layers, width = [], in_dim
    for size in hidden_sizes:
        layers += [layer_init(nn.Linear(width, size)), nn.Tanh()]
        width = size
    return nn.Sequential(*layers)


class Agent(nn.Module):
    """A tanh-squashed Gaussian actor (an MLP trunk, a mean head with std 0.01, a log-std) and an MLP critic
    (std 1). The observation and return statistics are buffers, so checkpoints carry them."""

    def __init__(self, obs_dim: int, action_space: gym.spaces.Box, args: Args):
        super().__init__()
        act_dim = action_space.shape[0]
        self.log_std_min, self.log_std_max = args.log_std_min, args.log_std_max
        self.register_buffer("action_low", torch.as_tensor(action_space.low, dtype=torch.float32))  # (A,)
        self.register_buffer("action_high", torch.as_tensor(action_space.high, dtype=torch.float32))  # (A,)
        self.obs_norm = RunningNorm(obs_dim, clip=args.obs_clip) if args.norm_obs else nn.Identity()
        self.return_norm = RunningNorm(1)  # statistics of the discounted return, for reward scaling
        critic_width, actor_width = ((obs_dim, *sizes)[-1] for sizes in (args.critic_hidden_sizes, args.actor_hidden_sizes))
        self.critic = nn.Sequential(mlp(obs_dim, args.critic_hidden_sizes), layer_init(nn.Linear(critic_width, 1), std=1.0))
        self.actor_trunk = mlp(obs_dim, args.actor_hidden_sizes)
        self.actor_mean = layer_init(nn.Linear(actor_width, act_dim), std=0.01)
        if args.state_dependent_std:
            self.actor_logstd = layer_init(nn.Linear(actor_width, act_dim), std=0.01, bias_const=args.log_std_init)
        else:
            self.actor_logstd = nn.Parameter(torch.full((1, act_dim), args.log_std_init))

    def get_value(self, x):
        return self.critic(x).squeeze(-1)  # (B,)

    def get_action_and_value(self, x, action=None):
        """action: the pre-squash sample u (B, A), drawn when not given; the env gets squash_action(u).
        Returns u, its exact log-probability (B,), the one-sample entropy estimate (B,) (None when drawn:
        only training uses it) and the value (B,)."""
        hidden = self.actor_trunk(x)
        action_mean = self.actor_mean(hidden)  # (B, A)
        action_logstd = self.actor_logstd(hidden) if isinstance(self.actor_logstd, nn.Linear) else self.actor_logstd
        action_logstd = action_logstd.clamp(self.log_std_min, self.log_std_max)  # (B, A) or (1, A), broadcast
        if action is None:  # the rollout's call: a sample and its log-probability, without the entropy
            action, logprob = sample_squashed_gaussian(action_mean, action_logstd, self.action_low, self.action_high)
            return action, logprob, None, self.get_value(x)
        probs = Normal(action_mean, action_logstd.exp(), validate_args=False)
        # change of variables, evaluated on u (never atanh of a squashed action): log p(a) = log N(u) - log |da/du|
        logprob = (probs.log_prob(action) - squash_log_abs_det(action, self.action_low, self.action_high)).sum(1)
        # no closed form: H[a] = H[u] + E[log |da/du|], estimated at a fresh reparameterised sample (its
        # gradient reaches the mean: with --ent-coef > 0 it also pushes the mean away from the saturated tails)
        entropy = probs.entropy() + squash_log_abs_det(probs.rsample(), self.action_low, self.action_high)
        return action, logprob, entropy.sum(1), self.get_value(x)


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


def squash_action(u: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """a = low + (tanh(u) + 1) / 2 * (high - low); u: (..., A), low and high: (A,). The clamp is a no-op in
    exact arithmetic; it only guards the last float rounding, so an action is never outside [low, high]."""
    return torch.clamp(low + (torch.tanh(u) + 1.0) * 0.5 * (high - low), low, high)


def squash_log_abs_det(u: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """log |da/du| (..., A) of a = squash_action(u): log(1 - tanh(u)^2) + log((high - low) / 2).
    TanhTransform's formula, 2 * (log 2 - u - softplus(-2u)), stays finite where tanh(u) rounds to +-1 (|u| >
    9 in float32)."""
    return TanhTransform().log_abs_det_jacobian(u, torch.tanh(u)) + torch.log((high - low) / 2.0)


def sample_squashed_gaussian(mean: torch.Tensor, log_std: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> tuple:
    """A pre-squash sample u of Normal(mean, exp(log_std)) and the exact log-probability (B,) of
    squash_action(u), written out: the rollout's sampler, as Normal's and TanhTransform's overhead slows it
    (benchmarks/results/sps_rollout_sampling.md)."""
    noise = torch.randn_like(mean)
    u = mean + log_std.exp() * noise
    log_normal = -0.5 * noise**2 - log_std - 0.5 * math.log(2.0 * math.pi)
    log_det = 2.0 * (math.log(2.0) - u - nn.functional.softplus(-2.0 * u)) + torch.log(
        (high - low) / 2.0
    )  # as squash_log_abs_det
    return u, (log_normal - log_det).sum(-1)


def minibatch_loss(agent: Agent, args: Args, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    """The PPO loss of a minibatch of samples (normalised observations, pre-squash actions u), its fields by
    name. Returns the loss and its stats by name, without a host sync."""
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(mb["obs"], mb["actions"])
    logratio = newlogprob - mb["logprobs"]
    ratio = logratio.exp()
    with torch.no_grad():
        # calculate approx_kl http://joschu.net/blog/kl-approx.html
        old_approx_kl = (-logratio).mean()
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()
    mb_advantages, mb_returns, mb_values = mb["advantages"], mb["returns"], mb["values"]
    if args.norm_adv:
        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
    # Policy loss
    pg_loss1 = -mb_advantages * ratio
    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()
    # Value loss
    if args.clip_vloss:
        v_loss_unclipped = (newvalue - mb_returns) ** 2
        v_clipped = mb_values + torch.clamp(newvalue - mb_values, -args.clip_coef, args.clip_coef)
        v_loss_clipped = (v_clipped - mb_returns) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
    else:
        v_loss = 0.5 * ((newvalue - mb_returns) ** 2).mean()
    entropy_loss = entropy.mean()
    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
    stats = dict(value_loss=v_loss, policy_loss=pg_loss, entropy=entropy_loss, old_approx_kl=old_approx_kl)
    stats.update(approx_kl=approx_kl, clipfrac=clipfrac)
    # the loss logged is the one returned, so that a term added to it anywhere above is in losses/loss
    return loss, {name: x.detach() for name, x in dict(stats, loss=loss).items()}


def main(args: Args, checkpoint: dict | None = None) -> None:
    # TRY NOT TO MODIFY: --eval-checkpoint plays a saved policy instead of training
    if args.eval_checkpoint is not None:
        return run_evaluation(args)

    # ENGINEERING: the env's flags, checked before anything is written
    check_env_args(args.env_id)

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
        [make_env(args.env_id, i, args.capture_video, run.video_path) for i in range(args.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    obs_dim = envs.single_observation_space.shape[0]
    agent = Agent(obs_dim, envs.single_action_space, args).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    get_action_and_value, loss_fn = agent.get_action_and_value, minibatch_loss
    if args.compile:  # the same parameters, compiled; `agent` is what gets saved
        get_action_and_value, loss_fn = torch.compile(get_action_and_value), torch.compile(loss_fn)

    # TRY NOT TO MODIFY: resume
    global_step = run.restore(agent, optimizer)  # 0, or the checkpoint's; iterations() goes on from its next

    # ALGO LOGIC: storage setup, (num_steps, num_envs, ...)
    # what the env returns stays in numpy until the rollout ends
    obs = torch.zeros((args.num_steps, args.num_envs) + envs.single_observation_space.shape, device=device)
    # pre-squash samples u, not env actions
    actions = torch.zeros((args.num_steps, args.num_envs) + envs.single_action_space.shape, device=device)
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    rewards_np = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    terminations_np = np.zeros((args.num_steps, args.num_envs), dtype=bool)
    truncations_np = np.zeros((args.num_steps, args.num_envs), dtype=bool)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)
    final_values = torch.zeros((args.num_steps, args.num_envs), device=device)  # V(final obs) of truncated steps
    discounted_returns = np.zeros(args.num_envs)  # running episodes' discounted returns, for reward scaling
    next_obs, _ = envs.reset(seed=args.seed + global_step)
    next_obs = torch.as_tensor(next_obs, dtype=torch.float32, device=device)

    # TRY NOT TO MODIFY: start the game (loggers, Ctrl-C flag; at its end, the logs and last checkpoint kept)
    with run.start(envs):
        for iteration in run.iterations():
            # ALGO LOGIC: annealing the rate if instructed to do so
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / args.num_iterations
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate

            # ALGO LOGIC: rollout
            final_values.zero_()
            for step in range(args.num_steps):
                run.check_interrupt()
                global_step += args.num_envs
                obs[step] = next_obs

                with torch.no_grad():  # the observation statistics stay frozen for the whole rollout
                    action, logprob, _, value = get_action_and_value(agent.obs_norm(next_obs))
                    env_action = squash_action(action, agent.action_low, agent.action_high)
                values[step] = value
                actions[step] = action
                logprobs[step] = logprob

                next_obs_np, reward, termination, truncation, infos = envs.step(env_action.cpu().numpy())
                rewards_np[step] = reward
                terminations_np[step], truncations_np[step] = termination, truncation
                if truncation.any():
                    # bootstrap a truncated episode from its final observation, normalised with the same statistics
                    zeros = np.zeros(obs_dim)
                    final_obs = np.stack([o if t else zeros for o, t in zip(infos["final_obs"], truncation)])
                    with torch.no_grad():
                        final_obs = torch.as_tensor(final_obs, dtype=torch.float32, device=device)
                        final_value = agent.get_value(agent.obs_norm(final_obs))
                    final_values[step] = final_value * torch.as_tensor(truncation, device=device)
                next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32, device=device)
                run.log_episodes(infos, global_step)

            # ALGO LOGIC: reward scaling by the running std of the discounted return, not of the reward (Engstrom
            # et al. 2020, arXiv 2005.12729; gymnasium's NormalizeReward), statistics updated first
            if args.norm_reward:
                rollout_returns = np.zeros_like(rewards_np)
                for t in range(args.num_steps):
                    discounted_returns = discounted_returns * args.gamma + rewards_np[t]
                    rollout_returns[t] = discounted_returns
                    discounted_returns = discounted_returns * ~(terminations_np[t] | truncations_np[t])
                agent.return_norm.update(torch.as_tensor(rollout_returns, device=device).reshape(-1, 1))
                reward_std = np.float32(torch.sqrt(agent.return_norm.var + agent.return_norm.epsilon).item())
                rewards_np[:] = np.clip(rewards_np / reward_std, -args.reward_clip, args.reward_clip)

            # ALGO LOGIC: bootstrap value and advantages
            rewards, terminations, truncations = (
                torch.as_tensor(x, device=device) for x in (rewards_np, terminations_np, truncations_np)
            )
            with torch.no_grad():
                next_value = agent.get_value(agent.obs_norm(next_obs))
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
                seen_obs = agent.obs_norm(obs)  # (T, B, ...): the policy's input, the statistics were frozen
            if args.norm_obs:
                agent.obs_norm.update(obs.flatten(0, 1))  # then the statistics take in this rollout

            # ALGO LOGIC: optimizing the policy and value network over minibatches of samples
            batch = dict(obs=seen_obs, actions=actions, logprobs=logprobs, values=values)
            batch.update(advantages=advantages, returns=returns)
            batch = {name: x.flatten(0, 1) for name, x in batch.items()}  # (batch_size, ...)
            b_inds = np.arange(args.batch_size)
            stats = []
            for epoch in range(args.update_epochs):
                np.random.shuffle(b_inds)
                for start in range(0, args.batch_size, args.minibatch_size):
                    mb_inds = torch.as_tensor(b_inds[start : start + args.minibatch_size], device=device)
                    minibatch = {name: x[mb_inds] for name, x in batch.items()}  # (minibatch_size, ...)
                    loss, mb_stats = loss_fn(agent, args, minibatch)
                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizer.step()
                    stats.append(mb_stats)

                if args.target_kl is not None and stats[-1]["approx_kl"].item() > args.target_kl:
                    break

            # TRY NOT TO MODIFY: record and keep the iteration (losses as CleanRL logs them, and their means)
            run.record(iteration, global_step, agent, optimizer, stats, explained_variance(values, returns))
            # ENGINEERING: --eval-interval; best.pt keeps the best policy across --resume; Ctrl-C waits for it
            if args.eval_interval and iteration % args.eval_interval == 0:
                evaluate_and_keep_best(run, agent, optimizer, iteration, global_step)


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


def build_agent_from_checkpoint(checkpoint: dict, device: torch.device) -> tuple[Agent, Args]:
    # a flag an earlier version had and this one has not is dropped
    flags = {f.name for f in fields(Args) if f.init}
    args = Args(**{k: v for k, v in checkpoint["args"].items() if k in flags})
    check_env_args(args.env_id)
    env = make_env(args.env_id, 0, False, "")()
    agent = Agent(env.observation_space.shape[0], env.action_space, args).to(device)
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
) -> list[float]:
    """Play `episodes` whole episodes with a saved policy, print each (raw) return as it ends and
    return them; with a video_path (folder/name start), record those that RecordVideo's schedule picks."""
    agent, saved_args = build_agent_from_checkpoint(checkpoint, device)
    return play(agent, saved_args.env_id, episodes, deterministic, device, seed, video_path, talk=True)


def play(
    agent: Agent,
    env_id: str,
    episodes: int,
    deterministic: bool,
    device: torch.device,
    seed: int,
    video_path: str = "",
    talk: bool = False,
) -> list[float]:
    """Play `episodes` whole episodes (env seeds seed, seed + 1, ...; torch seeded with seed) and return their
    returns (printed as each ends when `talk`); with a video_path, record them as `evaluate` does."""
    torch.manual_seed(seed)  # a sampling evaluation (--no-eval-deterministic) repeats
    env = make_env(env_id, 0, bool(video_path), video_path)()
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        done, total = False, 0.0
        while not done:
            # frozen statistics
            obs_t = agent.obs_norm(torch.as_tensor(obs, dtype=torch.float32, device=device).unsqueeze(0))
            u = agent.actor_mean(agent.actor_trunk(obs_t)) if deterministic else agent.get_action_and_value(obs_t)[0]
            # (1, A); deterministic: the rescaled tanh(mean)
            action = squash_action(u, agent.action_low, agent.action_high)
            obs, reward, terminated, truncated, _ = env.step(action[0].cpu().numpy())
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
        if talk:
            print(f"episode {episode + 1}: return {total:.2f}")
    env.close()
    return returns


def evaluate_and_keep_best(run: Run, agent: Agent, optimizer: torch.optim.Optimizer, iteration: int, global_step: int) -> None:
    args, device = run.args, run.device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():  # training's RNG untouched
        eval_returns = play(agent, args.env_id, args.eval_episodes, args.eval_deterministic, device, args.seed)
    eval_return, best_path = float(np.mean(eval_returns)), os.path.join(run.dir, "best.pt")
    run.writer.add_scalar("charts/eval_return", eval_return, global_step)
    if not os.path.isfile(best_path) or eval_return > load_checkpoint(best_path, "best.pt")["eval_return"]:
        best = make_checkpoint(args, run.name, agent, optimizer, iteration, global_step)
        save_checkpoint(best_path, {**best, "eval_return": eval_return})
        run.progress.write(f"step {global_step}: eval return {eval_return:.2f}, the best so far: {best_path}")


if __name__ == "__main__":
    main(*cli())  # tyro.cli(Args), with a --resume checkpoint's flags as the defaults; and that checkpoint
