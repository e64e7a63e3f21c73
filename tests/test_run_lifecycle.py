"""A run's life as a user meets it, in ppo_fsmn_cartpole.py (the blocks involved are the same in every
script): a resume from another folder goes on in the checkpoint's own run with its flags, videos and W&B run;
evaluation with videos and W&B; Ctrl-C twice while W&B closes; a full disk while saving; names that would
leave runs/; the end-of-run summary, the plain lines of --no-progress and the labelled progress bar; warnings
once.
W&B runs offline."""

import glob
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import NO_DISPLAY, ROOT, WANDB_OFFLINE, import_script, read_scalars, run_script, wandb_records

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
    """Once a video has reached the W&B run (videos are sent as they are written), Ctrl-C as a terminal does
    (to the whole process group), then Ctrl-C again as soon as the run says it stops, while the checkpoint and
    W&B close.
    Returns the lines up to that one, and the rest of stdout and stderr."""
    try:
        deadline = time.time() + 300  # generous: a start-up on a busy machine takes long
        while time.time() < deadline and not any(media_videos(run) for run in offline_runs(folder)):
            time.sleep(0.2)
        assert any(media_videos(run) for run in offline_runs(folder)), "no video reached W&B while training"
        os.killpg(process.pid, signal.SIGINT)
        lines = []
        while not lines or not lines[-1].startswith("interrupted"):
            lines.append(process.stdout.readline())
            assert lines[-1], "".join(lines)
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
def test_mujoco_video_without_a_display_and_no_deprecation_warning(tmp_path):
    env = {**NO_DISPLAY, "MUJOCO_GL": ""}
    flags = ["--env-id", "HalfCheetah-v5", "--num-envs", "1", "--num-steps", "16", "--num-minibatches", "2"]
    flags += ["--update-epochs", "1", "--total-timesteps", "16", "--threads", "1", "--capture-video"]
    flags += ["--no-progress"]
    run_env = {k: v for k, v in {**os.environ, **env}.items() if k != "MUJOCO_GL"}
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "ppo_continuous.py"), *flags],
        cwd=tmp_path,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
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
