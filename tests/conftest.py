"""Shared test helpers: the repository root, the chapters, CPU-only skips, one shared lab run."""

from __future__ import annotations

import importlib.util
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from grpolab.console import STEP_PREFIX

REPO_ROOT = Path(__file__).resolve().parent.parent
LAB_DIR = REPO_ROOT / "labs" / "grpo-first"


def trainer_labs() -> list[Path]:
    """The chapters that train with GRPOTrainer in this environment: every labs/*/lab.toml without
    an environment of its own (the verl chapter has its own uv project and tests)."""
    labs = []
    for toml in sorted((REPO_ROOT / "labs").glob("*/lab.toml")):
        if "environment" not in tomllib.loads(toml.read_text()):
            labs.append(toml.parent)
    return labs


TRAINER_LABS = trainer_labs()


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


HAS_CUDA = _cuda()


def gpu_only(reason: str):
    """Skip without a CUDA GPU; the reason says what the test would check on one."""
    return pytest.mark.skipif(not HAS_CUDA, reason=f"needs a CUDA GPU: {reason}")


def load_lab_module(lab_dir: Path):
    """labs/<chapter>/train.py imported as a module (chapter folders have hyphens)."""
    spec = importlib.util.spec_from_file_location(
        f"{lab_dir.name.replace('-', '_')}_train", lab_dir / "train.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def lab_module():
    return load_lab_module(LAB_DIR)


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A fresh SQLite MLflow store of the test's own, active through MLFLOW_TRACKING_URI; runs left
    open are ended. (A test module with a `store` fixture of its own uses that one.)"""
    import mlflow

    from grpolab import tracking

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracking.use_store()
    yield tmp_path
    while mlflow.active_run():
        mlflow.end_run()


def run_lab(
    args: list[str], tmp_path: Path, timeout: float = 600, lab_dir: Path = LAB_DIR, **env: str
) -> subprocess.CompletedProcess:
    """Run a lab as a user would, with its own MLflow store and outputs under tmp_path."""
    environment = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "PYTHONUNBUFFERED": "1",
        **env,
    }
    return subprocess.run(
        [sys.executable, str(lab_dir / "train.py"), "--output-dir", str(tmp_path / "outputs"), *args],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


README_LAB_COMMAND = ["uv", "run", "python", "labs/grpo-first/train.py"]
# The README's lab command with flags, less its --output-dir (each test gives its own).
README_FLAGS = [
    "--max-steps",
    "20",
    "--num-generations",
    "4",
    "--max-completion-length",
    "16",
    "--learning-rate",
    "2e-2",
]


@pytest.fixture(scope="session")
def cpu_lab_run(tmp_path_factory):
    """The README's lab command, run once on CPU into its own MLflow store, then read back."""
    import mlflow

    store = tmp_path_factory.mktemp("store")
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{store / 'mlflow.db'}", "PYTHONUNBUFFERED": "1"}
    # Exactly the README's command when uv is on PATH (CI and users), else the same script.
    command = README_LAB_COMMAND if shutil.which("uv") else [sys.executable, "labs/grpo-first/train.py"]
    started = time.perf_counter()
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - started
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    (run,) = mlflow.search_runs(experiment_names=["grpo-first"], output_format="list")
    yield {
        "run": run,
        "client": mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"]),
        "stdout": result.stdout,
        "seconds": seconds,
        "store": store,
    }
    shutil.rmtree(REPO_ROOT / "outputs" / "grpo-first" / run.info.run_name, ignore_errors=True)


# --- the wave: real lab processes, every way a run ends, started at once -------------------------
# A lab process spends most of a minute of CPU importing Unsloth before its first step, so the runs
# that several test files need (run-endings, the rehearsal, out of memory, a second task) start
# together, once, on one fresh store: that is also the test that two first runs on a new store both
# finish. One CPU thread each: nine labs on two cores would only fight over more.
# SIGINT takes the same handler (grpolab.endings): tests/test_run_endings.py sends it in-process.
SIGNALLED = {
    "SIGTERM": signal.SIGTERM,
    "SIGHUP": signal.SIGHUP,
    "SIGKILL": signal.SIGKILL,
}
STEPS_BEFORE_SIGNAL = 2
WAVE_TIMEOUT_S = 1800


def _default_signals() -> None:
    """A lab as a terminal starts it, even when pytest runs under nohup or in a background job."""
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


class Lab:
    """One lab process; a thread reads its output, counts training steps (the lab prints one compact
    line per step, starting `step N/M`: grpolab.console) and calls `at_step` once when
    `STEPS_BEFORE_SIGNAL` have been printed."""

    def __init__(self, name: str, args: list[str], uri: str, tmp: Path, at_step=None) -> None:
        env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        self.name, self.output = name, tmp / name
        self.stderr_path = tmp / f"{name}.stderr"
        self.lines: list[str] = []
        self.steps = 0
        self.at_step = at_step
        with open(self.stderr_path, "w") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, str(LAB_DIR / "train.py"), "--output-dir", str(self.output), *args],
                cwd=REPO_ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                preexec_fn=_default_signals,
            )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)
            if line.startswith(STEP_PREFIX):
                self.steps += 1
                if self.steps == STEPS_BEFORE_SIGNAL and self.at_step is not None:
                    self.at_step(self)

    def wait(self, timeout: float) -> int:
        code = self.process.wait(timeout=timeout)
        self.reader.join(timeout=10)
        return code

    @property
    def stdout(self) -> str:
        return "".join(self.lines)

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def log(self) -> str:
        return f"--- {self.name} stdout ---\n{self.stdout[-3000:]}\n--- stderr ---\n{self.stderr[-3000:]}"


class FileSizeLimit:
    """Once the lab's first checkpoint is whole, limit its file size: its next checkpoint cannot be
    written. The limit leaves room for its MLflow store to grow (its own SQLite file, under 1 MiB
    of growth for a few steps) and is below the checkpoint's largest file (LoRA rank 512: MBs)."""

    def __init__(self, store_db: Path) -> None:
        self.store_db = store_db
        self.limit: int | None = None
        self.kept: dict[str, dict[str, int]] = {}

    def watch(self, lab: Lab) -> None:
        threading.Thread(target=self._watch, args=(lab,), daemon=True).start()

    def _watch(self, lab: Lab) -> None:
        while lab.process.poll() is None:
            # trainer_state.json is the trainer's last file of a checkpoint: whole once it parses (it
            # exists, empty, while it is written: a snapshot then recorded it as 0 bytes, CI 2026-12-02).
            states = lab.output.glob("grpo-first/*/checkpoint-*/trainer_state.json")
            whole = [p.parent for p in states if _parses(p)]
            if whole:
                self.limit = self.store_db.stat().st_size + 1024**2
                resource.prlimit(lab.process.pid, resource.RLIMIT_FSIZE, (self.limit, self.limit))
                for folder in whole:
                    self.kept[folder.name] = {
                        str(f.relative_to(folder)): f.stat().st_size for f in folder.rglob("*") if f.is_file()
                    }
                return
            time.sleep(0.05)


def _parses(path: Path) -> bool:
    import json

    try:
        json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return True


@pytest.fixture(scope="session")
def wave(tmp_path_factory):
    """Ten labs started at once: seven on one fresh store (two that finish, the README's command
    with flags and another task; a rehearsal; one that runs out of memory; one per signal), one
    whose disk fills, on a store of its own (the file-size limit must not reach the shared store),
    and two stopped to be resumed, each on its own store. Only the README's command with flags (and
    the runs to resume, which train as it does) evaluates on the held-out prompts, so the others
    reach their steps sooner."""
    if HAS_CUDA:
        pytest.skip("runs the CPU profile; on a GPU the same commands run Qwen3-4B")
    tmp = tmp_path_factory.mktemp("wave")
    uri, disk_uri = f"sqlite:///{tmp / 'mlflow.db'}", f"sqlite:///{tmp / 'disk' / 'mlflow.db'}"
    (tmp / "disk").mkdir()
    quick = ["--eval-prompts", "0"]
    long = ["--max-steps", "500", *quick]

    def send(signum):
        return lambda lab: lab.process.send_signal(signum)

    disk = FileSizeLimit(tmp / "disk" / "mlflow.db")
    started = time.perf_counter()
    labs = {
        # the README's lab command with flags (tests/test_readme.py reads it), into the wave's folder
        "finish-1": Lab("finish-1", README_FLAGS, uri, tmp),
        # the README's other tasks: the same loop, another task's prompts and rewards
        "finish-2": Lab("finish-2", ["--task", "countdown", "--max-steps", "2", *quick], uri, tmp),
        # the README's rehearsal of the CPU profile (tests/test_rehearsal.py reads it)
        "rehearse": Lab("rehearse", ["--profile", "cpu", "--rehearse"], uri, tmp),
        # room for 20 MiB past loading: out of memory (tests/test_lab_end_to_end.py reads it)
        "oom": Lab(
            "oom", ["--profile", "cpu", "--max-steps", "3", "--memory-cap-gib", "0.02", *quick], uri, tmp
        ),
        **{name: Lab(name, long, uri, tmp, send(signum)) for name, signum in SIGNALLED.items()},
        "disk": Lab(
            "disk",
            [*long, "--save-steps", "2", "--lora-rank", "512", "--max-lora-rank", "512"],
            disk_uri,
            tmp,
        ),
    }
    # Two runs to resume (tests/test_run_resume.py): the README's command with flags, as finish-1 runs
    # it, stopped after two steps, each on a store of its own (a resume reconciles its store first):
    # one by SIGTERM, one by SIGKILL with a checkpoint every step, so it dies past its last checkpoint.
    for name, signum, extra in (
        ("resume-SIGTERM", signal.SIGTERM, []),
        ("resume-SIGKILL", signal.SIGKILL, ["--save-steps", "1"]),
    ):
        (tmp / name).mkdir()
        labs[name] = Lab(
            name, [*README_FLAGS, *extra], f"sqlite:///{tmp / name / 'mlflow.db'}", tmp, send(signum)
        )
    disk.watch(labs["disk"])
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        codes = {name: lab.wait(timeout=WAVE_TIMEOUT_S) for name, lab in labs.items()}
    finally:
        for lab in labs.values():
            if lab.process.poll() is None:
                lab.process.kill()
                lab.process.wait()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime
    print(f"\nthe wave of {len(labs)} labs: {time.perf_counter() - started:.0f} s, {cpu_s:.0f} CPU-seconds")
    import mlflow

    client = mlflow.MlflowClient(uri)
    yield {"labs": labs, "codes": codes, "client": client, "uri": uri, "disk": disk, "disk_uri": disk_uri}


def only_run(client, lab: Lab):
    """The MLflow run a lab opened (its run name ends with the lab's pid)."""
    experiment = client.get_experiment_by_name("grpo-first")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    (run,) = [r for r in runs if r.info.run_name.endswith(f"-{lab.process.pid}")]
    return run


# --- chapter 2: the CPU sweep, run once as the README runs it ---------------------------------------
README_SWEEP_REFUSED = ["uv", "run", "python", "labs/grpo-sizing/train.py", "--run-refused"]


@pytest.fixture(scope="session")
def cpu_sweep(tmp_path_factory):
    """`uv run python labs/grpo-sizing/train.py --run-refused`: the README's sweep and, after it, the
    refused cell run anyway; in its own MLflow store, then read back. Shared by the chapter's tests
    and its notebook's, which reads the sweep back instead of running one of its own."""
    import json

    import mlflow

    if HAS_CUDA:
        pytest.skip("runs the CPU sweep; on a GPU the same command sweeps Qwen3-4B")
    store = tmp_path_factory.mktemp("sizing")
    uri = f"sqlite:///{store / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONUNBUFFERED": "1"}
    command = README_SWEEP_REFUSED if shutil.which("uv") else [sys.executable, *README_SWEEP_REFUSED[3:]]
    started = time.perf_counter()
    result = subprocess.run(
        [*command, "--output-dir", str(store / "outputs")],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    seconds = time.perf_counter() - started
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient(uri)
    runs = mlflow.search_runs(experiment_names=["grpo-sizing"], output_format="list")
    (parent,) = [r for r in runs if r.data.tags.get("run_kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    cells = json.loads(
        Path(client.download_artifacts(parent.info.run_id, "sweep/cells.json", str(store))).read_text()
    )
    yield {
        "parent": parent,
        "children": children,
        "cells": cells,
        "client": client,
        "stdout": result.stdout,
        "seconds": seconds,
        "store": store,
    }


# --- chapter 4: every arm, run once as the README runs it ------------------------------------------
README_HACKING = ["uv", "run", "python", "labs/grpo-reward-hacking/train.py"]


@pytest.fixture(scope="session")
def cpu_hacking(tmp_path_factory):
    """`uv run python labs/grpo-reward-hacking/train.py`: every arm of the README's command, once, in
    its own MLflow store, then read back. Shared by the chapter's tests and its notebook's, which
    reads these arms back instead of training its own."""
    import json

    import mlflow

    if HAS_CUDA:
        pytest.skip("runs the CPU arms; on a GPU the same command trains Qwen3-4B")
    store = tmp_path_factory.mktemp("hacking")
    uri = f"sqlite:///{store / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONUNBUFFERED": "1"}
    command = README_HACKING if shutil.which("uv") else [sys.executable, *README_HACKING[3:]]
    started = time.perf_counter()
    result = subprocess.run(
        [*command, "--output-dir", str(store / "outputs")],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    seconds = time.perf_counter() - started
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient(uri)
    runs = mlflow.search_runs(experiment_names=["grpo-reward-hacking"], output_format="list")
    (parent,) = [r for r in runs if r.data.tags.get("run_kind") == "arms"]
    children = {
        r.data.tags["arm"]: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
    }
    record = json.loads(
        Path(client.download_artifacts(parent.info.run_id, "arms/arms.json", str(store))).read_text()
    )
    yield {
        "parent": parent,
        "children": children,
        "arms": {a["arm"]: a for a in record["arms"]},
        "client": client,
        "stdout": result.stdout,
        "seconds": seconds,
        "store": store,
    }


# --- a GPU machine as NVML and torch.cuda show it, for the order in which they are read ----------------
class FakeNVML:
    """pynvml's calls the module makes, over a list of cards (the hardware this machine lacks). Each
    call is appended to `calls`, so a test can see what was read and in which order."""

    def __init__(self, cards, driver="580.65.06", calls=None):
        self.cards, self.driver = cards, driver
        self.calls = calls if calls is not None else []

    def __getattribute__(self, name):
        if name.startswith("nvml"):
            object.__getattribute__(self, "calls").append(f"nvml.{name}")
        return object.__getattribute__(self, name)

    def nvmlDeviceGetCount(self):
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.cards[index]

    def nvmlDeviceGetUUID(self, handle):
        return handle["uuid"]

    def nvmlDeviceGetName(self, handle):
        return handle["name"]

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=handle["used"], total=handle["total"])

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return handle.get("procs", [])

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        return []

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return handle.get("capability", (12, 0))


CARDS = [
    {"uuid": "GPU-aaaa-1111", "name": "NVIDIA GeForce RTX 4090", "used": 1 << 30, "total": 24 << 30},
    {"uuid": "GPU-bbbb-2222", "name": "NVIDIA GeForce RTX 5080", "used": 2 << 30, "total": 16 << 30},
]


# torch.cuda's calls that initialise CUDA in this process (and with it torch's caching allocator,
# which reads PYTORCH_ALLOC_CONF then, once). A stand-in torch that records them, beside NVML's.
CUDA_INITIALISING = (
    "get_device_properties",
    "get_device_name",
    "get_device_capability",
    "mem_get_info",
    "current_device",
    "set_device",
    "init",
    "_lazy_init",
    "memory_reserved",
    "synchronize",
)


@pytest.fixture
def gpu_machine(monkeypatch):
    """A machine with two cards as this process sees it before CUDA is up: torch.cuda is available,
    not initialised, and every call that would initialise it is recorded in `calls`."""
    import torch

    import grpolab.device

    calls: list[str] = []
    cards = [
        {**CARDS[0], "capability": (8, 9)},
        {**CARDS[1], "capability": (12, 0), "procs": [SimpleNamespace(pid=1, usedGpuMemory=2 << 30)]},
    ]
    nvml = FakeNVML(cards, calls=calls)
    monkeypatch.setattr(grpolab.device, "_nvml", lambda: nvml)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    for name in CUDA_INITIALISING:
        monkeypatch.setattr(
            torch.cuda, name, lambda *a, _n=name, **k: calls.append(f"cuda.{_n}"), raising=False
        )
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return SimpleNamespace(calls=calls, nvml=nvml, cards=cards)
