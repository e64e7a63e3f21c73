"""Throughput of each script alone and with a second run beside it on the same cores, alternating, in one command.

    python benchmarks/side_by_side.py --repeats 2                      # every script; writes side_by_side.md
    python benchmarks/side_by_side.py --scripts fsmn --against 2438982 # also the scripts as they were at a commit

Each repeat runs, one configuration after the other: every script alone, beside a second copy of itself, and beside
ppo_atari.py (or `--second`). The second run starts first, with no step limit; once it has logged an iteration, the
measured run starts; when that one ends, the second is stopped with Ctrl-C. Steps per second come from each run's
TensorBoard `charts/SPS` events after a burn-in, the second run's over the same wall-clock window (its step count
interpolated at the window's ends), so the table gives both runs' share of their speed alone. `--against REF` also runs
each script's copy at git commit REF (or from a folder) alone, next to the new one: the speed before and after;
`--against-beside` also runs REF's copies side by side. The table goes to benchmark_runs/side_by_side/ under the
working folder (--out-dir elsewhere; --results into benchmarks/results/, the project's tracked results). Before each
measurement the cores that other processes keep busy are read for a second (--load-seconds); above a quarter of a
core the output and the table say that the machine was busy.
"""

import glob
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import tyro
from report import machine, write_result
from run import PENDULUM_FLAGS
from sps import BUSY, RESULTS, ROOT, extract_commit, load_before
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

# each script at its defaults, apart from the settings that make a run of a few tens of seconds with several iterations
SCRIPTS = {
    "fsmn": (["ppo_fsmn_cartpole.py"], 40_960),
    "continuous": (["ppo_continuous.py", "--env-id", "HalfCheetah-v5", *PENDULUM_FLAGS], 61_440),  # its old defaults
    "ppg": (["ppg_lunarlander.py", "--n-iteration", "8", "--num-minibatches", "64"], 98_304),  # aux phase every 8 iterations
    "atari": (["ppo_atari.py", "--env-id", "PongNoFrameskip-v4"], 10_240),
    "transformer": (["ppo_transformer_pong.py", "--env-id", "PongNoFrameskip-v4"], 10_240),
}


@dataclass
class Args:
    scripts: list[str] | None = None
    """which of the scripts to measure (default: all of fsmn, continuous, ppg, atari, transformer)"""
    repeats: int = 2
    """rounds of every configuration, alternating"""
    burn_in: float = 0.2
    """fraction of a measured run's steps left out of its measurement"""
    total_timesteps: int | None = None
    """steps of every measured run (default: each script's, in SCRIPTS)"""
    against: str | None = None
    """a git commit (or a folder holding the scripts as they were) whose copies also run alone"""
    second: str = "atari"
    """the second run every script is also measured beside (one of SCRIPTS; atari: the heaviest)"""
    against_beside: bool = False
    """with --against, also run the commit's copies beside each other (slow where they starve each other)"""
    out_dir: str = os.path.join("benchmark_runs", "side_by_side")
    """where the table is written"""
    results: bool = False
    """write the table into benchmarks/results/, the project's tracked results (overwrites the file of that name)"""
    load_seconds: float = 1.0
    """how long the cores that other processes keep busy are read before each measurement"""


def events(run_dir: str) -> tuple[np.ndarray, np.ndarray]:
    """(wall times, global steps) of a run's `charts/SPS` events (none while its folder does not exist)."""
    if not run_dir:
        return np.array([]), np.array([])
    accumulator = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    accumulator.Reload()
    scalars = accumulator.Scalars("charts/SPS") if "charts/SPS" in accumulator.Tags()["scalars"] else []
    return np.array([e.wall_time for e in scalars]), np.array([e.step for e in scalars], dtype=float)


POLL = 0.1  # seconds between two reads of the second run's events: it starts the measured run, then stops, on time


def start(command: list[str], folder: str, total_timesteps: int) -> subprocess.Popen:
    script = command[0] if os.path.isabs(command[0]) else os.path.join(ROOT, command[0])
    full = [sys.executable, script, *command[1:], "--no-progress", "--total-timesteps", str(total_timesteps)]
    os.makedirs(folder, exist_ok=True)
    log = open(os.path.join(folder, "log.txt"), "w")
    return subprocess.Popen(full, cwd=folder, stdout=log, stderr=subprocess.STDOUT)


def run_dir(folder: str) -> str:
    found = glob.glob(os.path.join(folder, "runs", "*"))
    return found[0] if found else ""


def finish(process: subprocess.Popen, folder: str, name: str, interrupted: bool = False) -> None:
    code = process.wait()
    if code != 0 and not (interrupted and code == 130):
        with open(os.path.join(folder, "log.txt")) as log:
            raise SystemExit(f"error: {name} exited {code}:\n{log.read()[-2000:]}")


def measure(command: list[str], total: int, burn_in: float, second: list[str] | None) -> tuple[float, float]:
    """Steps per second of `command` (alone, or beside `second`) and of `second` over the same window (nan alone)."""
    folder = tempfile.mkdtemp(prefix="side_by_side_")
    background = None
    try:
        if second is not None:
            background = start(second, os.path.join(folder, "second"), 10**9)
            while len(events(run_dir(os.path.join(folder, "second")))[0]) < 1:  # started up and ran one iteration
                if background.poll() is not None:
                    finish(background, os.path.join(folder, "second"), " ".join(second))
                time.sleep(POLL)
        process = start(command, os.path.join(folder, "first"), total)
        finish(process, os.path.join(folder, "first"), " ".join(command))
        wall, steps = events(run_dir(os.path.join(folder, "first")))
        kept = steps >= burn_in * total
        if kept.sum() < 2:
            raise SystemExit(f"error: {' '.join(command)} logged fewer than two iterations after the burn-in")
        t0, t1 = wall[kept][0], wall[kept][-1]
        sps, second_sps = (steps[kept][-1] - steps[kept][0]) / (t1 - t0), float("nan")
        if background is not None:
            while (wall2 := events(run_dir(os.path.join(folder, "second")))[0]).max() < t1:  # an event past the window
                if background.poll() is not None:
                    finish(background, os.path.join(folder, "second"), " ".join(second))
                time.sleep(POLL)
            background.send_signal(signal.SIGINT)
            finish(background, os.path.join(folder, "second"), " ".join(second), interrupted=True)
            wall2, steps2 = events(run_dir(os.path.join(folder, "second")))
            second_sps = (np.interp(t1, wall2, steps2) - np.interp(t0, wall2, steps2)) / (t1 - t0)
    finally:  # a failure leaves no second run behind
        if background is not None and background.poll() is None:
            background.kill()
    subprocess.run(["rm", "-rf", folder])
    return sps, second_sps


def main(args: Args) -> None:
    names = args.scripts or list(SCRIPTS)
    unknown = [name for name in [*names, args.second] if name not in SCRIPTS]
    if unknown:
        raise SystemExit(f"error: --scripts/--second={' '.join(unknown)}: each must be one of {', '.join(SCRIPTS)}")
    SECOND, second_script = args.second, SCRIPTS[args.second][0][0]
    versions = {"": ROOT}
    if args.against is not None:
        versions[args.against] = extract_commit(args.against)

    def command(name: str, version: str) -> list[str]:
        script, *flags = SCRIPTS[name][0]
        return [os.path.join(versions[version], script), *flags]

    # (measured script, second script or None, version) -> [(sps, second's sps), ...]
    configs = [(name, None, version) for name in names for version in versions]  # alone: each next to its old copy
    beside = [v for v in versions if v == "" or args.against_beside]
    configs += [(SECOND, None, version) for version in beside if SECOND not in names]  # the second's own speed alone
    configs += [(n, s, v) for v in beside for s in ("self", SECOND) for n in names if (s, n) != (SECOND, SECOND)]
    results, before = {config: [] for config in configs}, []
    for repeat in range(args.repeats):
        for name, second, version in configs:
            other = None if second is None else command(name if second == "self" else second, version)
            total = args.total_timesteps or SCRIPTS[name][1]
            before.append(load_before(args.load_seconds))
            results[name, second, version].append(measure(command(name, version), total, args.burn_in, other))
            sps, second_sps = results[name, second, version][-1]
            label = f"{version + ' ' if version else ''}{name}" + (f" beside {second}" if second else " alone")
            busy = " (the machine was busy)" if before[-1] >= BUSY else ""
            print(
                f"repeat {repeat + 1}, {label}: {sps:.0f} steps/s"
                + (f", second {second_sps:.0f}" if second else "")
                + f"; other processes before it: {before[-1]:.2f} cores{busy}",
                flush=True,
            )

    def median(config, index=0) -> float:
        return float(np.median([r[index] for r in results[config]]))

    lines = [
        "# Runs side by side",
        "",
        "Steps per second of each script alone and with a second run on the same cores (median over repeats), and each",
        "run's share of its speed alone. "
        + ", ".join(f"{n}: `{' '.join(SCRIPTS[n][0])}`, {SCRIPTS[n][1]} steps" for n in names),
        f"(measured runs; the first {args.burn_in:.0%} of their steps left out). Machine: {machine()}.",
        f"Generated by `python benchmarks/side_by_side.py --repeats {args.repeats}"
        + (f" --scripts {' '.join(names)}" if args.scripts else "")
        + (f" --total-timesteps {args.total_timesteps}" if args.total_timesteps else "")
        + (f" --burn-in {args.burn_in}" if args.burn_in != 0.2 else "")
        + (f" --against {args.against}" if args.against else "")
        + (" --against-beside" if args.against_beside else "")
        + (f" --second {args.second}" if args.second != "atari" else "")
        + (" --results" if args.results else "")
        + (f" --load-seconds {args.load_seconds:g}" if args.load_seconds != 1.0 else "")
        + "`.",
        "",
        f"| version | script | alone | beside itself (each) | share | beside {second_script} | share "
        f"| {second_script} beside it: share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for version in beside:
        atari_alone = median((SECOND, None, version))
        for name in names:
            alone, itself = median((name, None, version)), median((name, "self", version))
            row = [version or "this", name, f"{alone:.0f}", f"{itself:.0f}", f"{itself / alone:.0%}", "", "", ""]
            if (name, SECOND, version) in results:
                with_atari, atari = median((name, SECOND, version)), median((name, SECOND, version), 1)
                row[5:] = [f"{with_atari:.0f}", f"{with_atari / alone:.0%}", f"{atari / atari_alone:.0%}"]
            lines.append("| " + " | ".join(row) + " |")
    if args.against is not None:
        lines.append("")
        for name in names:
            ratios = [a[0] / b[0] for a, b in zip(results[name, None, ""], results[name, None, args.against])]
            lines.append(
                f"Alone, {name} against {args.against}: median ratio **{np.median(ratios):.2f}** "
                f"(min {min(ratios):.2f}, max {max(ratios):.2f})."
            )
    lines += ["", f"Other processes kept up to {max(before):.2f} cores busy in the {args.load_seconds:g} s before a "]
    lines[-1] += f"measurement ({BUSY} or more counts as busy)."
    if max(before) >= BUSY:
        lines += ["", "**Warning: the machine was busy before these runs: the shares may not hold on a quiet one.**"]
    lines.append("")
    print("\n".join(lines))
    name = "side_by_side" + (f"_against_{os.path.basename(os.path.normpath(args.against))}" if args.against else "")
    print(write_result(name, lines, RESULTS if args.results else args.out_dir))


if __name__ == "__main__":
    main(tyro.cli(Args))
