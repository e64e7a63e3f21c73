"""Checkpoints written by the scripts at an earlier commit (tests/fixtures/README.md says which and how) still resume
and evaluate: a change to the run's handling must keep every checkpoint a user has."""

import dataclasses
import io
import lzma
import os

import pytest
import torch
from conftest import ROOT, import_script, run_script

FIXTURES = os.path.join(ROOT, "tests", "fixtures")
SCRIPTS = ["ppo_fsmn_cartpole", "ppo_continuous", "ppg_lunarlander", "ppo_atari", "ppo_transformer_pong"]
# (script, fixture): each script's, and the FSMN's from aae4583, whose separate critic was a trunk twice as wide
FIXTURE_FILES = [(script, script) for script in SCRIPTS] + [("ppo_fsmn_cartpole", "ppo_fsmn_cartpole_aae4583")]


def place_fixture(fixture: str, folder: str) -> str:
    """The fixture as its run left it, runs/<run_name>/checkpoint.pt under `folder`; returns that path, relative."""
    source = os.path.join(FIXTURES, f"{fixture}.pt")
    if os.path.exists(source):
        data = open(source, "rb").read()
    else:  # the large one, compressed
        with lzma.open(f"{source}.xz") as f:
            data = f.read()
    path = os.path.join("runs", torch.load(io.BytesIO(data), weights_only=True)["run_name"], "checkpoint.pt")
    os.makedirs(os.path.join(folder, os.path.dirname(path)))
    with open(os.path.join(folder, path), "wb") as f:
        f.write(data)
    return path


@pytest.mark.smoke
@pytest.mark.parametrize("script, fixture", FIXTURE_FILES)
def test_an_earlier_commits_checkpoint_resumes_and_evaluates(tmp_path, script, fixture):
    cwd = str(tmp_path)
    path = place_fixture(fixture, cwd)
    before = torch.load(os.path.join(cwd, path), weights_only=True)
    assert (before["iteration"], before["global_step"]) == (2, 256)

    # one more iteration of 128 steps, with the checkpoint's own flags, in its own run folder
    result = run_script(f"{script}.py", "--resume", path, "--total-timesteps", "384", cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stdout.splitlines() if line.startswith("note: ")] == [
        "note: --total-timesteps=384 differs from the checkpoint's 256"
    ]
    after = torch.load(os.path.join(cwd, path), weights_only=True)
    assert (after["iteration"], after["global_step"]) == (3, 384)
    kept = {flag: after["args"][flag] for flag in before["args"]}
    assert kept == {**before["args"], "total_timesteps": 384, "num_iterations": 3, "resume": path}
    Args = import_script(script).Args
    # a flag added since the fixture: its default, or the value that builds the network the fixture holds
    defaults = {f.name: f.default for f in dataclasses.fields(Args) if f.init}
    defaults |= getattr(Args, "OLD_CHECKPOINT_FLAGS", {})
    added = {flag: after["args"][flag] for flag in set(after["args"]) - set(before["args"])}
    assert added == {flag: defaults[flag] for flag in added}
    # the same weights; the only entries added since are statistics of a flag added since (the FSMN's --norm-reward)
    assert set(before["model"]) <= set(after["model"])
    assert all(k.startswith("reward_scale.") for k in set(after["model"]) - set(before["model"]))
    assert any(not torch.equal(after["model"][k], before["model"][k]) for k in before["model"])  # it trained

    result = run_script(f"{script}.py", "--eval-checkpoint", path, "--eval-episodes", "1", "--no-eval-deterministic", cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert "eval: 1 episodes, mean return" in result.stdout
