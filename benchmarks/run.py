"""Run every (config, seed) of a benchmark as its own process through the script's CLI, then report.

    python benchmarks/run.py --preset fsmn-cartpole                      # the README's FSMN table, then its report
    python benchmarks/run.py --scripts ppo_fsmn_cartpole.py --env-ids CartPole-v1 Acrobot-v1 --seeds 1 2 3 \\
        --extra="--total-timesteps 100000" --workers 2

Each run writes its TensorBoard events under <out>/runs/ and its stdout and stderr to <out>/logs/<run>.log. A run
that fails is reported with its log and does not stop the others. `--backend ray` sends the same runs to a Ray
cluster (`--address`, e.g. `auto` on a node of it) or to a local Ray instance, as tasks that reserve
`--cpus-per-run`/`--gpus-per-run`; the repository travels to the nodes as the tasks' working dir and each run's
event files come back in its result. A run already complete (its marker in
<out>/done/) is skipped unless --rerun, so an interrupted sweep resumes where it stopped.

Presets (each writes its report to benchmarks/results/<name>.md, which gives the runs' wall times):
  fsmn-cartpole        CartPole-v1 and masked-velocity CartPole (memory 4 and 0), plus sb3-contrib RecurrentPPO on
                       the masked task, with and without the previous action as input, 5 seeds each, 150k steps.
  atari-pong           PongNoFrameskip-v4, seed 1, 1.5M steps, with --bf16 and in float32 (bf16 only on CPUs with
                       bf16 instructions: emulated, it is far slower); `--configs atari_fp32` for one of them.
  continuous-pendulum  Pendulum-v1, 5 seeds, 200k steps.
  continuous-mujoco    HalfCheetah-v5, Hopper-v5 and Walker2d-v5, 3 seeds, 1M steps, with CleanRL's MuJoCo settings
                       (gamma 0.99, lr 3e-4, minibatches of 64); `--env-ids Hopper-v5` runs only that env's config.
  continuous-bipedal   BipedalWalker-v3, 3 seeds, 5M steps, six configs: `zoo`, the rl-baselines3-zoo's PPO settings
                       (32 envs x 2048 steps, minibatches of 64, 10 epochs, gamma 0.999, lr 2.5e-4, clip 0.18),
                       `gamma0.99`, the same with gamma 0.99, `steps1024`, gamma 0.99 and 32 envs x 1024 steps,
                       `steps1024_gamma0.995`, `steps512`, and `steps1024_best` (steps1024 evaluated every 4
                       iterations, the best policy kept in best.pt); `--configs steps1024` for one of them.
  transformer-pong     ppo_transformer_pong.py on PongNoFrameskip-v4, seed 1, 1M steps.
  ppg-lunarlander      LunarLander-v3, 5 seeds, 1M steps: ppg_lunarlander.py, the same with --e-auxiliary 0, SB3's PPO
                       with the RL Zoo's settings, and ppo_fsmn_cartpole.py at its defaults.
On a GPU the Atari presets are the ones that gain; the FSMN and continuous networks are too small to.
"""

import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Literal

import tyro
from tqdm import tqdm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


MUJOCO_FLAGS = ["--gamma", "0.99", "--learning-rate", "3e-4", "--num-minibatches", "32"]  # CleanRL's MuJoCo settings
# the rl-baselines3-zoo's PPO settings for BipedalWalker-v3: 32 envs x 2048 steps, minibatches of 64, 10 epochs;
# the final checkpoint is kept for a deterministic evaluation (--eval-checkpoint), as the zoo scores its agents
BIPEDAL_FLAGS = ["--num-envs", "32", "--update-epochs", "10", "--learning-rate", "2.5e-4", "--clip-coef", "0.18"]
BIPEDAL_FLAGS += ["--ent-coef", "0", "--compile", "--save-model"]
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

PRESETS: dict[str, dict] = {
    "fsmn-cartpole": dict(
        configs=[
            Config("fsmn_m4", ["ppo_fsmn_cartpole.py", "--memory-order", "4"]),
            Config("fsmn_novel_m4", ["ppo_fsmn_cartpole.py", "--mask-velocity", "--memory-order", "4"]),
            Config("fsmn_novel_m0", ["ppo_fsmn_cartpole.py", "--mask-velocity", "--memory-order", "0"]),
            Config("sb3_recurrent_ppo_novel", ["benchmarks/peers.py", "recurrent-ppo"]),
            Config("sb3_recurrent_ppo_novel_prev_action", ["benchmarks/peers.py", "recurrent-ppo", "--prev-action"]),
        ],
        extra=["--total-timesteps", "150000"],
        seeds=[1, 2, 3, 4, 5],
        report=dict(name="fsmn_cartpole", threshold=475.0, title="FSMN PPO on CartPole-v1 and masked-velocity CartPole"),
    ),
    "ppg-lunarlander": dict(
        configs=[
            Config("ppg", ["ppg_lunarlander.py", "--save-model"]),
            Config("ppg_noaux", ["ppg_lunarlander.py", "--e-auxiliary", "0", "--save-model"]),
            Config("sb3_ppo_zoo", ["benchmarks/peers.py", "sb3-ppo", "--env-id", "LunarLander-v3", *LUNAR_ZOO]),
            Config("fsmn", ["ppo_fsmn_cartpole.py", "--env-id", "LunarLander-v3", "--save-model"]),
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
        configs=[Config("continuous", ["ppo_continuous.py", "--env-id", "Pendulum-v1"])],
        extra=["--total-timesteps", "200000"],
        seeds=[1, 2, 3, 4, 5],
        report=dict(name="continuous_pendulum", threshold=-200.0, title="Tanh-Gaussian PPO on Pendulum-v1"),
    ),
    "continuous-mujoco": dict(
        configs=[
            Config("continuous", ["ppo_continuous.py", "--env-id", env_id, *MUJOCO_FLAGS])
            for env_id in ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5")
        ],
        extra=["--total-timesteps", "1000000"],
        seeds=[1, 2, 3],
        report=dict(name="continuous_mujoco", threshold=None, title="Tanh-Gaussian PPO on MuJoCo, 1M steps"),
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
    """The run's command line, its script relative to the repository root."""
    argv = [*config.command, "--exp-name", config.name, "--seed", str(seed), *extra]
    return argv if "peers.py" in config.command[0] else [*argv, "--no-progress"]


def threads_per_run(workers: int) -> int | None:
    """OpenMP/torch threads for each of `workers` local runs at a time: this machine's cores shared out, unless
    OMP_NUM_THREADS is set already; None (the scripts' own default) for one run at a time. Left to itself each run
    starts a thread per core, and the threads of runs side by side spin against each other."""
    if workers <= 1 or "OMP_NUM_THREADS" in os.environ:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // workers)


def execute(argv: list[str], repo: str | None = None, threads: int | None = None) -> tuple[int, str, bytes]:
    """Run one command in a fresh folder; return its exit code, its output, and its runs/ folder as a tar.gz.
    The same function runs in a thread (local backend) or as a Ray task on any node of a cluster, where `repo`
    is None: the task then runs inside the repository copy that Ray's runtime_env shipped as its working dir.
    `threads`, when given, is the run's OMP_NUM_THREADS."""
    import io
    import tarfile
    import tempfile

    repo = repo or os.getcwd()
    env = None if threads is None else dict(os.environ, OMP_NUM_THREADS=str(threads))
    with tempfile.TemporaryDirectory(prefix="bench_") as cwd:
        result = subprocess.run(
            [sys.executable, os.path.join(repo, argv[0]), *argv[1:]], cwd=cwd, capture_output=True, text=True, env=env
        )
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w:gz") as tar:
            if os.path.isdir(os.path.join(cwd, "runs")):
                tar.add(os.path.join(cwd, "runs"), arcname="runs")
    return result.returncode, shlex.join(argv) + "\n" + result.stdout + result.stderr, archive.getvalue()


def collect(key: str, argv: list[str], code: int, output: str, archive: bytes, out: str) -> str:
    """Write the run's log, unpack its event files into <out>/runs and, on success, its completion marker."""
    import io
    import tarfile

    log_path = os.path.join(out, "logs", f"{key}.log")
    with open(log_path, "w") as log:
        log.write(output)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        tar.extractall(out, filter="data")
    if code == 0:
        with open(os.path.join(out, "done", key), "w") as marker:
            marker.write(shlex.join(argv) + "\n")
    return log_path


def backend_results(args: Args, jobs: dict[str, list[str]]):
    """Yield (key, argv, exit code, output, runs archive) for every job as it finishes, on the chosen backend."""
    progress = tqdm(total=len(jobs), desc="runs")
    if args.backend == "local":
        with ThreadPoolExecutor(max_workers=args.workers) as pool:
            threads = threads_per_run(args.workers)
            futures = {pool.submit(execute, argv, ROOT, threads): key for key, argv in jobs.items()}
            try:
                for future in as_completed(futures):
                    progress.update()
                    yield futures[future], jobs[futures[future]], *future.result()
            finally:  # on Ctrl-C the queued runs never start; the running ones stop on their own Ctrl-C
                for future in futures:
                    future.cancel()
    else:
        import ray

        # ship this repository to every node as the tasks' working dir (event files come back in the results)
        excludes = [".git", ".whl", "runs", "benchmarks/runs", "wandb", "videos", "__pycache__"]
        ray.init(
            address=args.address,
            num_cpus=None if args.address else args.workers,
            log_to_driver=False,
            runtime_env={"working_dir": ROOT, "excludes": excludes},
        )
        task = ray.remote(num_cpus=args.cpus_per_run, num_gpus=args.gpus_per_run)(execute)
        pending = {task.remote(argv): key for key, argv in jobs.items()}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            key = pending.pop(done[0])
            progress.update()
            yield key, jobs[key], *ray.get(done[0])
        ray.shutdown()
    progress.close()


def main(args: Args) -> None:
    runs, extra, report = plan(args)
    out = os.path.abspath(args.out or os.path.join(ROOT, "benchmarks", "runs", args.preset or "custom"))
    for sub in ("logs", "done", "runs"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)
    todo = []
    for config, seed in runs:
        if args.rerun or not os.path.exists(os.path.join(out, "done", run_key(config, seed))):
            todo.append((config, seed))
    print(f"{len(runs)} runs, {len(runs) - len(todo)} already complete, {len(todo)} to run, in {out}")
    failed, start = [], time.time()
    jobs = {run_key(config, seed): argv_of(config, seed, extra) for config, seed in todo}
    finished = 0
    try:
        for key, argv, code, output, archive in backend_results(args, jobs):
            log_path = collect(key, argv, code, output, archive, out)
            finished += 1
            if code != 0:
                failed.append(key)
                tqdm.write(f"FAILED {key} (exit {code}): see {log_path}")
    except KeyboardInterrupt:  # the runs cut short get no completion marker: the same command runs them again
        print(f"interrupted: {finished} of {len(jobs)} runs finished; the same command runs the others")
        raise SystemExit(130) from None
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
