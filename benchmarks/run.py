"""Run every (config, seed) of a benchmark as its own process through the script's CLI, then report.

    python benchmarks/run.py --preset fsmn-cartpole                      # the README's FSMN table, then its report
    python benchmarks/run.py --scripts ppo_fsmn_cartpole.py --env-ids CartPole-v1 Acrobot-v1 --seeds 1 2 3 \\
        --extra="--total-timesteps 100000" --workers 2

Everything goes under the sweep's folder, <out> (default benchmark_runs/<preset or 'custom'> under the working
folder), as it is written: each run works in <out>, so its TensorBoard events, videos and W&B files land in
<out>/runs/, <out>/videos/ and <out>/wandb/ while it runs (`tensorboard --logdir <out>/runs` shows a live sweep),
and its output in <out>/logs/<run>.log. A run that fails is reported with its log and does not stop the others. A
run already complete (its marker in <out>/done/) is skipped unless --rerun. Every script's run saves checkpoints
(--save-model): Ctrl-C or SIGTERM (a scheduler's time limit or preemption) is passed on to each running run, which
keeps its last checkpoint, and the same command resumes each unfinished run from there (the SB3 peers start again
from step 0; so does a run on Ray, whose files come back only when it ends, from its previous checkpoint if any).
`--backend ray` sends the same runs to a Ray cluster (`--address`, e.g. `auto` on a node of it) or to a local Ray
instance, as tasks that reserve `--cpus-per-run`/`--gpus-per-run`; the repository (less the tests' fixtures and the
tracked results) travels to the nodes as the tasks' working dir, and each run's runs/, videos/ and wandb/ come back
into <out> when it ends.

Presets (each writes its report to <out>/<name>.md, and with --results to benchmarks/results/<name>.md):
  fsmn-cartpole        CartPole-v1 and masked-velocity CartPole (memory 4 and 0, and memory 4 with --long-memory gate), plus
                       sb3-contrib RecurrentPPO on the masked task, with and without the previous action as input, 5
                       seeds each, 150k steps.
  atari-pong           PongNoFrameskip-v4, seed 1, 1.5M steps, with --bf16 and in float32 (bf16 only on CPUs with
                       bf16 instructions: emulated, it is far slower); `--configs atari_fp32` for one of them.
  continuous-pendulum  Pendulum-v1, 5 seeds, 200k steps: ppo_continuous.py at its defaults and at its old ones
                       (PENDULUM_FLAGS below, Pendulum's own, the defaults until CONTINUOUS_CARRY_KL replaced them).
  continuous-carry-pendulum, continuous-carry-lunar
                       Pendulum-v1 (100k steps) and LunarLanderContinuous-v3 (500k), 5 seeds: ppo_continuous.py at
                       its old defaults, with the MuJoCo settings below, with the continuous study's best flags
                       (CONTINUOUS_TUNED below, tuned on seeds 101-102), and with the continuous-carry study's
                       best and second (CONTINUOUS_CARRY and its gamma-0.99 variant, the same seeds, Hopper-v5 in
                       the objective too), and that second with its updates capped (CONTINUOUS_CARRY_KL).
  continuous-carry-mujoco  HalfCheetah-v5, Hopper-v5 and Walker2d-v5, 3 seeds, 1M steps: the MuJoCo settings (as
                       continuous-mujoco) against the studies' flags (Hopper-v5 was in the continuous-carry study's).
  continuous-fresh-pendulum, continuous-fresh-lunar, continuous-fresh-mujoco
                       the same envs on seeds no study or probe saw (6-10; 4-6 on MuJoCo): ppo_continuous.py at its
                       old defaults, with the MuJoCo settings and with CONTINUOUS_CARRY_KL (the defaults since).
  continuous-mujoco    HalfCheetah-v5, Hopper-v5 and Walker2d-v5, 3 seeds, 1M steps, with CleanRL's MuJoCo settings
                       (gamma 0.99, lr 3e-4, minibatches of 64); `--env-ids Hopper-v5` runs only that env's config.
  continuous-bipedal   BipedalWalker-v3, 3 seeds, 5M steps, six configs: `zoo`, the rl-baselines3-zoo's PPO settings
                       (32 envs x 2048 steps, minibatches of 64, 10 epochs, gamma 0.999, lr 2.5e-4, clip 0.18),
                       `gamma0.99`, the same with gamma 0.99, `steps1024`, gamma 0.99 and 32 envs x 1024 steps,
                       `steps1024_gamma0.995`, `steps512`, and `steps1024_best` (steps1024 evaluated every 4
                       iterations, the best policy kept in best.pt); `--configs steps1024` for one of them.
  transformer-pong     ppo_transformer_pong.py on PongNoFrameskip-v4, seed 1, 1M steps.
  popgym               POPGym's PositionOnlyCartPole, RepeatPrevious, RepeatFirst, CountRecall and Autoencode (Easy),
                       3 seeds, 400k steps: ppo_fsmn_cartpole.py at its defaults, with a memory as long as an episode
                       (memory order 32), at the fsmn-popgym study's best (POPGYM_PPO below), that with --long-memory gate
                       (`fsmn_gate`), its memoryless ablation (memory order 0), and sb3-contrib RecurrentPPO given the
                       same observation, previous action and PPO settings (the defaults', and the study's best);
                       `fsmn_gate_gamma0.97`, `fsmn_tuned_gamma0.97` and `sb3_recurrent_ppo_gamma0.97` at the study's
                       best with gamma 0.97 (POPGYM_PPO_GAMMA097).
  popgym-recall        POPGym's CountRecall and Autoencode (Easy), the tasks that need memory of what was seen, 3
                       seeds, 1M steps: the gated FSMN and sb3-contrib RecurrentPPO at the study's best with gamma 0.5
                       (POPGYM_PPO_GAMMA05); on Autoencode also the gate trained on whole episodes with the
                       recall loss (POPGYM_RECALL).
  popgym-one           One set of flags for every POPGym task (POPGYM_ONE below): the popgym preset's five Easy tasks,
                       RepeatPreviousMedium, and two tasks the presets above never ran, NoisyPositionOnlyCartPoleEasy
                       and RepeatFirstMedium; 3 seeds, 1M steps; sb3-contrib RecurrentPPO at the same settings (its
                       rewards, advantages and clip as the FSMN's defaults) on CountRecall and Autoencode. POPGYM_ONE
                       was picked on seeds 101-102 only. `fsmn_one_lr1e-3`: Autoencode at POPGYM_ONE with learning
                       rate 1e-3 (POPGYM_ONE_RECITE), the rate Autoencode preferred on seed 101.
  ppg-lunarlander      LunarLander-v3, 5 seeds, 1M steps: ppg_lunarlander.py, the same with --e-auxiliary 0, SB3's PPO
                       with the RL Zoo's settings, and ppo_fsmn_cartpole.py at its defaults.
  ppg-heldout          LunarLander-v3, seeds 1-5 (the PPG study used 101-102), 200k steps: ppg_lunarlander.py at its
                       defaults, with the study's best flags (PPG_TUNED below), and those with --e-auxiliary 0.
  ppg-heldout-steps    the same seeds and steps: ppg_lunarlander.py at its defaults, with the best flags of the study
                       of steps to 200 (PPG_STEPS below, tuned on seeds 103-105), and those with --e-auxiliary 0.
On a GPU the Atari presets are the ones that gain; the FSMN and continuous networks are too small to.
"""

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Literal

import tyro
from tqdm import tqdm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")  # the project's results, tracked: written only with --results


# the flags that ppo_continuous.py's defaults held until CONTINUOUS_CARRY_KL replaced them, apart from the three that
# PENDULUM_FLAGS and MUJOCO_FLAGS set: written out, so that the configs measured at them still run them
OLD_REST = ["--num-steps", "256", "--gae-lambda", "0.95", "--clip-coef", "0.2", "--ent-coef", "0"]
OLD_REST += ["--max-grad-norm", "0.5", "--log-std-init", "0", "--target-kl", "None"]
PENDULUM_FLAGS = ["--gamma", "0.95", "--learning-rate", "1e-3", "--num-minibatches", "8", *OLD_REST]  # the old defaults
MUJOCO_FLAGS = ["--gamma", "0.99", "--learning-rate", "3e-4", "--num-minibatches", "32", *OLD_REST]  # CleanRL's MuJoCo
# the rl-baselines3-zoo's PPO settings for BipedalWalker-v3: 32 envs x 2048 steps, minibatches of 64, 10 epochs;
# the final checkpoint is kept for a deterministic evaluation (--eval-checkpoint), as the zoo scores its agents
BIPEDAL_FLAGS = ["--num-envs", "32", "--update-epochs", "10", "--learning-rate", "2.5e-4", "--clip-coef", "0.18"]
BIPEDAL_FLAGS += ["--ent-coef", "0", "--gae-lambda", "0.95", "--max-grad-norm", "0.5", "--log-std-init", "0"]
BIPEDAL_FLAGS += ["--target-kl", "None", "--compile", "--save-model"]
BIPEDAL = ["ppo_continuous.py", "--env-id", "BipedalWalker-v3", *BIPEDAL_FLAGS]
ZOO_ROLLOUT = ["--num-steps", "2048", "--num-minibatches", "1024"]  # 65,536 steps an update, minibatches of 64


@dataclass
class Config:
    name: str
    """exp_name of the runs, the config's name in the report"""
    command: list[str]
    """script (relative to the repository root) and flags, without --seed"""


# the RL Baselines3 Zoo's PPO settings for LunarLander: 16 envs x 1024 steps, minibatches of 64, 4 epochs
LUNAR_ZOO = ["--num-envs", "16", "--num-steps", "1024", "--batch-size", "64", "--epochs", "4"]
LUNAR_ZOO += ["--gamma", "0.999", "--gae-lambda", "0.98", "--ent-coef", "0.01", "--eval-episodes", "20"]

# the best trial of `benchmarks/tune.py --preset ppg-lunarlander` (seeds 101-102), to three significant figures
PPG_TUNED = ["--learning-rate", "1.03e-3", "--gae-lambda", "0.953", "--clip-coef", "0.184", "--gamma", "0.995"]
PPG_TUNED += ["--num-envs", "8", "--num-steps", "128", "--num-minibatches", "64", "--ent-coef", "1.01e-3"]
PPG_TUNED += ["--n-iteration", "16", "--e-policy", "3", "--e-value", "4", "--e-auxiliary", "5", "--beta-clone", "0.536"]
# the best trial of `benchmarks/tune.py --preset ppg-lunarlander-steps` (seeds 103-105), to three significant figures
PPG_STEPS = ["--learning-rate", "1.22e-3", "--gae-lambda", "0.945", "--clip-coef", "0.219", "--gamma", "0.995"]
PPG_STEPS += ["--num-envs", "8", "--num-steps", "128", "--num-minibatches", "64", "--ent-coef", "3.23e-3"]
PPG_STEPS += ["--n-iteration", "16", "--e-policy", "4", "--e-value", "4", "--e-auxiliary", "4", "--beta-clone", "0.653"]


def ppg_heldout(tag: str, flags: list[str], name: str, best: str) -> dict:
    """PPG on LunarLander-v3, seeds 1-5, 200k steps: the defaults, a study's best flags, and those without the
    auxiliary phase."""
    return dict(
        configs=[
            Config("ppg", ["ppg_lunarlander.py"]),
            Config(f"ppg_{tag}", ["ppg_lunarlander.py", *flags]),
            Config(f"ppg_{tag}_noaux", ["ppg_lunarlander.py", *flags, "--e-auxiliary", "0"]),
        ],
        extra=["--total-timesteps", "200000"],
        seeds=[1, 2, 3, 4, 5],
        report=dict(name=name, threshold=200.0, title=f"PPG on LunarLander-v3: the defaults and {best}"),
    )


# the best trial of `benchmarks/tune.py --preset continuous` (seeds 101-102), to three significant figures
CONTINUOUS_TUNED = ["--learning-rate", "1.13e-3", "--gae-lambda", "0.929", "--clip-coef", "0.157", "--gamma", "0.98"]
CONTINUOUS_TUNED += ["--num-steps", "64", "--num-minibatches", "16", "--update-epochs", "10", "--ent-coef", "8.3e-3"]
CONTINUOUS_TUNED += ["--log-std-init", "0.142", "--max-grad-norm", "0.986", "--target-kl", "None"]
# the best trial of `benchmarks/tune.py --preset continuous-carry` (seeds 101-102, Hopper-v5 as well, judged by the
# worst env): one it was given to try first, CONTINUOUS_TUNED with a longer horizon
CONTINUOUS_CARRY = ["--learning-rate", "1.13e-3", "--gae-lambda", "0.929", "--clip-coef", "0.157", "--gamma", "0.995"]
CONTINUOUS_CARRY += ["--num-steps", "64", "--num-minibatches", "16", "--update-epochs", "10", "--ent-coef", "8.3e-3"]
CONTINUOUS_CARRY += ["--log-std-init", "0.142", "--max-grad-norm", "0.986", "--target-kl", "None"]
# the same study's second trial: CONTINUOUS_TUNED with gamma 0.99, between the two
CONTINUOUS_CARRY_099 = ["--learning-rate", "1.13e-3", "--gae-lambda", "0.929", "--clip-coef", "0.157", "--gamma", "0.99"]
CONTINUOUS_CARRY_099 += ["--num-steps", "64", "--num-minibatches", "16", "--update-epochs", "10", "--ent-coef", "8.3e-3"]
CONTINUOUS_CARRY_099 += ["--log-std-init", "0.142", "--max-grad-norm", "0.986", "--target-kl", "None"]
# that set with each update stopped at an approximate KL of 0.02: on MuJoCo the studies' sets took updates far larger
# than the MuJoCo settings' (found on seeds 1-5, so judged on the continuous-fresh presets' seeds)
CONTINUOUS_CARRY_KL = ["--learning-rate", "1.13e-3", "--gae-lambda", "0.929", "--clip-coef", "0.157", "--gamma", "0.99"]
CONTINUOUS_CARRY_KL += ["--num-steps", "64", "--num-minibatches", "16", "--update-epochs", "10", "--ent-coef", "8.3e-3"]
CONTINUOUS_CARRY_KL += ["--log-std-init", "0.142", "--max-grad-norm", "0.986", "--target-kl", "0.02"]


def continuous(envs: tuple[str, ...], flag_sets: dict, steps: int, seeds: list[int], report: dict) -> dict:
    """ppo_continuous.py on each env with each named set of flags."""
    return dict(
        configs=[
            Config(name, ["ppo_continuous.py", "--env-id", env_id, *flags])
            for env_id in envs
            for name, flags in flag_sets.items()
        ],
        extra=["--total-timesteps", str(steps)],
        seeds=seeds,
        report=report,
    )


# seeds 1-5 (the studies used 101-102): the old defaults, the MuJoCo settings, the continuous study's best flags and
# the continuous-carry study's best and second, and that second with its updates capped
CARRY_SETS = dict(old_defaults=PENDULUM_FLAGS, mujoco_flags=MUJOCO_FLAGS, tuned=CONTINUOUS_TUNED)
CARRY_SETS |= {"carry": CONTINUOUS_CARRY, "carry_gamma0.99": CONTINUOUS_CARRY_099, "carry_kl": CONTINUOUS_CARRY_KL}
# seeds that no study or probe saw: the old defaults, the MuJoCo settings and the KL-capped set, the defaults since
FRESH_SETS = dict(old_defaults=PENDULUM_FLAGS, mujoco_flags=MUJOCO_FLAGS, carry_kl=CONTINUOUS_CARRY_KL)
MUJOCO = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5")


# ppo_fsmn_cartpole.py's network before the critic had a trunk of its own (issue 73): one embedding and FSMN blocks
# for both heads, observation statistics updated under the network; every config measured with it spells it out
FSMN_SHARED = ["--no-separate-critic", "--no-norm-obs-preserving"]
# ppo_fsmn_cartpole.py with the defaults it had before CartPole's were changed to end solved (issue 73: rewards scaled
# by the return's std, advantages not normalised): the configs measured at them (POPGym's, LunarLander's) spell them out
FSMN_EARLIER = ["ppo_fsmn_cartpole.py", "--learning-rate", "1e-3", "--norm-adv", "--no-norm-reward", "--no-anneal-clip"]
FSMN_EARLIER += FSMN_SHARED

# POPGym (Morad et al., ICLR 2023): five Easy tasks; the LSTM gets the FSMN's observation, previous action and PPO settings
POPGYM = [f"popgym-{task}Easy-v0" for task in ("PositionOnlyCartPole", "RepeatPrevious", "RepeatFirst", "CountRecall")]
POPGYM += ["popgym-AutoencodeEasy-v0"]
LSTM = ["benchmarks/peers.py", "recurrent-ppo", "--prev-action", "--fsmn-settings"]
# the best trial of `benchmarks/tune.py --preset fsmn-popgym` (seeds 101-102), to three significant figures: its PPO
# settings, which the LSTM gets as well, and its memory order
POPGYM_PPO = ["--learning-rate", "2.52e-3", "--gae-lambda", "0.850", "--clip-coef", "0.200", "--update-epochs", "9"]
POPGYM_PPO += ["--num-steps", "128", "--num-minibatches", "4", "--ent-coef", "2.22e-3", "--gamma", "0.99"]
# fsmn_tuned with the input-gated memory (--long-memory gate) in every block: the one flag between the two configs
POPGYM_GATE = ["--memory-order", "16", "--long-memory", "gate"]
# POPGYM_PPO with gamma 0.97 for its last flag, --gamma 0.99: picked for the gated FSMN on seeds 101 and 102
# (popgym.md); the configs named *_gamma0.97 run at it, the LSTM among them
assert POPGYM_PPO[-2:] == ["--gamma", "0.99"]
POPGYM_PPO_GAMMA097 = [*POPGYM_PPO[:-2], "--gamma", "0.97"]
# and with gamma 0.5, for the tasks that need memory of what was seen (CountRecall, Autoencode): every reward there
# judges the action just taken, and at 0.97 a step's return is mostly the noise of the next answers' rewards
# (picked on seeds 101 and 102, popgym_recall.md)
POPGYM_PPO_GAMMA05 = [*POPGYM_PPO[:-2], "--gamma", "0.5"]
# Autoencode's episodes (103 steps) trained whole from their first step (--context-steps 104), with the memory's
# auxiliary loss (--recall-lags 32) and learning rate 1e-3: picked on seed 101 (popgym_recall.md)
assert POPGYM_PPO_GAMMA05[:2] == ["--learning-rate", "2.52e-3"]
POPGYM_RECALL = ["--learning-rate", "1e-3", *POPGYM_PPO_GAMMA05[2:], "--context-steps", "104", "--recall-lags", "32"]

# One config for every POPGym task (issue 72), nothing chosen by env id: the gated memory of popgym_gate at the
# script's own defaults for the scale of rewards and advantages (--norm-reward, advantages unnormalised, --anneal-clip),
# discount 0.95 and GAE lambda 0.7 (a horizon between what counting cards and balancing a pole each want), learning
# rate 2e-3; picked on seeds 101-102 (issue 72's exploration: CountRecall gains from the rate, Autoencode loses a little)
POPGYM_ONE_PPO = ["--learning-rate", "2e-3", "--gamma", "0.95", "--gae-lambda", "0.7", "--clip-coef", "0.2"]
POPGYM_ONE_PPO += ["--update-epochs", "9", "--num-steps", "128", "--num-minibatches", "4", "--ent-coef", "2.22e-3"]
POPGYM_ONE = [*POPGYM_ONE_PPO, *POPGYM_GATE, *FSMN_SHARED]  # measured with the shared trunk
# the LSTM at the same settings, the FSMN's defaults for rewards, advantages and the clip spelled for peers.py
LSTM_ONE = [*LSTM, *POPGYM_ONE_PPO, "--norm-reward", "--no-norm-adv", "--anneal-clip"]
# the one config at Autoencode's learning rate: its one flag changed, for the README's "which flags for which task"
# (the rate Autoencode preferred on exploration seed 101; the figures in popgym_one.md)
assert POPGYM_ONE[:2] == ["--learning-rate", "2e-3"]
POPGYM_ONE_RECITE = ["--learning-rate", "1e-3", *POPGYM_ONE[2:]]
# its tasks: the popgym preset's, RepeatPreviousMedium, and two no preset ran before, named before any judged run
POPGYM_ONE_TASKS = [*POPGYM, "popgym-RepeatPreviousMedium-v0", "popgym-NoisyPositionOnlyCartPoleEasy-v0"]
POPGYM_ONE_TASKS += ["popgym-RepeatFirstMedium-v0"]


def popgym_million(name: str, title: str) -> dict:
    """A POPGym preset's budget, seeds and report: 1M steps, seeds 1-3, the MMER over 100-episode windows."""
    report = dict(name=name, threshold=None, title=title, window=100, mmer=True)
    return dict(extra=["--total-timesteps", "1000000"], seeds=[1, 2, 3], report=report)


PRESETS: dict[str, dict] = {
    "fsmn-cartpole": dict(
        configs=[
            Config("fsmn_m4", ["ppo_fsmn_cartpole.py", "--memory-order", "4"]),
            Config("fsmn_novel_m4", ["ppo_fsmn_cartpole.py", "--mask-velocity", "--memory-order", "4"]),
            Config("fsmn_novel_m0", ["ppo_fsmn_cartpole.py", "--mask-velocity", "--memory-order", "0"]),
            Config("fsmn_m4_gate", ["ppo_fsmn_cartpole.py", "--memory-order", "4", "--long-memory", "gate"]),
            Config(
                "fsmn_novel_m4_gate",
                ["ppo_fsmn_cartpole.py", "--mask-velocity", "--memory-order", "4", "--long-memory", "gate"],
            ),
            Config("sb3_recurrent_ppo_novel", ["benchmarks/peers.py", "recurrent-ppo"]),
            Config("sb3_recurrent_ppo_novel_prev_action", ["benchmarks/peers.py", "recurrent-ppo", "--prev-action"]),
        ],
        extra=["--total-timesteps", "150000"],
        seeds=[1, 2, 3, 4, 5],
        report=dict(
            name="fsmn_cartpole",
            threshold=475.0,
            title="FSMN PPO on CartPole-v1 and masked-velocity CartPole",
            final_window=100,  # CartPole-v1's own bar: a mean of 475 over 100 consecutive episodes
        ),
    ),
    "popgym": dict(
        configs=[
            config
            for env_id in POPGYM
            for config in (
                Config("fsmn", [*FSMN_EARLIER, "--env-id", env_id]),
                Config("fsmn_m32", [*FSMN_EARLIER, "--env-id", env_id, "--memory-order", "32"]),
                Config("fsmn_tuned", [*FSMN_EARLIER, "--env-id", env_id, *POPGYM_PPO, "--memory-order", "16"]),
                Config("fsmn_gate", [*FSMN_EARLIER, "--env-id", env_id, *POPGYM_PPO, *POPGYM_GATE]),
                Config("fsmn_m0", [*FSMN_EARLIER, "--env-id", env_id, "--memory-order", "0"]),
                Config("sb3_recurrent_ppo", [*LSTM, "--env-id", env_id]),
                Config("sb3_recurrent_ppo_tuned", [*LSTM, "--env-id", env_id, *POPGYM_PPO]),
                Config("fsmn_gate_gamma0.97", [*FSMN_EARLIER, "--env-id", env_id, *POPGYM_PPO_GAMMA097, *POPGYM_GATE]),
                Config(
                    "fsmn_tuned_gamma0.97",
                    [*FSMN_EARLIER, "--env-id", env_id, *POPGYM_PPO_GAMMA097, "--memory-order", "16"],
                ),
                Config("sb3_recurrent_ppo_gamma0.97", [*LSTM, "--env-id", env_id, *POPGYM_PPO_GAMMA097]),
            )
        ],
        extra=["--total-timesteps", "400000"],
        seeds=[1, 2, 3],
        report=dict(
            name="popgym", threshold=None, title="POPGym Easy: the FSMN, its ablation and an LSTM", window=100, mmer=True
        ),
    ),
    "popgym-recall": dict(
        configs=[
            config
            for env_id in ("popgym-CountRecallEasy-v0", "popgym-AutoencodeEasy-v0")
            for config in (
                Config("fsmn_gate_gamma0.5", [*FSMN_EARLIER, "--env-id", env_id, *POPGYM_PPO_GAMMA05, *POPGYM_GATE]),
                Config("sb3_recurrent_ppo_gamma0.5", [*LSTM, "--env-id", env_id, *POPGYM_PPO_GAMMA05]),
            )
        ]
        + [
            Config(
                "fsmn_gate_recall",
                [*FSMN_EARLIER, "--env-id", "popgym-AutoencodeEasy-v0", *POPGYM_RECALL, *POPGYM_GATE],
            )
        ],
        **popgym_million(
            "popgym_recall", "POPGym's CountRecall and Autoencode (Easy): the gated FSMN and an LSTM at gamma 0.5"
        ),
    ),
    "popgym-one": dict(
        configs=[Config("fsmn_one", ["ppo_fsmn_cartpole.py", "--env-id", env_id, *POPGYM_ONE]) for env_id in POPGYM_ONE_TASKS]
        + [
            Config("sb3_recurrent_ppo_one", [*LSTM_ONE, "--env-id", env_id])
            for env_id in ("popgym-CountRecallEasy-v0", "popgym-AutoencodeEasy-v0")
        ]
        + [Config("fsmn_one_lr1e-3", ["ppo_fsmn_cartpole.py", "--env-id", "popgym-AutoencodeEasy-v0", *POPGYM_ONE_RECITE])],
        **popgym_million("popgym_one", "POPGym: one set of flags for every task, the gated FSMN and an LSTM"),
    ),
    "ppg-heldout": ppg_heldout("tuned", PPG_TUNED, "ppg_heldout", "the study's best"),
    "ppg-heldout-steps": ppg_heldout("steps", PPG_STEPS, "ppg_heldout_steps", "the steps study's best"),
    "ppg-lunarlander": dict(
        configs=[
            Config("ppg", ["ppg_lunarlander.py", "--save-model"]),
            Config("ppg_noaux", ["ppg_lunarlander.py", "--e-auxiliary", "0", "--save-model"]),
            Config("sb3_ppo_zoo", ["benchmarks/peers.py", "sb3-ppo", "--env-id", "LunarLander-v3", *LUNAR_ZOO]),
            Config("fsmn", [*FSMN_EARLIER, "--env-id", "LunarLander-v3", "--save-model"]),
        ],
        extra=["--total-timesteps", "1000000"],
        seeds=[1, 2, 3, 4, 5],
        report=dict(name="ppg_lunarlander", threshold=200.0, title="PPG, its ablation and PPO on LunarLander-v3"),
    ),
    "atari-pong": dict(
        configs=[
            Config("atari_bf16", ["ppo_atari.py", "--env-id", "PongNoFrameskip-v4", "--bf16"]),
            Config("atari_fp32", ["ppo_atari.py", "--env-id", "PongNoFrameskip-v4"]),
        ],
        extra=["--total-timesteps", "1500000"],
        seeds=[1],
        report=dict(name="atari_pong", threshold=0.0, title="PPO on PongNoFrameskip-v4 (CPU), bf16 and float32"),
    ),
    "continuous-pendulum": dict(
        configs=[
            Config("defaults", ["ppo_continuous.py", "--env-id", "Pendulum-v1"]),
            Config("old_defaults", ["ppo_continuous.py", "--env-id", "Pendulum-v1", *PENDULUM_FLAGS]),
        ],
        extra=["--total-timesteps", "200000"],
        seeds=[1, 2, 3, 4, 5],
        report=dict(name="continuous_pendulum", threshold=-200.0, title="Tanh-Gaussian PPO on Pendulum-v1"),
    ),
    "continuous-carry-pendulum": continuous(
        ("Pendulum-v1",),
        CARRY_SETS,
        100000,
        [1, 2, 3, 4, 5],
        dict(name="continuous_carry_pendulum", threshold=-200.0, title="Six default sets on Pendulum-v1"),
    ),
    "continuous-carry-lunar": continuous(
        ("LunarLanderContinuous-v3",),
        CARRY_SETS,
        500000,
        [1, 2, 3, 4, 5],
        dict(name="continuous_carry_lunar", threshold=200.0, title="Six default sets on LunarLanderContinuous-v3"),
    ),
    "continuous-carry-mujoco": continuous(
        MUJOCO,
        {name: flags for name, flags in CARRY_SETS.items() if name != "old_defaults"},
        1000000,
        [1, 2, 3],
        dict(name="continuous_carry_mujoco", threshold=None, title="The continuous studies' flags on MuJoCo"),
    ),
    "continuous-fresh-pendulum": continuous(
        ("Pendulum-v1",),
        FRESH_SETS,
        100000,
        [6, 7, 8, 9, 10],
        dict(name="continuous_fresh_pendulum", threshold=-200.0, title="Fresh seeds on Pendulum-v1"),
    ),
    "continuous-fresh-lunar": continuous(
        ("LunarLanderContinuous-v3",),
        FRESH_SETS,
        500000,
        [6, 7, 8, 9, 10],
        dict(name="continuous_fresh_lunar", threshold=200.0, title="Fresh seeds on LunarLanderContinuous-v3"),
    ),
    "continuous-fresh-mujoco": continuous(
        ("Walker2d-v5", "HalfCheetah-v5", "Hopper-v5"),
        FRESH_SETS,
        1000000,
        [4, 5, 6],
        dict(name="continuous_fresh_mujoco", threshold=None, title="Fresh seeds on MuJoCo"),
    ),
    "continuous-mujoco": continuous(
        MUJOCO,
        dict(continuous=MUJOCO_FLAGS),
        1000000,
        [1, 2, 3],
        dict(name="continuous_mujoco", threshold=None, title="Tanh-Gaussian PPO on MuJoCo, 1M steps"),
    ),
    "continuous-bipedal": dict(
        configs=[
            Config("zoo", [*BIPEDAL, *ZOO_ROLLOUT, "--gamma", "0.999"]),
            Config("gamma0.99", [*BIPEDAL, *ZOO_ROLLOUT, "--gamma", "0.99"]),
            Config(
                "steps1024",  # half the rollout: twice the updates for the same samples and gradient steps
                [*BIPEDAL, "--num-steps", "1024", "--num-minibatches", "512", "--gamma", "0.99"],
            ),
            Config(  # a quarter of the zoo's rollout: four times the updates for the same samples and gradient steps
                "steps512",
                [*BIPEDAL, "--num-steps", "512", "--num-minibatches", "256", "--gamma", "0.99"],
            ),
            Config(  # steps1024, evaluated every 4 iterations (131,072 steps): the best policy so far kept in best.pt
                "steps1024_best",
                [*BIPEDAL, "--num-steps", "1024", "--num-minibatches", "512", "--gamma", "0.99"]
                + ["--eval-interval", "4", "--eval-episodes", "10"],
            ),
            Config(  # between the zoo's gamma (never fell, slower gait) and 0.99 (faster gait, some falls)
                "steps1024_gamma0.995",
                [*BIPEDAL, "--num-steps", "1024", "--num-minibatches", "512", "--gamma", "0.995"],
            ),
        ],
        extra=["--total-timesteps", "5000000"],
        seeds=[1, 2, 3],
        report=dict(name="continuous_bipedal", threshold=300.0, title="Tanh-Gaussian PPO on BipedalWalker-v3"),
    ),
    "transformer-pong": dict(
        configs=[Config("transformer_l16", ["ppo_transformer_pong.py", "--env-id", "PongNoFrameskip-v4"])],
        extra=["--total-timesteps", "1000000"],
        seeds=[1],
        report=dict(name="transformer_pong", threshold=0.0, title="Transformer PPO on PongNoFrameskip-v4 (CPU), 1M steps"),
    ),
}


@dataclass
class Args:
    preset: str | None = None
    """a named benchmark (see the module docstring); its configs, seeds and report"""
    scripts: list[str] = field(default_factory=list)
    """scripts to run (without --preset)"""
    env_ids: list[str] = field(default_factory=list)
    """env ids, each run with every script; with --preset, run only its configs of these env ids"""
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    """seeds (a preset brings its own unless given)"""
    extra: str = ""
    """more flags for every run, written with '=': --extra="--total-timesteps 200000" """
    workers: int = 1
    """runs at a time on this machine (1 keeps wall-clock figures comparable), each on its share of the cores
    (OMP_NUM_THREADS, unless set); the CPUs of a local Ray instance"""
    backend: Literal["local", "ray"] = "local"
    """local: processes on this machine; ray: Ray tasks on a cluster (--address) or on a local Ray instance"""
    address: str | None = None
    """with --backend ray, the address of an existing cluster (e.g. ray://head:10001 or auto); none starts one here"""
    cpus_per_run: float = 1.0
    """with --backend ray, CPUs reserved for each run"""
    gpus_per_run: float = 0.0
    """with --backend ray, GPUs reserved for each run"""
    configs: list[str] = field(default_factory=list)
    """with --preset, run only these of its configs (by name; default all)"""
    out: str | None = None
    """the sweep's folder: runs/, logs/, videos/, wandb/ and the report (default benchmark_runs/<preset or 'custom'>
    under the working folder); the same command with the same --out resumes an interrupted sweep"""
    rerun: bool = False
    """run again, from step 0, runs that are already complete or were interrupted"""
    report: bool = True
    """write the report (<out>/<name>.md and .png) when the runs are done (presets only)"""
    results: bool = False
    """also write the report into benchmarks/results/ (the project's tracked results: overwrites the file of that
    name)"""


def plan(args: Args) -> tuple[list[tuple[Config, int]], list[str], dict | None]:
    if args.preset is not None:
        if args.preset not in PRESETS:
            raise SystemExit(f"error: --preset={args.preset} is not one of {', '.join(PRESETS)}")
        preset = PRESETS[args.preset]
        seeds = args.seeds if "--seeds" in sys.argv else preset["seeds"]
        names = [c.name for c in preset["configs"]]
        if unknown := set(args.configs) - set(names):
            raise SystemExit(f"error: --configs={' '.join(sorted(unknown))} not in preset {args.preset}: {', '.join(names)}")
        configs = [c for c in preset["configs"] if not args.configs or c.name in args.configs]
        envs = list(dict.fromkeys(env_of(c) for c in preset["configs"]))
        if unknown := [e for e in args.env_ids if e not in envs]:
            raise SystemExit(f"error: --env-ids={' '.join(unknown)} not in preset {args.preset}: {', '.join(envs)}")
        configs = [c for c in configs if not args.env_ids or env_of(c) in args.env_ids]
        # seed-major order: the configs of one seed run back to back, so a slow spell of the machine hits them alike
        return [(c, s) for s in seeds for c in configs], preset["extra"] + shlex.split(args.extra), preset["report"]
    if not args.scripts:
        raise SystemExit("error: give --preset or --scripts (with --env-ids)")
    configs = [
        Config(f"{os.path.splitext(os.path.basename(script))[0]}", [script] + (["--env-id", env_id] if env_id else []))
        for script in args.scripts
        for env_id in (args.env_ids or [None])
    ]
    return [(c, s) for s in args.seeds for c in configs], shlex.split(args.extra), None


def env_of(config: Config) -> str:
    return config.command[config.command.index("--env-id") + 1] if "--env-id" in config.command else "default"


def run_key(config: Config, seed: int) -> str:
    return f"{config.name}__{env_of(config)}__{seed}"


def argv_of(config: Config, seed: int, extra: list[str]) -> list[str]:
    """The run's command line, its script relative to the repository root. A script's run saves checkpoints, so
    that an interrupted sweep resumes it where it stopped."""
    argv = [*config.command, "--exp-name", config.name, "--seed", str(seed), *extra]
    if not resumable(argv):
        return argv
    return [*argv, "--no-progress"] + ([] if "--save-model" in argv else ["--save-model"])


def threads_per_run(workers: int) -> int | None:
    """OpenMP/torch threads for each of `workers` local runs at a time: this machine's cores shared out, unless
    OMP_NUM_THREADS is set already; None (the scripts' own default) for one run at a time. Left to itself each run
    starts a thread per core, and the threads of runs side by side spin against each other."""
    if workers <= 1 or "OMP_NUM_THREADS" in os.environ:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // workers)


def run_folder(log_path: str) -> str | None:
    """The run folder (`runs/<run_name>`, relative to the sweep's folder) that the run's last attempt logged to."""
    if not os.path.exists(log_path):
        return None
    with open(log_path, errors="replace") as log:
        folders = [line.split("logging to ", 1)[1].strip() for line in log if line.startswith("logging to runs/")]
    return folders[-1] if folders else None


def resume_flags(argv: list[str], out: str, log_path: str, rerun: bool) -> list[str]:
    """`--resume <checkpoint>` when the run's last attempt left a checkpoint in its run folder (the scripts save one
    on Ctrl-C), unless --rerun. Otherwise the run starts again in a new folder, and the report keeps the later of two
    runs of one config and seed."""
    folder = run_folder(log_path)
    if rerun or folder is None or not resumable(argv):
        return []
    checkpoint = os.path.join(folder, "checkpoint.pt")
    return ["--resume", checkpoint] if os.path.exists(os.path.join(out, checkpoint)) else []


def resumable(argv: list[str]) -> bool:
    """The top-level scripts save checkpoints and resume from them; the peers (SB3) start again from step 0."""
    return "peers.py" not in argv[0]


def run_local(
    argv: list[str], out: str, log_path: str, threads: int | None, live: dict, lock: threading.Lock, repo: str = ROOT
) -> int:
    """Run one command with <out> as its working folder, so its runs/, videos/ and wandb/ land there as they are
    written, its output appended to its log as it comes. The process gets a session of its own: a Ctrl-C at the
    terminal reaches the runner alone, which passes exactly one signal on to each run (see main)."""
    env = None if threads is None else dict(os.environ, OMP_NUM_THREADS=str(threads))
    with open(log_path, "a") as log:
        log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')}: {shlex.join(argv)}\n")
        log.flush()
        with lock:
            if live.get("stopping"):  # interrupted before this run started: it never starts
                return 130
            process = subprocess.Popen(
                [sys.executable, os.path.join(repo, argv[0]), *argv[1:]],
                cwd=out,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env or os.environ, PYTHONUNBUFFERED="1"),
                start_new_session=True,
            )
            live[process.pid] = process
        code = process.wait()
        with lock:
            live.pop(process.pid)
        log.write(f"=== exit {code}\n")
    return code


def execute(
    argv: list[str], repo: str | None = None, threads: int | None = None, files: bytes = b""
) -> tuple[int, str, bytes]:
    """Run one command in a fresh folder; return its exit code, its output, and its runs/, videos/ and wandb/ folders
    as a tar.gz. A Ray task on any node of a cluster runs this, where `repo` is None: the task then runs inside the
    repository copy that Ray's runtime_env shipped as its working dir. `files`, a tar.gz unpacked into the folder
    first, brings a checkpoint to resume from. `threads`, when given, is the run's OMP_NUM_THREADS."""
    import io
    import tarfile
    import tempfile

    repo = repo or os.getcwd()
    env = None if threads is None else dict(os.environ, OMP_NUM_THREADS=str(threads))
    with tempfile.TemporaryDirectory(prefix="bench_") as cwd:
        if files:
            with tarfile.open(fileobj=io.BytesIO(files), mode="r:gz") as tar:
                tar.extractall(cwd, filter="data")
        result = subprocess.run(
            [sys.executable, os.path.join(repo, argv[0]), *argv[1:]], cwd=cwd, capture_output=True, text=True, env=env
        )
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w:gz") as tar:
            for folder in ("runs", "videos", "wandb"):
                if os.path.isdir(os.path.join(cwd, folder)):
                    tar.add(os.path.join(cwd, folder), arcname=folder)
    return result.returncode, result.stdout + result.stderr, archive.getvalue()


def pack(out: str, paths: list[str]) -> bytes:
    """The given paths under <out>, as a tar.gz (a checkpoint sent to a Ray task to resume from)."""
    import io
    import tarfile

    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        for path in paths:
            tar.add(os.path.join(out, path), arcname=path)
    return archive.getvalue()


def ray_init(address: str | None, num_cpus: int) -> None:
    """Connect to the Ray cluster at `address`, or start a local Ray instance of `num_cpus` CPUs, without a dashboard
    (it adds seconds to the start). This repository, less what no run reads (the tests' fixtures, the tracked
    results), travels to every node as the tasks' working dir (the runs' files come back in the tasks' results)."""
    import ray

    excludes = [".git", ".whl", "runs", "benchmarks/runs", "benchmark_runs", "wandb", "videos", "__pycache__"]
    excludes += ["tests/fixtures", "benchmarks/results"]
    for attempt in range(3):
        try:
            ray.init(
                address=address,
                num_cpus=None if address else num_cpus,
                include_dashboard=None if address else False,
                log_to_driver=False,
                runtime_env={"working_dir": ROOT, "excludes": excludes},
            )
            return
        except Exception as e:  # ray.init raises plain Exceptions, ConnectionErrors and RuntimeErrors
            ray.shutdown()
            # a local raylet gives its dashboard agent a fixed time to start, which a busy machine can exceed
            if address is None and "timed out during startup" in str(e) and attempt < 2:
                continue
            where = f"--address={address}" if address else "--backend ray (a local Ray instance)"
            raise SystemExit(f"error: {where}: Ray did not start: {str(e).strip().splitlines()[0]}") from None


def ray_results(args: Args, jobs: dict[str, list[str]], out: str, stop: list[int]):
    """Yield (key, exit code) for every job as its Ray task (on the instance of `ray_init`) finishes, its files
    unpacked into <out> and its output appended to its log. A task's files come back when it ends: a run on another
    node is not visible before. Once a stop signal has come (in `stop`), the tasks still running are dropped with
    their files."""
    import io
    import tarfile

    import ray

    task = ray.remote(num_cpus=args.cpus_per_run, num_gpus=args.gpus_per_run)(execute)
    pending = {}
    for key, argv in jobs.items():
        resume = [argv[argv.index("--resume") + 1]] if "--resume" in argv else []
        pending[task.remote(argv, files=pack(out, resume))] = key
    try:
        while pending and not stop:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)  # a stop signal is read between waits
            if not done:
                continue
            key = pending.pop(done[0])
            code, output, archive = ray.get(done[0])
            with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
                tar.extractall(out, filter="data")
            with open(os.path.join(out, "logs", f"{key}.log"), "a") as log:
                log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')}: {shlex.join(jobs[key])}\n{output}=== exit {code}\n")
            yield key, code
    finally:
        ray.shutdown()


def local_results(args: Args, jobs: dict[str, list[str]], out: str, stop: list[int]):
    """Yield (key, exit code) for every job as its process ends, `--workers` at a time on this machine. Once a stop
    signal has come (in `stop`), no further run starts and each running one gets that signal, and a second one as
    the runner does; their exit codes still come as they end, after they have saved their checkpoints."""
    live, lock, threads = {}, threading.Lock(), threads_per_run(args.workers)
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        futures = {
            pool.submit(run_local, argv, out, os.path.join(out, "logs", f"{key}.log"), threads, live, lock): key
            for key, argv in jobs.items()
        }
        pending, passed_on = set(futures), 0
        while pending:
            # a short wait, so that a stop signal is passed on at once
            done, pending = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
            for future in done:
                if not future.cancelled():  # a queued run that the stop cancelled never started
                    yield futures[future], future.result()
            if len(stop) > passed_on:
                with lock:
                    live["stopping"] = True
                    running = [p for pid, p in live.items() if pid != "stopping"]
                for signum in stop[passed_on:]:
                    for process in running:
                        process.send_signal(signum)
                for future in pending:
                    future.cancel()
                if not passed_on:
                    print(f"interrupted: waiting for {len(running)} running run(s) to save their checkpoints", flush=True)
                passed_on = len(stop)


def main(args: Args) -> None:
    runs, extra, report = plan(args)
    if args.backend == "ray":  # before any folder is made: a cluster that cannot be reached leaves nothing behind
        ray_init(args.address, args.workers)
    out = os.path.abspath(args.out or os.path.join("benchmark_runs", args.preset or "custom"))
    for sub in ("logs", "done", "runs"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)
    todo = []
    for config, seed in runs:
        if args.rerun or not os.path.exists(os.path.join(out, "done", run_key(config, seed))):
            todo.append((config, seed))
    jobs = {}
    for config, seed in todo:
        key, argv = run_key(config, seed), argv_of(config, seed, extra)
        resume = resume_flags(argv, out, os.path.join(out, "logs", f"{key}.log"), args.rerun)
        jobs[key] = argv + resume
    resumed = sum("--resume" in argv for argv in jobs.values())
    print(
        f"{len(runs)} runs, {len(runs) - len(todo)} already complete, {len(todo)} to run"
        + (f" ({resumed} from their last checkpoint)" if resumed else "")
        + f", in {out}"
    )
    print(f"watch them: tensorboard --logdir {os.path.join(out, 'runs')}; each run's output: {os.path.join(out, 'logs')}")
    failed, start, finished = [], time.time(), 0
    # Ctrl-C, also where a shell started the runner with SIGINT ignored (in the background), and SIGTERM (a cluster's
    # scheduler, `kill`) stop the sweep alike, and each is passed on to the running runs, which keep their
    # checkpoints. A flag read between waits, not an exception: one could land between a run's end and its marker.
    stop = []
    signal.signal(signal.SIGINT, lambda signum, frame: stop.append(signum))
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    results = local_results if args.backend == "local" else ray_results
    progress = tqdm(total=len(jobs), desc="runs")
    for key, code in results(args, jobs, out, stop):
        progress.update()
        if code == 0:  # a run that reached its budget; a stopped one exits with 128 + the signal
            with open(os.path.join(out, "done", key), "w") as marker:
                marker.write(shlex.join(jobs[key]) + "\n")
            finished += 1
        elif not stop:
            failed.append(key)
            tqdm.write(f"FAILED {key} (exit {code}): see {os.path.join(out, 'logs', key + '.log')}")
    progress.close()
    if stop:  # the runs cut short get no completion marker: the same command resumes them
        print(
            f"interrupted: {finished} of {len(jobs)} runs finished; the same command resumes the others "
            "(each from its last checkpoint)"
        )
        raise SystemExit(128 + stop[0])  # the shell's status for the signal: 130 for Ctrl-C, 143 for SIGTERM
    print(f"done in {time.time() - start:.0f} s; {len(failed)} failed")
    if report and args.report:
        from report import Args as ReportArgs
        from report import write_report

        order = list(dict.fromkeys(c.name for c, _ in runs))
        runs_dir = os.path.join(out, "runs")
        for out_dir in [out] + ([RESULTS] if args.results else []):
            for path in write_report(ReportArgs(runs_dir=runs_dir, order=order, out_dir=out_dir, **report)):
                print(path)
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main(tyro.cli(Args))
