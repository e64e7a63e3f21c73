"""benchmarks/tune.py: the objectives against their definitions on made-up runs, search spaces refused in one
line, storages, the report, and tiny studies on CartPole through the CLI: interrupted with Ctrl-C, resumed and
pruned, and on a local Ray instance."""

import dataclasses
import glob
import itertools
import json
import os
import signal
import sqlite3
import sys
import time

import numpy as np
import optuna
import pytest
import tyro
from conftest import ROOT, assert_one_line_error, import_script, repository_unchanged, run_script, start_tool

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import report  # noqa: E402
import tune  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

# four envs of 64 steps an iteration, eight iterations, one thread (a tiny net): a trial's run takes seconds
TINY = {
    "script": "ppo_fsmn_cartpole.py",
    "params": {"learning-rate": {"type": "categorical", "choices": [0.01, 0.0]}},
    "fixed": {"num-envs": 4, "num-steps": 64, "num-minibatches": 2, "update-epochs": 4, "threads": 1},
    "seeds": [1],
    "total_timesteps": 2048,
    "envs": {"CartPole-v1": {"scores": [0, 500]}},
}
FAST = ["--startup-trials", "1", "--warmup", "0", "--poll", "0.2"]
COMMAND = "python ppo_fsmn_cartpole.py --num-envs 4 --num-steps 64 --num-minibatches 2 --update-epochs 4 --threads 1"


def made_up_run(returns: list[float], every: int = 100) -> report.Run:
    steps = np.arange(1, len(returns) + 1) * every
    return report.Run("Env-v0__t", 1, steps, np.array(returns, dtype=float), steps / 100.0, 0.0, 0.0)


def test_objectives_against_their_definitions():
    """last: the mean of the last `window` returns; auc: the trapezoid area over the steps, divided by their
    span; steps_to: the first step at which the mean of the last `window` returns reaches the threshold, as a
    fraction of the budget (never: 2); returns normalised by (min, max); each on the episodes up to a percent
    of the budget."""
    run = made_up_run([0, 10, 20, 30, 40, 50, 60, 70, 80, 90])  # steps 100 ... 1000
    env = {"scores": [0, 100], "total_timesteps": 1000, "threshold": 45}
    assert tune.run_score(run, env, "last", 4) == pytest.approx(((60 + 70 + 80 + 90) / 4 / 100, 75))
    area = sum((a + b) / 2 * 100 for a, b in zip(run.returns[:-1], run.returns[1:]))
    assert tune.run_score(run, env, "auc", 4) == pytest.approx((area / 900 / 100, area / 900))
    assert tune.run_score(run, env, "steps_to", 4) == (0.7, 700)  # (30 + 40 + 50 + 60) / 4 = 45 at step 700
    assert tune.run_score(run, env, "last", 4, percent=50) == pytest.approx((0.25, 25))  # steps 100 ... 500
    assert tune.run_score(run, env, "steps_to", 4, percent=50)[0] == tune.NEVER
    assert tune.run_score(None, env, "last", 4) is None
    space = {"envs": {"A": env, "B": {**env, "scores": [-100, 100]}}, "objective": "last", "window": 4}
    value = tune.trial_value({("A", 1): run, ("B", 1): run}, space)
    assert value == pytest.approx((0.75 + (75 + 100) / 200) / 2)
    assert tune.trial_value({("A", 1): run, ("B", 1): None}, space) is None


def test_worst_env_aggregate_against_its_definition():
    """aggregate worst: each env's scores averaged over its seeds, then the lowest env's mean (the highest with
    steps_to, which is minimised); mean: every run's score averaged."""
    # normalised last: 0, 0.5 and 1; steps_to: mid and high reach 50 at step 400 (a full window), low never
    low, mid, high = made_up_run([0] * 10), made_up_run([50] * 10), made_up_run([100] * 10)
    env = {"scores": [0, 100], "total_timesteps": 1000, "threshold": 50}
    space = {"envs": {"A": env, "B": env}, "objective": "last", "window": 4, "aggregate": "worst"}
    # by env A 0.25, B 1.0; by seed 0.5 and 0.75; the lowest run 0; the mean 0.625
    runs = {("A", 1): low, ("A", 2): mid, ("B", 1): high, ("B", 2): high}
    assert tune.trial_value(runs, space) == pytest.approx(0.25)
    assert tune.trial_value(runs, {**space, "aggregate": "mean"}) == pytest.approx(0.625)
    steps = {**space, "objective": "steps_to"}  # by env A 2, B 0.4; by seed and the mean 1.2
    assert tune.trial_value({**runs, ("A", 2): low}, steps) == pytest.approx(tune.NEVER)
    assert tune.trial_value({**runs, ("A", 1): high}, steps) == pytest.approx(0.4)
    # the value the pruner sees at 30% of the budget: no run has a full window yet
    assert tune.trial_value({**runs, ("A", 1): high}, steps, percent=30) == pytest.approx(tune.NEVER)
    assert tune.check_space(TINY, "space.yaml")["aggregate"] == "mean"


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_storages_and_a_stale_trial(tmp_path):
    """The default SQLite storage has a heartbeat: a trial left running by a killed tuner is failed once it
    misses it (its last heartbeat older than STALE seconds), and its flags are queued again; a path ending in
    .log is a journal file; anything else is one line. A study of that name made with another search space is
    refused."""
    args = tune.Args(space="tiny.json")
    space = tune.check_space(TINY, "tiny.json")
    study = tune.open_study(args, "tiny", space, tune.open_storage(args, str(tmp_path)))
    trial = study.ask()
    trial.suggest_categorical("learning-rate", [0.01, 0.0])
    study._storage.record_heartbeat(trial._trial_id)
    optuna.storages.fail_stale_trials(study)  # a fresh heartbeat: still running
    assert [t.state.name for t in study.trials] == ["RUNNING"]
    # the tuner killed STALE seconds ago: its last heartbeat as old as that (SQLite's clock counts whole seconds)
    with sqlite3.connect(tmp_path / "study.db") as db:
        db.execute("UPDATE trial_heartbeats SET heartbeat = datetime(heartbeat, ?)", (f"-{tune.STALE + 2} seconds",))
    optuna.storages.fail_stale_trials(study)
    assert [(t.state.name, t.params) for t in study.trials] == [
        ("FAIL", trial.params),
        ("WAITING", trial.params),
    ]
    journal = tune.open_storage(tune.Args(storage=str(tmp_path / "study.log")), str(tmp_path))
    assert isinstance(journal, optuna.storages.JournalStorage)
    with pytest.raises(SystemExit, match=r"^error: --storage=study\.db is not a database URL .* \.log file$"):
        tune.open_storage(tune.Args(storage="study.db"), str(tmp_path))
    with pytest.raises(SystemExit, match=r"^error: --study=tiny exists with another search space"):
        tune.open_study(args, "tiny", {**space, "seeds": [2]}, study._storage)
    with pytest.raises(SystemExit, match=r"^error: --study=tiny exists with another search space"):
        tune.open_study(args, "tiny", {**space, "aggregate": "worst"}, study._storage)
    # a study recorded before `aggregate` was a key resumes with the default
    study.set_user_attr("space", {key: value for key, value in space.items() if key != "aggregate"})
    assert tune.open_study(args, "tiny", space, study._storage).study_name == "tiny"


def test_report_lists_every_trial_and_the_best_command(tmp_path):
    """The report of a study (made-up trials here): the best flags as a command line, a row per trial with its
    state, value, flags and raw returns per env, and Optuna's plots, parameter importances among them."""
    gamma = {"type": "float", "low": 0.9, "high": 1}
    space = tune.check_space({**TINY, "params": {**TINY["params"], "gamma": gamma}}, "s")
    study = optuna.create_study(direction="maximize")
    distributions = {
        "learning-rate": optuna.distributions.CategoricalDistribution([0.01, 0.0]),
        "gamma": optuna.distributions.FloatDistribution(0.9, 1),
    }
    for value, rate, gamma in [(0.2, 0.0, 0.95), (0.5, 0.01, 0.99), (0.4, 0.01, 0.91)]:
        trial = optuna.trial.create_trial(
            params={"learning-rate": rate, "gamma": gamma},
            distributions=distributions,
            value=value,
            user_attrs={"raw CartPole-v1 1": value * 500},
        )
        study.add_trial(trial)
    paths = tune.write_report(study, space, tune.Args(), "tiny", str(tmp_path))
    text = (tmp_path / "tune_tiny.md").read_text()
    assert f"{COMMAND} --learning-rate 0.01 --gamma 0.99\n" in text and "Best: trial 1, value 0.5:" in text
    assert "| trial | state | value | learning-rate | gamma | CartPole-v1 (last) | wall s |" in text
    assert "| 2 | complete | 0.4 | 0.01 | 0.91 | 200 |" in text
    written = [f"tune_tiny{end}" for end in (".md", "_history.png", "_importances.png")]
    assert sorted(os.path.basename(path) for path in paths) == written


def test_report_of_steps_to_gives_steps_and_never(tmp_path):
    """With objective steps_to a trial's cell is its seeds' steps to the threshold, 'never' for a seed short of it,
    and the objective is not said to be normalised by the env's scores (it is a fraction of the budget)."""
    space = {**TINY, "seeds": [1, 2, 3], "objective": "steps_to"}
    space = tune.check_space({**space, "envs": {"CartPole-v1": {"scores": [0, 500], "threshold": 475}}}, "s")
    study = optuna.create_study(direction="minimize")
    trial = optuna.trial.create_trial(
        params={"learning-rate": 0.01},
        distributions={"learning-rate": optuna.distributions.CategoricalDistribution([0.01, 0.0])},
        value=(1024 / 2048 + 2 + 1536 / 2048) / 3,
        user_attrs={"raw CartPole-v1 1": 1024, "raw CartPole-v1 2": None, "raw CartPole-v1 3": 1536},
    )
    study.add_trial(trial)
    tune.write_report(study, space, tune.Args(), "tiny", str(tmp_path))
    text = (tmp_path / "tune_tiny.md").read_text()
    assert "| 0 | complete | 1.083 | 0.01 | 1,536 (1,024 to never), 1 of 3 never |" in text
    assert "minimised, averaged over the trial's runs" in text and "normalised" not in text
    tune.write_report(study, {**space, "aggregate": "worst"}, tune.Args(), "tiny", str(tmp_path))
    text = (tmp_path / "tune_tiny.md").read_text()
    assert "minimised, averaged over each env's seeds; a trial's value is its worst env's (the lowest," in text


@pytest.mark.parametrize("preset", tune.PRESETS)
def test_presets_give_flags_their_script_accepts(preset):
    """Every preset is a valid search space, and its script accepts every corner of it: each flag at its low
    and high end (or each choice), all combinations, beside the fixed flags, at the smallest budget."""
    space = tune.check_space(tune.PRESETS[preset], preset)
    script = import_script(space["script"][: -len(".py")])
    corners = [spec.get("choices", [spec.get("low"), spec.get("high")]) for spec in space["params"].values()]
    budget = min(env["total_timesteps"] for env in space["envs"].values())
    fixed = tyro.cli(script.Args, args=tune.as_flags(space["fixed"]))  # the fixed flags as the script parses them
    for values in itertools.product(*corners):
        fields = {flag.replace("-", "_"): value for flag, value in zip(space["params"], values)}
        dataclasses.replace(fixed, **fields, total_timesteps=budget)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"objectiv": "last"}, "objectiv: 'last' is not a key of a search space"),
        ({"script": "nope.py"}, "script: 'nope.py' is not a top-level script: "),
        (
            {"params": {"learnin-rate": {"type": "log", "low": 1e-4, "high": 1e-3}}},
            "params.learnin-rate: 'learnin-rate'",
        ),
        (
            {"params": {"seed": {"type": "int", "low": 1, "high": 3}}},
            "other than env-id, exp-name, seed, total-timesteps",
        ),
        (
            {"params": {"gamma": {"type": "uniform", "low": 0.9, "high": 1}}},
            "params.gamma.type: 'uniform' is not one of",
        ),
        (
            {"params": {"gamma": {"type": "float", "low": 0.99, "high": 0.9}}},
            "params.gamma.high: 0.9 is not above low",
        ),
        (
            {"params": {"gamma": {"type": "log", "low": 0, "high": 0.9}}},
            "params.gamma.low: 0.0 is not a number above 0",
        ),
        (
            {"params": {"gamma": {"type": "float", "low": "x", "high": 1}}},
            "params.gamma.low: 'x' is not a number",
        ),
        (
            {"params": {"hidden-dim": {"type": "int", "low": 8.5, "high": 9}}},
            "params.hidden-dim.low: 8.5 is not an integer",
        ),
        (
            {"params": {"gamma": {"type": "categorical", "choices": []}}},
            "params.gamma.choices: [] is not a non-empty",
        ),
        ({"fixed": {"learning-rate": 0.1}}, "fixed.learning-rate: 0.1 is not for a flag in params too"),
        ({"seeds": []}, "seeds: [] is not a non-empty list of integers"),
        ({"objective": "best"}, "objective: 'best' is not one of last, auc, steps_to"),
        ({"window": 0}, "window: 0 is not at least 1"),
        ({"aggregate": "min"}, "aggregate: 'min' is not one of mean, worst"),
        (
            {"envs": {"CartPole-v1": None, "Acrobot-v1": None}},
            "envs.CartPole-v1.scores: None is not optional with several",
        ),
        (
            {"envs": {"CartPole-v1": {"scores": [500, 0]}}},
            "envs.CartPole-v1.scores: [500, 0] is not a pair [min, max]",
        ),
        (
            {"objective": "steps_to"},
            "envs.CartPole-v1.threshold: None is not optional with objective steps_to",
        ),
    ],
)
def test_bad_search_space_is_one_line(change, message):
    with pytest.raises(SystemExit, match=r"^error: space\.yaml: ") as refused:
        tune.check_space({**TINY, **change}, "space.yaml")
    assert message in str(refused.value) and "\n" not in str(refused.value), refused.value


@pytest.mark.smoke
def test_bad_search_space_file_writes_nothing(tmp_path):
    """Through the CLI: a YAML file with a bad value is one line naming the key; the study writes nothing."""
    (tmp_path / "space.yaml").write_text(
        "script: ppo_fsmn_cartpole.py\nparams:\n  gamma: {type: log, low: 0.9, high: 1.5}\n"
        "  update-epochs: {type: int, low: 1, high: many}\nenvs: [CartPole-v1]\n"
    )
    result = run_script("benchmarks/tune.py", "--space", "space.yaml", cwd=str(tmp_path))
    assert_one_line_error(result, "params.update-epochs.high: 'many' is not an integer")
    assert os.listdir(tmp_path) == ["space.yaml"]


def study_states(path: str, name: str) -> list[tuple[str, dict]]:
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{path}")
    return [(t.state.name, t.params) for t in study.trials]


@pytest.mark.smoke
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_tiny_study_stops_on_ctrl_c_or_sigterm_resumes_and_prunes(tmp_path, signum):
    """A study on CartPole with no --out (it works under benchmark_runs/tune/<study>): a trial that learns,
    then one that cannot (learning rate 0; both queued), interrupted by Ctrl-C or SIGTERM: the tuner stops its
    run, marks it failed, queues its flags again, writes the report and exits with 128 + the signal, without a
    traceback. The same command runs the queued flags, and the pruner stops them against the first trial's
    values at the same steps."""
    (tmp_path / "tiny.json").write_text(json.dumps(TINY))
    out = tmp_path / "benchmark_runs" / "tune" / "tiny"
    out.mkdir(parents=True)
    storage = f"sqlite:///{out / 'study.db'}"
    queued = optuna.create_study(storage=storage, study_name="tiny", direction="maximize")
    queued.enqueue_trial({"learning-rate": 0.01})
    queued.enqueue_trial({"learning-rate": 0.0})
    flags = ["--space", "tiny.json", "--trials", "2", *FAST]
    with repository_unchanged():
        tuner = start_tool("benchmarks/tune.py", flags, str(tmp_path))
        try:
            while tuner.poll() is None and not glob.glob(str(out / "trials" / "1" / "logs" / "*.log")):
                time.sleep(0.2)
            os.killpg(tuner.pid, signum)
            stdout, stderr = tuner.communicate(timeout=600)  # a slow machine: the report still to write
        finally:
            if tuner.poll() is None:
                os.killpg(tuner.pid, signal.SIGKILL)
        assert tuner.returncode == 128 + signum, stdout + stderr
        assert "Traceback" not in stderr, stderr
        assert "trial 0: " in stdout
        assert "trial 1 interrupted: its flags run first when the study resumes" in stdout
        states = study_states(str(out / "study.db"), "tiny")
        assert states == [
            ("COMPLETE", {"learning-rate": 0.01}),
            ("FAIL", {"learning-rate": 0.0}),
            ("WAITING", {"learning-rate": 0.0}),
        ]
        assert "| 1 | fail |" in (out / "tune_tiny.md").read_text()

        again = run_script("benchmarks/tune.py", *flags, cwd=str(tmp_path))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "study tiny: 1 of 2 trials finished" in again.stdout and "trial 2 pruned at" in again.stdout
    states = study_states(str(out / "study.db"), "tiny")
    assert states[2] == ("PRUNED", {"learning-rate": 0.0})
    text = (out / "tune_tiny.md").read_text()
    assert "3 trials (1 complete, 1 pruned, 1 fail)" in text and "| 2 | pruned at " in text
    assert f"{COMMAND} --learning-rate 0.01\n" in text
    for kind in ("history", "intermediate"):
        assert f"![tune_tiny_{kind}.png](tune_tiny_{kind}.png)" in text
        assert (out / f"tune_tiny_{kind}.png").exists()
    runs = glob.glob(str(out / "trials" / "*" / "runs" / "CartPole-v1__trial*__1__*"))
    # trial 1 was stopped while its script started: before its run folder, mostly, but on a busy machine after
    assert sorted(run.split(os.sep)[-3] for run in runs) in (["0", "2"], ["0", "1", "2"])


@pytest.mark.smoke
def test_each_seed_is_scored_on_its_own_run(tmp_path):
    """A trial's runs share its folder: each seed's value comes from its own run's events, not a sibling's."""
    space = {**TINY, "seeds": [1, 2]}
    (tmp_path / "tiny.json").write_text(json.dumps(space))
    flags = ["--space", "tiny.json", "--trials", "1", "--pruner", "none", "--out", str(tmp_path), *FAST]
    result = run_script("benchmarks/tune.py", *flags, cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    trial = optuna.load_study(study_name="tiny", storage=f"sqlite:///{tmp_path / 'study.db'}").trials[0]
    space = tune.check_space(space, "tiny.json")
    env = space["envs"]["CartPole-v1"]
    raw = {seed: trial.user_attrs[f"raw CartPole-v1 {seed}"] for seed in (1, 2)}
    for seed in (1, 2):
        (run_dir,) = glob.glob(str(tmp_path / "trials" / "0" / "runs" / f"CartPole-v1__trial0__{seed}__*"))
        assert raw[seed] == tune.run_score(report.load_run(run_dir), env, space["objective"], space["window"])[1]
    assert raw[1] != raw[2]


@pytest.mark.smoke
def test_study_on_a_local_ray_instance(tmp_path):
    """--backend ray: each run a Ray task on a local instance, its episodes streamed back while it runs (the
    trial reports intermediate values), its events and log unpacked into the trial's folder when it ends."""
    (tmp_path / "tiny.json").write_text(json.dumps(TINY))
    flags = [
        "--space",
        "tiny.json",
        "--trials",
        "1",
        "--pruner",
        "none",
        "--backend",
        "ray",
        "--out",
        str(tmp_path),
    ]
    result = run_script("benchmarks/tune.py", *flags, *FAST, cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 of 1 trials finished" in result.stdout
    (run_dir,) = glob.glob(str(tmp_path / "trials" / "0" / "runs" / "CartPole-v1__trial0__1__*"))
    assert report.load_run(run_dir).steps[-1] > 0
    assert "=== exit 0" in (tmp_path / "trials" / "0" / "logs" / "CartPole-v1__1.log").read_text()
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{tmp_path / 'study.db'}")
    assert study.trials[0].intermediate_values and (tmp_path / "tune_tiny_intermediate.png").exists()


def test_enqueue_reads_the_scripts_defaults_and_refuses_bad_settings():
    """--enqueue defaults: the script's own defaults of the space's flags, as its Args has them; a setting is some of
    the space's flags with values in range, the rest at the script's defaults (where the space holds them); anything
    else is one line naming the setting and what it accepts."""
    space = tune.check_space(tune.PRESETS["continuous"], "preset continuous")
    defaults = {f.name.replace("_", "-"): f.default for f in dataclasses.fields(import_script("ppo_continuous").Args)}
    own = {flag: defaults[flag] for flag in space["params"]}
    assert tune.enqueued("defaults", space) == own
    assert tune.enqueued("gamma=0.95 --learning-rate 3e-4", space) == {**own, "gamma": 0.95, "learning-rate": 3e-4}
    # a flag left out whose default the space does not hold is left to the sampler
    narrow = {**space, "params": {**space["params"], "gamma": {"type": "categorical", "choices": [0.98, 0.995]}}}
    assert defaults["gamma"] not in (0.98, 0.995)
    without_gamma = {flag: value for flag, value in own.items() if flag != "gamma"}
    assert tune.enqueued("learning-rate=3e-4", narrow) == {**without_gamma, "learning-rate": 3e-4}
    optional = {**space, "params": {**space["params"], "gamma": {"type": "categorical", "choices": [None, 0.99]}}}
    assert tune.enqueued("gamma=None", optional)["gamma"] is None
    for setting, message in [
        ("gamma=0.9", "--gamma 0.9 is not one of [0.95, 0.98, 0.99, 0.995, 0.999]"),
        ("update-epochs=2.5", "--update-epochs 2.5 is not an integer in [2, 12]"),
        ("clip-coef=nan", "--clip-coef nan is not in [0.1, 0.3]"),
        ("seed=3", "'seed' is not one of the space's flags with a value"),
        ("learning-rate", "'learning-rate' is not one of the space's flags with a value"),
    ]:
        with pytest.raises(SystemExit) as refusal:
            tune.enqueued(setting, space)
        assert str(refusal.value).startswith(f"error: --enqueue={setting!r}: {message}")
        assert "\n" not in str(refusal.value)
