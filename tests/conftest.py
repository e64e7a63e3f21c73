"""Shared helpers: run a script through its CLI, read its TensorBoard events, import it as a module."""

import contextlib
import glob
import hashlib
import importlib
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# CleanRL's metric names and the total loss, written once per iteration (episode charts once an episode ends): the
# iteration's last minibatch's losses (clipfrac: the mean), and under losses/mean/ every one's mean over its minibatches
LOSS_STATS = ("value_loss", "policy_loss", "entropy", "old_approx_kl", "approx_kl", "loss", "clipfrac")
ITERATION_TAGS = {"charts/SPS", "charts/learning_rate", "losses/explained_variance"}
ITERATION_TAGS |= {f"losses/{name}" for name in LOSS_STATS} | {f"losses/mean/{name}" for name in LOSS_STATS}
EPISODE_TAGS = {"charts/episodic_return", "charts/episodic_length"}


# torch's default thread count, one per core: what a script reads on import as TORCH_THREADS, the most that its
# `--threads 0` takes
CORE_THREADS = torch.get_num_threads()


def import_script(name: str):
    """Scripts start nothing on import: tests use their pure functions and classes directly. Imported at torch's
    default thread count, whatever the test runs at (`one_torch_thread`), so that their TORCH_THREADS is a fresh
    interpreter's."""
    threads = torch.get_num_threads()
    torch.set_num_threads(CORE_THREADS)
    try:
        return importlib.import_module(name)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Every test starts torch in this process at one thread, restored after it (a run's threads=0 takes the free
    cores instead): most networks here are tiny, and a second thread costs more than it gives, far more on a busy
    machine. The Pong transformer's runs, large enough to gain from two threads on an idle machine, keep --threads 0."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# Starting Python and importing torch takes seconds, and the suite runs scripts hundreds of times: `run_script`
# forks each run from one process that has imported gymnasium, numpy, torch, tyro and TensorBoard's writer, and two
# modules that a run would otherwise load in its first seconds: torch._dynamo (torch.optim's constructors import it)
# and gymnasium's save_video (moviepy). None of them reads the variables a test sets or starts a thread. A forked run
# is the script's own `__main__`, in its own process, with its own folder, environment and output; what a fresh
# interpreter would have warned on import is replayed on its stderr. RUN_SCRIPTS_FRESH=1 starts a fresh interpreter
# for every run instead; so does an environment that sets a variable those imports read.
FORK_SERVER = r"""
import atexit, json, os, runpy, signal, sys, threading, warnings

with warnings.catch_warnings(record=True) as IMPORT_WARNINGS:
    import gymnasium, numpy, torch, tyro
    from torch.utils.tensorboard import SummaryWriter
    import torch._dynamo
    from gymnasium.utils import save_video


def run(request):
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path in ((0, os.devnull), (1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.stdout.reconfigure(write_through=True)
    sys.stderr.reconfigure(write_through=True)
    sys.argv, sys.path[0] = request["argv"], os.path.dirname(request["argv"][0])
    for w in IMPORT_WARNINGS:
        warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    code = 0
    try:
        runpy.run_path(request["argv"][0], run_name="__main__")
    except SystemExit as e:  # as the interpreter reads it: None is 0, a number the status, anything else printed
        if isinstance(e.code, int) or e.code is None:
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException as e:  # its traceback from the script's own frame on, as a fresh interpreter prints it
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != request["argv"][0]:
            tb = tb.tb_next
        e = e.with_traceback(tb or e.__traceback__)
        sys.excepthook(type(e), e, e.__traceback__)
        code = -signal.SIGINT if isinstance(e, KeyboardInterrupt) else 1
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    if code == -signal.SIGINT:  # an uncaught Ctrl-C ends the interpreter by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        run(request)
    print(json.dumps(pid), flush=True)
    print(json.dumps(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])), flush=True)
"""
IMPORTED_READS = ("OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "TORCH", "PYTORCH", "CUDA", "NVIDIA", "LD_", "PYTHON")
_fork_server: list[subprocess.Popen] = []


def fork_server() -> subprocess.Popen:
    if not _fork_server or _fork_server[0].poll() is not None:
        server = subprocess.Popen(
            [sys.executable, "-c", FORK_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
        )
        _fork_server[:] = [server]
    return _fork_server[0]


def run_script(
    script: str, *flags: str, cwd: str, env: dict | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run `python <script> <flags>` in `cwd` and return the finished process (stdout and stderr captured)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    argv = [os.path.join(ROOT, script), *flags]
    changed = {key for key in full_env if full_env[key] != os.environ.get(key)} - {"PYTHONUNBUFFERED"}
    if os.environ.get("RUN_SCRIPTS_FRESH") or any(key.startswith(IMPORTED_READS) for key in changed):
        return subprocess.run([sys.executable, *argv], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)
    server = fork_server()
    with tempfile.TemporaryDirectory() as folder:
        out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        request = dict(argv=argv, cwd=os.path.abspath(cwd), env=full_env, stdout=out, stderr=err)
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        pid = json.loads(server.stdout.readline())
        expired = threading.Event()
        timer = threading.Timer(timeout, lambda: (expired.set(), os.kill(pid, signal.SIGKILL)))
        timer.start()
        returncode = json.loads(server.stdout.readline())
        timer.cancel()
        with open(out) as stdout, open(err) as stderr:
            result = subprocess.CompletedProcess([sys.executable, *argv], returncode, stdout.read(), stderr.read())
    if expired.is_set():
        raise subprocess.TimeoutExpired(result.args, timeout, result.stdout, result.stderr)
    return result


def copy_alone(script: str, folder) -> str:
    """`script` copied into `folder`, empty until then, and nothing beside it: run from there (the project's root is
    not on its path), it shows that the script needs no other file of the project. Returns the copy's path."""
    assert not os.listdir(folder), os.listdir(folder)
    return shutil.copy(os.path.join(ROOT, script), folder)


@contextlib.contextmanager
def repository_unchanged():
    """What `git status` says of the repository, and every file under benchmarks/results/, are the same after
    the block as before it: a tool run without --results writes nothing there."""

    def state():
        git = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True)
        status = git.stdout
        results = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "results", "*")))
        return status, {path: hashlib.sha256(open(path, "rb").read()).hexdigest() for path in results}

    before = state()
    yield
    assert state() == before


def start_tool(tool: str, flags: list[str], cwd: str) -> subprocess.Popen:
    """A tool (benchmarks/run.py, tune.py) in a process group of its own, SIGINT at its default (pytest may
    ignore it), output captured: a test sends it Ctrl-C as a terminal does, with os.killpg."""
    return subprocess.Popen(
        [sys.executable, os.path.join(ROOT, tool), *flags],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
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


# The script run as its own `__main__`, with one change: its TensorBoard writer presses Ctrl-C as soon as the mean of the
# last `window` episode returns it logged reaches `threshold` (each return taken as the event file keeps it, a float32).
UNTIL_REACHED = r"""
import os, runpy, signal, sys

import numpy as np
import torch.utils.tensorboard

threshold, window, script, *flags = sys.argv[1:]
threshold, window, returns, pressed = float(threshold), int(window), [], []


class StopWhenReached(torch.utils.tensorboard.SummaryWriter):
    def add_scalar(self, tag, scalar_value, *args, **kwargs):
        super().add_scalar(tag, scalar_value, *args, **kwargs)
        if tag == "charts/episodic_return":
            returns.append(float(np.float32(scalar_value)))
            if not pressed and len(returns) >= window and sum(returns[-window:]) / window >= threshold:
                pressed.append(True)  # once: a second Ctrl-C would interrupt at once, wherever it lands
                os.kill(os.getpid(), signal.SIGINT)


torch.utils.tensorboard.SummaryWriter = StopWhenReached
sys.argv, sys.path[0] = [script, *flags], os.path.dirname(script)
runpy.run_path(script, run_name="__main__")
"""


def run_until_reached(script: str, *flags: str, cwd: str, threshold: float, window: int = 20) -> list[tuple[int, float]]:
    """A learning run: `python <script> <flags>` in `cwd`, stopped with Ctrl-C once the mean of its last `window`
    episode returns reaches `threshold` (the steps after it cannot change `first_step_reaching`). Returns its
    episodic returns as (step, return); it must have ended at its budget (status 0) or at that Ctrl-C (status 130)."""
    with tempfile.TemporaryDirectory() as folder:
        wrapper = os.path.join(folder, "until_reached.py")
        with open(wrapper, "w") as f:
            f.write(UNTIL_REACHED)
        result = run_script(wrapper, str(threshold), str(window), os.path.join(ROOT, script), *flags, cwd=cwd)
    assert result.returncode in (0, 130), result.stdout + result.stderr
    (run_dir,) = run_dirs(cwd)
    returns = read_scalars(run_dir)["charts/episodic_return"]
    # a Ctrl-C in the last iteration may come after its last step: the run ends at its budget
    stopped = result.returncode == 130 and "interrupted during iteration" in result.stdout
    reached = first_step_reaching(returns, threshold, window) is not None
    assert result.returncode == 0 or (stopped and reached), result.stdout + result.stderr
    return returns


# The script run as its own `__main__`, with one change: its TensorBoard writer sends the process the signal `signum` (a
# number) once, as soon as it has logged charts/SPS `after` times (each iteration logs it once, in `Run.record`): a
# signal that lands mid-run at the same place in every run.
SIGNAL_AFTER = r"""
import os, runpy, sys

import torch.utils.tensorboard

signum, after, script, *flags = sys.argv[1:]
logged = []


class SignalAfter(torch.utils.tensorboard.SummaryWriter):
    def add_scalar(self, tag, *args, **kwargs):
        super().add_scalar(tag, *args, **kwargs)
        if tag == "charts/SPS":
            logged.append(tag)
            if len(logged) == int(after):
                os.kill(os.getpid(), int(signum))


torch.utils.tensorboard.SummaryWriter = SignalAfter
sys.argv, sys.path[0] = [script, *flags], os.path.dirname(script)
runpy.run_path(script, run_name="__main__")
"""


def run_script_signalled(
    script: str, *flags: str, signum: int, after: int, cwd: str, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`run_script`, with the signal `signum` sent to the run once it has recorded `after` iterations."""
    with tempfile.TemporaryDirectory() as folder:
        wrapper = os.path.join(folder, "signal_after.py")
        with open(wrapper, "w") as f:
            f.write(SIGNAL_AFTER)
        return run_script(wrapper, str(int(signum)), str(after), os.path.join(ROOT, script), *flags, cwd=cwd, env=env)


WANDB_OFFLINE = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}  # --track without a network: the run goes to ./wandb
# no display, as on a server: SDL (pygame) complains unless the scripts render off-screen, as they should
NO_DISPLAY = {"XDG_RUNTIME_DIR": "", "DISPLAY": "", "WAYLAND_DISPLAY": ""}


def assert_videos_reached_the_wandb_run(cwd: str) -> None:
    """A run with --track --capture-video (offline): its videos were written and every one is in the W&B run."""
    videos = glob.glob(os.path.join(cwd, "videos", "*", "*.mp4"))
    (offline_run,) = glob.glob(os.path.join(cwd, "wandb", "offline-run-*"))
    assert glob.glob(os.path.join(offline_run, "*.wandb"))
    media = glob.glob(os.path.join(offline_run, "**", "*.mp4"), recursive=True)
    assert videos and len(media) == len(videos), (videos, media)


def wandb_records(offline_run: str) -> list:
    """The records of an offline W&B run's .wandb file (a LevelDB-style log of protobuf records after a 7-byte
    header), read without wandb's service: a run cut short leaves few or none."""
    import struct

    from wandb.proto import wandb_internal_pb2

    (path,) = glob.glob(os.path.join(offline_run, "*.wandb"))
    data, block, pos, pending, records = open(path, "rb").read(), 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zero padding up to the block's end
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk  # FULL, FIRST; then MIDDLE, LAST
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


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


def assert_training_replays_the_rollout(script, monkeypatch, **args) -> None:
    """Run `script.main` for 3 iterations at a learning rate of 0: the policy never changes, so every minibatch of
    every epoch must give back the log-probabilities stored in the rollout (KL 0, no clipping). This fails if
    training sees other inputs (normalisation, memory, episode masks) or computes log-probabilities differently from
    the rollout. Heads start with unit-scale weights (not 0.01), so that a wrong input shows in their outputs."""
    original = script.layer_init
    unit_scale = lambda layer, std=1.0, bias_const=0.0: original(layer, max(std, 1.0), bias_const)  # noqa: E731
    monkeypatch.setattr(script, "layer_init", unit_scale)
    total_timesteps = 3 * args["num_envs"] * args["num_steps"]  # 3 iterations
    run_args = script.Args(**args, total_timesteps=total_timesteps, learning_rate=0.0, progress=False, threads=1)
    run_args.exp_name = "replay"
    script.main(run_args)
    (run_dir,) = glob.glob("runs/*__replay__*")
    scalars = read_scalars(run_dir)
    assert len(scalars["losses/approx_kl"]) == 3
    for tag in ("losses/approx_kl", "losses/old_approx_kl", "losses/clipfrac"):
        assert all(abs(v) < 1e-6 for _, v in scalars[tag]), (tag, scalars[tag])


def assert_non_finite_loss_stops_and_keeps_last_good_checkpoint(script, monkeypatch, **args) -> None:
    """Poison the advantages from the third iteration on (NaN): the run must stop there with one line, and the
    checkpoint on disk must be the last good one, iteration 2, with finite weights. Runs 6 iterations at most."""
    calls = []
    original = script.compute_gae

    def poisoned(*gae_args, **gae_kwargs):
        advantages, returns = original(*gae_args, **gae_kwargs)
        calls.append(1)
        return (advantages * float("nan"), returns) if len(calls) >= 3 else (advantages, returns)

    monkeypatch.setattr(script, "compute_gae", poisoned)
    total_timesteps = 6 * args["num_envs"] * args["num_steps"]
    run_args = script.Args(**args, total_timesteps=total_timesteps, progress=False, threads=1)
    run_args.save_model, run_args.save_interval = True, 1
    with pytest.raises(SystemExit, match="the loss diverged at iteration 3: lower --learning-rate .*checkpoint is kept"):
        script.main(run_args)
    checkpoint = torch.load(glob.glob("runs/*/checkpoint.pt")[0], weights_only=True)
    assert checkpoint["iteration"] == 2
    assert all(torch.isfinite(v).all() for v in checkpoint["model"].values())


TERM = 1000.0  # a constant added to a loss, far above the loss itself: it moves no gradient


def with_a_term_added_last(script, name: str):
    """`script.<name>`, a loss function, as a forker extends it: `loss = loss + TERM` on the line before its return,
    after its stats were made."""
    lines = textwrap.dedent(inspect.getsource(getattr(script, name))).splitlines()
    at = max(i for i, line in enumerate(lines) if line.lstrip().startswith("return loss"))
    lines.insert(at, lines[at][: len(lines[at]) - len(lines[at].lstrip())] + f"loss = loss + {TERM}")
    namespace = dict(vars(script))
    exec(compile("\n".join(lines), script.__file__, "exec"), namespace)
    return namespace[name]


def assert_logged_losses(script, monkeypatch, prefixes: dict | None = None, **args) -> dict:
    """Run `script.main` for 2 iterations with TERM added last to each loss function of `prefixes` (its name -> the
    prefix of its tags; minibatch_loss's losses/ by default) and compare the events with every minibatch's stats.
    A stat's <prefix><name> is the value of the last minibatch before it was logged (clipfrac: the mean), as CleanRL
    logs its losses; <prefix>mean/<name> the mean over those minibatches; <prefix>loss is the loss returned, the term
    added last included. Returns the run's scalars."""
    prefixes = prefixes or {"minibatch_loss": "losses/"}
    calls = {name: [[], []] for name in prefixes}  # each loss function's stats, call by call, in iteration 1 and 2
    iteration = [0]
    for name in prefixes:
        extended = with_a_term_added_last(script, name)

        def recorded(*call_args, extended=extended, name=name, **kwargs):
            loss, stats = extended(*call_args, **kwargs)
            assert torch.equal(stats["loss"], loss.detach()) and loss.item() > TERM / 2
            calls[name][iteration[0]].append(stats)
            return loss, stats

        monkeypatch.setattr(script, name, recorded)
    record = script.Run.record

    def counted(*record_args, **kwargs):
        record(*record_args, **kwargs)
        iteration[0] += 1

    monkeypatch.setattr(script.Run, "record", counted)
    total_timesteps = 2 * args["num_envs"] * args["num_steps"]
    run_args = script.Args(**args, total_timesteps=total_timesteps, progress=False, threads=1)
    run_args.exp_name = "logged"
    script.main(run_args)
    (run_dir,) = glob.glob("runs/*__logged__*")
    scalars = read_scalars(run_dir)
    for name, prefix in prefixes.items():
        logged = [stats for stats in calls[name] if stats]  # the iterations in which it ran, one logged value each
        assert logged and len(scalars[f"{prefix}loss"]) == len(logged), (name, scalars.get(f"{prefix}loss"))
        for i, stats in enumerate(logged):
            for stat in stats[0]:
                mean = torch.stack([mb_stats[stat] for mb_stats in stats]).mean().item()
                expected = {stat: mean if stat == "clipfrac" else stats[-1][stat].item(), f"mean/{stat}": mean}
                for tag, value in expected.items():
                    assert scalars[prefix + tag][i][1] == pytest.approx(value, rel=1e-6, abs=1e-7), (prefix + tag, i)
            assert scalars[f"{prefix}loss"][i][1] > TERM / 2
    return scalars


def assert_same_seed_same_losses(script, **args) -> None:
    """Three runs of 3 iterations on the CPU: the same seed twice gives the same losses, bit for bit; another seed
    gives other losses (the test can fail)."""

    def losses_of_run(seed: int, name: str) -> list[float]:
        total_timesteps = 3 * args["num_envs"] * args["num_steps"]
        # one thread: the free cores (--threads 0) can differ between the runs, and with them the summation order
        run_args = script.Args(**args, seed=seed, total_timesteps=total_timesteps, progress=False, threads=1)
        run_args.exp_name = name
        script.main(run_args)
        (run_dir,) = glob.glob(f"runs/*__{name}__*")
        scalars = read_scalars(run_dir)
        return [v for tag in ("losses/value_loss", "losses/policy_loss", "losses/approx_kl") for _, v in scalars[tag]]

    first, second, other = losses_of_run(3, "first"), losses_of_run(3, "second"), losses_of_run(4, "other")
    assert len(first) == 9
    assert first == second
    assert first != other


def assert_ctrl_c_keeps_logs_and_a_checkpoint(script: str, flags: list[str], cwd: str) -> None:
    """Start a long run of `script`, wait until it has logged an iteration, then press Ctrl-C as a terminal does (SIGINT
    to its whole process group, worker processes included): it exits with status 130 (interrupted), keeping its logs
    and the checkpoint of its last complete iteration, and printing no traceback."""
    flags = [*flags, "--total-timesteps", "10000000", "--save-model", "--save-interval", "1000"]
    process = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, script), *flags],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    deadline = time.time() + 120
    while time.time() < deadline:  # wait until at least one iteration has been logged
        events = glob.glob(os.path.join(cwd, "runs", "*", "events.*"))
        if events and "charts/SPS" in read_scalars(os.path.dirname(events[0])):
            break
        time.sleep(0.1)
    os.killpg(process.pid, signal.SIGINT)
    try:
        stdout, stderr = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # never leave a training run behind to compete with the rest of the suite
        raise
    assert process.returncode == 130, stderr  # interrupted is not finished
    assert "Traceback" not in stderr, stderr
    assert "interrupted during iteration" in stdout
    (run_dir,) = run_dirs(cwd)
    checkpoint = torch.load(os.path.join(run_dir, "checkpoint.pt"), weights_only=True)
    assert checkpoint["iteration"] >= 1
    assert len(read_scalars(run_dir)["charts/SPS"]) >= checkpoint["iteration"]


def assert_evaluation_fires_after_a_lost_life(script, tmp_path, monkeypatch) -> None:
    """A policy that never presses FIRE, evaluated on Breakout (FIRE serves the ball): the evaluation presses FIRE after
    every lost life, so the game ends in a few hundred steps instead of running to the 27,000-step frame cap."""
    args = script.Args(env_id="BreakoutNoFrameskip-v4")
    agent = script.Agent(4, args)  # Breakout's actions: NOOP, FIRE, RIGHT, LEFT
    with torch.no_grad():
        agent.actor.weight.zero_()
        agent.actor.bias.copy_(torch.tensor([10.0, 0.0, 0.0, 0.0]))  # NOOP, deterministically
    optimizer = torch.optim.Adam(agent.parameters())
    path = str(tmp_path / "checkpoint.pt")
    script.save_checkpoint(path, script.make_checkpoint(args, "run", agent, optimizer, 1, 0))
    lengths = []

    class Recorded(script.RecordGameStatistics):
        def step(self, actions):
            *rest, info = super().step(actions)
            lengths.extend(info["episode"]["l"][info["_episode"]] if "episode" in info else [])
            return *rest, info

    monkeypatch.setattr(script, "RecordGameStatistics", Recorded)
    loaded = script.load_checkpoint(path, "--eval-checkpoint")
    scores = script.evaluate(loaded, 1, True, torch.device("cpu"), seed=1)
    assert len(scores) == 1 and len(lengths) == 1
    assert lengths[0] < 3000, lengths  # without FIRE: 27,000 agent steps (108,000 frames)
