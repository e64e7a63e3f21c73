"""PPO with an exact tanh-squashed Gaussian policy, for any gymnasium env with a Box action space.

The actor is a Gaussian over pre-squash actions u; an action is a = low + (tanh(u) + 1) / 2 * (high - low), so
every action lies inside the env's bounds with no clipping. The log-probability is exact (change of variables),

    log p(a) = log N(u; mean, std) - sum log(1 - tanh(u)^2) - sum log((high - low) / 2),
    log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u))          (stable for any u; no atanh of a stored action)

and is evaluated on the stored pre-squash sample u. The squashed distribution has no closed-form entropy; the
script uses the one-sample estimate H ~ H[N(mean, std)] + sum log((high - low) / 2) + sum log(1 - tanh(u')^2),
u' = mean + std * eps a fresh reparameterised sample: unbiased, and with --ent-coef > 0 its gradient also pushes
the mean away from the saturated tails. The log-std is a free parameter (`--state-dependent-std`: a head of the
actor), clamped to [--log-std-min, --log-std-max]; actor and critic are separate tanh MLPs. Deterministic
evaluation plays the rescaled tanh(mean).

Observations are normalised by their running mean and std (clipped) and rewards scaled by the running std of
the discounted return, as CleanRL's ppo_continuous_action.py does with gymnasium wrappers; here the statistics are
buffers of the agent, so they are saved in checkpoints, restored on --resume and frozen in evaluation (a reloaded
agent sees what it saw in training). Both stay frozen for a whole rollout and take in its observations and
returns after it, so the rollout loop does no statistics work and training replays every observation exactly as
the policy saw it. Pendulum is only ever truncated (200 steps): truncated steps bootstrap from the value of their
final observation, normalised with the same statistics; terminated steps do not.

    python ppo_continuous.py                          # Pendulum-v1, defaults tuned to learn it in 200k steps
    python ppo_continuous.py --env-id HalfCheetah-v5 --total-timesteps 1000000 --num-envs 1 --num-steps 2048 \
        --gamma 0.99 --learning-rate 3e-4 --num-minibatches 32    # CleanRL's MuJoCo settings (not tuned here)
    python ppo_continuous.py --env-id BipedalWalker-v3 --total-timesteps 5000000 --num-envs 32 --num-steps 2048 \
        --num-minibatches 1024 --gamma 0.999 --learning-rate 2.5e-4 --clip-coef 0.18 --ent-coef 0   # the SB3 zoo's
    python ppo_continuous.py --eval-checkpoint runs/<run>/checkpoint.pt
    python ppo_continuous.py --eval-interval 4          # evaluate every 4 iterations, keep the best in runs/<run>/best.pt
    python ppo_continuous.py --compile                # torch.compile the rollout step and the minibatch loss
    python ppo_continuous.py --async-envs             # each env in its own worker process (on many cores)
    python ppo_continuous.py --rollout-threads 0      # the rollout on all torch threads (default: on one)

Defaults, tuned for Pendulum-v1: 8 envs x 256 steps (batch 2048), 8 minibatches of 256 samples, 10 epochs,
learning rate 1e-3 annealed, gamma 0.95 (a short horizon suits Pendulum's dense reward; the SB3 zoo uses 0.9),
lambda 0.95, 64x64 tanh MLPs, log-std init 0 clamped to [-5, 2]. Measured on 2 CPU cores, 5 seeds, 200k steps
(`python benchmarks/run.py --preset continuous-pendulum`, about 60 s and 3.4k steps/s a run): the mean of the last
20 episodes first reaches -200 at a median of 62k steps (53k-115k, every seed) and ends at -159.
"""

import copy
import math
import os
import random
import signal
import time
from dataclasses import asdict, dataclass, field

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

SCRIPT = "ppo_continuous"


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
    capture_video: bool = False
    """whether to capture videos of the agent performances (check out `videos` folder)"""
    save_model: bool = False
    """whether to save checkpoints to `runs/{run_name}/checkpoint.pt`"""
    save_interval: int = 50
    """with --save-model, write a checkpoint every this many iterations (and at the end)"""
    resume: str | None = None
    """path of a checkpoint of this script to continue training from (pass the same flags as the original run)"""
    eval_checkpoint: str | None = None
    """if set, do not train: load this checkpoint, play --eval-episodes episodes and print the mean and std"""
    eval_episodes: int = 10
    """number of episodes played by the evaluation mode"""
    eval_deterministic: bool = True
    """the evaluation mode takes the most likely action (otherwise it samples)"""
    eval_interval: int = 0
    """while training, every this many iterations play --eval-episodes episodes as the evaluation mode does (env
    seeds --seed onwards), log their mean as charts/eval_return and keep the best policy so far in
    `runs/{run_name}/best.pt` (as SB3's EvalCallback); 0: never. Its time counts in charts/SPS; the last iteration
    is evaluated when the interval divides the number of iterations"""
    progress: bool = True
    """show a progress bar (`--no-progress` to turn it off)"""

    # ALGO LOGIC: algorithm arguments
    env_id: str = "Pendulum-v1"
    """the id of the environment (a gymnasium id with a Box action space)"""
    total_timesteps: int = 200_000
    """total timesteps of the experiments"""
    learning_rate: float = 1e-3
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments"""
    async_envs: bool = False
    """step each env in its own worker process (gymnasium's AsyncVectorEnv) instead of one after the other in this
    one: for machines with cores to spare (16 cores: BipedalWalker 1.29x); on 2 cores it is slower (0.63x)"""
    num_steps: int = 256
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.95
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 8
    """the number of mini-batches (formed over samples: it must divide num_envs * num_steps)"""
    update_epochs: int = 10
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization"""
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
    norm_obs: bool = True
    """normalise observations by their running mean and std (saved in checkpoints, frozen in evaluation)"""
    obs_clip: float = 10.0
    """clip normalised observations to [-obs_clip, obs_clip]"""
    norm_reward: bool = True
    """scale rewards by the running std of the discounted return (saved in checkpoints)"""
    reward_clip: float = 10.0
    """clip scaled rewards to [-reward_clip, reward_clip]"""

    # ALGO LOGIC: network arguments
    actor_hidden_sizes: tuple[int, ...] = (64, 64)
    """widths of the actor's tanh MLP layers"""
    critic_hidden_sizes: tuple[int, ...] = (64, 64)
    """widths of the critic's tanh MLP layers"""
    state_dependent_std: bool = False
    """make the log-std a head of the actor (default: one free parameter per action dimension)"""
    log_std_init: float = 0.0
    """initial log-std of the pre-squash Gaussian"""
    log_std_min: float = -5.0
    """lower clamp of the log-std"""
    log_std_max: float = 2.0
    """upper clamp of the log-std"""
    compile: bool = False
    """compile the network with torch.compile (opt-in: compilation takes a minute)"""
    rollout_threads: int = 1
    """torch's CPU threads during the rollout (the update uses all of them): a forward at batch num_envs gains little
    from a second thread, and that thread, left spinning after it, slows the env stepping beside it (HalfCheetah on
    2 cores, --compile: 1.19x the steps/s of the update's count); 0 keeps the update's count"""

    # to be filled in runtime
    batch_size: int = field(init=False)
    """the batch size (computed in runtime)"""
    minibatch_size: int = field(init=False)
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = field(init=False)
    """the number of iterations (computed in runtime)"""

    def __post_init__(self):
        for name in (
            "num_envs",
            "num_steps",
            "num_minibatches",
            "update_epochs",
            "total_timesteps",
            "save_interval",
            "eval_episodes",
        ):
            if getattr(self, name) < 1:
                raise SystemExit(f"error: --{name.replace('_', '-')}={getattr(self, name)} must be at least 1")
        if self.eval_interval < 0:
            raise SystemExit(f"error: --eval-interval={self.eval_interval} must be 0 (never) or more")
        if self.rollout_threads < 0:
            raise SystemExit(f"error: --rollout-threads={self.rollout_threads} must be 0 (the update's count) or more")
        for name in ("actor_hidden_sizes", "critic_hidden_sizes"):
            if not all(size >= 1 for size in getattr(self, name)):
                raise SystemExit(f"error: --{name.replace('_', '-')}={getattr(self, name)} must be widths of at least 1")
        if not self.log_std_min < self.log_std_max:
            raise SystemExit(f"error: --log-std-min={self.log_std_min} must be below --log-std-max={self.log_std_max}")
        if self.obs_clip <= 0 or self.reward_clip <= 0:
            raise SystemExit(f"error: --obs-clip={self.obs_clip} and --reward-clip={self.reward_clip} must be positive")
        self.batch_size = self.num_envs * self.num_steps
        if self.batch_size % self.num_minibatches != 0:
            raise SystemExit(
                f"error: --num-minibatches={self.num_minibatches} must divide num_envs * num_steps = {self.batch_size} "
                "(minibatches are formed over samples)"
            )
        self.minibatch_size = self.batch_size // self.num_minibatches
        if self.norm_adv and self.minibatch_size < 2:
            raise SystemExit(
                f"error: --num-minibatches={self.num_minibatches} leaves one sample per minibatch; "
                "advantage normalisation (--norm-adv) needs at least 2"
            )
        self.num_iterations = max(1, self.total_timesteps // self.batch_size)


def make_env(env_id: str, idx: int, capture_video: bool, run_name: str, in_worker: bool = False):
    def thunk():
        if in_worker:  # an AsyncVectorEnv worker process: Ctrl-C is the main process's, which then closes the workers
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array")
            env = gym.wrappers.RecordVideo(env, f"videos/{run_name}")
        else:
            env = gym.make(env_id)
        return DropStepInfo(env)

    return thunk


class DropStepInfo(gym.Wrapper):
    """An env whose steps return an empty info: the script reads no env's own step info (HalfCheetah's x_position,
    reward_ctrl, ...), and the vector env would merge each key of it across the envs at every step (on 8 HalfCheetahs:
    434 against 398 us a vector step). The vector env still adds final_obs, RecordEpisodeStatistics the episode."""

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, reward, terminated, truncated, _ = self.env.step(action)
        return obs, reward, terminated, truncated, {}


def check_env_args(env_id: str) -> None:
    """One clear line for an env this script cannot run: unknown id, non-Box actions, unbounded actions."""
    try:
        spec = gym.spec(env_id)
    except gym.error.Error:
        raise SystemExit(
            f"error: --env-id={env_id} is not a registered gymnasium id "
            "(list them with `python -c 'import gymnasium; gymnasium.pprint_registry()'`)"
        ) from None
    env = gym.make(spec)
    action_space, observation_space = env.action_space, env.observation_space
    env.close()
    if not isinstance(action_space, gym.spaces.Box):
        raise SystemExit(
            f"error: --env-id={env_id} has a {type(action_space).__name__} action space; "
            f"{SCRIPT}.py needs a Box one (e.g. Pendulum-v1, HalfCheetah-v5); use ppo_fsmn_cartpole.py for Discrete actions"
        )
    if len(action_space.shape) != 1 or not (np.isfinite(action_space.low).all() and np.isfinite(action_space.high).all()):
        raise SystemExit(f"error: --env-id={env_id} must have a flat Box action space with finite bounds, not {action_space}")
    if not (isinstance(observation_space, gym.spaces.Box) and len(observation_space.shape) == 1):
        raise SystemExit(f"error: --env-id={env_id} must have a flat Box observation space, not {observation_space}")


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_dim: int, hidden_sizes: tuple[int, ...]) -> nn.Sequential:
    """Linear + tanh layers of the given widths (CleanRL's continuous-action trunk)."""
    layers, width = [], in_dim
    for size in hidden_sizes:
        layers += [layer_init(nn.Linear(width, size)), nn.Tanh()]
        width = size
    return nn.Sequential(*layers)


class RunningNorm(nn.Module):
    """Normalisation by a running mean and variance (Chan et al.'s parallel update, as in SB3's VecNormalize),
    clipped to +-clip. Its statistics are buffers: checkpoints carry them and evaluation, which never calls
    `update`, uses them frozen. Observations go through one; rewards are divided by the std of another's
    discounted returns."""

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
        self.var.copy_((self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total) / total)
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp((x - self.mean) / torch.sqrt(self.var + self.epsilon), -self.clip, self.clip)


class Agent(nn.Module):
    def __init__(self, obs_dim: int, action_space: gym.spaces.Box, args: Args):
        super().__init__()
        act_dim = action_space.shape[0]
        self.log_std_min, self.log_std_max = args.log_std_min, args.log_std_max
        self.register_buffer("action_low", torch.as_tensor(action_space.low, dtype=torch.float32))  # (A,)
        self.register_buffer("action_high", torch.as_tensor(action_space.high, dtype=torch.float32))  # (A,)
        self.obs_norm = RunningNorm(obs_dim, clip=args.obs_clip) if args.norm_obs else nn.Identity()
        self.return_norm = RunningNorm(1)  # statistics of the discounted return, for reward scaling
        critic_width, actor_width = (
            ([obs_dim] + list(sizes))[-1] for sizes in (args.critic_hidden_sizes, args.actor_hidden_sizes)
        )
        self.critic = nn.Sequential(mlp(obs_dim, args.critic_hidden_sizes), layer_init(nn.Linear(critic_width, 1), std=1.0))
        self.actor_trunk = mlp(obs_dim, args.actor_hidden_sizes)
        self.actor_mean = layer_init(nn.Linear(actor_width, act_dim), std=0.01)
        if args.state_dependent_std:
            self.actor_logstd = layer_init(nn.Linear(actor_width, act_dim), std=0.01, bias_const=args.log_std_init)
        else:
            self.actor_logstd = nn.Parameter(torch.full((1, act_dim), args.log_std_init))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x).squeeze(-1)  # (B,)

    def actor_params(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and clamped log-std of the pre-squash Gaussian, both (B, A)."""
        features = self.actor_trunk(x)
        mean = self.actor_mean(features)
        log_std = self.actor_logstd(features) if isinstance(self.actor_logstd, nn.Linear) else self.actor_logstd
        return mean, log_std.clamp(self.log_std_min, self.log_std_max).expand_as(mean)

    def get_action_and_value(
        self, x: torch.Tensor, u: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Pre-squash sample u (B, A) (drawn when not given), its exact log-prob (B,), the entropy estimate (B,)
        and the value (B,). The env action is squash_action(u, agent.action_low, agent.action_high)."""
        mean, log_std = self.actor_params(x)
        if u is None:
            u = mean + log_std.exp() * torch.randn_like(mean)
        logprob = squashed_log_prob(u, mean, log_std, self.action_low, self.action_high)
        entropy = squashed_entropy(mean, log_std, self.action_low, self.action_high, torch.randn_like(mean))
        return u, logprob, entropy, self.get_value(x)

    def sample_action_and_value(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The rollout's call: a pre-squash sample u (B, A), its exact log-prob (B,) and the value (B,), without the
        entropy estimate that only the update needs."""
        mean, log_std = self.actor_params(x)
        u = mean + log_std.exp() * torch.randn_like(mean)
        return u, squashed_log_prob(u, mean, log_std, self.action_low, self.action_high), self.get_value(x)

    def act(self, x: torch.Tensor, deterministic: bool) -> torch.Tensor:
        """Env actions (B, A): the rescaled tanh(mean), or a rescaled tanh of a sample."""
        mean, log_std = self.actor_params(x)
        u = mean if deterministic else mean + log_std.exp() * torch.randn_like(mean)
        return squash_action(u, self.action_low, self.action_high)


# ALGO LOGIC: the tanh-squashed Gaussian, as pure functions (u, mean, log_std: (..., A); low, high: (A,))
def tanh_log_abs_det(u: torch.Tensor) -> torch.Tensor:
    """log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u)), elementwise; finite for any finite u (the naive form
    is log(0) = -inf from |u| ~ 9.1 in float32). Same identity as torch's TanhTransform.log_abs_det_jacobian."""
    return 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))


def squash_action(u: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """a = low + (tanh(u) + 1) / 2 * (high - low). The clamp is a no-op in exact arithmetic; it only guards the
    last float rounding, so an action is never outside [low, high]."""
    action = low + (torch.tanh(u) + 1.0) * 0.5 * (high - low)
    return torch.minimum(torch.maximum(action, low), high)


def squashed_log_prob(
    u: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor, low: torch.Tensor, high: torch.Tensor
) -> torch.Tensor:
    """Exact log-density (..., ) of the action squash_action(u) under the squashed Gaussian, from the pre-squash u:
    log N(u; mean, std) - sum log(1 - tanh(u)^2) - sum log((high - low) / 2)."""
    gaussian = -0.5 * ((u - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2.0 * math.pi)
    return (gaussian - tanh_log_abs_det(u) - torch.log((high - low) / 2.0)).sum(-1)


def squashed_entropy(
    mean: torch.Tensor, log_std: torch.Tensor, low: torch.Tensor, high: torch.Tensor, noise: torch.Tensor
) -> torch.Tensor:
    """One-sample estimate (..., ) of the squashed distribution's entropy, H[a] = H[u] + E[log |da/du|]:
    the Gaussian entropy plus the log-det of the squash at u' = mean + std * noise (noise ~ N(0, 1))."""
    u = mean + log_std.exp() * noise
    gaussian_entropy = 0.5 + 0.5 * math.log(2.0 * math.pi) + log_std
    return (gaussian_entropy + tanh_log_abs_det(u) + torch.log((high - low) / 2.0)).sum(-1)


def rollout_step(agent: Agent, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One rollout step's inference: raw obs (B, obs_dim) seen through the frozen observation statistics -> pre-squash
    samples u (B, A), their exact log-probabilities, values and the env actions squash_action(u) (B, A), in bounds."""
    u, logprob, value = agent.sample_action_and_value(agent.obs_norm(obs))
    return u, logprob, value, squash_action(u, agent.action_low, agent.action_high)


def minibatch_loss(
    agent: Agent,
    args: Args,
    mb_obs: torch.Tensor,
    mb_actions: torch.Tensor,
    mb_logprobs: torch.Tensor,
    mb_advantages: torch.Tensor,
    mb_returns: torch.Tensor,
    mb_values: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The PPO loss of one minibatch of samples (normalised observations, pre-squash actions u). Returns the loss and
    (value loss, policy loss, entropy, old approx KL, approx KL, loss, clip fraction), without a host sync."""
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(mb_obs, mb_actions)
    logratio = newlogprob - mb_logprobs
    ratio = logratio.exp()

    with torch.no_grad():
        # calculate approx_kl http://joschu.net/blog/kl-approx.html
        old_approx_kl = (-logratio).mean()
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()

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
    return loss, torch.stack([v_loss, pg_loss, entropy_loss, old_approx_kl, approx_kl, loss, clipfrac]).detach()


def minibatch_loss_at(
    agent: Agent, args: Args, mb_inds: torch.Tensor, *batch: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """minibatch_loss of the samples mb_inds (M,) of the flat batch (b_obs, b_actions, ...: (T * B, ...)): compiled,
    the gather is fused into the graph's kernels instead of an indexing call per tensor."""
    return minibatch_loss(agent, args, *(x[mb_inds] for x in batch))


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    terminations: torch.Tensor,
    truncations: torch.Tensor,
    final_values: torch.Tensor,
    next_value: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016) over (T, B) tensors.

    Step t's successor value is values[t + 1] (next_value after the last step) unless the episode ended at t:
    a terminated step has no successor (0), a truncated one bootstraps from final_values[t], the value of
    its final observation (the next stored observation already belongs to the new episode).
    """
    dones = torch.logical_or(terminations, truncations).to(rewards.dtype)
    bootstrap_final = torch.logical_and(truncations, ~terminations).to(rewards.dtype)
    next_values = torch.cat([values[1:], next_value.unsqueeze(0)])  # (T, B)
    next_values = next_values * (1.0 - dones) + final_values * bootstrap_final
    deltas = rewards + gamma * next_values - values
    discounts = gamma * gae_lambda * (1.0 - dones)  # the recursion stops at the end of an episode
    advantages = torch.zeros_like(rewards)
    lastgaelam = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        lastgaelam = deltas[t] + discounts[t] * lastgaelam
        advantages[t] = lastgaelam
    return advantages, advantages + values


def explained_variance(y_pred: torch.Tensor, y_true: torch.Tensor) -> float:
    var_y = torch.var(y_true)
    return float("nan") if var_y == 0 else (1 - torch.var(y_true - y_pred) / var_y).item()


# TRY NOT TO MODIFY: checkpoint helpers
def save_checkpoint(path: str, checkpoint: dict) -> None:
    """Write atomically: a crash mid-write leaves the previous checkpoint intact."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp_path = f"{path}.tmp"
    torch.save(checkpoint, tmp_path)
    os.replace(tmp_path, path)


def load_checkpoint(path: str, flag: str) -> dict:
    """Load tensors and plain values only (`weights_only=True`) and refuse another script's checkpoint."""
    if not os.path.isfile(path):
        raise SystemExit(f"error: {flag}={path} does not exist")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise SystemExit(f"error: {flag}={path} is not a checkpoint of {SCRIPT}.py ({type(e).__name__})") from None
    script = checkpoint.get("script") if isinstance(checkpoint, dict) else None
    if script != SCRIPT:
        raise SystemExit(f"error: {flag}={path} is a checkpoint of {script or 'an unknown script'}, not of {SCRIPT}.py")
    return checkpoint


def rng_states() -> dict:
    """Python's, numpy's (all of its MT19937 state) and torch's generators, CUDA's too when there is one."""
    _, key, pos, has_gauss, cached_gaussian = np.random.get_state()
    numpy_state = {
        "key": key.tolist(),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached_gaussian),
    }
    states = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    n = states["numpy"]
    np.random.set_state(("MT19937", np.array(n["key"], dtype=np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def make_checkpoint(
    args: Args, run_name: str, agent: nn.Module, optimizer: torch.optim.Optimizer, iteration: int, global_step: int
) -> dict:
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


# ALGO LOGIC: evaluation
def build_agent_from_checkpoint(checkpoint: dict, device: torch.device) -> tuple[Agent, Args]:
    saved = {k: v for k, v in checkpoint["args"].items() if k not in ("batch_size", "minibatch_size", "num_iterations")}
    args = Args(**saved)
    check_env_args(args.env_id)
    env = make_env(args.env_id, 0, False, "")()
    agent = Agent(env.observation_space.shape[0], env.action_space, args).to(device)
    env.close()
    agent.load_state_dict(checkpoint["model"])  # the normalisation statistics are buffers: restored here, exactly
    return agent, args


def evaluate(checkpoint_path: str, episodes: int, deterministic: bool, device: torch.device, seed: int) -> list[float]:
    """Play `episodes` whole episodes with a saved policy and return their (raw) returns."""
    agent, saved_args = build_agent_from_checkpoint(load_checkpoint(checkpoint_path, "--eval-checkpoint"), device)
    return play(agent, saved_args.env_id, episodes=episodes, deterministic=deterministic, device=device, seed=seed)


@torch.no_grad()
def play(agent: Agent, env_id: str, episodes: int, deterministic: bool, device: torch.device, seed: int) -> list[float]:
    """Play `episodes` whole episodes (env seeds seed, seed + 1, ...) and return their raw returns. The observation
    statistics are the agent's, frozen: evaluation reads them and never updates them. A sampling policy draws from
    torch's generator seeded with `seed`, and the caller's generator state is restored after: evaluating during
    training leaves the training's random numbers as they were."""
    env = make_env(env_id, 0, False, "")()
    returns = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            done, total = False, 0.0
            while not done:
                obs_t = agent.obs_norm(torch.as_tensor(obs, dtype=torch.float32, device=device).unsqueeze(0))  # frozen
                action = agent.act(obs_t, deterministic)  # (1, A), inside the bounds
                obs, reward, terminated, truncated, _ = env.step(action[0].cpu().numpy())
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    env.close()
    return returns


def main(args: Args) -> None:
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.eval_checkpoint is not None:
        returns = evaluate(args.eval_checkpoint, args.eval_episodes, args.eval_deterministic, device, args.seed)
        print(f"eval: {len(returns)} episodes, mean return {np.mean(returns):.2f} +/- {np.std(returns):.2f}")
        return
    check_env_args(args.env_id)
    checkpoint = load_checkpoint(args.resume, "--resume") if args.resume is not None else None

    # TRY NOT TO MODIFY: run name, tracking and logging
    run_name = checkpoint["run_name"] if checkpoint else f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    if args.track:
        import wandb

        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            sync_tensorboard=True,
            config=vars(args),
            name=run_name,
            monitor_gym=True,
            save_code=True,
        )
    writer = SummaryWriter(f"runs/{run_name}")
    writer.add_text(
        "hyperparameters",
        "|param|value|\n|-|-|\n%s" % ("\n".join([f"|{key}|{value}|" for key, value in vars(args).items()])),
    )
    checkpoint_path = f"runs/{run_name}/checkpoint.pt"

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    # ALGO LOGIC: env setup, agent and optimizer
    # env setup: SAME_STEP autoreset, so a done step returns the next episode's first observation and
    # the finished episode's last one in info["final_obs"] (https://farama.org/Vector-Autoreset-Mode)
    # the envs step in this process one after the other, or with --async-envs each in its own worker process
    vector_env = gym.vector.AsyncVectorEnv if args.async_envs else gym.vector.SyncVectorEnv
    envs = vector_env(
        [make_env(args.env_id, i, args.capture_video, run_name, args.async_envs) for i in range(args.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    obs_dim, act_dim = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]

    agent = Agent(obs_dim, envs.single_action_space, args).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    # the same parameters compiled or not; `agent` is what gets saved
    # on the CPU inductor's C++ wrapper calls a graph's kernels without Python in between (a rollout step at 8 envs:
    # 65 against 83 us); it takes longer to compile
    options = {"cpp_wrapper": device.type == "cpu"}
    policy_step, loss_fn = (
        torch.compile(f, options=options) if args.compile else f for f in (rollout_step, minibatch_loss_at)
    )
    update_threads = torch.get_num_threads()  # the update's CPU threads; the rollout runs on --rollout-threads

    # TRY NOT TO MODIFY: resume
    start_iteration, global_step = 1, 0
    if checkpoint:
        try:
            agent.load_state_dict(checkpoint["model"])
        except RuntimeError:
            raise SystemExit(
                f"error: --resume={args.resume} holds a network of another shape; pass the run's own flags"
            ) from None
        optimizer.load_state_dict(checkpoint["optimizer"])
        start_iteration, global_step = checkpoint["iteration"] + 1, checkpoint["global_step"]
        set_rng_states(checkpoint["rng_states"])
        if start_iteration > args.num_iterations:
            raise SystemExit(
                f"error: --total-timesteps={args.total_timesteps} must exceed the checkpoint's {global_step} steps to resume"
            )

    # ALGO LOGIC: storage setup, (num_steps, num_envs, ...): what the env returns stays in numpy until the rollout ends
    obs = torch.zeros((args.num_steps, args.num_envs, obs_dim), device=device)  # raw observations
    actions = torch.zeros((args.num_steps, args.num_envs, act_dim), device=device)  # pre-squash samples u, not env actions
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    rewards_np = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)  # raw rewards
    terminations_np = np.zeros((args.num_steps, args.num_envs), dtype=bool)
    truncations_np = np.zeros((args.num_steps, args.num_envs), dtype=bool)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)
    final_values = torch.zeros((args.num_steps, args.num_envs), device=device)  # V(final obs) of truncated steps
    discounted_returns = np.zeros(args.num_envs)  # the running episodes' discounted returns, for reward scaling

    # ALGO LOGIC: periodic evaluation (--eval-interval): the best policy so far, and its mean return, in best.pt; a resumed
    # run goes on from the best it had (Ctrl-C waits for an evaluation to end)
    best_path, best_eval = f"runs/{run_name}/best.pt", -math.inf
    if checkpoint and args.eval_interval and os.path.isfile(best_path):
        best_eval = load_checkpoint(best_path, "--resume's best.pt")["eval_return"]

    # TRY NOT TO MODIFY: start the game
    start_time, start_step = time.time(), global_step
    next_obs, _ = envs.reset(seed=args.seed + global_step)
    next_obs = torch.as_tensor(next_obs, dtype=torch.float32, device=device)
    recent_returns, done_iteration, last_good = [], start_iteration - 1, None
    progress = tqdm(range(start_iteration, args.num_iterations + 1), disable=not args.progress, desc=run_name)
    # Ctrl-C is honoured at the next environment step: a KeyboardInterrupt raised wherever the signal lands (inside a
    # finalizer, for one) can be swallowed, a flag cannot. A second Ctrl-C interrupts at once.
    interrupts = []

    def on_interrupt(signum, frame):
        interrupts.append(signum)
        if len(interrupts) > 1:
            raise KeyboardInterrupt

    previous_handler = signal.signal(signal.SIGINT, on_interrupt)

    try:
        for iteration in progress:
            # Annealing the rate if instructed to do so.
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / args.num_iterations
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate

            # ALGO LOGIC: rollout; the buffer keeps the pre-squash sample u, the env gets the squashed action
            final_values.zero_()
            torch.set_num_threads(args.rollout_threads or update_threads)
            for step in range(args.num_steps):
                if interrupts:
                    raise KeyboardInterrupt
                global_step += args.num_envs
                obs[step] = next_obs

                with torch.inference_mode():  # the observation statistics stay frozen for the whole rollout
                    action, logprob, value, env_action = policy_step(agent, next_obs)
                values[step] = value
                actions[step] = action
                logprobs[step] = logprob

                next_obs_np, reward, termination, truncation, infos = envs.step(env_action.cpu().numpy())
                rewards_np[step], terminations_np[step], truncations_np[step] = reward, termination, truncation
                if truncation.any():
                    # bootstrap a truncated episode from its final observation, normalised with the same statistics
                    final_obs = np.stack([o if t else np.zeros(obs_dim) for o, t in zip(infos["final_obs"], truncation)])
                    with torch.inference_mode():
                        final_value = agent.get_value(
                            agent.obs_norm(torch.as_tensor(final_obs, dtype=torch.float32, device=device))
                        )
                    final_values[step] = final_value * torch.as_tensor(truncation, device=device)
                next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32, device=device)

                # TRY NOT TO MODIFY: episode statistics
                if "episode" in infos:
                    for r, length in zip(infos["episode"]["r"][infos["_episode"]], infos["episode"]["l"][infos["_episode"]]):
                        writer.add_scalar("charts/episodic_return", r, global_step)
                        writer.add_scalar("charts/episodic_length", length, global_step)
                        recent_returns = (recent_returns + [float(r)])[-20:]

            torch.set_num_threads(update_threads)

            # ALGO LOGIC: reward scaling by the running std of the discounted return, not of the reward (Engstrom et al.
            # 2020, arXiv 2005.12729; gymnasium's NormalizeReward); the return restarts with every episode. The
            # statistics take in the whole rollout's returns, then scale its rewards.
            rewards = torch.as_tensor(rewards_np, device=device)
            if args.norm_reward:
                rollout_returns = np.zeros_like(rewards_np)
                for t in range(args.num_steps):
                    discounted_returns = discounted_returns * args.gamma + rewards_np[t]
                    rollout_returns[t] = discounted_returns
                    discounted_returns = discounted_returns * ~(terminations_np[t] | truncations_np[t])
                agent.return_norm.update(torch.as_tensor(rollout_returns, device=device).reshape(-1, 1))  # (T * B, 1)
                reward_std = torch.sqrt(agent.return_norm.var + agent.return_norm.epsilon)  # (1,)
                rewards = (rewards / reward_std).clamp(-args.reward_clip, args.reward_clip)

            # ALGO LOGIC: bootstrap value and advantages
            terminations, truncations = (torch.as_tensor(x, device=device) for x in (terminations_np, truncations_np))
            with torch.no_grad():
                next_value = agent.get_value(agent.obs_norm(next_obs))
                advantages, returns = compute_gae(
                    rewards, values, terminations, truncations, final_values, next_value, args.gamma, args.gae_lambda
                )
                seen_obs = agent.obs_norm(obs)  # (T, B, obs_dim): exactly what the policy saw, the statistics were frozen
            if args.norm_obs:
                agent.obs_norm.update(obs.flatten(0, 1))  # then the statistics take in this rollout

            # flatten the batch
            b_obs = seen_obs.reshape((-1, obs_dim))  # (T * B, obs_dim), normalised as the policy saw them
            b_actions = actions.reshape((-1, act_dim))  # (T * B, A), pre-squash u
            b_logprobs, b_advantages = logprobs.reshape(-1), advantages.reshape(-1)  # (T * B,)
            b_returns, b_values = returns.reshape(-1), values.reshape(-1)  # (T * B,)

            # ALGO LOGIC: optimizing the policy and value network over minibatches of samples
            b_inds = np.arange(args.batch_size)
            stats = []
            for epoch in range(args.update_epochs):
                np.random.shuffle(b_inds)
                for start in range(0, args.batch_size, args.minibatch_size):
                    mb_inds = torch.as_tensor(b_inds[start : start + args.minibatch_size], device=device)
                    minibatch = (b_obs, b_actions, b_logprobs, b_advantages, b_returns, b_values)
                    loss, mb_stats = loss_fn(agent, args, mb_inds, *minibatch)
                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizer.step()
                    stats.append(mb_stats)

                if args.target_kl is not None and stats[-1][4].item() > args.target_kl:
                    break

            # TRY NOT TO MODIFY: record losses (averaged over all minibatches, one host sync per iteration)
            weights_finite = torch.stack([p.isfinite().all() for p in agent.parameters()]).all().float().view(1)
            *losses, weights_finite = torch.cat([torch.stack(stats).mean(0), weights_finite]).tolist()
            v_loss, pg_loss, entropy_loss, old_approx_kl, approx_kl, loss, clipfrac = losses
            if not (np.isfinite(loss) and weights_finite):
                raise SystemExit(
                    f"error: non-finite loss or weights at iteration {iteration}; the last good checkpoint is kept"
                )
            y_pred, y_true = values.flatten(), returns.flatten()
            sps = int((global_step - start_step) / (time.time() - start_time))
            writer.add_scalar("charts/learning_rate", float(optimizer.param_groups[0]["lr"]), global_step)
            writer.add_scalar("losses/value_loss", v_loss, global_step)
            writer.add_scalar("losses/policy_loss", pg_loss, global_step)
            writer.add_scalar("losses/entropy", entropy_loss, global_step)
            writer.add_scalar("losses/old_approx_kl", old_approx_kl, global_step)
            writer.add_scalar("losses/approx_kl", approx_kl, global_step)
            writer.add_scalar("losses/clipfrac", clipfrac, global_step)
            writer.add_scalar("losses/explained_variance", explained_variance(y_pred, y_true), global_step)
            writer.add_scalar("charts/SPS", sps, global_step)
            if recent_returns:
                progress.set_postfix(ret=f"{np.mean(recent_returns):.1f}", sps=sps, refresh=False)

            # ALGO LOGIC: periodic evaluation, the best policy so far kept (the statistics frozen, as in training)
            if args.eval_interval and iteration % args.eval_interval == 0:
                torch.set_num_threads(args.rollout_threads or update_threads)
                eval_returns = play(
                    agent,
                    args.env_id,
                    episodes=args.eval_episodes,
                    deterministic=args.eval_deterministic,
                    device=device,
                    seed=args.seed,
                )
                eval_return = float(np.mean(eval_returns))
                torch.set_num_threads(update_threads)
                writer.add_scalar("charts/eval_return", eval_return, global_step)
                if eval_return > best_eval:
                    best_eval = eval_return
                    best = make_checkpoint(args, run_name, agent, optimizer, iteration, global_step)
                    save_checkpoint(best_path, {**best, "eval_return": eval_return})

            # TRY NOT TO MODIFY: periodic checkpoint
            done_iteration = iteration
            if args.save_model:  # a snapshot of this complete iteration: what Ctrl-C or an error saves later
                last_good = copy.deepcopy(make_checkpoint(args, run_name, agent, optimizer, iteration, global_step))
                if iteration % args.save_interval == 0:
                    save_checkpoint(checkpoint_path, last_good)
    except KeyboardInterrupt:
        print(f"interrupted during iteration {done_iteration + 1}; keeping the logs and the last checkpoint")
    finally:
        # TRY NOT TO MODIFY: on success, error or Ctrl-C, keep the logs and the last complete iteration's checkpoint
        if last_good is not None:
            save_checkpoint(checkpoint_path, last_good)
            print(
                f"checkpoint saved to {checkpoint_path} (iteration {last_good['iteration']}, step {last_good['global_step']})"
            )
        signal.signal(signal.SIGINT, previous_handler)
        progress.close()
        envs.close()
        writer.close()
        if args.track:
            import wandb

            wandb.finish()


if __name__ == "__main__":
    main(tyro.cli(Args))
