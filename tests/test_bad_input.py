"""Bad input to every top-level script: each kind is refused by its flag parser with one line that names the flag and
what it accepts, before anything is written; a refused --resume leaves its run as it was; a resume with other flags
names each one that differs; a folder where runs/ cannot be made, and Ctrl-C while the libraries load, are one line."""

import dataclasses
import glob
import os
import subprocess
import sys

import pytest
import torch
import tyro
from conftest import ROOT, assert_one_line_error, import_script, run_dirs, run_script

SCRIPTS = sorted(
    os.path.basename(path)[: -len(".py")]
    for pattern in ("ppo_*.py", "ppg_*.py")
    for path in glob.glob(os.path.join(ROOT, pattern))
)

# (flags, the refused flag and value as the error line names them); a script runs the kinds whose flags it has
KINDS = [
    (["--seed", "-1"], "--seed=-1"),
    (["--seed", str(2**32)], f"--seed={2**32}"),
    (["--threads", "-1"], "--threads=-1"),
    (["--save-interval", "0"], "--save-interval=0"),
    (["--eval-episodes", "0"], "--eval-episodes=0"),
    (["--final-eval-episodes", "-1"], "--final-eval-episodes=-1"),
    (["--num-envs", "0"], "--num-envs=0"),
    (["--num-steps", "0"], "--num-steps=0"),
    (["--total-timesteps", "1"], "--total-timesteps=1"),
    (["--learning-rate", "nan"], "--learning-rate=nan"),
    (["--learning-rate", "-1.0"], "--learning-rate=-1.0"),
    (["--learning-rate", "inf"], "--learning-rate=inf"),
    (["--gamma", "1.5"], "--gamma=1.5"),
    (["--gae-lambda", "-0.1"], "--gae-lambda=-0.1"),
    (["--num-minibatches", "0"], "--num-minibatches=0"),
    (["--update-epochs", "0"], "--update-epochs=0"),
    (["--clip-coef", "-1.0"], "--clip-coef=-1.0"),
    (["--ent-coef", "nan"], "--ent-coef=nan"),
    (["--vf-coef", "-1.0"], "--vf-coef=-1.0"),
    (["--max-grad-norm", "-1.0"], "--max-grad-norm=-1.0"),
    (["--target-kl", "0.0"], "--target-kl=0.0"),
    (["--memory-stride", "0"], "--memory-stride=0"),
    (["--memory-gate", "--memory-decay"], "--memory-decay=True"),
    (["--long-memory", "lstm"], "--long-memory=lstm"),
    (["--long-memory", "decay", "--memory-gate"], "--long-memory=decay"),
]


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_kind_of_bad_number_is_one_line_naming_the_flag(name):
    script = import_script(name)
    flags = {f"--{field.name.replace('_', '-')}" for field in dataclasses.fields(script.Args) if field.init}
    kinds = [(argv, refused) for argv, refused in KINDS if argv[0] in flags]
    assert len(kinds) >= 15, f"{name} checks only {len(kinds)} kinds"
    for argv, refused in kinds:
        with pytest.raises(SystemExit) as refusal:
            script.cli(argv)  # the command line's parser: tyro's, and a choice it would refuse in a box checked first
        message = str(refusal.value.code)
        assert message.startswith(f"error: {refused} must be ") and "\n" not in message, (argv, message)


CHEAP = {  # a script whose runs are quick enough for a resume test; the resume block is the same in every script
    "ppo_fsmn_cartpole": ["--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"],
}
WIDER = {"ppo_fsmn_cartpole": ["--hidden-dim", "32"]}


@pytest.mark.smoke
@pytest.mark.parametrize("name", sorted(CHEAP))
def test_refused_resume_writes_nothing_and_other_flags_are_named(tmp_path, name):
    cwd, tiny = str(tmp_path), [*CHEAP[name], "--no-progress"]
    result = run_script(f"{name}.py", *tiny, "--total-timesteps", "256", "--save-model", cwd=cwd)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(cwd)
    path = os.path.join(run_dir, "checkpoint.pt")
    before = sorted(os.listdir(run_dir))

    # another network shape, a folder, a checkpoint without RNG states: one line each, and the run folder untouched
    result = run_script(f"{name}.py", *tiny, *WIDER[name], "--total-timesteps", "512", "--resume", path, cwd=cwd)
    differing = f"{WIDER[name][0]}={WIDER[name][1]} differs"  # the flag that made the shape differ is named
    assert_one_line_error(result, f"--resume={path}", "another shape", differing)
    result = run_script(f"{name}.py", *tiny, "--total-timesteps", "512", "--resume", run_dir, cwd=cwd)
    assert_one_line_error(result, f"--resume={run_dir}", "folder", "checkpoint.pt")
    old = os.path.join(cwd, "old.pt")
    torch.save({k: v for k, v in torch.load(path, weights_only=True).items() if k != "rng_states"}, old)
    result = run_script(f"{name}.py", *tiny, "--total-timesteps", "512", "--resume", old, cwd=cwd)
    assert_one_line_error(result, f"--resume={old}", "RNG state")
    assert sorted(os.listdir(run_dir)) == before and run_dirs(cwd) == [run_dir]
    # evaluation of a checkpoint whose weights another version named otherwise: one line, not a traceback
    checkpoint = torch.load(path, weights_only=True)
    torch.save({**checkpoint, "model": {f"old.{k}": v for k, v in checkpoint["model"].items()}}, old)
    assert_one_line_error(run_script(f"{name}.py", "--eval-checkpoint", old, cwd=cwd), "--eval-checkpoint", "another shape")

    # other flags that keep the shapes: the run goes on and names each flag that differs
    result = run_script(
        f"{name}.py", *tiny, "--total-timesteps", "512", "--learning-rate", "0.01", "--save-model", "--resume", path, cwd=cwd
    )
    assert result.returncode == 0, result.stderr
    assert "note: --learning-rate=0.01 differs from the checkpoint's" in result.stdout
    assert "note: --total-timesteps=512 differs from the checkpoint's 256" in result.stdout
    assert result.stdout.count("note: ") == 2, result.stdout


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_folder_where_runs_cannot_be_created_is_one_line(tmp_path, monkeypatch, name):
    script = import_script(name)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("")  # a file where the runs/ folder would go
    args = tyro.cli(script.Args, args=["--num-envs", "2", "--num-minibatches", "2", "--no-progress"])
    args.total_timesteps, args.num_iterations = args.batch_size, 1  # one iteration, should the check be missing
    with pytest.raises(SystemExit) as refusal:
        script.main(args)
    message = str(refusal.value.code)
    assert message.startswith("error: cannot create runs/") and "\n" not in message, message
    assert os.listdir(tmp_path) == ["runs"]


@pytest.mark.parametrize("flag", ["--resume", "--eval-checkpoint"])
@pytest.mark.parametrize("name", SCRIPTS)
def test_a_checkpoint_of_another_script_is_one_line_and_writes_nothing(tmp_path, name, flag):
    other = SCRIPTS[(SCRIPTS.index(name) + 1) % len(SCRIPTS)]
    path = str(tmp_path / "other.pt")
    torch.save({"script": other, "args": {}, "model": {}}, path)
    result = run_script(f"{name}.py", flag, path, cwd=str(tmp_path))
    assert_one_line_error(result, f"{flag}={path}", other, f"{name}.py")
    assert sorted(os.listdir(tmp_path)) == ["other.pt"]


CTRL_C_ON_TORCH = """
import os, runpy, signal, sys

class CtrlCOnTorch:  # press Ctrl-C the moment the script starts to import torch
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            os.kill(os.getpid(), signal.SIGINT)

sys.meta_path.insert(0, CtrlCOnTorch())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("name", SCRIPTS)
def test_ctrl_c_while_the_libraries_load_is_one_line_and_status_130(tmp_path, name):
    script = os.path.join(ROOT, f"{name}.py")
    argv = [sys.executable, "-c", CTRL_C_ON_TORCH, script, "--help"]
    result = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True)
    assert (result.returncode, result.stdout, result.stderr) == (130, "interrupted\n", ""), result.stderr


RAISES = """import sys
print("to stdout")
if sys.argv[1:] == ["exit"]:
    sys.exit("a message")
raise ValueError("not a number")
"""


@pytest.mark.parametrize("argv", [["ppo_fsmn_cartpole.py", "--num-envs", "0"], ["raises.py", "exit"], ["raises.py"]])
def test_a_forked_run_exits_and_prints_as_a_fresh_interpreter(tmp_path, monkeypatch, argv):
    """`run_script` forks script runs from a process that has imported torch (see conftest): the same exit status,
    output and traceback as a fresh interpreter's."""
    (tmp_path / "raises.py").write_text(RAISES)
    script = argv[0] if argv[0].startswith("ppo") else str(tmp_path / argv[0])
    forked = run_script(script, *argv[1:], cwd=str(tmp_path))
    monkeypatch.setenv("RUN_SCRIPTS_FRESH", "1")
    fresh = run_script(script, *argv[1:], cwd=str(tmp_path))
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert fresh.returncode != 0 and fresh.stderr
