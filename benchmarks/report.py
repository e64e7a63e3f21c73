"""Read the TensorBoard event files of a set of runs and write a Markdown table and a PNG of the learning curves.

    python benchmarks/report.py benchmarks/runs/fsmn-cartpole --name fsmn_cartpole --threshold 475

Runs are grouped into configs by their directory name, `{env_id}__{exp_name}__{seed}__{time}` (the config is
`env_id__exp_name`). Per config, over seeds: the first step at which the mean of the last 20 episode returns
reaches the threshold, the wall time to get there, the final return (mean of the last 20 episodes), steps per
second and wall time, each as the median with min and max. Writes benchmarks/results/<name>.md and <name>.png.
"""

import glob
import os
import platform
from dataclasses import dataclass, field

import matplotlib
import numpy as np
import torch
import tyro
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository


@dataclass
class Args:
    runs_dir: tyro.conf.Positional[str]
    """a folder holding run directories (searched recursively for TensorBoard event files)"""
    name: str = "report"
    """the report's file name under benchmarks/results/ (without extension)"""
    threshold: float | None = None
    """the return threshold for 'steps to threshold'"""
    window: int = 20
    """episodes in the moving mean of the return"""
    title: str = ""
    """a title for the plot and the table"""
    out_dir: str = RESULTS
    """where the .md and .png go"""
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
    start_wall: float  # wall time when the run's writer opened
    wall: np.ndarray  # wall time of each episode event
    sps: float
    end_wall: float


def load_run(run_dir: str) -> Run | None:
    parts = os.path.basename(run_dir).split("__")
    if len(parts) != 4:
        return None
    env_id, exp_name, seed, _ = parts
    accumulator = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    accumulator.Reload()
    tags = accumulator.Tags()["scalars"]
    if "charts/episodic_return" not in tags:
        return None
    events = accumulator.Scalars("charts/episodic_return")
    sps_events = accumulator.Scalars("charts/SPS") if "charts/SPS" in tags else []
    return Run(
        config=f"{env_id}__{exp_name}",
        seed=int(seed),
        steps=np.array([e.step for e in events]),
        returns=np.array([e.value for e in events]),
        start_wall=accumulator.FirstEventTimestamp(),
        wall=np.array([e.wall_time for e in events]),
        sps=sps_events[-1].value if sps_events else float("nan"),
        end_wall=max(events[-1].wall_time, sps_events[-1].wall_time if sps_events else 0.0),
    )


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
    return int(run.steps[i]), float(run.wall[i] - run.start_wall)


def spread(values: list[float | None], fmt: str = "{:.0f}") -> str:
    """'median (min-max)' over runs. A run that never got there (None) counts as +infinity, 'never', so that the
    median stays honest: with 2 of 5 seeds never reaching a threshold, the median is the third-best seed's step."""
    ranked = [np.inf if v is None or not np.isfinite(v) else float(v) for v in values]
    show = lambda v: "never" if np.isinf(v) else fmt.format(v)  # noqa: E731
    if all(np.isinf(ranked)):
        return "never"
    text = show(np.median(ranked)) + (f" ({show(min(ranked))}-{show(max(ranked))})" if len(ranked) > 1 else "")
    missing = int(np.isinf(ranked).sum())
    return text + (f", {missing} of {len(ranked)} never" if missing else "")


def summarize(runs: list[Run], threshold: float | None, window: int) -> dict:
    reached = [first_reaching(r, threshold, window) if threshold is not None else None for r in runs]
    return {
        "seeds": sorted(r.seed for r in runs),
        "steps_to": [x[0] if x else None for x in reached],
        "wall_to": [x[1] if x else None for x in reached],
        "final": [float(np.mean(r.returns[-window:])) for r in runs],
        "total_steps": [int(r.steps[-1]) for r in runs],
        "sps": [r.sps for r in runs],
        "wall": [r.end_wall - r.start_wall for r in runs],
    }


def write_result(name: str, lines: list[str], out_dir: str = RESULTS) -> str:
    """Write a benchmark's Markdown lines to <out_dir>/<name>.md (benchmarks/results/ by default); return the path."""
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
    runs = [
        r for d in sorted(glob.glob(os.path.join(args.runs_dir, "**", "*__*__*__*"), recursive=True)) if (r := load_run(d))
    ]
    if not runs:
        raise SystemExit(f"error: no runs with charts/episodic_return under {args.runs_dir}")
    configs: dict[str, list[Run]] = {}
    for run in runs:
        configs.setdefault(run.config, []).append(run)
    rank = lambda config: args.order.index(config.split("__")[1]) if config.split("__")[1] in args.order else len(args.order)
    names = sorted(configs, key=lambda config: (rank(config), config))

    os.makedirs(args.out_dir, exist_ok=True)
    md_path, png_path = os.path.join(args.out_dir, f"{args.name}.md"), os.path.join(args.out_dir, f"{args.name}.png")
    threshold = f"{args.threshold:g}" if args.threshold is not None else "-"
    runs_dir = os.path.abspath(args.runs_dir)
    shown_dir = os.path.relpath(runs_dir, ROOT) if runs_dir.startswith(ROOT + os.sep) else args.runs_dir
    lines = [
        f"# {args.title or args.name}",
        "",
        f"Median (min-max) over seeds. 'Steps to {threshold}': first step at which the mean return of the last "
        f"{args.window} episodes reaches {threshold}; 'final': mean of the last {args.window} episodes. "
        f"Machine: {args.machine or machine()}. Generated by `python benchmarks/report.py {shown_dir} --name {args.name}"
        + (f" --threshold {threshold}" if args.threshold is not None else "")
        + (f' --title "{args.title}"' if args.title else "")
        + (f' --machine "{args.machine}"`.' if args.machine else "`."),
        "",
        f"| config | seeds | steps to {threshold} | wall s to {threshold} | final return | steps | SPS | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    figure, axis = plt.subplots(figsize=(8, 5))
    for name in names:
        s = summarize(configs[name], args.threshold, args.window)
        cells = [name, str(len(s["seeds"])), spread(s["steps_to"]), spread(s["wall_to"]), spread(s["final"], "{:.1f}")]
        cells += [spread(s["total_steps"]), spread(s["sps"]), spread(s["wall"])]
        lines.append("| " + " | ".join(cells) + " |")
        grid = np.linspace(0, max(s["total_steps"]), 200)
        curves = np.stack([np.interp(grid, r.steps, moving_mean(r.returns, args.window)) for r in configs[name]])
        mean = curves.mean(0)
        (line,) = axis.plot(grid, mean, label=f"{name} ({len(curves)} seeds)")
        axis.fill_between(grid, curves.min(0), curves.max(0), color=line.get_color(), alpha=0.2)
    if args.threshold is not None:
        axis.axhline(args.threshold, color="gray", linestyle="--", linewidth=1)
    axis.set_xlabel("environment steps")
    axis.set_ylabel(f"episodic return (mean of last {args.window})")
    axis.set_title(args.title or args.name)
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3)
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
