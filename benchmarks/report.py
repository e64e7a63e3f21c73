"""Read the TensorBoard event files of a set of runs and write a Markdown table and a PNG of the learning curves.

    python benchmarks/report.py benchmark_runs/fsmn-cartpole/runs --name fsmn_cartpole --threshold 475

Runs are grouped into configs by their directory name, `{env_id}__{exp_name}__{seed}__{time}` (the config is
`env_id__exp_name`). Per config, over seeds: with --threshold, the first step at which the mean of the last 20
episode returns reaches it and the wall time to get there; the final return (mean of the last 20 episodes), with
--mmer POPGym's MMER (the maximum of that mean over training; with --mmer-by-step N, also over the first N steps),
steps per second and wall time; each as the median with min and max. A run counts once: W&B's copies of its event
files (under wandb/) are left out, and of two runs of one config and seed only the later is kept (it says so). The
wall time of a resumed run counts its parts, not the pause between them. The plot has one panel per env. Writes
<name>.md and <name>.png beside the runs (--out-dir elsewhere; --results into benchmarks/results/, the project's
tracked results).
"""

import glob
import math
import os
import platform
from dataclasses import dataclass, field

import matplotlib
import numpy as np
import torch
import tyro
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository


@dataclass
class Args:
    runs_dir: tyro.conf.Positional[str]
    """a folder holding run directories (searched recursively for TensorBoard event files)"""
    name: str = "report"
    """the report's file name (without extension)"""
    threshold: float | None = None
    """the return threshold for 'steps to threshold'"""
    window: int = 20
    """episodes in the moving mean of the return"""
    final_window: int | None = None
    """episodes in the final return, the mean of the run's last ones (default: --window); CartPole-v1's own bar for
    solved is a mean of 475 over 100 consecutive episodes"""
    mmer: bool = False
    """also give POPGym's MMER (Morad et al. 2023): the maximum over training of the moving mean return"""
    mmer_by_step: int | None = None
    """with --mmer, also the MMER over each run's first N steps: what a slower config reaches in the time a faster
    one takes for its whole run, given the two configs' steps/s measured side by side"""
    title: str = ""
    """a title for the plot and the table"""
    out_dir: str | None = None
    """where the .md and .png go (default: the runs folder)"""
    results: bool = False
    """write into benchmarks/results/, the project's tracked results (overwrites the files of that name)"""
    order: list[str] = field(default_factory=list)
    """exp_names in the order to list their configs (others follow, sorted)"""
    machine: str | None = None
    """the machine the runs ran on, when not this one (e.g. runs fetched from a GPU machine)"""


@dataclass
class Run:
    config: str
    seed: int
    steps: np.ndarray  # global step of each finished episode
    returns: np.ndarray  # its return
    wall: np.ndarray  # seconds of the run's own time (pauses between its parts left out) at each episode event
    sps: float
    duration: float  # seconds of the run's own time, all its parts
    path: str = ""
    eval_return: float | None = None  # its last charts/eval_return (--final-eval-episodes)


class RunReader:
    """A run's events, read again as they are written: each call reads only what its event files gained since
    the last call (the tuner calls it every few seconds while a run trains), and returns the run so far."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self.files: dict[str, FileReader] = {}

    def __call__(self) -> Run | None:
        parts = os.path.basename(self.run_dir).split("__")
        if len(parts) != 4 or not parts[2].isdigit():
            return None
        env_id, exp_name, seed, _ = parts
        for path in glob.glob(os.path.join(self.run_dir, "events.out.tfevents.*")):  # one per part of a resumed run
            if path not in self.files:
                self.files[path] = FileReader(path)
        scalars = in_order([read() for read in self.files.values()])
        events = merge_parts([s.get("charts/episodic_return", []) for s in scalars])
        if not events:
            return None
        sps_events = merge_parts([s.get("charts/SPS", []) for s in scalars])
        eval_events = merge_parts([s.get("charts/eval_return", []) for s in scalars])
        segments = [(s["start"], s["end"]) for s in scalars if "start" in s]
        return Run(
            config=f"{env_id}__{exp_name}",
            seed=int(seed),
            steps=np.array([step for step, _, _ in events]),
            returns=np.array([value for _, value, _ in events]),
            wall=np.array([active_seconds(wall, segments) for _, _, wall in events]),
            sps=sps_events[-1][1] if sps_events else float("nan"),
            duration=sum(end - begin for begin, end in segments),
            path=self.run_dir,
            eval_return=eval_events[-1][1] if eval_events else None,
        )


def load_run(run_dir: str) -> Run | None:
    return RunReader(run_dir)()


class FileReader:
    """One event file, read on from where the last call stopped (TensorBoard's loaders keep their place)."""

    def __init__(self, path: str):
        self.accumulator = EventAccumulator(path, size_guidance={"scalars": 0})
        self.loader = EventFileLoader(path)
        self.times: list[float] = []  # the first and last wall time of any event

    def __call__(self) -> dict:
        """tag -> [(step, value, wall time), ...], and the file's first and last wall time ('start', 'end')."""
        self.accumulator.Reload()
        tags = self.accumulator.Tags()["scalars"]
        found = {tag: [(e.step, e.value, e.wall_time) for e in self.accumulator.Scalars(tag)] for tag in tags}
        times = self.times + [event.wall_time for event in self.loader.Load()]
        self.times = [min(times), max(times)] if times else []
        return {**found, "start": self.times[0], "end": self.times[1]} if self.times else found


def merge_parts(parts: list[list[tuple]]) -> list[tuple]:
    """The events of a run's parts in order. A resumed part starts again from its checkpoint's step: the earlier
    parts' events from that step on (logged after the checkpoint, before the interruption) are replaced by its own."""
    merged = []
    for part in parts:
        if part:
            merged = [event for event in merged if event[0] < part[0][0]] + part
    return merged


def wall_segments(run_dir: str) -> list[tuple[float, float]]:
    """(first, last) wall time of each event file of a run: one per part of a run that was resumed."""
    scalars = in_order([FileReader(path)() for path in glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))])
    return [(s["start"], s["end"]) for s in scalars if "start" in s]


def in_order(parts: list[dict]) -> list[dict]:
    """A run's parts in the order they ran, by their first wall time (names tie within a second); empty ones last."""
    return sorted(parts, key=lambda s: s.get("start", math.inf))


def active_seconds(wall_time: float, segments: list[tuple[float, float]]) -> float:
    """Seconds of the run's own time from its start to `wall_time`: the pauses between its parts left out."""
    return sum(max(0.0, min(wall_time, end) - begin) for begin, end in segments)


def find_runs(runs_dir: str) -> list[Run]:
    """Every run under `runs_dir`, each once: folders under a wandb/ folder (W&B's copies of the event files) are left
    out, a run name found twice (a link, a copy) is read once, and of two runs of one config and seed only the
    later is kept, with a note."""
    found: dict[str, str] = {}
    for path in sorted(glob.glob(os.path.join(runs_dir, "**", "*__*__*__*"), recursive=True)):
        relative = os.path.relpath(path, runs_dir).split(os.sep)
        if os.path.isdir(path) and not any(part.startswith("wandb") for part in relative[:-1]):
            found.setdefault(os.path.basename(path), path)
    kept: dict[tuple[str, int], Run] = {}
    for name in sorted(found, key=lambda name: name.rsplit("__", 1)[-1]):  # oldest first
        if (run := load_run(found[name])) is None:
            continue
        if (run.config, run.seed) in kept:
            print(f"note: {kept[run.config, run.seed].path} left out: {run.path} is a later run of that config and seed")
        kept[run.config, run.seed] = run
    return list(kept.values())


def moving_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of the last `window` values at each index (fewer at the start)."""
    cumulative = np.cumsum(np.insert(values.astype(float), 0, 0.0))
    counts = np.minimum(np.arange(1, len(values) + 1), window)
    return (cumulative[1:] - cumulative[np.arange(1, len(values) + 1) - counts]) / counts


def first_reaching(run: Run, threshold: float, window: int) -> tuple[int, float] | None:
    """(step, seconds since the start) at which the mean of the last `window` returns first reaches `threshold`."""
    if len(run.returns) < window:
        return None
    means = moving_mean(run.returns, window)
    hits = np.nonzero(means[window - 1 :] >= threshold)[0]
    if len(hits) == 0:
        return None
    i = hits[0] + window - 1
    return int(run.steps[i]), float(run.wall[i])


def spread(values: list[float | None], fmt: str = "{:.0f}") -> str:
    """'median (min to max)' over runs. A run that never got there (None) counts as +infinity, 'never', so that the
    median stays honest: with 2 of 5 seeds never reaching a threshold, the median is the third-best seed's step."""
    ranked = [np.inf if v is None or not np.isfinite(v) else float(v) for v in values]
    show = lambda v: "never" if np.isinf(v) else fmt.format(v)  # noqa: E731
    if all(np.isinf(ranked)):
        return "never"
    text = show(np.median(ranked)) + (f" ({show(min(ranked))} to {show(max(ranked))})" if len(ranked) > 1 else "")
    missing = int(np.isinf(ranked).sum())
    return text + (f", {missing} of {len(ranked)} never" if missing else "")


def eval_cell(values: list[float | None], fmt: str) -> str:
    """The 'eval return' cell: the spread over the runs that evaluated (a run without one is not 'never'), how many
    did not, or '-' where none did."""
    evaluated = [v for v in values if v is not None]
    missing = f", {len(values) - len(evaluated)} of {len(values)} without" if len(evaluated) < len(values) else ""
    return spread(evaluated, fmt) + missing if evaluated else "-"


def best_moving_mean(returns: np.ndarray, window: int) -> float | None:
    """POPGym's MMER: the best mean of `window` returns in a row (of all of them while there are fewer); None when
    there are none."""
    if len(returns) == 0:
        return None
    return float(moving_mean(returns, window)[min(window, len(returns)) - 1 :].max())


def summarize(
    runs: list[Run], threshold: float | None, window: int, by_step: int | None = None, final_window: int | None = None
) -> dict:
    reached = [first_reaching(r, threshold, window) if threshold is not None else None for r in runs]
    return {
        "seeds": sorted(r.seed for r in runs),
        "steps_to": [x[0] if x else None for x in reached],
        "wall_to": [x[1] if x else None for x in reached],
        "final": [float(np.mean(r.returns[-(final_window or window) :])) for r in runs],
        "eval": [r.eval_return for r in runs],
        "mmer": [best_moving_mean(r.returns, window) for r in runs],
        "mmer_by_step": [best_moving_mean(r.returns[r.steps <= by_step], window) for r in runs] if by_step else [],
        "total_steps": [int(r.steps[-1]) for r in runs],
        "sps": [r.sps for r in runs],
        "wall": [r.duration for r in runs],
    }


def write_result(name: str, lines: list[str], out_dir: str) -> str:
    """Write a benchmark's Markdown lines to <out_dir>/<name>.md; return the path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def machine() -> str:
    """The CPU's model name (or the GPU's), core count and torch version of the machine writing the report."""
    cpu = platform.machine()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{cpu}, {os.cpu_count()} cores, {device}, torch {torch.__version__}"


def write_report(args: Args) -> tuple[str, str]:
    if args.mmer_by_step is not None and (not args.mmer or args.mmer_by_step < 1):
        raise SystemExit(f"error: --mmer-by-step={args.mmer_by_step}: a number of steps (>= 1), and only with --mmer")
    runs = find_runs(args.runs_dir)
    if not runs:
        raise SystemExit(f"error: no runs with charts/episodic_return under {args.runs_dir}")
    configs: dict[str, list[Run]] = {}
    for run in runs:
        configs.setdefault(run.config, []).append(run)
    rank = lambda config: args.order.index(config.split("__")[1]) if config.split("__")[1] in args.order else len(args.order)
    names = sorted(configs, key=lambda config: (rank(config), config))

    out_dir = RESULTS if args.results else args.out_dir or args.runs_dir
    os.makedirs(out_dir, exist_ok=True)
    md_path, png_path = os.path.join(out_dir, f"{args.name}.md"), os.path.join(out_dir, f"{args.name}.png")
    runs_dir = os.path.abspath(args.runs_dir)
    shown_dir = os.path.relpath(runs_dir, ROOT) if runs_dir.startswith(ROOT + os.sep) else args.runs_dir
    threshold = f"{args.threshold:g}" if args.threshold is not None else None
    by_step, final_window = args.mmer_by_step, args.final_window or args.window
    if final_window < 1:
        raise SystemExit(f"error: --final-window={args.final_window} must be at least 1")
    reached = f"'Steps to {threshold}': first step at which the mean return of the last {args.window} episodes "
    reached += f"reaches {threshold}; 'wall s to {threshold}': the run's seconds until then. "
    with_eval = any(run.eval_return is not None for run in runs)
    evaluated = "'Eval return': the mean return of the policy the run ended with, played after training for its "
    evaluated += "--final-eval-episodes (`ppo_fsmn_cartpole.py`; '-' for a config without). "
    lines = [
        f"# {args.title or args.name}",
        "",
        "Median (min to max) over seeds. "
        + (reached if threshold else "")
        + f"'Final return': mean of the last {final_window} episodes. "
        + (evaluated if with_eval else "")
        + ("'MMER': the maximum over training of that mean (POPGym's metric). " if args.mmer else "")
        + (f"'MMER by step {by_step}': the same over each run's first {by_step} steps. " if by_step else "")
        + f"Machine: {args.machine or machine()}. Generated by `python benchmarks/report.py {shown_dir} --name {args.name}"
        + (f" --threshold {threshold}" if threshold else "")
        + (f" --window {args.window}" if args.window != 20 else "")
        + (f" --final-window {final_window}" if final_window != args.window else "")
        + (" --mmer" if args.mmer else "")
        + (f" --mmer-by-step {by_step}" if by_step else "")
        + (f' --title "{args.title}"' if args.title else "")
        + (f' --machine "{args.machine}"' if args.machine else "")
        + "`.",
        "",
    ]
    header = ["config", "seeds"] + ([f"steps to {threshold}", f"wall s to {threshold}"] if threshold else [])
    header += ["final return"] + (["eval return"] if with_eval else []) + (["MMER"] if args.mmer else [])
    header += [f"MMER by step {by_step}"] if by_step else []
    header += ["steps", "SPS", "wall s"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    envs = list(dict.fromkeys(name.split("__")[0] for name in names))  # one panel each
    columns = min(len(envs), 3)
    rows = -(-len(envs) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(6 * columns, 4.2 * rows), squeeze=False)
    colors = {}  # one colour per exp_name, the same in every panel
    for name in names:
        s = summarize(configs[name], args.threshold, args.window, by_step, final_window)
        cells = [name, str(len(s["seeds"]))] + ([spread(s["steps_to"]), spread(s["wall_to"])] if threshold else [])
        returns = "{:.3f}" if args.mmer else "{:.1f}"  # POPGym's returns lie in [-1, 1]
        cells += [spread(s["final"], returns)]
        cells += [eval_cell(s["eval"], returns)] if with_eval else []
        cells += [spread(s["mmer"], returns)] if args.mmer else []
        cells += [spread(s["mmer_by_step"], returns)] if by_step else []
        cells += [spread(s["total_steps"]), spread(s["sps"]), spread(s["wall"])]
        lines.append("| " + " | ".join(cells) + " |")
        env_id, exp_name = name.split("__")
        axis = axes.flat[envs.index(env_id)]
        grid = np.linspace(0, max(s["total_steps"]), 200)
        curves = np.stack([np.interp(grid, r.steps, moving_mean(r.returns, args.window)) for r in configs[name]])
        color = colors.setdefault(exp_name, f"C{len(colors) % 10}")
        axis.plot(grid, curves.mean(0), color=color, label=f"{exp_name} ({len(curves)} seeds)")
        axis.fill_between(grid, curves.min(0), curves.max(0), color=color, alpha=0.2)
    for axis, env_id in zip(axes.flat, envs):
        if args.threshold is not None:
            axis.axhline(args.threshold, color="gray", linestyle="--", linewidth=1)
        axis.set_xlabel("environment steps")
        axis.set_ylabel(f"episodic return (mean of last {args.window})")
        axis.set_title(env_id, fontsize=10)
        axis.legend(fontsize=8)
        axis.grid(alpha=0.3)
    for axis in list(axes.flat)[len(envs) :]:
        axis.set_visible(False)
    figure.suptitle(args.title or args.name)
    figure.tight_layout()
    figure.savefig(png_path, dpi=110)
    plt.close(figure)
    lines += ["", f"![{args.name}]({args.name}.png)", "", "Line: mean over seeds; band: min to max over seeds.", ""]
    with open(md_path, "w") as f:
        f.write("\n".join(lines))
    return md_path, png_path


if __name__ == "__main__":
    for path in write_report(tyro.cli(Args)):
        print(path)
