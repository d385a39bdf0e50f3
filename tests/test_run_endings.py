"""Runs that never lie, whatever ends them: each ending read back through MLflow's client.

Finish, exception, Ctrl-C, SIGTERM, SIGHUP, SIGKILL, out of memory (tests/test_lab_end_to_end.py)
and a full disk each leave the run in a status that tells the truth, with the cause in its tag
`ending` and its description. The store is checked before anything loads: a wrong tracking URI is
one line and exit code 2, before torch, transformers or Unsloth is imported.

The slow tests share the wave of real lab processes (conftest.py), started at the same moment, four
of them on one fresh store (which is also the test that first runs on a new store are safe): two
that finish, one out of memory and one stopped by SIGHUP; on stores of their own one stopped by
SIGTERM and one by SIGKILL (each sent once the lab has printed two training steps; tests/test_run_resume.py
resumes both) and one whose disk fills. A full disk is a file-size limit (RLIMIT_FSIZE, set on the
running lab with prlimit once its first checkpoint is written): Python ignores SIGXFSZ, so the
trainer's next checkpoint write fails with EFBIG inside the real save, exactly where ENOSPC would,
without root, a mount or a stand-in for the save.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from argparse import Namespace
from pathlib import Path

import mlflow
import pytest
import torch

from budgets.units import GIB, MIB
from grpolab.lifecycle import endings, tracking
from grpolab.lifecycle.atomic import save_pretrained_atomically
from grpolab.memory import run_result

from suite import LAB_DIR, REPO_ROOT, SIGNALLED, STEPS_BEFORE_SIGNAL, cpu_only, free_port, only_run

ON_CPU = cpu_only("runs the CPU profile; on a GPU the same command runs Qwen3-4B")


# --- the store, checked before anything loads -----------------------------------------------------
# What a refusal must come before: the imports that cost most of a minute of CPU on 2 cores.
HEAVY = ("torch", "transformers", "trl", "unsloth", "datasets")
# `python train.py ARGS`, and at exit the heavy modules it had imported, written where IMPORTED names.
RECORDING = (
    "import atexit, json, os, runpy, sys; heavy = json.loads(os.environ['HEAVY']);"
    "atexit.register(lambda: open(os.environ['IMPORTED'], 'w').write(json.dumps([m for m in heavy if m in sys.modules])));"
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def refused(uri: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The README's lab command against `uri`, in a fresh process: how it ended, and which of the heavy
    imports it had made when it did (a refusal made before them costs seconds on any machine)."""
    imported = tmp_path / "imported.json"
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            RECORDING,
            str(LAB_DIR / "train.py"),
            "--output-dir",
            str(tmp_path / "outputs"),
        ],
        cwd=REPO_ROOT,
        env={
            **os.environ,
            "MLFLOW_TRACKING_URI": uri,
            "PYTHONUNBUFFERED": "1",
            "HEAVY": json.dumps(HEAVY),
            "IMPORTED": str(imported),
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    return result, json.loads(imported.read_text())


@pytest.mark.slow
def test_an_unreachable_tracking_server_is_one_line_before_the_heavy_imports(tmp_path):
    port = free_port()  # nothing listens there
    result, imported = refused(f"http://127.0.0.1:{port}", tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: the MLflow tracking server at http://127.0.0.1:{port} does not answer")
    assert f"start it (uv run mlflow server --backend-store-uri sqlite:///mlflow.db --port {port})" in line
    assert "unset MLFLOW_TRACKING_URI" in line
    assert imported == [], f"refused only after importing {imported}"
    assert not (tmp_path / "outputs").exists()


def test_http_retries_are_bounded_once_the_server_answers(monkeypatch):
    from grpolab.lifecycle import store

    class Health(__import__("http.server").server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args):
            pass

    from http.server import HTTPServer

    server = HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for name in store.HTTP_LIMITS:
            monkeypatch.delenv(name, raising=False)
        store.require(f"http://127.0.0.1:{server.server_port}")
        for name, value in store.HTTP_LIMITS.items():
            assert os.environ[name] == value
        from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_MAX_RETRIES, MLFLOW_HTTP_REQUEST_TIMEOUT

        assert (MLFLOW_HTTP_REQUEST_MAX_RETRIES.get(), MLFLOW_HTTP_REQUEST_TIMEOUT.get()) == (2, 30)
    finally:
        server.shutdown()


def _locked_store(path: Path):
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("CREATE TABLE t (x)")
    db.execute("BEGIN EXCLUSIVE")  # what a sqlite3 shell in the middle of a transaction holds
    return db


@pytest.mark.slow
@pytest.mark.parametrize(
    ("problem", "expected"),
    [
        ("missing folder", "does not exist: create it (mkdir -p"),
        ("folder is a file", "is not a folder"),
        ("folder not writable", "cannot write in"),
        ("damaged", "is not a readable SQLite database (file is not a database): move it aside"),
        ("locked", "is locked by another program (database is locked after 2 s)"),
    ],
)
def test_a_store_that_cannot_be_used_is_one_line_and_exit_2_with_nothing_written(tmp_path, problem, expected):
    db, holder = tmp_path / "store" / "mlflow.db", None
    if problem == "folder is a file":
        (tmp_path / "store").write_text("a file")
    elif problem == "folder not writable":
        # root writes anywhere its permissions say no; sysfs refuses a new file even to root
        db = Path("/sys/mlflow.db") if os.geteuid() == 0 else db
        if os.geteuid() != 0:
            db.parent.mkdir(mode=0o555)
    elif problem == "damaged":
        db.parent.mkdir()
        db.write_bytes(b"not a database, " * 500)
    elif problem == "locked":
        db.parent.mkdir()
        holder = _locked_store(db)
    before = sorted(p.name for p in db.parent.iterdir()) if db.parent.is_dir() else None
    # stat, never open: closing any descriptor of the file would drop the holder's POSIX lock
    content = (db.stat().st_size, db.stat().st_mtime_ns) if db.is_file() else None
    try:
        result, imported = refused(f"sqlite:///{db}", tmp_path)
    finally:
        if holder is not None:
            holder.close()
    assert result.returncode == 2, result.stderr[-2000:]
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and expected in line, line
    assert "unset MLFLOW_TRACKING_URI" in line
    assert imported == [], f"refused only after importing {imported}"
    # Nothing written: no new store, no -journal, the damaged file as it was, no outputs.
    assert (sorted(p.name for p in db.parent.iterdir()) if db.parent.is_dir() else None) == before
    assert ((db.stat().st_size, db.stat().st_mtime_ns) if db.is_file() else None) == content
    assert not (tmp_path / "outputs").exists()


# --- signals, in this process ---------------------------------------------------------------------
@pytest.fixture(autouse=True)
def terminal_signals():
    """Each test starts with the handlers a lab started from a terminal has, even when pytest itself
    runs under nohup (SIGHUP ignored) or as a background job (SIGINT ignored); they come back after."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def test_a_signal_ignored_stays_ignored():
    """`nohup` ignores SIGHUP so that a closed terminal does not stop the lab: neither does the run."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with endings.catching_signals():
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.2)
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


class SlowModel:
    """A model whose save writes two files with signals arriving between them."""

    def __init__(self, *signals: int, tag: str = "new") -> None:
        self.signals, self.tag = signals, tag

    def save_pretrained(self, path: str) -> None:
        (Path(path) / "adapter_model.safetensors").write_text(self.tag)
        for signum in self.signals:
            os.kill(os.getpid(), signum)
        (Path(path) / "adapter_config.json").write_text(self.tag)


class Tokenizer:
    def save_pretrained(self, path: str) -> None:
        (Path(path) / "tokenizer.json").write_text("{}")


def test_a_second_signal_during_the_adapter_save_waits_for_the_save(tmp_path):
    final = tmp_path / "adapter"
    save_pretrained_atomically(SlowModel(tag="old"), Tokenizer(), final)
    # An interrupted run saves its adapter; Ctrl-C twice more and SIGTERM arrive during the save.
    with pytest.raises(endings.Interrupted) as stopped, endings.catching_signals() as stops:
        save_pretrained_atomically(
            SlowModel(signal.SIGINT, signal.SIGTERM, signal.SIGINT), Tokenizer(), final
        )
        stops.check()  # the harness's next check: nothing was raised inside the save
    assert stopped.value.signum == signal.SIGINT  # delivered once the save was whole
    assert {p.name: p.read_text() for p in final.iterdir()} == {
        "adapter_model.safetensors": "new",
        "adapter_config.json": "new",
        "tokenizer.json": "{}",
    }
    assert [p.name for p in tmp_path.iterdir()] == ["adapter"]  # no staging or old folder left


class Weights:
    """Saves like PEFT's save_pretrained: tensors through safetensors, then a JSON config."""

    def __init__(self, fill: float) -> None:
        self.tensors = {"lora_A": torch.full((256, 256), fill), "lora_B": torch.full((256, 256), fill)}

    def save_pretrained(self, path: str) -> None:
        from safetensors.torch import save_file

        save_file(self.tensors, str(Path(path) / "adapter_model.safetensors"))
        (Path(path) / "adapter_config.json").write_text(json.dumps({"r": 256}))


def _file_size_limit(limit: int):
    """RLIMIT_FSIZE on this process: a write past `limit` fails with EFBIG (Python ignores SIGXFSZ)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_full_disk_during_the_adapter_save_keeps_the_old_adapter_whole(tmp_path):
    final = save_pretrained_atomically(Weights(0.0), Tokenizer(), tmp_path / "adapter")
    before = {p.name: p.read_bytes() for p in final.iterdir()}
    undo = _file_size_limit((final / "adapter_model.safetensors").stat().st_size // 2)
    try:
        with pytest.raises(Exception) as failed:  # safetensors' own error, the errno inside its message
            save_pretrained_atomically(Weights(1.0), Tokenizer(), final)
        code = endings.disk_errno(failed.value, tmp_path)
    finally:
        undo()
    assert code == errno.EFBIG, repr(failed.value)
    assert {p.name: p.read_bytes() for p in final.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["adapter"]


def test_torch_saves_that_fail_for_room_are_recognised(tmp_path):
    undo = _file_size_limit(10_000)
    try:
        with pytest.raises(RuntimeError) as failed:  # no errno: "unexpected pos ..." or "file write failed"
            torch.save({"x": torch.zeros(100_000)}, tmp_path / "optimizer.pt")
        recognised = endings.is_disk_full(failed.value, tmp_path)
    finally:
        undo()
    assert recognised, repr(failed.value)
    assert not endings.is_disk_full(RuntimeError("unexpected pos 576 vs 534"), tmp_path)  # room, no limit
    assert endings.disk_errno(OSError(errno.ENOSPC, "No space left on device")) == errno.ENOSPC
    assert not endings.is_disk_full(OSError(errno.EACCES, "Permission denied"))


# --- MLflow: one store for the in-process tests ---------------------------------------------------
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("endings-store")
    saved = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{path / 'mlflow.db'}"
    client = tracking.client()
    yield client
    while mlflow.active_run():
        mlflow.end_run()
    if saved is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = saved
    tracking.use_store()


def dead_process() -> tuple[int, str]:
    """A pid and start time of a process of this host that has exited (and been reaped)."""
    import psutil

    child = subprocess.Popen(["sleep", "5"])
    started = psutil.Process(child.pid).create_time()
    child.kill()
    child.wait()
    return child.pid, f"{started:.2f}"


def plant(client, experiment: str, name: str, **process: str):
    experiment_id = tracking.experiment_id(experiment)
    tags = {f"process.{k}": v for k, v in process.items()}
    return client.create_run(experiment_id, run_name=name, tags=tags)


@pytest.mark.slow
def test_reconcile_ends_only_runs_whose_process_died_on_this_host(store):
    pid, started = dead_process()
    dead = plant(store, "reconcile", "dead", host=socket.gethostname(), pid=str(pid), start_time=started)
    for step, peak in enumerate([1.2, 1.9, 1.5], start=1):
        store.log_metric(dead.info.run_id, "memory/step_peak_gib", peak, step=step)
    me = tracking.process_tags()
    alive = plant(
        store,
        "reconcile",
        "alive",
        host=me["process.host"],
        pid=me["process.pid"],
        start_time=me["process.start_time"],
    )
    reused = plant(
        store, "reconcile", "pid reused", host=me["process.host"], pid=me["process.pid"], start_time="1.00"
    )
    other = plant(store, "reconcile", "other host", host="another-host", pid=str(pid), start_time=started)
    untagged = plant(store, "reconcile", "untagged")

    lines = endings.reconcile(store)

    status = {r.info.run_id: store.get_run(r.info.run_id) for r in (dead, alive, reused, other, untagged)}
    assert [status[r.info.run_id].info.status for r in (dead, reused)] == ["KILLED", "KILLED"]
    assert [status[r.info.run_id].info.status for r in (alive, other, untagged)] == ["RUNNING"] * 3
    note = status[dead.info.run_id].data.tags["mlflow.note.content"]
    assert f"The process (pid {pid} on {socket.gethostname()}" in note
    assert "died without closing its run: SIGKILL" in note and "OOM killer" in note
    assert "Last step logged: 3; peak memory logged: 1.90 GiB" in note
    assert status[dead.info.run_id].data.tags["ending"] == "process died"
    # It ended when it last logged, not when it was found.
    last = max(p.timestamp for p in store.get_metric_history(dead.info.run_id, "memory/step_peak_gib"))
    assert status[dead.info.run_id].info.end_time == last
    assert "No step was logged" in status[reused.info.run_id].data.tags["mlflow.note.content"]
    assert len(lines) == 2 and any(dead.info.run_id in line for line in lines)
    for run in (alive, other, untagged):
        store.set_terminated(run.info.run_id, "FINISHED")


@pytest.mark.slow
def test_runs_command_lists_open_runs_and_whether_their_process_lives(store, capsys):
    from grpolab.__main__ import main

    pid, started = dead_process()
    dead = plant(store, "listing", "dead", host=socket.gethostname(), pid=str(pid), start_time=started)
    other = plant(store, "listing", "elsewhere", host="another-host", pid="1", start_time="1.00")
    assert main(["runs"]) == 0
    out = capsys.readouterr().out
    assert f"listing/dead ({dead.info.run_id}), pid {pid} on {socket.gethostname()}: its process died" in out
    assert f"listing/elsewhere ({other.info.run_id}), pid 1 on another-host: from another host" in out
    assert "python -m grpolab runs --reconcile" in out
    assert store.get_run(dead.info.run_id).info.status == "RUNNING"  # listing touches nothing
    assert main(["runs", "--reconcile"]) == 0
    assert store.get_run(dead.info.run_id).info.status == "KILLED"
    assert store.get_run(other.info.run_id).info.status == "RUNNING"
    store.set_terminated(other.info.run_id, "FINISHED")


def test_a_run_stopped_by_sigterm_says_so_and_a_failed_one_names_its_error(store):
    with pytest.raises(endings.Interrupted), tracking.lab_run("lab-run", "term", {}) as run:
        mlflow.log_metric("reward", 0.5)
        os.kill(os.getpid(), signal.SIGTERM)  # recorded; acted on before the run would end FINISHED
    ended = store.get_run(run.info.run_id)
    assert (ended.info.status, ended.data.tags["ending"]) == ("KILLED", "SIGTERM")
    assert ended.data.tags["mlflow.note.content"].startswith("Stopped by SIGTERM (kill, timeout, docker stop")
    assert ended.data.metrics["reward"] == 0.5
    with pytest.raises(ValueError), tracking.lab_run("lab-run", "crash", {}) as run:
        raise ValueError("the reward function crashed\nsecond line")
    ended = store.get_run(run.info.run_id)
    assert (ended.info.status, ended.data.tags["ending"]) == ("FAILED", "exception")
    assert ended.data.tags["mlflow.note.content"] == "Failed: ValueError: the reward function crashed."
    with tracking.lab_run("lab-run", "fine", {}) as run:
        pass
    assert store.get_run(run.info.run_id).data.tags["ending"] == "finished"


def _session_inputs(tmp_path):
    from budgets import compute
    from grpolab.config.settings import lab_settings
    from grpolab.memory.device import Device

    settings = lab_settings(LAB_DIR, "cpu")
    args = Namespace(
        output_dir=tmp_path / "outputs",
        memory_sample_ms=5.0,
        system_metrics_interval=None,
        memory_cap_gib=None,
    )
    return settings, compute(settings.plan()), Device("cpu"), args


@pytest.mark.slow
def test_the_harness_reconciles_at_start_and_describes_how_its_run_ended(store, tmp_path, capsys):
    from grpolab.lab.session import session

    pid, started = dead_process()
    left = plant(
        store, "grpo-first", "killed earlier", host=socket.gethostname(), pid=str(pid), start_time=started
    )
    inputs = _session_inputs(tmp_path)
    with pytest.raises(ValueError), session(*inputs, None) as run:
        raise ValueError("a reward function crashed")
    out = capsys.readouterr().out
    assert f"Ended run killed earlier ({left.info.run_id}) KILLED: its process {pid} died" in out
    assert store.get_run(left.info.run_id).info.status == "KILLED"
    failed = store.get_run(run.mlflow_run.info.run_id)
    assert (failed.info.status, failed.data.tags["ending"]) == ("FAILED", "exception")
    assert failed.data.tags["mlflow.note.content"] == (
        "Failed before training started: ValueError: a reward function crashed."
    )
    assert run_result.read(run.output_dir / run_result.NAME) is None  # it died before measuring itself
    with pytest.raises(endings.Interrupted), session(*inputs, None) as run:
        os.kill(os.getpid(), signal.SIGHUP)  # recorded; acted on as the lesson's body ends
    assert (
        "Stopped by SIGHUP (its terminal or SSH session closed) during the run's set-up, before training started: run"
        in (capsys.readouterr().out)
    )
    stopped = store.get_run(run.mlflow_run.info.run_id)
    assert (stopped.info.status, stopped.data.tags["ending"]) == ("KILLED", "SIGHUP")
    note = stopped.data.tags["mlflow.note.content"]
    assert note.startswith("Stopped by SIGHUP") and "(run ended KILLED: figures so far)" in note
    # What it measured, for the process that started it (a sweep): the run, its ending, its figures.
    result = run_result.read(run.output_dir / run_result.NAME)
    assert (result["run_id"], result["status"], result["ending"]) == (stopped.info.run_id, "KILLED", "SIGHUP")
    # The CPU stand-in's memory figures are logged in MiB, the unit in their names (tag memory_unit).
    assert stopped.data.tags["memory_unit"] == "mib"
    assert result["total"]["measured_bytes"] / MIB == pytest.approx(
        stopped.data.metrics["total/measured_mib"]
    )
    assert {name: line["budget_bytes"] / MIB for name, line in result["lines"].items()} == pytest.approx(
        {name: stopped.data.metrics[f"{name}/budget_mib"] for name in result["lines"]}
    )
    assert not [p.name for p in run.output_dir.iterdir() if p.name.startswith(".")]  # no staging file left


def test_a_run_out_of_memory_leaves_its_result_for_the_process_that_started_it(store, tmp_path):
    from grpolab.lab.session import session
    from grpolab.memory.oom import OutOfMemory

    with pytest.raises(OutOfMemory), session(*_session_inputs(tmp_path), None) as run:
        raise MemoryError("the step's activations")
    failed = store.get_run(run.mlflow_run.info.run_id)
    result = run_result.read(run.output_dir / run_result.NAME)
    assert (result["run_id"], result["status"], result["ending"]) == (
        failed.info.run_id,
        "FAILED",
        "out of memory",
    )
    assert failed.info.status == "FAILED" and failed.data.tags["ending"] == "out of memory"
    oom = result["oom"]
    assert (oom["phase"], oom["line"]) == (failed.data.tags["oom_phase"], failed.data.tags["oom_line"])
    assert oom["peak_bytes"] / GIB == pytest.approx(failed.data.metrics["oom/peak_gib"])
    assert result["total"]["compared"] is False and result["total"]["rel_error"] is None  # not logged either


def test_a_half_written_checkpoint_is_removed_and_the_previous_one_kept(store, tmp_path):
    output = tmp_path / "run"
    for step, whole in ((2, True), (4, False)):
        folder = output / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "adapter_model.safetensors").write_bytes(b"\0" * 1000)
        if whole:
            (folder / "trainer_state.json").write_text("{}")
    trainer = Namespace(state=Namespace(global_step=4))
    run = Namespace(output_dir=output, trainer=trainer, settings=Namespace(max_steps=10))
    with tracking.lab_run("disk", "full", {}) as mlflow_run:
        full = endings.disk_full(OSError(errno.ENOSPC, "No space left on device"), run)
        tracking.describe_ending(full.ending, full.description)  # as the harness records it
    message = str(full)
    assert message.startswith(f"no room to save the checkpoint checkpoint-4 in {output / 'checkpoint-4'}")
    assert "No space left on device;" in message and "free on that disk" in message
    assert "the half-written checkpoint-4 was removed; checkpoint-2 is intact" in message
    assert sorted(p.name for p in output.iterdir()) == ["checkpoint-2"]
    tags = store.get_run(mlflow_run.info.run_id).data.tags
    assert tags["ending"] == "disk full"
    assert tags["mlflow.note.content"] == f"Failed at step 4 of 10: {message}."


# --- real lab processes: the wave (conftest.py), every ending at once ------------------------------
def client_of(wave, name: str | None = None):
    """The MLflow client on the wave's shared store, or on the store of the lab `name` ran on alone."""
    if name is None:
        return mlflow.MlflowClient(wave["uri"])
    return mlflow.MlflowClient(f"sqlite:///{wave['labs'][name].output / 'mlflow.db'}")


@pytest.mark.slow
@ON_CPU
def test_two_first_runs_on_a_fresh_store_both_finish(wave):
    for name in ("finish-1", "finish-2"):
        lab = wave["labs"][name]
        assert wave["codes"][name] == 0, lab.log()
        run = only_run(client_of(wave), lab)
        assert (run.info.status, run.data.tags["ending"]) == ("FINISHED", "finished")
        assert run.data.tags["mlflow.note.content"].startswith("**The budget ")  # the Overview's verdict
        # finish-1 runs the CPU profile's task (lab.toml's [profile.cpu]); finish-2 the README's other task
        assert run.data.params["task"] == ("countdown" if name == "finish-2" else "small-addition")
    # Four processes opened a new store at once; none died in MLflow's schema migration.
    for lab in wave["labs"].values():
        assert "duplicate column" not in lab.stderr, lab.log()


@pytest.mark.slow
@ON_CPU
@pytest.mark.parametrize(
    ("name", "opening", "steps"),
    [
        (
            "SIGTERM",
            "Stopped by SIGTERM (kill, timeout, docker stop, a scheduler or a closed cloud session)",
            20,
        ),
        ("SIGHUP", "Stopped by SIGHUP (its terminal or SSH session closed)", 500),
    ],
)
def test_a_signal_ends_the_run_killed_with_its_measurements_and_adapter(wave, name, opening, steps):
    lab = wave["labs"][name]
    assert wave["codes"][name] == 128 + SIGNALLED[name], lab.log()
    run = only_run(client_of(wave, name if name == "SIGTERM" else None), lab)
    assert (run.info.status, run.data.tags["ending"]) == ("KILLED", name), lab.log()
    note = run.data.tags["mlflow.note.content"]
    step = int(note.removeprefix(f"{opening} during training, at step ").split(" ")[0])
    assert note.startswith(f"{opening} during training, at step {step} of {steps}."), note
    assert step >= STEPS_BEFORE_SIGNAL, note
    assert "(run ended KILLED: figures so far)" in note
    assert (
        f"{opening} during training, at step {step} of {steps}: run {run.info.run_id} ends KILLED"
        in lab.stdout
    )
    assert "lora_params/measured_mib" in run.data.metrics and "total/measured_mib" in run.data.metrics
    (folder,) = lab.output.glob("grpo-first/*")
    assert (folder / "adapter" / "adapter_model.safetensors").is_file()
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")], "a staging folder was left"


@pytest.mark.slow
@ON_CPU
def test_sigkill_leaves_a_run_that_reconcile_ends_killed_and_nothing_else(stopped):
    """The README's `runs --reconcile` on the store of the lab SIGKILL stopped (conftest.py: `stopped`,
    which plants a run of this live process and one of another host beside it)."""
    killed = stopped["SIGKILL"]
    lab = killed["lab"]
    assert killed["code"] == -signal.SIGKILL, lab.log()
    assert killed["before"].info.status == "RUNNING"  # what SIGKILL leaves: nothing could close it
    result = killed["reconciled"]
    assert result.returncode == 0, result.stderr[-3000:]
    run_id, alive = killed["before"].info.run_id, killed["planted"]["alive"]
    assert f"Ended run {killed['before'].info.run_name} ({run_id}) KILLED" in result.stdout
    assert (
        f"({alive.info.run_id}), pid {os.getpid()} on {socket.gethostname()}: its process is alive"
        in result.stdout
    )
    ended = killed["after_stop"]
    assert (ended.info.status, ended.data.tags["ending"]) == ("KILLED", "process died")
    note = ended.data.tags["mlflow.note.content"]
    assert f"The process (pid {lab.pid} on {socket.gethostname()}" in note
    assert "died without closing its run: SIGKILL" in note
    last_step = int(note.split("Last step logged: ")[1].split(";")[0])
    assert last_step >= STEPS_BEFORE_SIGNAL and "peak memory logged: " in note
    # A live process's run and another host's: untouched.
    assert killed["planted_status"] == {"alive": "RUNNING", "other host": "RUNNING"}


@pytest.mark.slow
@ON_CPU
def test_a_full_disk_at_a_checkpoint_fails_the_run_and_keeps_the_previous_checkpoint(wave):
    lab, disk = wave["labs"]["disk"], wave["disk"]
    assert disk.limit is not None and disk.kept, "the first checkpoint never appeared:\n" + lab.log()
    assert wave["codes"]["disk"] == endings.EXIT_DISK_FULL, lab.log()
    error = lab.stderr.strip().splitlines()[-1]
    (folder,) = lab.output.glob("grpo-first/*")
    assert error.startswith("error: no room to save the checkpoint checkpoint-"), error
    assert f" in {folder}/checkpoint-" in error and "File too large" in error and "free on that disk" in error
    # No half-written checkpoint, no hidden leftover, no adapter (the run never finished); TRL's
    # model card (README.md) is the only other file.
    names = {p.name for p in folder.iterdir()} - {"README.md"}
    assert names == set(disk.kept), f"besides the kept checkpoints: {names - set(disk.kept)}"
    for name, files in disk.kept.items():  # the previous checkpoints, exactly as they were
        now = {
            str(f.relative_to(folder / name)): f.stat().st_size
            for f in (folder / name).rglob("*")
            if f.is_file()
        }
        assert now == files, name
        assert f"{name} is intact" in error
    assert "was removed" in error
    (run,) = client_of(wave, "disk").search_runs(
        [client_of(wave, "disk").get_experiment_by_name("grpo-first").experiment_id]
    )
    assert (run.info.status, run.data.tags["ending"]) == ("FAILED", "disk full")
    note = run.data.tags["mlflow.note.content"]
    assert note.startswith("Failed at step ") and error.removeprefix("error: ") in note


@pytest.mark.slow
@ON_CPU
def test_running_out_of_memory_leaves_a_failed_run_with_peak_phase_and_line(wave, tmp_path):
    """`train.py --profile cpu --max-steps 3 --memory-cap-gib 0.02`, run in the wave (conftest.py)."""
    lab = wave["labs"]["oom"]
    assert wave["codes"]["oom"] == 3, lab.log()
    (error,) = [line for line in lab.stderr.splitlines() if line.startswith("error: out of memory")]
    assert "lower" in error or "use" in error
    run = only_run(client_of(wave), lab)
    assert (run.info.status, run.data.tags["ending"]) == ("FAILED", "out of memory"), lab.log()
    assert run.data.tags["mlflow.note.content"].startswith("Out of memory during ")
    assert run.data.metrics["oom/peak_gib"] > 0
    assert run.data.tags["oom_phase"] in {"load", "generate", "train_step", "train"}
    assert run.data.tags["oom_line"] in json.dumps(
        json.loads(
            Path(
                client_of(wave).download_artifacts(run.info.run_id, "budget/sheet.json", str(tmp_path))
            ).read_text()
        )["lines"]
    )
    assert not list(lab.output.glob("*/*/adapter")), "no adapter for a run that never trained"
