"""Shared helpers: run a script through its CLI, read its TensorBoard events, import it as a module."""

import glob
import importlib
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# CleanRL's metric names, written by every script once per iteration (episode charts once an episode ends)
ITERATION_TAGS = {
    "charts/SPS",
    "charts/learning_rate",
    "losses/value_loss",
    "losses/policy_loss",
    "losses/entropy",
    "losses/old_approx_kl",
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/explained_variance",
}
EPISODE_TAGS = {"charts/episodic_return", "charts/episodic_length"}


def import_script(name: str):
    """Scripts start nothing on import: tests use their pure functions and classes directly."""
    return importlib.import_module(name)


def run_script(
    script: str, *flags: str, cwd: str, env: dict | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run `python <script> <flags>` in `cwd` and return the finished process (stdout and stderr captured)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, script), *flags],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_dirs(cwd: str) -> list[str]:
    return sorted(glob.glob(os.path.join(cwd, "runs", "*")))


def read_scalars(run_dir: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of a TensorBoard run directory, as tag -> [(step, value), ...]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def first_step_reaching(returns: list[tuple[int, float]], threshold: float, window: int = 20) -> int | None:
    """The first global step at which the mean of the last `window` episode returns is at least `threshold`."""
    for i in range(window, len(returns) + 1):
        if sum(r for _, r in returns[i - window : i]) / window >= threshold:
            return returns[i - 1][0]
    return None


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    """Bad input: a non-zero exit and a single line on stderr that starts with 'error:' and names the flag."""
    assert result.returncode != 0, result.stdout + result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error:"), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run in an empty directory, so runs/, videos/ and wandb/ land in the test's own folder."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
