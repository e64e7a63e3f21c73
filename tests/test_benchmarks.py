"""benchmarks/: the report on synthetic event files written here, and the runner end to end on tiny runs."""

import glob
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, import_script, run_script
from torch.utils.tensorboard import SummaryWriter

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import peers  # noqa: E402
import report  # noqa: E402


def write_run(root: str, name: str, returns: list[float], steps_per_episode: int = 100) -> None:
    writer = SummaryWriter(os.path.join(root, name))
    for i, r in enumerate(returns):
        writer.add_scalar("charts/episodic_return", r, (i + 1) * steps_per_episode)
    writer.add_scalar("charts/SPS", 1000, len(returns) * steps_per_episode)
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
    assert report.spread(summary["steps_to"]) == "never (800-never), 1 of 2 never"  # median of 800 and never
    assert report.spread([300, None, 100, 200, None]) == "300 (100-never), 2 of 5 never"
    assert report.spread([1.0, 3.0, 2.0]) == "2 (1-3)"


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
    assert rows[1].startswith("| Env-v0__fast | 3 | 2000 (2000-never), 1 of 3 never |")
    assert "| 20.0 (10.0-30.0) |" in rows[1]
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


@pytest.mark.smoke
def test_runner_runs_skips_and_resumes(tmp_path):
    flags = ["--scripts", "ppo_fsmn_cartpole.py", "--env-ids", "CartPole-v1", "--seeds", "1", "2", "--out", str(tmp_path)]
    extra = "--total-timesteps 256 --num-envs 4 --num-steps 32 --num-minibatches 2 --update-epochs 1"
    result = run_script("benchmarks/run.py", *flags, f"--extra={extra}", "--workers", "2", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "2 to run" in result.stdout
    assert len(os.listdir(tmp_path / "runs")) == 2 and len(os.listdir(tmp_path / "done")) == 2
    again = run_script("benchmarks/run.py", *flags, f"--extra={extra}", cwd=str(tmp_path))
    assert "2 already complete, 0 to run" in again.stdout
    failing = run_script("benchmarks/run.py", *flags, "--extra=--num-minibatches 3", "--rerun", cwd=str(tmp_path))
    assert failing.returncode != 0 and "FAILED" in failing.stdout + failing.stderr


@pytest.mark.smoke
def test_runner_ctrl_c_marks_nothing_complete_and_starts_nothing_more(tmp_path):
    """Ctrl-C as a terminal sends it (SIGINT to the runner's process group, its runs included): the runner exits 130
    with one line and no traceback, the interrupted run gets no completion marker and the queued one never starts."""
    flags = ["--scripts", "ppo_fsmn_cartpole.py", "--seeds", "1", "2", "--out", str(tmp_path), "--no-report"]
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "run.py"), *flags, "--extra=--total-timesteps 10000000"]
    runner = subprocess.Popen(
        command,
        cwd=str(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as from a terminal, even if pytest ignores it
    )
    deadline = time.time() + 60
    while time.time() < deadline and not any("ppo_fsmn_cartpole.py" in p for p in child_commands(runner.pid)):
        time.sleep(0.5)
    assert any("ppo_fsmn_cartpole.py" in p for p in child_commands(runner.pid)), "the runner started no run"
    time.sleep(5)  # the run is under way
    os.killpg(runner.pid, signal.SIGINT)
    try:
        stdout, stderr = runner.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(runner.pid, signal.SIGKILL)
        raise
    assert runner.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert "interrupted: 0 of 2 runs finished" in stdout
    assert os.listdir(tmp_path / "done") == [] and os.listdir(tmp_path / "logs") == []


def child_commands(pid: int) -> list[str]:
    """The command lines of a process's children, whichever of its threads started them (Linux /proc)."""
    commands = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            if int(open(stat).read().rsplit(")", 1)[1].split()[1]) == pid:  # the field after the state is the parent
                commands.append(open(os.path.join(os.path.dirname(stat), "cmdline")).read().replace("\0", " "))
        except (OSError, IndexError, ValueError):  # a process that ended meanwhile
            pass
    return commands


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
    code, output, _ = run.execute(["show.py"], repo=str(tmp_path), threads=1)
    assert code == 0 and output.split("\n")[1] == "1 1", output


@pytest.mark.smoke
def test_runner_on_a_local_ray_instance(tmp_path):
    flags = ["--scripts", "ppo_fsmn_cartpole.py", "--seeds", "1", "2", "--out", str(tmp_path), "--backend", "ray"]
    extra = "--total-timesteps 256 --num-envs 4 --num-steps 32 --num-minibatches 2 --update-epochs 1"
    result = run_script("benchmarks/run.py", *flags, f"--extra={extra}", "--workers", "2", cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    runs = sorted(os.listdir(tmp_path / "runs"))
    assert len(runs) == 2 and all(os.listdir(tmp_path / "runs" / run) for run in runs)  # event files came back
    assert sorted(os.listdir(tmp_path / "done")) == ["ppo_fsmn_cartpole__default__1", "ppo_fsmn_cartpole__default__2"]


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


@pytest.mark.smoke
def test_sps_pair_against_an_earlier_commit(tmp_path):
    """sps.py runs the peer, the script and the script as it was at a git commit, alternating, and writes the table
    with each ratio; an unknown commit or variant is one line."""
    flags = ["--pair", "fsmn-cartpole", "--repeats", "1", "--total-timesteps", "2048", "--variants", "eager"]
    result = run_script("benchmarks/sps.py", *flags, "--against", "HEAD", "--out-dir", str(tmp_path), cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    text = (tmp_path / "sps_fsmn_cartpole_against_HEAD.md").read_text()
    assert "| repeat | eager steps/s | HEAD eager steps/s | peer steps/s |" in text
    assert "Median ratio eager/HEAD eager: **" in text and "Median ratio eager/peer: **" in text
    assert "--variants eager --against HEAD`." in text
    bad = run_script("benchmarks/sps.py", *flags[:4], "--against", "no-such-commit", cwd=str(tmp_path))
    assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1].startswith("error: --against=no-such-commit")
    bad = run_script("benchmarks/sps.py", *flags[:4], "--variants", "nope", cwd=str(tmp_path))
    assert bad.returncode != 0 and "error: --variants=nope not in pair fsmn-cartpole: eager, --compile" in bad.stderr


@pytest.mark.smoke
def test_side_by_side_table(tmp_path):
    """side_by_side.py measures a script alone, beside itself and beside a second script, and writes every share (its
    --against shares sps.py's commit extraction, tested there); an unknown script is one line."""
    flags = ["--scripts", "fsmn", "--second", "continuous", "--repeats", "1", "--total-timesteps", "4096", "--burn-in", "0"]
    result = run_script("benchmarks/side_by_side.py", *flags, "--out-dir", str(tmp_path), cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    text = (tmp_path / "side_by_side.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| this | fsmn |")).split("|")[1:-1]
    assert len(row) == 8 and all(cell.strip().rstrip("%").isdigit() for cell in row[2:]), row
    assert "--scripts fsmn --total-timesteps 4096 --burn-in 0.0 --second continuous`." in text
    bad = run_script("benchmarks/side_by_side.py", "--scripts", "nope", cwd=str(tmp_path))
    assert bad.returncode != 0 and "error: --scripts/--second=nope: each must be one of fsmn, continuous" in bad.stderr
