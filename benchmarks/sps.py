"""Throughput of a script against its peer at equal settings, run alternately in one command.

    python benchmarks/sps.py --pair fsmn-cartpole --repeats 7      # eager and --compile (also continuous-halfcheetah)
    python benchmarks/sps.py --pair atari-pong --repeats 3          # atari-pong-bf16: float32 and --bf16, on bf16 CPUs
    python benchmarks/sps.py --pair transformer-pong --repeats 3    # ppo_transformer_pong.py against ppo_atari.py
    python benchmarks/sps.py --pair atari-pong-gpu --repeats 1      # on a GPU: eager, --cudagraphs, --compile, ...
    python benchmarks/sps.py --pair transformer-pong-gpu --repeats 1  # on a GPU: the transformer against ppo_atari.py
    python benchmarks/sps.py --pair fsmn-cartpole --against 65b7b5a   # also the script as it was at a git commit
    python benchmarks/sps.py --pair fsmn-memory --repeats 2         # the FSMN's steps/s as its memory reaches further back
    python benchmarks/sps.py --pair fsmn-context --repeats 3        # the FSMN trained with and without --context-steps
    python benchmarks/sps.py --pair popgym-one --repeats 3          # the one POPGym config, the per-task ones, the LSTM

Each repeat runs the peer, then the script, as separate processes one after the other (never at once: they
would share the cores); every second repeat runs them in the reverse order, so that a machine whose speed drifts
within a repeat favours no run. A run's steps per second is measured from its TensorBoard `charts/SPS` events, over the
iterations after a burn-in (the first `--burn-in` fraction of the steps: imports, allocation, first calls),
as (steps at the last event - steps at the first event after burn-in) / (wall time between them). Prints and
writes sps_<pair>.md: each run's figure, the median ratio script/peer with min and max
(ratios of the runs paired by repeat), and the peak resident memory of each process. A pair with `variants` runs
the script once per variant (its extra flags) in each repeat, and reports each variant's ratio to the peer and to
the first variant. `--against REF` also runs every variant of the script as it was at git commit REF (extracted with
`git archive` into a temporary folder), in the same alternation, and reports each variant's ratio to its REF copy:
how a refactor is checked. The table goes to benchmark_runs/sps/ under the working folder (--out-dir elsewhere;
--results into benchmarks/results/, the project's tracked results).

Every run is also timed against the rest of the machine: the cores that other processes kept busy in the second
(--load-seconds) before it starts and while it runs (Linux's /proc/stat, less the run's and this process's own CPU
time). Above a quarter of a core the output and the table say that the machine was busy, so that the ratios may not
hold on a quiet one. The peers take the cores other processes leave free, as the scripts do (peers.py).
"""

import glob
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import tyro
from report import machine, write_result
from run import (
    FSMN_EARLIER,
    FSMN_SHARED,
    LSTM_ONE,
    PENDULUM_FLAGS,  # ppo_continuous.py's old defaults, at which the SB3 pair was matched and measured
    POPGYM_GATE,
    POPGYM_ONE,
    POPGYM_PPO_GAMMA05,
)
from run import POPGYM_RECALL as AUTOENCODE_RECALL
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")  # the project's results, tracked: written only with --results
BUSY = 0.25  # cores kept busy by other processes above which a measurement says that the machine was busy

# the popgym-recall preset's fsmn_gate_gamma0.5, with the network it was measured with
POPGYM_RECALL = [*POPGYM_PPO_GAMMA05, *POPGYM_GATE, *FSMN_SHARED]

# Equal settings: envs, steps per rollout, epochs and minibatch size (SB3's batch_size = samples per minibatch).
PAIRS = {
    "fsmn-cartpole": dict(
        script=["ppo_fsmn_cartpole.py", "--num-envs", "4", "--num-steps", "128", "--num-minibatches", "4"]
        + ["--update-epochs", "4", "--memory-order", "4", "--no-progress"],
        variants={"eager": [], "--compile": ["--compile"]},
        peer=["benchmarks/peers.py", "sb3-ppo", "--env-id", "CartPole-v1", "--num-envs", "4", "--num-steps", "128"]
        + ["--batch-size", "128", "--epochs", "4"],
        total_timesteps=40_960,
        description="ppo_fsmn_cartpole.py (memory 4, 2 blocks of 64) vs SB3 PPO MlpPolicy (2x64), CartPole-v1, "
        "4 envs x 128 steps, 4 epochs, minibatch 128",
    ),
    "fsmn-memory": dict(  # the FSMN's cost as its memory reaches further back: reach = blocks x order x stride
        script=["ppo_fsmn_cartpole.py", "--env-id", "popgym-RepeatFirstEasy-v0", "--no-progress", *FSMN_SHARED],
        variants={
            "order 4 (reach 8)": [],
            "order 4 stride 4 (reach 32)": ["--memory-stride", "4"],
            "order 16 (reach 32)": ["--memory-order", "16"],
            "order 32 (reach 64)": ["--memory-order", "32"],
            "order 8 stride 8 (reach 128)": ["--memory-order", "8", "--memory-stride", "8"],
            "order 64 (reach 128)": ["--memory-order", "64"],
            "order 32 stride 4 (reach 256)": ["--memory-order", "32", "--memory-stride", "4"],
            "order 4 + decay (reach: the episode)": ["--long-memory", "decay"],
            "order 4 + gate (reach: the episode)": ["--long-memory", "gate"],
            "order 16 + gate (the popgym preset's fsmn_gate memory)": ["--memory-order", "16", "--long-memory", "gate"],
        },
        peer=["benchmarks/peers.py", "recurrent-ppo", "--env-id", "popgym-RepeatFirstEasy-v0", "--prev-action"]
        + ["--fsmn-settings"],
        total_timesteps=40_960,
        description="ppo_fsmn_cartpole.py (2 blocks of 64) at its defaults with memories of growing reach vs sb3-contrib "
        "RecurrentPPO (LSTM 64) at the same PPO settings, popgym-RepeatFirstEasy-v0, 8 envs x 64 steps, 10 epochs, "
        "4 minibatches",
    ),
    "fsmn-context": dict(  # what training over --context-steps before each rollout costs, at popgym-recall's settings
        script=["ppo_fsmn_cartpole.py", "--env-id", "popgym-CountRecallEasy-v0", "--no-progress", *POPGYM_RECALL],
        variants={
            "context 52 (a CountRecall episode)": ["--context-steps", "52"],
            "context 128 (a whole rollout)": ["--context-steps", "128"],
        },
        peer=["ppo_fsmn_cartpole.py", "--env-id", "popgym-CountRecallEasy-v0", "--no-progress", *POPGYM_RECALL],
        total_timesteps=40_960,
        description="ppo_fsmn_cartpole.py at the popgym-recall preset's fsmn_gate_gamma0.5 settings (order 16 + gate, 8 "
        "envs x 128 steps, 9 epochs, 4 minibatches) with training replaying a context before each rollout vs the same "
        "without, popgym-CountRecallEasy-v0",
    ),
    "popgym-one": dict(  # the one POPGym config against the per-task configs it replaces, on one task, and the LSTM at it
        script=["ppo_fsmn_cartpole.py", "--env-id", "popgym-CountRecallEasy-v0", "--no-progress"],
        variants={
            "one config (POPGYM_ONE)": POPGYM_ONE,
            "CountRecall's (gamma 0.5)": [*FSMN_EARLIER[1:], *POPGYM_PPO_GAMMA05, *POPGYM_GATE],
            "Autoencode's (context 104, recall loss)": [*FSMN_EARLIER[1:], *AUTOENCODE_RECALL, *POPGYM_GATE],
        },
        peer=[*LSTM_ONE, "--env-id", "popgym-CountRecallEasy-v0"],
        total_timesteps=40_960,
        description="ppo_fsmn_cartpole.py at the one POPGym config (run.py's POPGYM_ONE) and at the per-task configs of "
        "the popgym-recall preset, vs sb3-contrib RecurrentPPO (LSTM 64) at the one config, popgym-CountRecallEasy-v0",
    ),
    "continuous-halfcheetah": dict(
        script=["ppo_continuous.py", "--env-id", "HalfCheetah-v5", "--no-progress", *PENDULUM_FLAGS],
        variants={
            "eager": [],
            "--compile": ["--compile"],
        },
        peer=["benchmarks/peers.py", "sb3-ppo", "--env-id", "HalfCheetah-v5", "--num-envs", "8", "--num-steps", "256"]
        + ["--batch-size", "256", "--epochs", "10", "--normalize"],
        total_timesteps=81_920,  # compiled runs are fast: more steps keep the measured window after the burn-in long
        description="ppo_continuous.py (64x64 tanh actor and critic) vs SB3 PPO MlpPolicy (the same) with VecNormalize, "
        "HalfCheetah-v5, 8 envs x 256 steps, 10 epochs, minibatch 256",
    ),
    "ppg-lunarlander": dict(
        script=["ppg_lunarlander.py", "--no-progress"],
        variants={"ppg": [], "--e-auxiliary 0": ["--e-auxiliary", "0"]},
        peer=["benchmarks/peers.py", "sb3-ppo", "--env-id", "LunarLander-v3", "--num-envs", "16", "--num-steps", "256"]
        + ["--batch-size", "64", "--epochs", "1"],
        total_timesteps=163_840,  # 40 iterations: the window after the burn-in holds one auxiliary phase (iteration 32)
        description="ppg_lunarlander.py (PPG at its defaults, and without its auxiliary phase) vs SB3 PPO MlpPolicy "
        "(2x64), LunarLander-v3, 16 envs x 256 steps, 1 epoch, minibatch 64",
    ),
    "atari-pong": dict(
        script=["ppo_atari.py", "--env-id", "PongNoFrameskip-v4", "--no-progress"],
        peer=["benchmarks/peers.py", "sb3-ppo-atari", "--env-id", "PongNoFrameskip-v4", "--device", "cpu"],
        total_timesteps=10_240,
        description="ppo_atari.py (float32, channels-last) vs SB3 PPO CnnPolicy with make_atari_env + VecFrameStack, "
        "PongNoFrameskip-v4, 8 envs x 128 steps, 4 epochs, minibatch 256",
    ),
    "atari-pong-bf16": dict(  # for CPUs with avx512_bf16 or AMX: elsewhere bf16 is emulated, far slower
        script=["ppo_atari.py", "--env-id", "PongNoFrameskip-v4", "--no-progress"],
        variants={
            "float32": [],
            "--bf16": ["--bf16"],
        },
        peer=["benchmarks/peers.py", "sb3-ppo-atari", "--env-id", "PongNoFrameskip-v4", "--device", "cpu"],
        total_timesteps=10_240,
        description="ppo_atari.py in float32 (channels-last) and under --bf16 (default layout), vs SB3 PPO CnnPolicy "
        "with make_atari_env + VecFrameStack, PongNoFrameskip-v4, 8 envs x 128 steps, 4 epochs, minibatch 256",
    ),
    "transformer-pong": dict(
        script=["ppo_transformer_pong.py", "--env-id", "PongNoFrameskip-v4", "--no-progress"],
        peer=["ppo_atari.py", "--env-id", "PongNoFrameskip-v4", "--no-progress"],
        total_timesteps=10_240,
        description="ppo_transformer_pong.py (lookback 16, 2 layers, d_model 128, one frame per step) vs ppo_atari.py "
        "(NatureCNN on 4 stacked frames), both float32 channels-last, PongNoFrameskip-v4, 8 envs x 128 steps, 4 epochs, "
        "minibatch 256 (2 env sequences for the transformer)",
    ),
    "transformer-pong-gpu": dict(
        script=["ppo_transformer_pong.py", "--env-id", "PongNoFrameskip-v4", "--no-progress"],
        variants={"eager": [], "--compile": ["--compile"]},
        peer=["ppo_atari.py", "--env-id", "PongNoFrameskip-v4", "--no-progress"],
        total_timesteps=30_720,
        description="ppo_transformer_pong.py (lookback 16, 2 layers, d_model 128, one frame per step), eager and "
        "--compile, vs ppo_atari.py (NatureCNN on 4 stacked frames, eager), on the GPU, float32 channels-last, "
        "PongNoFrameskip-v4, 8 envs x 128 steps, 4 epochs, minibatch 256 (2 env sequences for the transformer)",
    ),
    "atari-pong-gpu": dict(
        script=["ppo_atari.py", "--env-id", "PongNoFrameskip-v4", "--no-progress"],
        variants={
            "eager": [],
            "--cudagraphs": ["--cudagraphs"],
            "--compile": ["--compile"],
            "--compile --cudagraphs": ["--compile", "--cudagraphs"],
            "--bf16 --compile --cudagraphs": ["--bf16", "--compile", "--cudagraphs"],
        },
        peer=["benchmarks/peers.py", "sb3-ppo-atari", "--env-id", "PongNoFrameskip-v4", "--device", "cuda"],
        total_timesteps=30_720,
        description="ppo_atari.py (channels-last) with each speed option vs SB3 PPO CnnPolicy on the GPU with "
        "make_atari_env + VecFrameStack, PongNoFrameskip-v4, 8 envs x 128 steps, 4 epochs, minibatch 256",
    ),
}


@dataclass
class Args:
    pair: str = "fsmn-cartpole"
    """which script and peer (see PAIRS)"""
    repeats: int = 3
    """runs of each, alternating"""
    burn_in: float = 0.2
    """fraction of the steps left out of the measurement"""
    total_timesteps: int | None = None
    """steps per run (default: the pair's)"""
    variants: list[str] | None = None
    """run only these of the pair's variants, named with or without their leading dashes (default: all)"""
    out_dir: str = os.path.join("benchmark_runs", "sps")
    """where the table is written"""
    results: bool = False
    """write the table into benchmarks/results/, the project's tracked results (overwrites the file of that name)"""
    against: str | None = None
    """a git commit (or a folder holding the scripts as they were) whose copy of the script also runs every variant,
    for a before/after ratio"""
    load_seconds: float = 1.0
    """how long the cores that other processes keep busy are read before each run"""


def busy_cpu_seconds() -> float:
    """CPU seconds that all of this machine's cores have spent busy since it booted (Linux's /proc/stat; 0 elsewhere)."""
    try:
        with open("/proc/stat") as f:  # the first line sums every CPU: user, nice, system, idle, iowait, irq, softirq
            fields = f.readline().split()
    except OSError:
        return 0.0
    return sum(int(fields[i]) for i in (1, 2, 3, 6, 7)) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class OtherLoad:
    """The cores that processes other than this one (and a measured child, whose CPU time is given) keep busy, on
    average, from this object's creation to a call of `cores`."""

    def __init__(self):
        self.start = time.perf_counter(), busy_cpu_seconds(), own_cpu_seconds()

    def cores(self, child_cpu_seconds: float = 0.0) -> float:
        now, busy, own = time.perf_counter(), busy_cpu_seconds(), own_cpu_seconds()
        others = busy - self.start[1] - (own - self.start[2]) - child_cpu_seconds
        return max(0.0, others / max(now - self.start[0], 1e-9))


def load_before(seconds: float = 1.0) -> float:
    """The cores that other processes keep busy over `seconds` of this process's sleep."""
    load = OtherLoad()
    time.sleep(seconds)
    return load.cores()


def busy_lines(before: list[float], during: list[float], seconds: float = 1.0) -> list[str]:
    """The table's line on the rest of the machine's load (read for `seconds` before each run), and a warning when it
    was busy."""
    line = f"Other processes kept up to {max(before):.2f} cores busy in the {seconds:g} s before a run, {max(during):.2f} "
    line += f"on average during one (a run's own CPU time left out; {BUSY} or more counts as busy)."
    if max(max(before), max(during)) < BUSY:
        return [line]
    return [line, "", "**Warning: the machine was busy while these runs ran: the ratios may not hold on a quiet one.**"]


def measured_sps(run_dir: str, burn_in_steps: int) -> float:
    accumulator = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    accumulator.Reload()
    events = [e for e in accumulator.Scalars("charts/SPS") if e.step >= burn_in_steps]
    if len(events) < 2:
        raise SystemExit(f"error: {run_dir} logged fewer than two iterations after the burn-in; raise --total-timesteps")
    return (events[-1].step - events[0].step) / (events[-1].wall_time - events[0].wall_time)


def run(
    command: list[str], total_timesteps: int, burn_in: float, load_seconds: float = 1.0
) -> tuple[float, float, float, float]:
    """Run one process in a fresh folder; return its steps per second, its peak resident memory in MiB, and the cores
    that other processes kept busy in the `load_seconds` before it and while it ran."""
    cwd = tempfile.mkdtemp(prefix="sps_")
    full = [sys.executable, os.path.join(ROOT, command[0]), *command[1:], "--total-timesteps", str(total_timesteps)]
    # a script extracted from another commit (--against) is an absolute path, which os.path.join keeps as it is
    before = load_before(load_seconds)
    with open(os.path.join(cwd, "log.txt"), "w") as log:
        load = OtherLoad()
        process = subprocess.Popen(full, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)  # this child's own resource usage; ru_maxrss in KiB on Linux
        during = load.cores(usage.ru_utime + usage.ru_stime)
    if os.waitstatus_to_exitcode(status) != 0:
        with open(os.path.join(cwd, "log.txt")) as log:
            raise SystemExit(f"error: {' '.join(command)} failed:\n{log.read()[-2000:]}")
    (run_dir,) = glob.glob(os.path.join(cwd, "runs", "*"))
    sps = measured_sps(run_dir, int(burn_in * total_timesteps))
    shutil.rmtree(cwd)
    return sps, usage.ru_maxrss / 1024, before, during


def command_line(args: Args) -> str:
    """The flags that reproduce this table (those that differ from the defaults), for its 'Generated by' line."""
    flags = [f"--pair {args.pair}", f"--repeats {args.repeats}"] + (["--results"] if args.results else [])
    if args.total_timesteps is not None:
        flags.append(f"--total-timesteps {args.total_timesteps}")
    if args.variants is not None:
        flags.append("--variants " + " ".join(shlex.quote(name) for name in args.variants))
    if args.against is not None:
        flags.append(f"--against {args.against}")
    if args.load_seconds != 1.0:
        flags.append(f"--load-seconds {args.load_seconds:g}")
    return " ".join(flags)


def extract_commit(ref: str) -> str:
    """The repository's files at git commit `ref`, in a temporary folder (one clear line if git cannot find it); a
    folder given as `ref` (the scripts as they were, copied where there is no git history) is used as it is."""
    if os.path.isdir(ref):
        return os.path.abspath(ref)
    folder = tempfile.mkdtemp(prefix="sps_against_")
    archive = subprocess.run(["git", "-C", ROOT, "archive", ref], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"error: --against={ref} is not a commit of this repository ({archive.stderr.decode().strip()})")
    subprocess.run(["tar", "-x", "-C", folder], input=archive.stdout, check=True)
    return folder


def main(args: Args) -> None:
    if args.pair not in PAIRS:
        raise SystemExit(f"error: --pair={args.pair} is not one of {', '.join(PAIRS)}")
    pair = PAIRS[args.pair]
    variants = pair.get("variants", {"script": []})
    if args.variants is not None:  # named with or without their leading dashes: `--variants eager cudagraphs`
        wanted = {name.lstrip("-") for name in args.variants}
        unknown = sorted(wanted - {name.lstrip("-") for name in variants})
        if unknown:
            raise SystemExit(f"error: --variants={' '.join(unknown)} not in pair {args.pair}: {', '.join(variants)}")
        variants = {name: flags for name, flags in variants.items() if name.lstrip("-") in wanted}
    commands = {name: pair["script"] + flags for name, flags in variants.items()}
    if args.against is not None:
        old_script = os.path.join(extract_commit(args.against), pair["script"][0])
        commands.update({f"{args.against} {name}": [old_script, *command[1:]] for name, command in list(commands.items())})
    total = args.total_timesteps or pair["total_timesteps"]
    sps = {name: [] for name in [*commands, "peer"]}
    memory = {name: [] for name in sps}
    before, during = [], []
    for repeat in range(args.repeats):
        order = [("peer", pair["peer"]), *commands.items()]
        for name, command in order if repeat % 2 == 0 else order[::-1]:
            try:
                run_sps, run_memory, load, run_load = run(command, total, args.burn_in, args.load_seconds)
                before.append(load), during.append(run_load)
            except SystemExit as failure:  # the other runs still run; the table shows nan and the exit status is 1
                print(failure, flush=True)
                run_sps, run_memory, load, run_load = float("nan"), float("nan"), float("nan"), float("nan")
            sps[name].append(run_sps), memory[name].append(run_memory)
            busy = " (the machine was busy)" if max(load, run_load) >= BUSY else ""
            print(
                f"repeat {repeat + 1}, {name}: {run_sps:.0f} steps/s; other processes: {load:.2f} cores before, "
                f"{run_load:.2f} during{busy}",
                flush=True,
            )
    first = next(iter(variants))

    def ratio(a: str, b: str) -> str:
        r = np.array(sps[a]) / np.array(sps[b])
        return f"**{np.median(r):.2f}** (min {r.min():.2f}, max {r.max():.2f})"

    lines = [
        f"# Throughput: {args.pair}",
        "",
        f"{pair['description']}; {total} steps per run, the first {args.burn_in:.0%} left out; runs alternate, one at a time, "
        "every second repeat in the reverse order.",
        f"Machine: {machine()}. Generated by `python benchmarks/sps.py {command_line(args)}`.",
        "",
        "| repeat | " + " | ".join(f"{name} steps/s" for name in sps) + " |",
        "|---|" + "---|" * len(sps),
        *[f"| {i + 1} | " + " | ".join(f"{sps[name][i]:.0f}" for name in sps) + " |" for i in range(args.repeats)],
        "",
        *[f"Median ratio {name}/peer: {ratio(name, 'peer')}." for name in variants],
        *[f"Median ratio {name}/{first}: {ratio(name, first)}." for name in list(variants)[1:]],
        *(
            [f"Median ratio {name}/{args.against} {name}: {ratio(name, f'{args.against} {name}')}." for name in variants]
            if args.against
            else []
        ),
        "Peak resident memory (MiB, largest over repeats): " + ", ".join(f"{n} {max(m):.0f}" for n, m in memory.items()) + ".",
        *busy_lines(before or [0.0], during or [0.0], args.load_seconds),
        "",
    ]
    name = f"sps_{args.pair.replace('-', '_')}" + (
        f"_against_{os.path.basename(os.path.normpath(args.against))}" if args.against else ""
    )
    path = write_result(name, lines, RESULTS if args.results else args.out_dir)
    print("\n".join(line for line in lines if line.startswith(("Median", "Other processes", "**Warning"))))
    print(path)
    if any(np.isnan(values).any() for values in sps.values()):
        raise SystemExit("error: a run failed (its log is printed above)")


if __name__ == "__main__":
    main(tyro.cli(Args))
