"""A run's life as a user meets it, in ppo_fsmn_cartpole.py (the blocks involved are the same in every
script): a resume from another folder goes on in the checkpoint's own run with its flags, videos and W&B run;
evaluation with videos and W&B; Ctrl-C twice while W&B closes; a full disk while saving; names that would
leave runs/; the end-of-run summary, the plain lines of --no-progress and the labelled progress bar; warnings
once.
W&B runs offline."""

import glob
import hashlib
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import (
    NO_DISPLAY,
    ROOT,
    WANDB_OFFLINE,
    import_script,
    read_scalars,
    run_script,
    run_script_signalled,
    wandb_records,
)

SCRIPT = "ppo_fsmn_cartpole.py"
TINY = ["--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"]
TINY += ["--threads", "1"]
TINY_ARGS = dict(num_envs=4, num_steps=32, num_minibatches=2, update_epochs=1, threads=1, cuda=False)


def offline_runs(folder) -> list[str]:
    return sorted(glob.glob(os.path.join(folder, "wandb", "offline-run-*")))


def record_types(offline_run: str) -> list[str]:
    return [record.WhichOneof("record_type") for record in wandb_records(offline_run)]


def media_videos(offline_run: str) -> list[str]:
    return glob.glob(os.path.join(offline_run, "files", "media", "videos", "*.mp4"))


def interrupt_twice(process: subprocess.Popen, folder) -> tuple[list[str], str, str]:
    """Once two videos have reached the W&B run (videos are sent as they are written), Ctrl-C as a terminal does
    (to the whole process group), then Ctrl-C again as soon as the run says it stops, while the checkpoint and
    W&B close.
    Returns the lines up to that one, and the rest of stdout and stderr."""
    try:
        deadline = time.time() + 300  # generous: a start-up on a busy machine takes long
        # two videos (episodes 0 and 1): the next one recorded is episode 8's, so the Ctrl-C does not land while
        # ffmpeg, in the same process group, encodes one (a stop too: test_an_oserror_after_ctrl_c_...)
        while time.time() < deadline and sum(len(media_videos(run)) for run in offline_runs(folder)) < 2:
            time.sleep(0.2)
        assert sum(len(media_videos(run)) for run in offline_runs(folder)) >= 2, "no video reached W&B while training"
        os.killpg(process.pid, signal.SIGINT)
        lines = []
        while not lines or not lines[-1].startswith("interrupted"):
            lines.append(process.stdout.readline())
            assert lines[-1], "".join(lines) + process.stderr.read()  # it ended early: its stderr says why
        os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:  # never leave a training run behind to compete with the rest of the suite
            os.killpg(process.pid, signal.SIGKILL)
    return lines, stdout, stderr


@pytest.mark.smoke
def test_interrupted_tracked_run_resumed_from_another_folder_then_evaluated_with_videos(tmp_path):
    first, other = tmp_path / "first", tmp_path / "other"
    first.mkdir(), other.mkdir()
    env = {**WANDB_OFFLINE, **NO_DISPLAY}
    flags = [*TINY, "--save-model", "--save-interval", "1", "--track", "--capture-video", "--no-progress"]
    flags += ["--wandb-group", "sweep-1", "--wandb-tags", "fsmn", "tiny", "--total-timesteps", "10000000"]
    process = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, SCRIPT), *flags],
        cwd=first,
        env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    lines, stdout, stderr = interrupt_twice(process, first)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    (run_dir,) = glob.glob(str(first / "runs" / "*"))
    stopped = torch.load(os.path.join(run_dir, "checkpoint.pt"), weights_only=True)
    kept = f"keeping the logs and the checkpoint of iteration {stopped['iteration']}"
    assert lines[-1].rstrip().endswith(kept), lines[-1]
    (first_run,) = offline_runs(first)
    types = record_types(first_run)
    assert "history" in types and "exit" in types, types  # the W&B run survived the second Ctrl-C
    run_name = os.path.basename(run_dir)
    video_glob = str(first / "videos" / run_name / "*.mp4")
    first_videos = {path: os.path.getmtime(path) for path in glob.glob(video_glob)}
    assert first_videos

    # from another folder, only the flag that changes: the checkpoint's own run folder, videos and W&B run go
    # on, with its flags (--save-model, --track, --capture-video too); the earlier checkpoints stay, numbered
    checkpoint = os.path.relpath(os.path.join(run_dir, "checkpoint.pt"), other)
    total = stopped["global_step"] + 256
    flags = ["--resume", checkpoint, "--total-timesteps", str(total)]
    result = run_script(SCRIPT, *flags, cwd=str(other), env=env)
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stdout.splitlines() if line.startswith("note: ")] == [
        f"note: --total-timesteps={total} differs from the checkpoint's 10000000"
    ]
    assert os.listdir(other) == []
    assert len(glob.glob(os.path.join(run_dir, "events.*"))) == 2
    assert read_scalars(run_dir)["charts/SPS"][-1][0] == total
    assert torch.load(os.path.join(run_dir, "checkpoint.pt"), weights_only=True)["global_step"] == total
    kept = sorted(glob.glob(os.path.join(run_dir, "checkpoint-*.pt")), key=os.path.getmtime)
    kept = [os.path.basename(path) for path in kept]
    assert kept == [f"checkpoint-{total - step}.pt" for step in (256, 128, 0)], kept
    assert "Overwriting existing videos" not in result.stderr
    videos = glob.glob(video_glob)
    new_videos = [path for path in videos if path not in first_videos]
    assert new_videos and all(os.path.getmtime(path) == mtime for path, mtime in first_videos.items())
    summary = result.stdout.splitlines()[-3:]  # where it got, the checkpoint, the curves
    assert summary[0].startswith(f"step {total}: mean return ") and "steps/s" in summary[0], summary
    assert summary[1].startswith(f"checkpoint: {checkpoint} (iteration "), summary
    assert summary[2] == f"tensorboard --logdir {os.path.dirname(checkpoint)}", summary

    # one W&B run in two parts (one id), each part's videos sent once, the code saved from outside the repo
    runs = offline_runs(first)
    assert len(runs) == 2
    (run_record,) = [r.run for r in wandb_records(first_run) if r.WhichOneof("record_type") == "run"]
    assert (run_record.run_group, list(run_record.tags)) == ("sweep-1", ["fsmn", "tiny"])
    assert {run.rsplit("-", 1)[1] for run in runs} == {run_record.run_id}
    resumed_run = next(run for run in runs if run != first_run)
    assert len(media_videos(first_run)) == len(first_videos)
    assert len(media_videos(resumed_run)) == len(new_videos)
    for part in runs:  # TensorBoard's scalars synced in each part, under their own names
        history = [r.history for r in wandb_records(part) if r.WhichOneof("record_type") == "history"]
        assert {"charts/SPS", "losses/loss"} <= {item.key or "/".join(item.nested_key) for h in history for item in h.item}
    code = [r.artifact for r in wandb_records(first_run) if r.WhichOneof("record_type") == "artifact"]
    assert [entry.path for artifact in code for entry in artifact.manifest.contents] == [SCRIPT]

    # evaluation: each episode's return as it ends, its videos, and a W&B run of its own with them
    flags = ["--eval-checkpoint", checkpoint, "--eval-episodes", "2", "--capture-video", "--track"]
    result = run_script(SCRIPT, *flags, cwd=str(other), env=env)
    assert result.returncode == 0, result.stderr
    # pygame greets on stdout when it is first imported in a process (it renders CartPole's video)
    lines = [line for line in result.stdout.splitlines() if not line.startswith("pygame")]
    assert lines[0].startswith("episode 1: return ") and lines[1].startswith("episode 2: return ")
    assert lines[2].startswith("eval: 2 episodes, mean return")
    eval_videos = glob.glob(str(other / "videos" / f"{run_name}__eval__*" / "*.mp4"))
    (eval_run,) = offline_runs(other)
    assert len(eval_videos) == 2 and len(media_videos(eval_run)) == 2


def test_ctrl_c_without_save_model_promises_no_checkpoint(in_tmp, monkeypatch, capsys):
    """Ctrl-C (a SIGINT to the process itself) during the second iteration of a run without --save-model."""
    script = import_script(SCRIPT[: -len(".py")])
    original = script.compute_gae

    def ctrl_c_after(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # the run's handler notes it; the next env step stops the run
        return original(*args, **kwargs)

    monkeypatch.setattr(script, "compute_gae", ctrl_c_after)
    with pytest.raises(SystemExit) as stop:
        script.main(script.Args(**TINY_ARGS, total_timesteps=512, progress=False))
    assert stop.value.code == 130
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("interrupted"))
    assert line == "interrupted during iteration 2; keeping the logs; no checkpoint: no --save-model", line
    assert not glob.glob("runs/*/*.pt")


@pytest.mark.parametrize("signalled", [True, False])
def test_an_oserror_after_ctrl_c_is_the_stop_and_without_one_an_error(in_tmp, monkeypatch, capsys, signalled):
    """Ctrl-C reaches the whole process group: ffmpeg, encoding a video inside an env step, dies of it and the step
    raises an OSError (a broken pipe). After a stop signal that ends the run as the signal would, its line naming the
    error; without one, the OSError is raised as it is."""
    script = import_script(SCRIPT[: -len(".py")])

    def ffmpeg_killed(*args, **kwargs):
        if signalled:
            os.kill(os.getpid(), signal.SIGINT)
        raise OSError(32, "Broken pipe\n\nMoviePy error: FFMPEG encountered the following error ...")

    monkeypatch.setattr(script, "compute_gae", ffmpeg_killed)
    with pytest.raises(SystemExit if signalled else OSError) as stop:
        script.main(script.Args(**TINY_ARGS, total_timesteps=512, progress=False))
    lines = capsys.readouterr().out.splitlines()
    if signalled:
        assert stop.value.code == 130
        kept = "keeping the logs; no checkpoint: no --save-model"
        assert f"interrupted ([Errno 32] Broken pipe) during iteration 1; {kept}" in lines, lines
    else:
        assert stop.value.errno == 32 and not any(line.startswith("interrupted") for line in lines), lines


def test_a_full_disk_while_saving_is_one_line_and_keeps_the_previous_checkpoint(in_tmp, monkeypatch):
    """The second save fails as torch's zip writer fails on a full disk, after writing part of the file: one
    line naming the file and the free space, no .tmp left, the first checkpoint intact, a non-zero exit."""
    script = import_script(SCRIPT[: -len(".py")])
    saves, original = [], torch.save

    def full_disk(obj, path, *args, **kwargs):
        saves.append(path)
        if len(saves) == 1:
            return original(obj, path, *args, **kwargs)
        with open(path, "wb") as f:
            f.write(b"PK\x03\x04 half a checkpoint")
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 150336 vs 150224")

    monkeypatch.setattr(torch, "save", full_disk)
    args = script.Args(**TINY_ARGS, total_timesteps=384, save_model=True, save_interval=1, progress=False)
    with pytest.raises(SystemExit) as stop:
        script.main(args)
    monkeypatch.setattr(torch, "save", original)
    (run_dir,) = glob.glob("runs/*")
    path = os.path.join(run_dir, "checkpoint.pt")
    message = str(stop.value.code)
    assert message.startswith(f"error: cannot write {path}: ") and "KiB free on its disk" in message, message
    assert "\n" not in message
    assert not glob.glob(os.path.join(run_dir, "*.tmp"))
    assert torch.load(path, weights_only=True)["iteration"] == 1


@pytest.mark.parametrize(
    "flags, refused",
    [
        (["--exp-name", "x/../../../escaped"], "--exp-name=x/../../../escaped"),
        (["--track", "--wandb-project-name", "a/b"], "--wandb-project-name=a/b"),
        (["--track", "--wandb-tags", "ok", "no:colon"], "--wandb-tags=no:colon"),
    ],
)
def test_names_that_would_leave_runs_or_that_wandb_refuses_are_one_line(in_tmp, flags, refused):
    import tyro

    script = import_script(SCRIPT[: -len(".py")])
    with pytest.raises(SystemExit) as refusal:
        script.main(tyro.cli(script.Args, args=[*TINY, "--total-timesteps", "128", "--no-progress", *flags]))
    message = str(refusal.value.code)
    assert message.startswith(f"error: {refused} must ") and "\n" not in message, message
    assert os.listdir(in_tmp) == [] and not glob.glob(str(in_tmp.parent.parent / "escaped*"))


def test_summary_plain_lines_progress_label_and_the_rounding_warning(in_tmp, monkeypatch, capsys):
    script = import_script(SCRIPT[: -len(".py")])
    monkeypatch.setattr(script, "PLAIN_LINE_SECONDS", 0.0)  # every step, instead of every 30 s
    script.main(script.Args(**TINY_ARGS, total_timesteps=300, progress=False))  # 2 batches of 128
    out, err = capsys.readouterr()
    assert err.count("warning: --total-timesteps=300 trains 256, whole batches of 128") == 1, err
    lines = out.splitlines()
    plain = [line for line in lines if line.startswith("step ") and "steps/s" in line]
    assert len(plain) >= 64 and "step 4: no episode finished yet, " in plain[0], plain[:2]
    assert any("mean return" in line and "episodes)" in line for line in plain)
    (run_dir,) = glob.glob("runs/*")
    assert lines[-1] == f"tensorboard --logdir {run_dir}", lines[-3:]
    assert lines[-2].startswith("step 256: mean return "), lines[-3:]

    # a default budget never warns: the rounding is for a --total-timesteps the user gave (here 300 as the default)
    monkeypatch.setattr(script.Args, "total_timesteps", 300)
    script.main(script.Args(**TINY_ARGS, total_timesteps=300, exp_name="baz", progress=False))
    assert "warning" not in capsys.readouterr().err

    script.main(script.Args(**TINY_ARGS, total_timesteps=256, exp_name="bar"))
    out, err = capsys.readouterr()
    # the progress bar's label
    assert "mean return " in err and "episodes), " in err and "steps/s" in err, err
    assert not [line for line in out.splitlines() if line.startswith("step ") and "steps/s" in line][:-1]


@pytest.mark.smoke
def test_mujoco_video_without_a_display_and_no_deprecation_warning(tmp_path, monkeypatch):
    """No display and no MUJOCO_GL in the run's environment: the video renders off-screen, nothing is deprecated."""
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    flags = ["--env-id", "HalfCheetah-v5", "--num-envs", "1", "--num-steps", "16", "--num-minibatches", "2"]
    flags += ["--update-epochs", "1", "--total-timesteps", "16", "--threads", "1", "--capture-video"]
    flags += ["--no-progress"]
    result = run_script("ppo_continuous.py", *flags, cwd=str(tmp_path), env=NO_DISPLAY)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "deprecated" not in result.stderr, result.stderr
    assert glob.glob(str(tmp_path / "videos" / "*" / "*.mp4"))


@pytest.mark.parametrize(
    "name, flags, warning",
    [
        (
            "ppo_atari",
            dict(bf16=True, num_envs=2, num_steps=16, total_timesteps=32, num_minibatches=2),
            "--bf16 on a CPU",
        ),
        (
            "ppg_lunarlander",
            dict(num_envs=2, num_steps=16, total_timesteps=32, num_minibatches=2, num_aux_rollouts=2),
            "ends before the first auxiliary phase",
        ),
    ],
)
def test_warnings_once_where_they_help(in_tmp, monkeypatch, capsys, name, flags, warning):
    """Stopped right after the warnings, where the run would start: each warning once, on stderr."""
    script = import_script(name)
    monkeypatch.setattr(script, "cpu_has_bf16", lambda: False, raising=False)

    def stop(run, envs):
        raise SystemExit("stopped where the run starts")

    monkeypatch.setattr(script.Run, "start", stop)
    with pytest.raises(SystemExit, match="stopped where the run starts"):
        script.main(script.Args(**flags, cuda=False, threads=1, progress=False))
    err = capsys.readouterr().err
    assert err.count(warning) == 1 and err.count("warning: ") == 1, err


# every script at its smallest, a batch of BATCH[script] steps; the machinery under test is the same in all of them
SMALLEST = {
    "ppo_fsmn_cartpole.py": ["--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"],
    "ppo_continuous.py": ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"],
    "ppg_lunarlander.py": ["--env-id", "CartPole-v1", "--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2"]
    + ["--n-iteration", "2", "--num-aux-rollouts", "2", "--e-policy", "1", "--e-value", "1", "--e-auxiliary", "1"],
    "ppo_atari.py": ["--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1"],
    "ppo_transformer_pong.py": ["--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1"]
    + ["--lookback", "4", "--d-model", "16", "--n-layers", "1", "--n-heads", "2"],
}
BATCH = {"ppo_fsmn_cartpole.py": 128, "ppo_continuous.py": 64, "ppg_lunarlander.py": 128, "ppo_atari.py": 32}
BATCH["ppo_transformer_pong.py"] = 32


@pytest.mark.smoke
@pytest.mark.parametrize("script", sorted(SMALLEST))
def test_sigterm_keeps_the_last_iteration_and_the_same_command_resumes_it(tmp_path, script):
    """SIGTERM, what a scheduler sends at a time limit or a preemption, during the second of three iterations of a
    run started with `--resume auto` (none to resume yet): the run stops at its next env step with one line naming the
    signal, its summary and status 143, keeping its logs and the first iteration's checkpoint (saved by the stop:
    --save-interval is far off). The same command, started again as a scheduler requeues a job, goes on from that
    checkpoint in the same folder to the end; once more, it says the run is finished, exits 0 and starts nothing."""
    cwd, batch = str(tmp_path), BATCH[script]
    flags = [*SMALLEST[script], "--threads", "1", "--no-progress", "--total-timesteps", str(3 * batch)]
    flags += ["--save-model", "--save-interval", "1000", "--resume", "auto"]
    stopped = run_script_signalled(script, *flags, signum=signal.SIGTERM, after=1, cwd=cwd)
    assert stopped.returncode == 143, stopped.stdout + stopped.stderr
    assert "Traceback" not in stopped.stderr, stopped.stderr
    (run_dir,) = glob.glob(os.path.join(cwd, "runs", "*"))
    name = os.path.relpath(run_dir, cwd)
    lines = stopped.stdout.splitlines()
    assert lines[0] == "--resume auto found no checkpoint of this run under runs/: starting a new run", lines
    assert lines[-4:] == [
        "stopped by SIGTERM during iteration 2; keeping the logs and the checkpoint of iteration 1",
        lines[-3],
        f"checkpoint: {name}/checkpoint.pt (iteration 1, step {batch})",
        f"tensorboard --logdir {name}",
    ], lines
    assert lines[-3].startswith(f"step {batch}: ") and "steps/s" in lines[-3], lines
    checkpoint = torch.load(os.path.join(run_dir, "checkpoint.pt"), weights_only=True)
    assert (checkpoint["iteration"], checkpoint["global_step"]) == (1, batch)
    # everything logged reached the event file, which the stop closed
    assert [step for step, _ in read_scalars(run_dir)["charts/SPS"]] == [batch]

    resumed = run_script(script, *flags, cwd=cwd)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert resumed.stdout.splitlines()[0] == f"resuming {name}/checkpoint.pt at step {batch}", resumed.stdout
    assert glob.glob(os.path.join(cwd, "runs", "*")) == [run_dir] and len(glob.glob(os.path.join(run_dir, "events.*"))) == 2
    assert [step for step, _ in read_scalars(run_dir)["charts/SPS"]] == [batch, 2 * batch, 3 * batch]
    assert torch.load(os.path.join(run_dir, "checkpoint.pt"), weights_only=True)["global_step"] == 3 * batch

    again = run_script(script, *flags, cwd=cwd)
    assert again.returncode == 0, again.stdout + again.stderr
    finished = f"{name} already finished at step {3 * batch} of --total-timesteps={3 * batch}; nothing to do"
    assert again.stdout.splitlines() == [finished] and again.stderr == "", again.stdout + again.stderr
    assert glob.glob(os.path.join(cwd, "runs", "*")) == [run_dir] and len(glob.glob(os.path.join(run_dir, "events.*"))) == 2


def test_resume_auto_takes_this_runs_newest_checkpoint_and_never_another_runs(in_tmp):
    """Checkpoints of this run (env, exp name, seed), of other runs whose names begin alike, of another script and
    one that is not a checkpoint: `--resume auto` takes the newest of this run's, whatever is newer; without
    --save-model it is one line."""
    script = import_script(SCRIPT[: -len(".py")])
    mine = dict(env_id="CartPole-v1", exp_name="mine", seed=2)
    placed = [  # (folder, what its checkpoint.pt holds), oldest first
        ("CartPole-v1__mine__2__100", {"script": "ppo_fsmn_cartpole", "args": mine}),
        ("CartPole-v1__mine__2__200", {"script": "ppo_fsmn_cartpole", "args": mine}),
        ("CartPole-v1__mine__2__300", {"script": "ppo_continuous", "args": mine}),
        ("CartPole-v1__mine__2__400", {"script": "ppo_fsmn_cartpole", "args": {**mine, "seed": 3}}),
        ("CartPole-v1__mine__20__500", {"script": "ppo_fsmn_cartpole", "args": {**mine, "seed": 20}}),
        ("CartPole-v1__mine2__2__600", {"script": "ppo_fsmn_cartpole", "args": {**mine, "exp_name": "mine2"}}),
        ("Acrobot-v1__mine__2__700", {"script": "ppo_fsmn_cartpole", "args": {**mine, "env_id": "Acrobot-v1"}}),
        ("CartPole-v1__mine__2__800", None),
    ]
    for mtime, (folder, checkpoint) in enumerate(placed):
        path = os.path.join("runs", folder, "checkpoint.pt")
        os.makedirs(os.path.dirname(path))
        if checkpoint is None:
            open(path, "w").write("not a checkpoint")
        else:
            torch.save(checkpoint, path)
        os.utime(path, (1000 + mtime, 1000 + mtime))
    args = script.Args(**mine, save_model=True)
    path, checkpoint = script.own_checkpoint(args)
    assert path == os.path.join("runs", "CartPole-v1__mine__2__200", "checkpoint.pt")
    assert checkpoint == torch.load(path, weights_only=True)  # what the run resumes, loaded once
    assert script.own_checkpoint(script.Args(**{**mine, "seed": 4}, save_model=True)) == (None, None)
    with pytest.raises(SystemExit) as refusal:
        script.own_checkpoint(script.Args(**mine))
    assert str(refusal.value.code).startswith("error: --resume=auto needs --save-model: "), refusal.value.code


# Two runs of a script, forked at once from one process, each with its own flags (a JSON list of two flag lists) and
# its output in run<k>.out; both wait where their names are chosen (the clock read in Run.__init__) until both are
# there, so that they read the same second unless the machine stalls one of them at that very moment.
TWO_AT_ONCE = r"""
import atexit, json, os, runpy, sys, threading, time, traceback

script, barrier, commands = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
clock = time.time


def clock_after_the_barrier():
    if sys._getframe(1).f_code.co_qualname == "Run.__init__":
        open(os.path.join(barrier, str(os.getpid())), "w").close()
        while len(os.listdir(barrier)) < len(commands):
            time.sleep(0.001)
    return clock()


for k, flags in enumerate(commands):
    if os.fork() == 0:
        out = os.open(f"run{k}.out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out, 1), os.dup2(out, 2)
        time.time = clock_after_the_barrier
        sys.argv, sys.path[0] = [script, *flags], os.path.dirname(script)
        code = 0
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)
codes = [os.waitstatus_to_exitcode(os.wait()[1]) for _ in commands]
print(json.dumps(codes))
"""


@pytest.mark.smoke
def test_two_runs_started_at_once_get_their_own_folders_checkpoints_and_wandb_runs(tmp_path):
    """Two runs of the same env, exp name and seed, started at the same moment with different learning rates, as a
    shell loop with `&` starts them: two run folders (the second's name takes a suffix when both read the same
    second), each with its own checkpoint that resumes with its own flags, and two W&B runs (offline)."""
    import json

    script = import_script(SCRIPT[: -len(".py")])
    rates = ["0.001", "0.002"]
    flags = [*TINY, "--total-timesteps", "128", "--no-progress", "--save-model", "--track"]
    commands = json.dumps([[*flags, "--learning-rate", rate] for rate in rates])
    barrier = tmp_path / "barrier"
    (work := tmp_path / "work").mkdir(), barrier.mkdir()
    wrapper = tmp_path / "two_at_once.py"
    wrapper.write_text(TWO_AT_ONCE)
    result = run_script(str(wrapper), os.path.join(ROOT, SCRIPT), str(barrier), commands, cwd=str(work), env=WANDB_OFFLINE)
    outputs = [(work / f"run{k}.out").read_text() for k in range(2)]
    assert result.returncode == 0 and json.loads(result.stdout) == [0, 0], (result.stdout, result.stderr, outputs)

    names = sorted(os.listdir(work / "runs"))
    assert len(names) == 2, names
    first, second = (name.rsplit("__", 1)[1] for name in names)
    if first.split("-")[0] == second.split("-")[0]:  # the same second: the name taken second has a suffix
        assert sorted([first, second]) == [first.split("-")[0], first.split("-")[0] + "-2"], names
    saved_rates = []
    for name in names:
        path = os.path.join(work, "runs", name, "checkpoint.pt")
        checkpoint = torch.load(path, weights_only=True)
        assert checkpoint["run_name"] == name
        assert f"logging to runs/{name}" in "".join(outputs)
        saved_rates.append(checkpoint["args"]["learning_rate"])
        args, resumed = script.cli(["--resume", path])
        assert args.learning_rate == saved_rates[-1] and resumed["run_name"] == name  # its own flags, resumed
    assert sorted(saved_rates) == [float(rate) for rate in rates]
    ids = {run.rsplit("-", 1)[1] for run in offline_runs(work)}
    assert len(offline_runs(work)) == 2 and ids == {hashlib.sha256(name.encode()).hexdigest()[:16] for name in names}


REFUSED_AFTER_THE_NAME = r"""
import os, runpy, sys

import gymnasium

script, *flags = sys.argv[1:]


def refuse(*args, **kwargs):
    raise SystemExit("error: refused after the run's name was chosen")


gymnasium.vector.SyncVectorEnv = refuse
sys.argv, sys.path[0] = [script, *flags], os.path.dirname(script)
runpy.run_path(script, run_name="__main__")
"""


def test_a_run_refused_after_its_name_was_chosen_leaves_nothing(tmp_path):
    """Refused where its envs are built, after its folder was claimed: one line, and no runs/ left behind."""
    (work := tmp_path / "work").mkdir()
    wrapper = tmp_path / "refused.py"
    wrapper.write_text(REFUSED_AFTER_THE_NAME)
    result = run_script(str(wrapper), os.path.join(ROOT, SCRIPT), *TINY, "--total-timesteps", "128", cwd=str(work))
    assert result.returncode == 1 and result.stderr == "error: refused after the run's name was chosen\n", result.stderr
    assert os.listdir(work) == []
