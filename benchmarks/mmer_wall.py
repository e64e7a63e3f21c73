"""A report's MMER against its wall time: one panel per env, one point per config (medians, bars from min to max).

    python benchmarks/mmer_wall.py benchmarks/results/popgym.md     # writes benchmarks/results/popgym_mmer_wall.png

Reads the table that `report.py --mmer` writes (rows `| env__config | seeds | ... | MMER | ... | wall s |`, cells
'median (min to max)'), so that rows measured at different commits, each kept as measured, share one figure.
"""

import os
import re
from dataclasses import dataclass

import matplotlib
import matplotlib.ticker
import tyro

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

CELL = re.compile(r"^(-?[0-9.]+)(?: \((-?[0-9.]+) to (-?[0-9.]+)\))?$")  # 'median (min to max)', or one run's value


@dataclass
class Args:
    table: tyro.conf.Positional[str]
    """a report's Markdown file with MMER and wall s columns"""
    out: str | None = None
    """the PNG to write (default: <table>_mmer_wall.png beside the table)"""


def cell(text: str) -> tuple[float, float, float]:
    """'median (min to max)' -> (median, min, max); a single value is all three."""
    match = CELL.match(text.strip())
    if match is None:
        raise SystemExit(f"error: '{text.strip()}' is not 'median (min to max)'")
    median, low, high = (float(x) if x is not None else None for x in match.groups())
    return median, low if low is not None else median, high if high is not None else median


def read_table(path: str) -> dict[str, dict[str, tuple[tuple[float, ...], tuple[float, ...]]]]:
    """env -> config -> ((MMER median, min, max), (wall s median, min, max)), from the file's first table with both."""
    tables, lines = [], open(path).read().splitlines()
    for i, line in enumerate(lines):  # each table: the rows from a header line on, to the first line that is none
        if line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|")):
            tables.append([])
        if line.startswith("|"):
            tables[-1].append([cell.strip() for cell in line.strip().strip("|").split("|")])
    rows = next((t for t in tables if "MMER" in t[0] and "wall s" in t[0]), None)  # the first with both columns
    if rows is None:
        raise SystemExit(f"error: {path} has no table with 'MMER' and 'wall s' columns (report.py --mmer writes one)")
    mmer, wall = rows[0].index("MMER"), rows[0].index("wall s")
    found: dict[str, dict] = {}
    for row in rows[2:]:  # after the header and its |---| line
        if "__" not in row[0]:
            raise SystemExit(f"error: {path}: '{row[0]}' is not a report's config, env__config")
        env, config = row[0].split("__", 1)
        found.setdefault(env, {})[config] = (cell(row[mmer]), cell(row[wall]))
    return found


def main(args: Args) -> str:
    table = read_table(args.table)
    out = args.out or os.path.splitext(args.table)[0] + "_mmer_wall.png"
    fig, axes = plt.subplots(1, len(table), figsize=(4.2 * len(table), 4.6), squeeze=False)
    names = sorted({config for configs in table.values() for config in configs})  # one colour per config, all panels
    colours = {config: plt.cm.tab10(i % 10) for i, config in enumerate(names)}
    for ax, (env, configs) in zip(axes[0], sorted(table.items())):
        for config, ((m, m_low, m_high), (w, w_low, w_high)) in sorted(configs.items()):
            bars = dict(xerr=[[w - w_low], [w_high - w]], yerr=[[m - m_low], [m_high - m]], capsize=3)
            ax.errorbar(w, m, fmt="o", color=colours[config], label=config, **bars)
        if all(wall[0] > 0 for _, wall in configs.values()):
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(env.removeprefix("popgym-"), fontsize=9)
        ax.set_xlabel("wall s a run (median, min to max)")
        ax.set_ylabel("MMER (median, min to max)")
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], marker="o", linestyle="", color=colours[name]) for name in names]
    fig.legend(handles, names, loc="lower center", ncol=min(len(names), 8), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(out, dpi=110)
    print(out)
    return out


if __name__ == "__main__":
    main(tyro.cli(Args))
