"""Run every (config, seed) of a benchmark as its own process through the script's CLI, then report.

    python benchmarks/run.py --preset fsmn-cartpole                      # the README's FSMN table, then its report
    python benchmarks/run.py --scripts ppo_fsmn_cartpole.py --env-ids CartPole-v1 Acrobot-v1 --seeds 1 2 3 \\
        --extra="--total-timesteps 100000" --workers 2

Each run writes its TensorBoard events under <out>/runs/ and its stdout and stderr to <out>/logs/<run>.log. A run
that fails is reported with its log and does not stop the others. A run already complete (its marker in
<out>/done/) is skipped unless --rerun, so an interrupted sweep resumes where it stopped.

Presets, with their measured wall time on 2 CPU cores (workers 1):
  fsmn-cartpole   CartPole-v1 and masked-velocity CartPole (memory 8 and 0), plus sb3-contrib RecurrentPPO on
                  the masked task, 5 seeds each, 150k steps: about 40 minutes.
"""

import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

import tyro
from tqdm import tqdm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Config:
    name: str
    """exp_name of the runs, the config's name in the report"""
    command: list[str]
    """script (relative to the repository root) and flags, without --seed"""


PRESETS: dict[str, dict] = {
    "fsmn-cartpole": dict(
        configs=[
            Config("fsmn_m8", ["ppo_fsmn_cartpole.py", "--memory-order", "8"]),
            Config("fsmn_novel_m8", ["ppo_fsmn_cartpole.py", "--mask-velocity", "--memory-order", "8"]),
            Config("fsmn_novel_m0", ["ppo_fsmn_cartpole.py", "--mask-velocity", "--memory-order", "0"]),
            Config("sb3_recurrent_ppo_novel", ["benchmarks/peers.py", "recurrent-ppo"]),
        ],
        extra=["--total-timesteps", "150000"],
        seeds=[1, 2, 3, 4, 5],
        report=dict(name="fsmn_cartpole", threshold=475.0, title="FSMN PPO on CartPole-v1 and masked-velocity CartPole"),
    ),
}


@dataclass
class Args:
    preset: str | None = None
    """a named benchmark (see the module docstring); its configs, seeds and report"""
    scripts: list[str] = field(default_factory=list)
    """scripts to run (without --preset)"""
    env_ids: list[str] = field(default_factory=list)
    """env ids, each run with every script"""
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    """seeds (a preset brings its own unless given)"""
    extra: str = ""
    """more flags for every run, written with '=': --extra="--total-timesteps 200000" """
    workers: int = 1
    """runs at a time (1 keeps wall-clock figures comparable)"""
    out: str | None = None
    """output folder (default benchmarks/runs/<preset or 'custom'>)"""
    rerun: bool = False
    """run again runs that are already complete"""
    report: bool = True
    """write the report when the runs are done (presets only)"""


def plan(args: Args) -> tuple[list[tuple[Config, int]], list[str], dict | None]:
    if args.preset is not None:
        if args.preset not in PRESETS:
            raise SystemExit(f"error: --preset={args.preset} is not one of {', '.join(PRESETS)}")
        preset = PRESETS[args.preset]
        seeds = args.seeds if "--seeds" in sys.argv else preset["seeds"]
        # seed-major order: the configs of one seed run back to back, so a slow spell of the machine hits them alike
        return [(c, s) for s in seeds for c in preset["configs"]], preset["extra"] + shlex.split(args.extra), preset["report"]
    if not args.scripts:
        raise SystemExit("error: give --preset or --scripts (with --env-ids)")
    configs = [
        Config(f"{os.path.splitext(os.path.basename(script))[0]}", [script] + (["--env-id", env_id] if env_id else []))
        for script in args.scripts
        for env_id in (args.env_ids or [None])
    ]
    return [(c, s) for s in args.seeds for c in configs], shlex.split(args.extra), None


def run_one(config: Config, seed: int, extra: list[str], out: str) -> tuple[str, int, str]:
    env_flag = config.command[config.command.index("--env-id") + 1] if "--env-id" in config.command else "default"
    key = f"{config.name}__{env_flag}__{seed}"
    log_path = os.path.join(out, "logs", f"{key}.log")
    command = [sys.executable, os.path.join(ROOT, config.command[0]), *config.command[1:]]
    command += ["--exp-name", config.name, "--seed", str(seed), *extra]
    if "peers.py" not in config.command[0]:
        command.append("--no-progress")
    with open(log_path, "w") as log:
        log.write(shlex.join(command) + "\n")
        log.flush()
        code = subprocess.call(command, cwd=out, stdout=log, stderr=subprocess.STDOUT)
    if code == 0:
        with open(os.path.join(out, "done", key), "w") as marker:
            marker.write(shlex.join(command) + "\n")
    return key, code, log_path


def main(args: Args) -> None:
    runs, extra, report = plan(args)
    out = os.path.abspath(args.out or os.path.join(ROOT, "benchmarks", "runs", args.preset or "custom"))
    for sub in ("logs", "done", "runs"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)
    todo = []
    for config, seed in runs:
        env_flag = config.command[config.command.index("--env-id") + 1] if "--env-id" in config.command else "default"
        if args.rerun or not os.path.exists(os.path.join(out, "done", f"{config.name}__{env_flag}__{seed}")):
            todo.append((config, seed))
    print(f"{len(runs)} runs, {len(runs) - len(todo)} already complete, {len(todo)} to run, in {out}")
    failed, start = [], time.time()
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        futures = [pool.submit(run_one, config, seed, extra, out) for config, seed in todo]
        for future in tqdm(as_completed(futures), total=len(futures), desc="runs"):
            key, code, log_path = future.result()
            if code != 0:
                failed.append(key)
                tqdm.write(f"FAILED {key} (exit {code}): see {log_path}")
    print(f"done in {time.time() - start:.0f} s; {len(failed)} failed")
    if report and args.report:
        from report import Args as ReportArgs
        from report import write_report

        order = list(dict.fromkeys(c.name for c, _ in runs))
        for path in write_report(ReportArgs(runs_dir=os.path.join(out, "runs"), order=order, **report)):
            print(path)
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main(tyro.cli(Args))
