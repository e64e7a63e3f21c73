"""benchmarks/: the report on synthetic event files written here, and the runner end to end on tiny runs. No tool
writes into the repository unless told to (`repository_unchanged`), and none of these tests depends on the load."""

import contextlib
import glob
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from conftest import (
    NO_DISPLAY,
    ROOT,
    WANDB_OFFLINE,
    assert_videos_reached_the_wandb_run,
    import_script,
    repository_unchanged,
    run_script,
    start_tool,
)
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from torch.utils.tensorboard import SummaryWriter

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import peers  # noqa: E402
import report  # noqa: E402


def write_run(root: str, name: str, returns: list[float], steps_per_episode: int = 100, first_step: int = 0) -> None:
    writer = SummaryWriter(os.path.join(root, name))
    for i, r in enumerate(returns):
        writer.add_scalar("charts/episodic_return", r, first_step + (i + 1) * steps_per_episode)
    writer.add_scalar("charts/SPS", 1000, first_step + len(returns) * steps_per_episode)
    writer.close()


def test_steps_to_threshold_and_final_return(tmp_path):
    # seed 1: the last 3 returns are first all 10 at its 8th episode (step 800); seed 2 never reaches 10
    write_run(str(tmp_path), "Env-v0__algo__1__100", [0, 0, 0, 10, 0, 10, 10, 10, 10])
    write_run(str(tmp_path), "Env-v0__algo__2__100", [0, 5, 5, 5, 5])
    runs = [report.load_run(os.path.join(tmp_path, d)) for d in sorted(os.listdir(tmp_path))]
    assert [r.config for r in runs] == ["Env-v0__algo", "Env-v0__algo"]
    assert report.first_reaching(runs[0], 10.0, window=3)[0] == 800
    assert report.first_reaching(runs[1], 10.0, window=3) is None
    summary = report.summarize(runs, threshold=10.0, window=3)
    assert summary["steps_to"] == [800, None]
    assert summary["final"] == [10.0, 5.0]
    assert report.spread(summary["steps_to"]) == "never (800 to never), 1 of 2 never"  # median of 800 and never
    assert report.spread([300, None, 100, 200, None]) == "300 (100 to never), 2 of 5 never"
    assert report.spread([1.0, 3.0, 2.0]) == "2 (1 to 3)"
    assert report.spread([-1217.3, -983.7, -1100.0], "{:.1f}") == "-1100.0 (-1217.3 to -983.7)"  # no "--983.7"


def test_a_run_read_as_it_is_written_equals_one_read_at_the_end(tmp_path):
    # the tuner reads a run every few seconds while it trains: each read goes on where the last stopped, and
    # must give what the files hold, a resumed part included
    run_dir = os.path.join(tmp_path, "Env-v0__algo__1__100")
    reader = report.RunReader(run_dir)
    assert reader() is None  # no events yet
    writer = SummaryWriter(run_dir, filename_suffix=".part1")
    seen = []
    for i in range(30):
        writer.add_scalar("charts/episodic_return", float(i), (i + 1) * 10)
        writer.add_scalar("charts/SPS", 100 + i, (i + 1) * 10)
        writer.flush()
        if i % 7 == 3:
            seen.append(reader())
    writer.close()
    resumed = SummaryWriter(run_dir, filename_suffix=".part2")  # a resumed part from step 200 replaces 200 on
    for i in range(19, 40):
        resumed.add_scalar("charts/episodic_return", -float(i), (i + 1) * 10)
        resumed.flush()
        if i % 7 == 3:
            seen.append(reader())
    resumed.close()
    final = reader()
    assert [len(run.steps) for run in seen] == [4, 11, 18, 25, 25, 32, 39]  # step 200 on replaced at 250
    assert np.array_equal(final.steps, np.arange(1, 41) * 10)
    assert np.array_equal(final.returns, [float(i) for i in range(19)] + [-float(i) for i in range(19, 40)])
    assert final.sps == 129.0  # the first part's last SPS: the resumed part logged none
    # every event's wall time, read by TensorBoard's own loader in one pass per file
    times = [[e.wall_time for e in EventFileLoader(path).Load()] for path in sorted(reader.files)]
    assert final.duration == sum(max(t) - min(t) for t in times)
    # the parts are taken in the order they ran, whatever their names: the first part renamed to sort last
    (first,) = glob.glob(os.path.join(run_dir, "*.part1"))
    os.rename(first, os.path.join(run_dir, "events.out.tfevents.9999999999.z"))
    again = report.load_run(run_dir)
    assert np.array_equal(again.steps, final.steps) and np.array_equal(again.returns, final.returns)


def png_width(path: str) -> int:
    with open(path, "rb") as f:
        return int.from_bytes(f.read(24)[16:20], "big")  # the IHDR chunk's width


def test_report_without_threshold_and_with_two_envs(tmp_path):
    """No threshold: no 'steps to' columns at all; two envs: one panel each, side by side; the report goes beside the
    runs by default."""
    for seed in (1, 2):
        write_run(str(tmp_path / "runs"), f"EnvA-v0__algo__{seed}__1", [-1000.0 - seed] * 25)
        write_run(str(tmp_path / "runs"), f"EnvB-v0__algo__{seed}__1", [5.0] * 25)
    md, png = report.write_report(report.Args(runs_dir=str(tmp_path / "runs"), name="two"))
    assert os.path.dirname(md) == str(tmp_path / "runs")
    text = open(md).read()
    assert "| config | seeds | final return | steps | SPS | wall s |" in text and "steps to" not in text
    assert "| EnvA-v0__algo | 2 | -1001.5 (-1002.0 to -1001.0) |" in text
    write_run(str(tmp_path / "one"), "EnvA-v0__algo__1__1", [1.0] * 25)
    _, one_png = report.write_report(report.Args(runs_dir=str(tmp_path / "one"), name="one"))
    assert png_width(png) == 2 * png_width(one_png)


def test_report_gives_the_end_of_run_evaluation_where_a_config_has_one(tmp_path):
    """charts/eval_return (the FSMN's --final-eval-episodes): its last value per run, median over the seeds that
    have one in an 'eval return' column, with how many have none; '-' for a config whose runs have none; no column
    where no run has one."""
    runs = tmp_path / "runs"
    for seed, evaluated in ((1, 500.0), (2, 480.0), (3, 420.0)):
        write_run(str(runs), f"Env-v0__fsmn__{seed}__1", [400.0] * 5)
        writer = SummaryWriter(str(runs / f"Env-v0__fsmn__{seed}__1"))
        writer.add_scalar("charts/eval_return", 0.0, 100)  # two: the last one counts
        writer.add_scalar("charts/eval_return", evaluated, 500)
        writer.close()
        write_run(str(runs), f"Env-v0__peer__{seed}__1", [300.0] * 5)
    write_run(str(runs), "Env-v0__fsmn__4__1", [400.0] * 5)  # stopped before its evaluation: not 'never'
    text = open(report.write_report(report.Args(runs_dir=str(runs), name="e"))[0]).read()
    assert "| config | seeds | final return | eval return | steps | SPS | wall s |" in text
    assert "| Env-v0__fsmn | 4 | 400.0 (400.0 to 400.0) | 480.0 (420.0 to 500.0), 1 of 4 without |" in text
    assert "| Env-v0__peer | 3 | 300.0 (300.0 to 300.0) | - |" in text
    write_run(str(tmp_path / "none"), "Env-v0__peer__1__1", [300.0] * 5)
    assert "eval" not in open(report.write_report(report.Args(runs_dir=str(tmp_path / "none"), name="n"))[0]).read()


def test_report_mmer_is_the_best_moving_mean(tmp_path):
    """POPGym's MMER: the maximum over training of the mean return of the last `window` episodes (here 3)."""
    write_run(str(tmp_path), "Env-v0__algo__1__1", [0.0, 0.0, 3.0, 3.0, 3.0, 0.0, 0.0, 0.0])  # means 1, 2, 3, 2, 1, 0
    write_run(str(tmp_path), "Env-v0__algo__2__1", [1.0, 1.0])  # fewer episodes than the window: their mean
    summary = report.summarize(report.find_runs(str(tmp_path)), threshold=None, window=3)
    assert summary["mmer"] == [3.0, 1.0] and summary["final"] == [0.0, 1.0]
    md, _ = report.write_report(report.Args(runs_dir=str(tmp_path), name="m", window=3, mmer=True))
    assert "| final return | MMER | steps |" in open(md).read() and "--window 3 --mmer" in open(md).read()


def test_report_mmer_by_step_reads_only_the_first_steps(tmp_path):
    """--mmer-by-step N: the MMER over each run's first N steps (episodes ending at step N or before), beside the MMER
    of the whole run; refused in one line without --mmer or below 1, writing nothing."""
    write_run(str(tmp_path / "runs"), "Env-v0__algo__1__1", [0.0, 0.0, 3.0, 3.0, 3.0, 0.0])  # episodes end at 100, 200, ...
    write_run(str(tmp_path / "runs"), "Env-v0__algo__2__1", [1.0, 2.0, 0.0, 0.0, 0.0, 0.0])
    summary = report.summarize(report.find_runs(str(tmp_path / "runs")), threshold=None, window=2, by_step=300)
    assert summary["mmer"] == [3.0, 1.5] and summary["mmer_by_step"] == [1.5, 1.5]  # by step 300: 0, 0, 3 and 1, 2, 0
    assert report.summarize(report.find_runs(str(tmp_path / "runs")), None, 2, by_step=50)["mmer_by_step"] == [None, None]
    args = report.Args(runs_dir=str(tmp_path / "runs"), name="m", window=2, mmer=True, mmer_by_step=300)
    text = open(report.write_report(args)[0]).read()
    assert "| final return | MMER | MMER by step 300 | steps |" in text and "--mmer --mmer-by-step 300`" in text
    assert "| Env-v0__algo | 2 | 0.750 (0.000 to 1.500) | 2.250 (1.500 to 3.000) | 1.500 (1.500 to 1.500) |" in text
    for bad in (dict(mmer_by_step=300), dict(mmer=True, mmer_by_step=0)):
        with pytest.raises(SystemExit, match=r"^error: --mmer-by-step=(300|0): a number of steps \(>= 1\), and only"):
            report.write_report(report.Args(runs_dir=str(tmp_path / "runs"), name="bad", out_dir=str(tmp_path / "o"), **bad))
    assert not (tmp_path / "o").exists()


def test_mmer_wall_reads_the_report_it_plots(tmp_path):
    """mmer_wall.py reads report.py's own table back: each config's MMER and wall s as medians with min and max (a
    single run's value for all three), one panel per env; a table without those columns is refused in one line."""
    import mmer_wall

    write_run(str(tmp_path / "runs"), "EnvA-v0__algo__1__1", [0.0, 3.0, 3.0, 0.0])  # MMER over 2 episodes: 3
    write_run(str(tmp_path / "runs"), "EnvA-v0__algo__2__1", [1.0, 1.0, 1.0])  # 1
    write_run(str(tmp_path / "runs"), "EnvB-v0__other__1__1", [-2.0, -1.0])  # -1.5
    md, _ = report.write_report(report.Args(runs_dir=str(tmp_path / "runs"), name="m", window=2, mmer=True))
    runs = {(r.config, r.seed): r.duration for r in report.find_runs(str(tmp_path / "runs"))}
    table = mmer_wall.read_table(md)
    assert set(table) == {"EnvA-v0", "EnvB-v0"}
    (mmer, wall), (mmer_b, wall_b) = table["EnvA-v0"]["algo"], table["EnvB-v0"]["other"]
    assert mmer == (2.0, 1.0, 3.0) and mmer_b == (-1.5, -1.5, -1.5)
    durations = sorted(d for (config, _), d in runs.items() if config == "EnvA-v0__algo")
    assert wall[1:] == pytest.approx(durations, abs=0.5) and wall_b[0] == pytest.approx(runs["EnvB-v0__other", 1], abs=0.5)
    png = mmer_wall.main(mmer_wall.Args(table=md, out=str(tmp_path / "f.png")))
    (tmp_path / "a.md").write_text("".join(line for line in open(md) if "EnvB" not in line))
    assert png_width(png) == 2 * png_width(mmer_wall.main(mmer_wall.Args(table=str(tmp_path / "a.md"))))  # a panel each
    (tmp_path / "plain.md").write_text("| config | seeds | final return |\n|---|---|---|\n| E__c | 1 | 1.0 |\n")
    with pytest.raises(SystemExit, match="^error: .*plain.md has no table with 'MMER' and 'wall s' columns"):
        mmer_wall.main(mmer_wall.Args(table=str(tmp_path / "plain.md"), out=str(tmp_path / "no.png")))
    assert not (tmp_path / "no.png").exists()


def test_mmer_wall_refuses_a_row_that_is_not_a_config(tmp_path):
    """A table row whose first cell is not `env__config` is one line naming the file and the cell, not a traceback."""
    import mmer_wall

    (tmp_path / "t.md").write_text("| config | MMER | wall s |\n|---|---|---|\n| median | 1.0 | 2.0 |\n")
    with pytest.raises(SystemExit, match=r"^error: .*t.md: 'median' is not a report's config, env__config$"):
        mmer_wall.read_table(str(tmp_path / "t.md"))


def test_report_counts_each_run_once(tmp_path, capsys):
    """A tracked run leaves W&B's copies of its event files under wandb/ (and a latest-run link to them): the report
    counts the run once. Of two runs of one config and seed, the later one is kept, with a note."""
    write_run(str(tmp_path / "runs"), "Env-v0__algo__1__200", [10.0] * 25)
    copy = tmp_path / "wandb" / "offline-run-1" / "files" / "runs"
    shutil.copytree(tmp_path / "runs", copy)
    os.symlink("offline-run-1", tmp_path / "wandb" / "latest-run")
    write_run(str(tmp_path / "runs"), "Env-v0__algo__2__200", [20.0] * 25)
    write_run(str(tmp_path / "runs"), "Env-v0__algo__2__100", [0.0] * 25)  # an earlier run of seed 2
    runs = report.find_runs(str(tmp_path))
    assert sorted((r.seed, float(r.returns[-1])) for r in runs) == [(1, 10.0), (2, 20.0)]
    assert "Env-v0__algo__2__100 left out" in capsys.readouterr().out


def test_resumed_run_is_read_once_without_its_pause(tmp_path):
    """A run resumed from its checkpoint at step 500 writes a second event file to the same folder: the episodes that
    the first part logged past step 500 are replaced by the second part's, and its wall time leaves out the pause."""
    run_dir = str(tmp_path / "Env-v0__algo__1__100")
    write_run(str(tmp_path), "Env-v0__algo__1__100", [1.0] * 10)  # steps 100..1000
    time.sleep(2.0)  # the pause between the two parts
    write_run(str(tmp_path), "Env-v0__algo__1__100", [2.0] * 10, first_step=500)  # steps 600..1500
    (run,) = report.find_runs(str(tmp_path))
    assert run.steps.tolist() == [100, 200, 300, 400, 500, *range(600, 1501, 100)]
    assert run.returns.tolist() == [1.0] * 5 + [2.0] * 10
    segments = report.wall_segments(run_dir)
    assert len(segments) == 2 and segments[1][0] - segments[0][1] >= 2.0
    assert run.duration == pytest.approx(sum(end - begin for begin, end in segments))
    assert run.wall[-1] <= run.duration < segments[1][1] - segments[0][0] - 2.0  # the pause is not in the run's time


def test_moving_mean_against_a_loop():
    values = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0]
    expected = [sum(values[max(0, i - 2) : i + 1]) / len(values[max(0, i - 2) : i + 1]) for i in range(len(values))]
    assert report.moving_mean(__import__("numpy").array(values), 3).tolist() == pytest.approx(expected)


def test_report_writes_table_and_plot(tmp_path):
    runs_dir = tmp_path / "runs"
    for seed in (1, 2, 3):
        write_run(str(runs_dir), f"Env-v0__fast__{seed}__1", [seed * 10.0] * 30)
        write_run(str(runs_dir), f"Env-v0__slow__{seed}__1", [1.0] * 30)
    md, png = report.write_report(
        report.Args(runs_dir=str(runs_dir), name="t", threshold=15.0, out_dir=str(tmp_path), order=["slow", "fast"])
    )
    text = open(md).read()
    rows = [line for line in text.splitlines() if line.startswith("| Env-v0")]
    assert rows[0].startswith("| Env-v0__slow | 3 | never |")
    # seeds 2 and 3 (returns 20 and 30) reach 15 once 20 episodes are in the window, at step 2000; seed 1 never
    assert rows[1].startswith("| Env-v0__fast | 3 | 2000 (2000 to never), 1 of 3 never |")
    assert "| 20.0 (10.0 to 30.0) |" in rows[1]
    assert os.path.getsize(png) > 1000
    assert f"Machine: {report.machine()}." in text
    # runs fetched from another machine: the report names that machine and the command that says so
    md, _ = report.write_report(
        report.Args(runs_dir=str(runs_dir), name="t", threshold=15.0, out_dir=str(tmp_path), machine="a GPU machine")
    )
    text = open(md).read()
    assert "Machine: a GPU machine." in text and '--threshold 15 --machine "a GPU machine"`.' in text


def test_peer_previous_action_is_the_input_the_fsmn_script_builds():
    """peers.PreviousAction gives RecurrentPPO what `ppo_fsmn_cartpole.py --prev-action` gives its network."""
    import gymnasium as gym
    import numpy as np
    import torch

    fsmn = import_script("ppo_fsmn_cartpole")
    agent = fsmn.Agent(2, 2, fsmn.Args(prev_action=True, norm_obs=False))
    env = peers.PreviousAction(peers.mask_velocity(gym.make("CartPole-v1")))
    obs, _ = env.reset(seed=0)
    previous, start = 0, True
    for action in [1, 1, 0, 1, 0, 0]:
        expected = agent.observe(torch.as_tensor(obs[:2])[None], torch.tensor([previous]), torch.tensor([start]))[0]
        assert env.observation_space.contains(obs) and np.array_equal(obs, expected.numpy()), (obs, expected)
        obs, *_ = env.step(action)
        previous, start = action, False


def test_peer_lstm_takes_the_fsmn_scripts_ppo_settings(tmp_path, monkeypatch):
    """`recurrent-ppo --fsmn-settings` gives RecurrentPPO ppo_fsmn_cartpole.py's PPO defaults, read from its Args;
    each of the script's PPO flags replaces one; without --fsmn-settings a flag, or one out of range, is one line
    and the run writes nothing."""
    fsmn = import_script("ppo_fsmn_cartpole").Args()
    ppo = peers.fsmn_ppo(peers.RecurrentPPOArgs(fsmn_settings=True))
    assert fsmn.num_envs == 8 and (ppo["n_steps"], ppo["n_epochs"]) == (fsmn.num_steps, fsmn.update_epochs)
    assert ppo["batch_size"] * fsmn.num_minibatches == fsmn.num_envs * fsmn.num_steps
    assert (ppo["gamma"], ppo["gae_lambda"], ppo["clip_range"]) == (fsmn.gamma, fsmn.gae_lambda, fsmn.clip_coef)
    assert ppo["ent_coef"] == fsmn.ent_coef and fsmn.anneal_lr
    assert ppo["learning_rate"](1.0) == fsmn.learning_rate and ppo["learning_rate"](0.25) == fsmn.learning_rate / 4
    flags = dict(learning_rate=2e-3, num_steps=128, num_minibatches=8, update_epochs=5, gamma=0.9, gae_lambda=0.8)
    tuned = peers.fsmn_ppo(peers.RecurrentPPOArgs(fsmn_settings=True, clip_coef=0.1, ent_coef=0.01, **flags))
    assert (tuned["n_steps"], tuned["batch_size"], tuned["n_epochs"]) == (128, 128, 5)
    assert (tuned["gamma"], tuned["gae_lambda"], tuned["clip_range"], tuned["ent_coef"]) == (0.9, 0.8, 0.1, 0.01)
    assert tuned["learning_rate"](0.5) == 1e-3 and peers.fsmn_ppo(peers.RecurrentPPOArgs()) is None
    assert tuned["normalize_advantage"] is True  # the FSMN script's earlier defaults, at which POPGym's presets ran
    current = peers.fsmn_ppo(peers.RecurrentPPOArgs(fsmn_settings=True, norm_adv=False, anneal_clip=True, clip_coef=0.3))
    assert current["normalize_advantage"] is False and current["clip_range"](0.5) == 0.15
    refused = {
        (("gamma", 0.9),): "error: --gamma=0.9 needs --fsmn-settings",
        (("fsmn_settings", True), ("num_minibatches", 3)): "error: --num-minibatches=3 must be a divisor of the 8 envs",
        (("fsmn_settings", True), ("num_steps", 1), ("num_minibatches", 8)): "error: --num-minibatches=8 must be at most "
        "half the batch (advantages are normalised per minibatch)",
        (("fsmn_settings", True), ("gae_lambda", 1.5)): "error: --gae-lambda=1.5 must be in [0, 1]",
        (("fsmn_settings", True), ("clip_coef", math.inf)): "error: --clip-coef=inf must be a positive number",
        (("norm_reward", True),): "error: --norm-reward needs --fsmn-settings",
        (("norm_adv", False),): "error: --no-norm-adv needs --fsmn-settings",
    }
    for given, line in refused.items():
        with pytest.raises(SystemExit) as error:
            peers.fsmn_ppo(peers.RecurrentPPOArgs(**dict(given)))
        assert str(error.value) == line
    # recurrent_ppo builds RecurrentPPO from these settings; through the CLI, a refused run writes nothing
    built = {}

    class Built(Exception):
        pass

    def capture(policy, envs, **kwargs):
        built.update(kwargs, norm_reward=envs.norm_reward, reward_gamma=envs.gamma)
        raise Built

    monkeypatch.setattr(peers, "RecurrentPPO", capture)
    with pytest.raises(Built):
        peers.recurrent_ppo(peers.RecurrentPPOArgs(fsmn_settings=True, total_timesteps=64, **flags))
    assert (built["n_steps"], built["batch_size"], built["gamma"], built["learning_rate"](1.0)) == (128, 128, 0.9, 2e-3)
    assert built["norm_reward"] is False  # observations only, as the FSMN's earlier defaults
    with pytest.raises(Built):  # --norm-reward: the discounted return's std at the run's own gamma
        peers.recurrent_ppo(peers.RecurrentPPOArgs(fsmn_settings=True, total_timesteps=64, norm_reward=True, **flags))
    assert built["norm_reward"] is True and built["reward_gamma"] == 0.9
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "peers.py"), "recurrent-ppo", "--fsmn-settings"]
    done = subprocess.run([*command, "--num-minibatches", "16"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and done.stdout == "", done
    assert done.stderr.strip() == "error: --num-minibatches=16 must be a divisor of the 8 envs" and not os.listdir(tmp_path)


TINY = "--total-timesteps 256 --num-envs 4 --num-steps 32 --num-minibatches 2 --update-epochs 1"


@pytest.mark.smoke
def test_runner_runs_skips_and_writes_only_under_its_folder(tmp_path):
    """A user's first small sweep of a preset, as in the README, with no --out: everything lands under
    benchmark_runs/<preset>/ in the working folder (the report too), and the repository is left as it was."""
    flags = ["--preset", "fsmn-cartpole", "--configs", "fsmn_m4", "--seeds", "1", "2"]
    extra = "--extra=--total-timesteps 512"
    with repository_unchanged():
        result = run_script("benchmarks/run.py", *flags, extra, "--workers", "2", cwd=str(tmp_path))
        assert result.returncode == 0, result.stdout + result.stderr
        out = tmp_path / "benchmark_runs" / "fsmn-cartpole"
        assert "2 to run" in result.stdout and str(out) in result.stdout
        assert len(os.listdir(out / "runs")) == 2 and len(os.listdir(out / "done")) == 2
        assert (out / "fsmn_cartpole.md").exists() and (out / "fsmn_cartpole.png").exists()
        again = run_script("benchmarks/run.py", *flags, extra, cwd=str(tmp_path))
        assert "2 already complete, 0 to run" in again.stdout
        seed_1 = ["--preset", "fsmn-cartpole", "--configs", "fsmn_m4", "--seeds", "1"]  # one failing run is enough
        failing = run_script("benchmarks/run.py", *seed_1, "--extra=--num-minibatches 3", "--rerun", cwd=str(tmp_path))
        assert failing.returncode != 0 and "FAILED" in failing.stdout + failing.stderr
        report_result = run_script("benchmarks/report.py", str(out / "runs"), "--name", "again", cwd=str(tmp_path))
        assert report_result.returncode == 0 and (out / "runs" / "again.md").exists(), report_result.stderr
    ignored = subprocess.run(["git", "check-ignore", "-q", "benchmark_runs/fsmn-cartpole"], cwd=ROOT)
    assert ignored.returncode == 0, "run from the repository's root, the default folder must be ignored by git"


@pytest.mark.smoke
def test_runner_keeps_videos_and_wandb_runs(tmp_path):
    """--extra="--capture-video --track": the videos and the offline W&B run stay in the sweep's folder (where the log
    says to `wandb sync` them), and the report over the whole folder still counts the run once."""
    flags = ["--scripts", "ppo_fsmn_cartpole.py", "--seeds", "1", "--out", str(tmp_path), "--no-report"]
    extra = "--extra=--total-timesteps 1024 --num-envs 2 --num-steps 256 --num-minibatches 2 --track --capture-video"
    result = run_script("benchmarks/run.py", *flags, extra, cwd=str(tmp_path), env={**WANDB_OFFLINE, **NO_DISPLAY})
    assert result.returncode == 0, result.stdout + result.stderr
    assert_videos_reached_the_wandb_run(str(tmp_path))
    runs = report.find_runs(str(tmp_path))
    assert len(runs) == 1, [r.path for r in runs]


@pytest.mark.smoke
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_runner_stopped_keeps_the_run_and_the_same_sweep_resumes_it(tmp_path, signum):
    """Ctrl-C as a terminal sends it (SIGINT to the runner's process group), or SIGTERM as a scheduler sends it at a
    time limit (to every process of the job, the run as well as the runner): the runner passes it on to the run, which
    keeps its events, log and last checkpoint under the sweep's folder while it runs; the runner exits with 128 + the
    signal, one line and no traceback, marks nothing complete and starts nothing more. Run again (here with a budget
    just past the checkpoint, so that the test ends), the sweep resumes the run from its checkpoint in its own run
    folder and runs the queued one from step 0."""
    flags = ["--scripts", "ppo_fsmn_cartpole.py", "--seeds", "1", "2", "--out", str(tmp_path), "--no-report"]
    long_runs = f"--extra={TINY} --total-timesteps 10000000 --save-interval 1"
    runner = start_tool("benchmarks/run.py", [*flags, long_runs], str(tmp_path))
    deadline = time.time() + 120
    while time.time() < deadline and not glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt")):
        time.sleep(0.1)
    try:
        (checkpoint_path,) = glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))  # visible while it runs
        assert glob.glob(str(tmp_path / "runs" / "*" / "events.*")) and os.listdir(tmp_path / "logs")
        if signum == signal.SIGTERM:  # the scheduler's own SIGTERM reaches the run too, then the runner's
            for pid in children(runner.pid):
                with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                    os.kill(pid, signal.SIGTERM)
        os.killpg(runner.pid, signum)
        stdout, stderr = runner.communicate(timeout=60)
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
        for pid in children(runner.pid):  # never leave a training run behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert runner.returncode == 128 + signum, stderr
    assert "Traceback" not in stderr, stderr
    assert "interrupted: 0 of 2 runs finished" in stdout
    assert os.listdir(tmp_path / "done") == []
    log = (tmp_path / "logs" / "ppo_fsmn_cartpole__default__1.log").read_text()
    stopped = "interrupted" if signum == signal.SIGINT else "stopped by SIGTERM"
    assert f"{stopped} during iteration" in log and f"=== exit {128 + signum}" in log, log
    assert "Traceback" not in log, log
    assert not (tmp_path / "logs" / "ppo_fsmn_cartpole__default__2.log").exists()  # queued: never started
    step = torch.load(checkpoint_path, weights_only=True)["global_step"]

    resume = [*flags, f"--extra={TINY} --total-timesteps {step + 256}", "--workers", "2"]  # both at once
    again = run_script("benchmarks/run.py", *resume, cwd=str(tmp_path))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "2 to run (1 from their last checkpoint)" in again.stdout
    log = (tmp_path / "logs" / "ppo_fsmn_cartpole__default__1.log").read_text()
    assert f"--resume runs/{os.path.basename(os.path.dirname(checkpoint_path))}/checkpoint.pt" in log.split("===")[-2]
    assert sorted(os.listdir(tmp_path / "done")) == ["ppo_fsmn_cartpole__default__1", "ppo_fsmn_cartpole__default__2"]
    assert len(os.listdir(tmp_path / "runs")) == 2  # the resumed run went on in its own folder
    resumed = report.load_run(os.path.dirname(checkpoint_path))
    assert len(report.wall_segments(resumed.path)) == 2 and resumed.steps[-1] > step
    assert torch.load(checkpoint_path, weights_only=True)["global_step"] == step + 256


def children(pid: int) -> list[int]:
    """The ids of a process's children, whichever of its threads started them (Linux /proc)."""
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            if int(open(stat).read().rsplit(")", 1)[1].split()[1]) == pid:  # the field after the state is the parent
                found.append(int(os.path.basename(os.path.dirname(stat))))
        except (OSError, IndexError, ValueError):  # a process that ended meanwhile
            pass
    return found


def test_runs_side_by_side_share_the_cores_out(tmp_path, monkeypatch):
    """--workers N: each local run gets OMP_NUM_THREADS = cores // N (at least 1), and torch in it that many threads;
    one worker, or OMP_NUM_THREADS already set, leaves the runs' own defaults."""
    import run

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert [run.threads_per_run(w) for w in (1, 2, 3, 8, 16)] == [None, 4, 2, 1, 1]
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert run.threads_per_run(2) is None
    (tmp_path / "show.py").write_text("import os, torch; print(os.environ['OMP_NUM_THREADS'], torch.get_num_threads())")
    log = tmp_path / "show.log"
    with ThreadPoolExecutor() as pool:  # the local way and the Ray backend's way, at once: each starts a Python
        local = pool.submit(run.run_local, ["show.py"], str(tmp_path), str(log), 1, {}, threading.Lock(), str(tmp_path))
        on_ray = pool.submit(run.execute, ["show.py"], repo=str(tmp_path), threads=1)
        code, (ray_code, output, _) = local.result(), on_ray.result()
    assert code == 0 and log.read_text().splitlines()[1] == "1 1", log.read_text()
    assert ray_code == 0 and output.splitlines()[0] == "1 1", output


@pytest.mark.smoke
def test_runner_on_a_local_ray_instance(tmp_path):
    """The same runs as Ray tasks (one Ray start: it is slow on a busy machine): their files come back into the sweep's
    folder, and a run that did not finish (here: run locally, its completion marker removed) resumes from its
    checkpoint, which travels to its task."""
    flags = ["--scripts", "ppo_fsmn_cartpole.py", "--out", str(tmp_path)]
    local = run_script("benchmarks/run.py", *flags, "--seeds", "1", f"--extra={TINY}", cwd=str(tmp_path))
    assert local.returncode == 0, local.stdout + local.stderr
    os.remove(tmp_path / "done" / "ppo_fsmn_cartpole__default__1")
    ray_flags = [*flags, "--seeds", "1", "2", "--backend", "ray", "--workers", "2"]
    result = run_script("benchmarks/run.py", *ray_flags, f"--extra={TINY} --total-timesteps 512", cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 to run (1 from their last checkpoint)" in result.stdout
    assert sorted(os.listdir(tmp_path / "done")) == ["ppo_fsmn_cartpole__default__1", "ppo_fsmn_cartpole__default__2"]
    runs = sorted(os.listdir(tmp_path / "runs"))
    assert len(runs) == 2 and all(os.listdir(tmp_path / "runs" / run) for run in runs)  # event files came back
    (checkpoint,) = glob.glob(str(tmp_path / "runs" / "*__1__*" / "checkpoint.pt"))
    assert torch.load(checkpoint, weights_only=True)["global_step"] == 512
    assert len(report.wall_segments(os.path.dirname(checkpoint))) == 2  # both parts' event files, in one folder
    assert "=== exit 0" in (tmp_path / "logs" / "ppo_fsmn_cartpole__default__2.log").read_text()


def test_ray_start_up_failures_are_one_line(monkeypatch):
    """A local Ray instance whose node times out during start-up (its raylet waits a fixed time for the dashboard
    agent, which a busy machine can take longer to start) is started again, up to three tries, then one line; a
    failure to reach a cluster at --address is one line naming the flag, with no retry."""
    import ray
    import run

    calls = []

    def failing(message):
        def init(**kwargs):
            calls.append(kwargs["address"])
            raise Exception(message + "\nmore lines of Ray's own")

        return init

    monkeypatch.setattr(ray, "init", failing("The current node timed out during startup. This could happen ..."))
    with pytest.raises(SystemExit) as error:
        run.ray_init(None, 2)
    assert calls == [None] * 3
    assert str(error.value) == (
        "error: --backend ray (a local Ray instance): Ray did not start: The current node timed out during startup. "
        "This could happen ..."
    )
    calls.clear()
    monkeypatch.setattr(ray, "init", failing("Could not connect to head:6379"))
    with pytest.raises(SystemExit) as error:
        run.ray_init("head:6379", 2)
    assert calls == ["head:6379"]
    assert str(error.value) == "error: --address=head:6379: Ray did not start: Could not connect to head:6379"


@pytest.mark.smoke
def test_popgym_preset_on_one_task(tmp_path):
    """The popgym preset's ten configs on one task, tiny: the FSMN at two memory lengths and at the tuned settings
    (with and without --long-memory gate), its ablation, and the LSTM at the FSMN's default and tuned settings on the same
    flattened observation, those three tuned ones again at gamma 0.97, and a report with POPGym's MMER. 1,024 steps
    hold a whole rollout of each (8 envs x 64 or 128 steps), which holds an episode of every env: the task's episodes
    are 51 steps long. One epoch an update (the last --update-epochs wins over a config's): the runs are what is
    tested here, not their learning."""
    flags = ["--preset", "popgym", "--env-ids", "popgym-RepeatFirstEasy-v0", "--seeds", "1", "--out", str(tmp_path)]
    tiny = "--extra=--total-timesteps 1024 --update-epochs 1"
    result = run_script("benchmarks/run.py", *flags, tiny, "--workers", "2", cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line for line in (tmp_path / "popgym.md").read_text().splitlines() if line.startswith("| popgym-")]
    names = [row.split("|")[1].strip() for row in rows]
    configs = ("fsmn", "fsmn_m32", "fsmn_tuned", "fsmn_gate", "fsmn_m0", "sb3_recurrent_ppo", "sb3_recurrent_ppo_tuned")
    configs += ("fsmn_gate_gamma0.97", "fsmn_tuned_gamma0.97", "sb3_recurrent_ppo_gamma0.97")
    assert names == [f"popgym-RepeatFirstEasy-v0__{name}" for name in configs]
    assert "| final return | eval return | MMER |" in (tmp_path / "popgym.md").read_text()  # the FSMN's end-of-run eval


def test_preset_configs_filter(monkeypatch):
    import run as runner

    monkeypatch.setattr(runner.sys, "argv", ["run.py"])
    runs, extra, _ = runner.plan(runner.Args(preset="atari-pong", configs=["atari_bf16"]))
    assert [(c.name, s) for c, s in runs] == [("atari_bf16", 1)]
    assert extra == ["--total-timesteps", "1500000"]
    with pytest.raises(SystemExit, match="--configs=nope not in preset atari-pong"):
        runner.plan(runner.Args(preset="atari-pong", configs=["nope"]))
    monkeypatch.setattr(runner.sys, "argv", ["run.py", "--seeds", "4", "5"])  # seeds given: the preset's are replaced
    runs, _, _ = runner.plan(runner.Args(preset="continuous-mujoco", env_ids=["Hopper-v5"], seeds=[4, 5]))
    assert [(runner.env_of(c), s) for c, s in runs] == [("Hopper-v5", 4), ("Hopper-v5", 5)]
    with pytest.raises(SystemExit, match="--env-ids=Ant-v5 not in preset continuous-mujoco: HalfCheetah-v5, Hopper-v5"):
        runner.plan(runner.Args(preset="continuous-mujoco", env_ids=["Hopper-v5", "Ant-v5"]))


def test_the_readmes_popgym_command_is_the_one_config():
    """The README's POPGym command parses to the same Args as the popgym-one preset's config (run.py's POPGYM_ONE)
    on its task: the front page and the judged runs cannot drift apart; flags left at the script's defaults may be
    left out of either."""
    import shlex

    import run as runner
    import tyro

    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        lines = f.read().replace("\\\n", " ").splitlines()
    [command] = [line for line in lines if line.startswith("python ppo_fsmn_cartpole.py --env-id popgym-")]
    readme = shlex.split(command, comments=True)[2:]
    env_id = readme[readme.index("--env-id") + 1]
    [config] = [c for c in runner.PRESETS["popgym-one"]["configs"] if c.name == "fsmn_one" and env_id in c.command]
    preset = [*config.command[1:], *runner.PRESETS["popgym-one"]["extra"]]
    script = import_script("ppo_fsmn_cartpole")
    assert vars(tyro.cli(script.Args, args=readme)) == vars(tyro.cli(script.Args, args=preset))
    assert "--learning-rate" in readme and "--long-memory" in readme  # what makes it the one config, spelled
    assert f"(Autoencode: --learning-rate {runner.POPGYM_ONE_RECITE[1]})" in command  # its one flag, in the comment


@pytest.mark.smoke
def test_sps_pair_against_an_earlier_commit_on_a_busy_machine(tmp_path):
    """sps.py runs the peer, the script and the script as it was at a git commit, alternating, and writes the table
    with each ratio under the working folder; with a process spinning beside it (a core's worth, whatever else runs),
    it says in its output and its table that the machine was busy; an unknown commit or variant is one line."""
    import sps

    flags = ["--pair", "fsmn-cartpole", "--repeats", "1", "--total-timesteps", "1024", "--variants", "eager"]
    flags += ["--load-seconds", "0.2"]  # the spinner shows within a fifth of a second
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        load = sps.OtherLoad()
        time.sleep(0.5)
        assert load.cores() >= 0.5  # the spinner, not this process's sleep
        with repository_unchanged():
            result = run_script("benchmarks/sps.py", *flags, "--against", "HEAD", cwd=str(tmp_path))
    finally:
        spinner.kill()
        spinner.wait()
    assert result.returncode == 0, result.stdout + result.stderr
    text = (tmp_path / "benchmark_runs" / "sps" / "sps_fsmn_cartpole_against_HEAD.md").read_text()
    assert "| repeat | eager steps/s | HEAD eager steps/s | peer steps/s |" in text
    assert "Median ratio eager/HEAD eager: **" in text and "Median ratio eager/peer: **" in text
    assert "--variants eager --against HEAD --load-seconds 0.2`." in text
    assert "Other processes kept up to" in text
    assert "(the machine was busy)" in result.stdout and "**Warning: the machine was busy" in result.stdout
    assert "**Warning: the machine was busy" in text
    bad = run_script("benchmarks/sps.py", *flags[:4], "--against", "no-such-commit", cwd=str(tmp_path))
    assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1].startswith("error: --against=no-such-commit")
    bad = run_script("benchmarks/sps.py", *flags[:4], "--variants", "nope", cwd=str(tmp_path))
    assert bad.returncode != 0 and "error: --variants=nope not in pair fsmn-cartpole: eager, --compile" in bad.stderr


def test_sps_writes_its_table_under_out_dir(tmp_path, monkeypatch):
    """--out-dir: the table goes there (the runs themselves are smoke-run above; here each is a made-up figure)."""
    import sps

    monkeypatch.setattr(sps, "run", lambda command, *settings: (1000.0, 100.0, 0.0, 0.0))
    sps.main(sps.Args(repeats=1, variants=["eager"], out_dir=str(tmp_path / "elsewhere")))
    assert "| 1 | 1000 | 1000 |" in (tmp_path / "elsewhere" / "sps_fsmn_cartpole.md").read_text()


def test_sps_reverses_the_order_every_second_repeat(tmp_path, monkeypatch):
    """A machine whose speed drifts within a repeat favours no run: peer, script, old script; then the reverse."""
    import sps

    started = []
    monkeypatch.setattr(sps, "extract_commit", lambda ref: "/old")
    monkeypatch.setattr(sps, "run", lambda command, *settings: started.append(command[0]) or (1000.0, 1.0, 0.0, 0.0))
    sps.main(sps.Args(repeats=3, variants=["eager"], against="REF", out_dir=str(tmp_path)))
    peer, new, old = "benchmarks/peers.py", "ppo_fsmn_cartpole.py", "/old/ppo_fsmn_cartpole.py"
    assert started == [peer, new, old, old, new, peer, peer, new, old]


def test_peers_take_the_free_cores_as_the_scripts_do(monkeypatch):
    """SB3's peers get the scripts' thread policy (`--threads 0`): torch takes the cores other processes leave free,
    read again before every rollout."""
    threads = torch.get_num_threads()
    free = iter([1, 2])
    monkeypatch.setattr(peers, "free_cores", lambda reading: next(free))
    monkeypatch.setattr(peers, "TORCH_THREADS", 8)
    try:
        callback = peers.CleanRLTags(writer=None)
        assert torch.get_num_threads() == 1
        callback._on_rollout_start()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


@pytest.mark.smoke
def test_side_by_side_table(tmp_path):
    """side_by_side.py measures a script alone, beside itself and beside a second script, and writes every share under
    the working folder (its --against shares sps.py's commit extraction, tested there); an unknown script is one
    line."""
    flags = ["--scripts", "fsmn", "--second", "continuous", "--repeats", "1", "--total-timesteps", "4096", "--burn-in", "0"]
    flags += ["--load-seconds", "0.2"]
    with repository_unchanged():
        result = run_script("benchmarks/side_by_side.py", *flags, cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    text = (tmp_path / "benchmark_runs" / "side_by_side" / "side_by_side.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| this | fsmn |")).split("|")[1:-1]
    assert len(row) == 8 and all(cell.strip().rstrip("%").isdigit() for cell in row[2:]), row
    assert "--scripts fsmn --total-timesteps 4096 --burn-in 0.0 --second continuous --load-seconds 0.2`." in text
    assert "Other processes kept up to" in text
    bad = run_script("benchmarks/side_by_side.py", "--scripts", "nope", cwd=str(tmp_path))
    assert bad.returncode != 0 and "error: --scripts/--second=nope: each must be one of fsmn, continuous" in bad.stderr


def test_levels_of_a_card_task_and_of_a_cartpole():
    """benchmarks/levels.py on CountRecallEasy (3 episodes): each of its 51 steps has one right count of 27, worth
    +1/51 against -1/51 for the 26 others, so answering at random earns exactly -25/27 an episode and every right
    answer 1; at step 0 the count is 1 if the card dealt is the one asked for, else 0, which the memoryless table
    must pick. PositionOnlyCartPole, whose pushes change what follows, is no card task: a reactive floor instead."""
    import levels

    rows = levels.levels("popgym-CountRecallEasy-v0", episodes=3, seed=0)
    assert np.allclose(rows["random"], -25 / 27) and np.allclose(rows["perfect"], 1.0)
    fitted = levels.card_task_episodes("popgym-CountRecallEasy-v0", range(3))
    for steps in fitted:
        (t, (card, asked)), rewards = steps[0]
        assert t == 0 and int(np.argmax(rewards)) == int(card == asked)
    # the level is the higher of the exact and the fitted (3 episodes fit a poor table: the exact)
    assert rows["memoryless"] == rows["exact"] > rows["fitted"] and rows["how"].startswith("exact: ")
    assert levels.card_task_episodes("popgym-PositionOnlyCartPoleEasy-v0", range(1)) is None
    cartpole = levels.levels("popgym-PositionOnlyCartPoleEasy-v0", episodes=2, seed=0)
    assert cartpole["perfect"] is None and cartpole["how"].startswith("floor: the best reactive policy")
    assert cartpole["exact"] is None and cartpole["fitted"] is None


@pytest.mark.parametrize(
    "env_id, episodes",
    [
        ("popgym-CountRecallEasy-v0", 12000),
        ("popgym-RepeatPreviousEasy-v0", 4000),
        ("popgym-RepeatFirstEasy-v0", 2000),
        ("popgym-AutoencodeEasy-v0", 1000),
    ],
)
def test_levels_exact_level_is_what_its_policy_scores_in_the_env(env_id, episodes):
    """levels.py's exact memoryless level of a card task against a simulation with the env's own code: the policy
    the formula implies (its best answer per step and observation), played in the env, scores the level within 4
    standard errors of its mean return. The episodes are enough for a wrong formula to fail: on CountRecall a
    hypergeometric that leaves the card on screen in the deck claims 0.019 more than its policy scores (8 standard
    errors), on the Repeat tasks a deck dealt with replacement (chance 1/4, not 13/51) 0.010 less (5)."""
    import gymnasium as gym
    import levels

    env = gym.make(env_id).unwrapped  # the env's own code, no checker or wrapper between
    exact = levels.exact_level(env)
    returns = []
    for seed in range(episodes):
        obs, _ = env.reset(seed=seed)
        total, t, done = 0.0, 0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(exact.answer(t, levels.key(obs)))
            total, t, done = total + reward, t + 1, terminated or truncated
        returns.append(total)
    standard_error = np.std(returns) / np.sqrt(episodes)
    assert abs(np.mean(returns) - exact.level) < 4 * standard_error, (np.mean(returns), exact.level, standard_error)


def test_levels_table_reads_back_and_marks_a_report(tmp_path):
    """levels.py end to end: the table it writes (RepeatPrevious, 2 episodes) is the one --levels-file reads, and
    --annotate then marks a report's row of that task."""
    import levels

    text = levels.main(levels.Args(env_ids=["popgym-RepeatPreviousEasy-v0"], episodes=2, out_dir=str(tmp_path)))
    assert (tmp_path / "levels.md").read_text() == text
    ((memoryless, noise),) = levels.read_levels(str(tmp_path / "levels.md")).values()
    assert memoryless <= noise
    report_table = "| config | MMER |\n|---|---|\n| popgym-RepeatPreviousEasy-v0__fsmn | 1.000 (0.9 to 1.0) |\n"
    (tmp_path / "r.md").write_text(report_table)
    levels.main(levels.Args(levels_file=str(tmp_path / "levels.md"), annotate=(str(tmp_path / "r.md"),)))
    assert (
        (tmp_path / "r.md").read_text().splitlines()[2].endswith(f"| {memoryless:.3f} | clears it ({1 - memoryless:+.3f}) |")
    )


def test_probe_answers_are_the_envs_own_and_it_writes_its_table(tmp_path):
    """benchmarks/probe.py's recorded answers on CountRecallEasy equal the env's own count of the card asked for
    (read from its state, `counts[query]`, which the probe never reads), and Autoencode's only where it is reciting
    (its watching steps score every action alike); a tiny probe of two kinds writes its table under --out-dir."""
    import probe
    from popgym.envs.count_recall import CountRecallEasy

    obs, answers, has_answer, rewards = probe.record("popgym-CountRecallEasy-v0", range(2))
    for episode in range(2):
        env = CountRecallEasy()
        env.reset(seed=episode)
        for t in range(answers.shape[0]):
            assert answers[t, episode] == env.counts[env.query]
            env.step(0)
    assert has_answer.all() and rewards.shape == (51, 2, 27)
    _, _, has_answer, _ = probe.record("popgym-AutoencodeEasy-v0", range(1))
    assert has_answer[:, 0].tolist() == [False] * 51 + [True] * 52
    tiny = dict(kinds=("none", "gate"), episodes=4, steps=2, batch=2, out_dir=str(tmp_path))
    text = probe.main(probe.Args(env_id="popgym-RepeatPreviousEasy-v0", **tiny))
    assert (tmp_path / "probe_RepeatPreviousEasy.md").read_text().strip() == text.strip()
    assert [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ")][1:] == ["none", "gate"]


def test_levels_mark_a_reports_rows_against_the_memoryless_level(tmp_path):
    """levels.py --annotate: a row's MMER median above its task's MMER noise clears the level, one between the two
    is within its noise, one under the level is below it; a task without a level gets empty cells; marking again
    replaces the columns instead of adding more."""
    import levels

    (tmp_path / "levels.md").write_text(
        "| task | random | memoryless | MMER noise | perfect | how |\n|---|---|---|---|---|---|\n"
        "| popgym-CountRecallEasy-v0 | -0.926 | -0.420 | -0.400 | 1.000 | table |\n"
    )
    rows = [("CountRecallEasy-v0__a", "-0.300 (-0.4 to 0)"), ("CountRecallEasy-v0__b", "-0.410")]
    rows += [("CountRecallEasy-v0__c", "-0.463 (-0.478 to -0.454)"), ("RepeatFirstEasy-v0__d", "1.000")]
    report_table = "intro\n\n| config | seeds | MMER | wall s |\n|---|---|---|---|\n"
    report_table += "".join(f"| popgym-{name} | 3 | {mmer} | 10 |\n" for name, mmer in rows) + "\nafter\n"
    (tmp_path / "r.md").write_text(report_table)
    marks = levels.read_levels(str(tmp_path / "levels.md"))
    for _ in range(2):
        assert levels.annotate(str(tmp_path / "r.md"), marks) == 3
    lines = (tmp_path / "r.md").read_text().splitlines()
    assert lines[2] == "| config | seeds | MMER | wall s | memoryless level | MMER against it |"
    assert lines[3] == "|---|---|---|---|---|---|"
    assert [line.split(" | ")[-2:] for line in lines[4:8]] == [
        ["-0.420", "clears it (+0.120) |"],
        ["-0.420", "within its noise (+0.010) |"],
        ["-0.420", "below it (-0.043) |"],
        ["", " |"],
    ]
    assert lines[0] == "intro" and lines[-2:] == ["", "after"]
