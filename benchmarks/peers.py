"""Peers to benchmark against, side by side, logging the same TensorBoard tags as the scripts.

    python benchmarks/peers.py recurrent-ppo --seed 1 --total-timesteps 150000     # sb3-contrib LSTM, masked CartPole
    python benchmarks/peers.py recurrent-ppo --env-id popgym-RepeatFirstEasy-v0 --prev-action --fsmn-settings
    python benchmarks/peers.py sb3-ppo --env-id CartPole-v1 --num-envs 4 --num-steps 128 --batch-size 128 --epochs 4
    python benchmarks/peers.py sb3-ppo-atari --env-id PongNoFrameskip-v4                # CnnPolicy, CleanRL's settings

Runs are written to runs/{env_id}__{exp_name}__{seed}__{time}, as the scripts do, with `charts/episodic_return`,
`charts/episodic_length` and `charts/SPS`, so benchmarks/report.py and benchmarks/sps.py read both alike.
"""

import math
import os
import sys
import time
from dataclasses import dataclass

import ale_py
import gymnasium as gym
import numpy as np
import torch
import tyro
from sb3_contrib import RecurrentPPO
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_atari_env, make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecFrameStack, VecNormalize
from torch.utils.tensorboard import SummaryWriter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ppo_fsmn_cartpole import TORCH_THREADS, free_cores  # noqa: E402  (the scripts' shared thread block)

gym.register_envs(ale_py)  # the Atari ids for make_atari_env


class CleanRLTags(BaseCallback):
    """Writes CleanRL's tags from SB3's Monitor infos: a return per finished episode, SPS per rollout. Before each
    rollout it gives torch the cores other processes leave free, as the scripts' `--threads 0` does every iteration,
    so that a peer and a script compared on a busy machine get the same thread policy."""

    def __init__(self, writer: SummaryWriter):
        super().__init__()
        self.writer, self.start, self.cpu_reading = writer, time.time(), []
        torch.set_num_threads(min(TORCH_THREADS, free_cores(self.cpu_reading)))

    def _on_rollout_start(self) -> None:
        torch.set_num_threads(min(TORCH_THREADS, free_cores(self.cpu_reading)))

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            if "episode" in info:
                self.writer.add_scalar("charts/episodic_return", info["episode"]["r"], self.num_timesteps)
                self.writer.add_scalar("charts/episodic_length", info["episode"]["l"], self.num_timesteps)
        return True

    def _on_rollout_end(self) -> None:
        self.writer.add_scalar("charts/SPS", int(self.num_timesteps / (time.time() - self.start)), self.num_timesteps)


def open_writer(env_id: str, exp_name: str, seed: int) -> SummaryWriter:
    """The TensorBoard writer of a run, named as the scripts name theirs; says where, as they do."""
    run_name = f"{env_id}__{exp_name}__{seed}__{int(time.time())}"
    print(f"logging to runs/{run_name}", flush=True)
    return SummaryWriter(f"runs/{run_name}")


def mask_velocity(env: gym.Env) -> gym.Env:
    """CartPole without velocities, observation [x, theta]: the same masking as ppo_fsmn_cartpole.py --mask-velocity."""
    low, high = env.observation_space.low[[0, 2]], env.observation_space.high[[0, 2]]
    return gym.wrappers.TransformObservation(
        env, lambda obs: obs[[0, 2]], observation_space=gym.spaces.Box(low, high, dtype=np.float32)
    )


class PreviousAction(gym.Wrapper):
    """Appends the previous action, one-hot and zero after a reset, to the observation: the input that
    `ppo_fsmn_cartpole.py --prev-action` gives its network, for a peer whose library has no such option."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        n = env.action_space.n
        self.one_hot, self.none = np.eye(n, dtype=np.float32), np.zeros(n, dtype=np.float32)
        low, high = env.observation_space.low, env.observation_space.high
        self.observation_space = gym.spaces.Box(
            np.concatenate([low, self.none]), np.concatenate([high, self.none + 1]), dtype=np.float32
        )

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return np.concatenate([obs, self.none]), info

    def step(self, action):
        obs, *rest = self.env.step(action)
        return (np.concatenate([obs, self.one_hot[action]]), *rest)


@dataclass
class RecurrentPPOArgs:
    """sb3-contrib RecurrentPPO (an LSTM) with the RL Zoo's `ppo_lstm` settings for CartPoleNoVel-v1: on CartPole the
    velocities are hidden; a POPGym task (popgym-...) gets the observation ppo_fsmn_cartpole.py gets, flattened to
    float32 one-hot, and grid actions numbered by popgym's DiscreteAction."""

    seed: int = 1
    total_timesteps: int = 150_000
    exp_name: str = "sb3_recurrent_ppo"
    env_id: str = "CartPole-v1"
    prev_action: bool = False
    """append the previous action to the observation (PreviousAction), as ppo_fsmn_cartpole.py --prev-action"""
    fsmn_settings: bool = False
    """the PPO settings of ppo_fsmn_cartpole.py's earlier defaults (run.py's FSMN_EARLIER, at which the POPGym presets
    ran) instead of the zoo's: 8 envs x 64 steps, 10 epochs of 4 minibatches, gamma 0.99, GAE lambda 0.95, learning
    rate 1e-3 annealed, clip 0.2, advantages normalised, observations normalised and rewards not (the value loss
    unclipped, SB3's default, where the script clips it); --norm-reward --no-norm-adv --anneal-clip make those three
    the script's current defaults"""
    # with --fsmn-settings, any of ppo_fsmn_cartpole.py's PPO flags, so that the LSTM gets a tuned FSMN's settings
    learning_rate: float | None = None
    """with --fsmn-settings: the learning rate at the start (annealed linearly to 0)"""
    num_steps: int | None = None
    """with --fsmn-settings: steps per env in a rollout"""
    num_minibatches: int | None = None
    """with --fsmn-settings: minibatches per epoch, formed over the 8 envs (a divisor of 8)"""
    update_epochs: int | None = None
    """with --fsmn-settings: epochs per rollout"""
    gamma: float | None = None
    """with --fsmn-settings: the discount factor"""
    gae_lambda: float | None = None
    """with --fsmn-settings: GAE's lambda"""
    clip_coef: float | None = None
    """with --fsmn-settings: the surrogate clipping coefficient"""
    ent_coef: float | None = None
    """with --fsmn-settings: the entropy coefficient"""
    norm_reward: bool = False
    """with --fsmn-settings: rewards divided by the running std of the discounted return at --gamma (VecNormalize's
    norm_reward), as the FSMN script's --norm-reward"""
    norm_adv: bool = True
    """with --fsmn-settings: advantages normalised per minibatch, as the FSMN script's --norm-adv"""
    anneal_clip: bool = False
    """with --fsmn-settings: the clip coefficient annealed linearly to 0 with the rate, as the FSMN script's
    --anneal-clip"""


def fsmn_ppo(args: RecurrentPPOArgs) -> dict | None:
    """ppo_fsmn_cartpole.py's PPO settings (its defaults, or the flags given) as RecurrentPPO's arguments, None
    without --fsmn-settings; a setting given without it, or out of range, is refused in one line."""
    defaults = dict(
        learning_rate=1e-3, num_steps=64, num_minibatches=4, update_epochs=10, gamma=0.99, gae_lambda=0.95,
        clip_coef=0.2, ent_coef=0.0,
    )  # fmt: skip
    given = {flag: getattr(args, flag) for flag in defaults if getattr(args, flag) is not None}
    switches = dict(norm_reward=False, norm_adv=True, anneal_clip=False)  # the FSMN script's earlier defaults
    given.update({flag: getattr(args, flag) for flag, value in switches.items() if getattr(args, flag) != value})
    if not args.fsmn_settings:
        if given:
            flag, value = next(iter(given.items()))
            name = flag.replace("_", "-")
            name = name if value is not False else f"no-{name}"
            shown = f"--{name}" if isinstance(value, bool) else f"--{name}={value}"
            raise SystemExit(f"error: {shown} needs --fsmn-settings")
        return None
    v = {**defaults, **given}
    minibatch = 8 * v["num_steps"] // max(v["num_minibatches"], 1)
    for flag, accepted, what in (  # ppo_fsmn_cartpole.py's own conditions, with its 8 envs
        ("learning_rate", 0 <= v["learning_rate"] < math.inf, "a number >= 0"),
        ("num_steps", v["num_steps"] >= 1, "at least 1"),
        ("gamma", 0 <= v["gamma"] <= 1, "in [0, 1]"),
        ("gae_lambda", 0 <= v["gae_lambda"] <= 1, "in [0, 1]"),
        ("num_minibatches", v["num_minibatches"] >= 1, "at least 1"),
        ("num_minibatches", 8 % max(v["num_minibatches"], 1) == 0, "a divisor of the 8 envs"),
        ("num_minibatches", minibatch >= 2, "at most half the batch (advantages are normalised per minibatch)"),
        ("update_epochs", v["update_epochs"] >= 1, "at least 1"),
        ("clip_coef", 0 < v["clip_coef"] < math.inf, "a positive number"),
        ("ent_coef", 0 <= v["ent_coef"] < math.inf, "a number >= 0"),
    ):
        if not accepted:
            raise SystemExit(f"error: --{flag.replace('_', '-')}={v[flag]} must be {what}")
    lr, clip = v["learning_rate"], v["clip_coef"]
    return dict(
        n_steps=v["num_steps"],
        batch_size=minibatch,
        n_epochs=v["update_epochs"],
        gamma=v["gamma"],
        gae_lambda=v["gae_lambda"],
        ent_coef=v["ent_coef"],
        learning_rate=lambda remaining: lr * remaining,  # annealed to 0, as the FSMN script's --anneal-lr
        clip_range=(lambda remaining: clip * remaining) if args.anneal_clip else clip,
        normalize_advantage=args.norm_adv,
    )


def flat_observation(env: gym.Env) -> gym.Env:
    """A POPGym task as ppo_fsmn_cartpole.py builds it: grid actions numbered, the observation one-hot, float32."""
    from popgym.wrappers import DiscreteAction

    if isinstance(env.action_space, gym.spaces.MultiDiscrete):
        env = DiscreteAction(env.unwrapped)
    env = gym.wrappers.FlattenObservation(env)
    return gym.wrappers.DtypeObservation(env, np.float32)


def recurrent_ppo(args: RecurrentPPOArgs) -> None:
    if args.env_id.startswith("popgym-"):
        import popgym  # noqa: F401  (registers the POPGym ids)
    base = mask_velocity if args.env_id.startswith("CartPole") else flat_observation
    wrap = (lambda env: PreviousAction(base(env))) if args.prev_action else base
    fsmn = args.fsmn_settings
    zoo = dict(
        n_steps=32,
        batch_size=256,
        n_epochs=20,
        gamma=0.98,
        gae_lambda=0.8,
        ent_coef=0.0,
        learning_rate=lambda remaining: 1e-3 * remaining,  # the zoo's lin_1e-3: linear decay to 0
        clip_range=lambda remaining: 0.2 * remaining,  # the zoo's lin_0.2
    )
    ppo = fsmn_ppo(args) or zoo
    envs = make_vec_env(args.env_id, n_envs=8, seed=args.seed, wrapper_class=wrap)
    if fsmn and args.norm_reward:  # the FSMN's --norm-reward: the discounted return's std at its own gamma
        envs = VecNormalize(envs, gamma=ppo["gamma"])
    else:  # the zoo's `normalize: true`; the FSMN's earlier defaults normalise observations only
        envs = VecNormalize(envs, norm_reward=not fsmn)
    model = RecurrentPPO(
        "MlpLstmPolicy",
        envs,
        **ppo,
        policy_kwargs=dict(
            ortho_init=False,
            activation_fn=torch.nn.ReLU,
            lstm_hidden_size=64,
            enable_critic_lstm=True,
            net_arch=dict(pi=[64], vf=[64]),
        ),
        seed=args.seed,
        device="cpu",
    )
    writer = open_writer(args.env_id, args.exp_name, args.seed)
    model.learn(total_timesteps=args.total_timesteps, callback=CleanRLTags(writer))
    writer.close()


@dataclass
class PPOArgs:
    """SB3 PPO (MlpPolicy): for throughput at settings equal to a script's, and the RL Zoo's LunarLander settings."""

    env_id: str = "CartPole-v1"
    seed: int = 1
    total_timesteps: int = 50_000
    num_envs: int = 4
    num_steps: int = 128
    batch_size: int = 128
    epochs: int = 4
    exp_name: str = "sb3_ppo"
    gamma: float = 0.99
    gae_lambda: float = 0.95
    ent_coef: float = 0.0
    normalize: bool = False
    """VecNormalize observations and rewards (as ppo_continuous.py does by default)"""
    eval_episodes: int = 0
    """after training, play this many episodes with the deterministic policy and print their mean (as the scripts'
    --eval-checkpoint does); 0: none"""


def sb3_ppo(args: PPOArgs) -> None:
    envs = make_vec_env(args.env_id, n_envs=args.num_envs, seed=args.seed)
    envs = VecNormalize(envs) if args.normalize else envs
    model = PPO(
        "MlpPolicy",
        envs,
        n_steps=args.num_steps,
        batch_size=args.batch_size,
        n_epochs=args.epochs,
        gamma=args.gamma,
        gae_lambda=args.gae_lambda,
        ent_coef=args.ent_coef,
        seed=args.seed,
        device="cpu",
    )
    writer = open_writer(args.env_id, args.exp_name, args.seed)
    model.learn(total_timesteps=args.total_timesteps, callback=CleanRLTags(writer))
    writer.close()
    if args.eval_episodes:
        eval_env = make_vec_env(args.env_id, n_envs=1, seed=args.seed)
        if args.normalize:  # the training statistics, frozen
            eval_env = VecNormalize(eval_env, training=False, norm_reward=False)
            eval_env.obs_rms = envs.obs_rms
        returns, _ = evaluate_policy(model, eval_env, n_eval_episodes=args.eval_episodes, return_episode_rewards=True)
        print(f"eval: {len(returns)} episodes, mean return {np.mean(returns):.2f} +/- {np.std(returns):.2f}")


@dataclass
class PPOAtariArgs:
    """SB3 PPO (CnnPolicy: the NatureCNN) on Atari with SB3's wrappers, at ppo_atari.py's default settings (CleanRL's)."""

    env_id: str = "PongNoFrameskip-v4"
    seed: int = 1
    total_timesteps: int = 10_000_000
    num_envs: int = 8
    num_steps: int = 128
    batch_size: int = 256
    epochs: int = 4
    exp_name: str = "sb3_ppo_atari"
    device: str = "auto"


def sb3_ppo_atari(args: PPOAtariArgs) -> None:
    envs = VecFrameStack(make_atari_env(args.env_id, n_envs=args.num_envs, seed=args.seed), n_stack=4)
    model = PPO(
        "CnnPolicy",
        envs,
        n_steps=args.num_steps,
        batch_size=args.batch_size,
        n_epochs=args.epochs,
        learning_rate=lambda remaining: 2.5e-4 * remaining,
        clip_range=0.1,
        ent_coef=0.01,
        vf_coef=0.5,
        max_grad_norm=0.5,
        gamma=0.99,
        gae_lambda=0.95,
        seed=args.seed,
        device=args.device,
    )
    writer = open_writer(args.env_id, args.exp_name, args.seed)
    model.learn(total_timesteps=args.total_timesteps, callback=CleanRLTags(writer))
    writer.close()


if __name__ == "__main__":
    peers = {"recurrent-ppo": (RecurrentPPOArgs, recurrent_ppo), "sb3-ppo": (PPOArgs, sb3_ppo)}
    peers["sb3-ppo-atari"] = (PPOAtariArgs, sb3_ppo_atari)
    args = tyro.extras.subcommand_cli_from_dict({name: cls for name, (cls, _) in peers.items()})
    next(run for cls, run in peers.values() if isinstance(args, cls))(args)
