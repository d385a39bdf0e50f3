"""What the suite's tests share: where things are, the chapters as the README lists them, and how a
lab is run (as a real process forked from the preloaded parent, or in this process).

Chapters are discovered, never named here: the README's chapter table says which command is a
chapter's and which notebook follows it, and its lab.toml whether it runs in this environment (a
chapter with an `environment` of its own, verl's, has its own tests there). A chapter's tests live
in its folder (`labs/<name>/test_*.py`) and read its README run through the `chapter_run` fixture
(conftest.py), which runs the chapter's command once per session.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from grpolab.config.paths import REPO_ROOT
from grpolab.lab.console import STEP_PREFIX
from grpolab.lifecycle.endings import PHASE_PREFIX

README = REPO_ROOT / "README.md"
LABS = REPO_ROOT / "labs"
# Chapter 1 trains the book's recipe as it is: the harness's own tests run it.
LAB_DIR = LABS / "grpo-first"


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


HAS_CUDA = _cuda()


def gpu_only(reason: str):
    """Marked `gpu` and skipped without a CUDA GPU; the reason says what the test would check on one."""
    skip = pytest.mark.skipif(not HAS_CUDA, reason=f"needs a CUDA GPU: {reason}")
    return lambda test: pytest.mark.gpu(skip(test))


def cpu_only(reason: str):
    """Skip on a GPU machine: the test runs the CPU profile; the reason says what runs there instead."""
    return pytest.mark.skipif(HAS_CUDA, reason=reason)


def load_lab_module(lab_dir: Path):
    """labs/<chapter>/train.py imported as a module (chapter folders have hyphens)."""
    from grpolab.chapters import load_chapter

    return load_chapter(Path(lab_dir).name)


def free_port() -> int:
    """A TCP port on loopback that nothing listens on (closed again when the socket goes)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the chapters ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Chapter:
    """A chapter as the README's table lists it, with what its lab.toml says of its environment."""

    number: int
    title: str
    name: str
    command: str  # the README's command for it
    notebook: Path
    measured: str  # the row's one line of what it measured
    environment: str | None  # a uv project of its own (verl's), or None: this one
    starts_from: str | None = None  # the chapter whose README run its command reads (lab.toml), or None

    @property
    def folder(self) -> Path:
        return LABS / self.name

    @property
    def here(self) -> bool:
        """Whether it runs, and is tested, in this environment."""
        return self.environment is None


# | N. [title](labs/<name>/README.md) | `command` | `notebooks/NN-<name>.ipynb` | what it measured |
ROW = re.compile(
    r"^\| (?P<number>\d+)\. \[(?P<title>[^\]]+)\]\(labs/(?P<name>[^/)]+)/README\.md\) \| `(?P<command>[^`]+)` "
    r"\| `(?P<notebook>notebooks/[^`]+\.ipynb)` \| (?P<measured>[^|]+?) \|$"
)


def chapters(readme: Path = README) -> list[Chapter]:
    """Every chapter of the README's table, in its order."""
    found = []
    for line in readme.read_text().splitlines():
        row = ROW.match(line)
        if row is None:
            continue
        folder = readme.parent / "labs" / row["name"]
        toml = folder / "lab.toml"
        declared = tomllib.loads(toml.read_text()) if toml.is_file() else {}
        environment = declared.get("environment")
        found.append(
            Chapter(
                int(row["number"]),
                row["title"],
                row["name"],
                row["command"],
                readme.parent / row["notebook"],
                row["measured"],
                environment,
                declared.get("starts_from"),
            )
        )
    return found


@cache
def chapter(name: str) -> Chapter:
    (found,) = [c for c in chapters() if c.name == name]
    return found


def chapter_of(path: Path) -> Chapter | None:
    """The chapter whose folder holds `path`, or whose notebook it is, or None."""
    path = Path(path).resolve()
    for c in chapters():
        if path == c.notebook.resolve() or c.folder.resolve() in path.parents:
            return c
    return None


# A page's picture: the first thing under its title, `![what it shows](file.png)`.
PICTURE = re.compile(r"\A# [^\n]*\n+!\[[^\]]*\]\(([^)\s]+\.png)\)")


def page_picture(page: Path) -> Path | None:
    """The picture a page opens with (the line under its title), or None."""
    found = PICTURE.match(page.read_text())
    return (page.parent / found[1]).resolve() if found else None


def prose(page: Path) -> str:
    """A page's text with every run of whitespace one space: a figure quoted across a line break reads
    as one phrase, and bold marks (`**`) are dropped."""
    return " ".join(page.read_text().replace("**", "").split())


def table_rows(page: Path, columns: int) -> list[list[str]]:
    """The rows of a page's Markdown tables that have `columns` cells, each cell stripped and its bold
    marks dropped (header and separator rows included: a caller picks its rows by their first cell)."""
    rows = []
    for line in page.read_text().replace("**", "").splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows += [cells] if len(cells) == columns else []
    return rows


def update_screenshots() -> bool:
    """UPDATE_SCREENSHOTS=1: the tests that read a run write its pictures into the checkout (the README's,
    each chapter page's), where they otherwise write to a temporary folder."""
    return os.environ.get("UPDATE_SCREENSHOTS") == "1"


def trainer_labs() -> list[Path]:
    """The chapter folders that train in this environment: every labs/*/lab.toml without an
    environment of its own."""
    return [
        toml.parent
        for toml in sorted(LABS.glob("*/lab.toml"))
        if "environment" not in tomllib.loads(toml.read_text())
    ]


TRAINER_LABS = trainer_labs()


# --- commands as the README writes them -----------------------------------------------------------
def command_words(command: str) -> list[str]:
    """A README command (`uv run python X`, `uv run mlflow ...`) as written when uv is on PATH, else
    the same in this interpreter: the one place the suite falls back from uv to plain Python."""
    words = shlex.split(command)
    if shutil.which("uv") or words[:2] != ["uv", "run"]:
        return words
    rest = words[2:]
    while rest and rest[0].startswith("--"):  # uv's own options (--project DIR, --frozen)
        rest = rest[2:] if rest[0] == "--project" else rest[1:]
    return [sys.executable, *rest[1:]] if rest[0] == "python" else [sys.executable, "-m", *rest]


def script_and_args(command: str) -> tuple[Path, list[str]]:
    """`uv run python labs/<chapter>/train.py ARGS` as (the script, ARGS)."""
    words = shlex.split(command)
    at = next(i for i, w in enumerate(words) if w.endswith(".py"))
    return REPO_ROOT / words[at], words[at + 1 :]


def run_command(command: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """A README command run as the README writes it, from the repository root."""
    return subprocess.run(
        command_words(command),
        cwd=REPO_ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_into_store(command: str, folder: Path, experiment: str, timeout: float = 3600):
    """A chapter's command run with an MLflow store and outputs of its own under `folder`; returns the
    store's client and the experiment's one run (the GPU tests: one short run, read back)."""
    import mlflow

    uri = f"sqlite:///{folder / 'mlflow.db'}"
    result = run_command(
        f"{command} --output-dir {folder / 'outputs'}", timeout=timeout, MLFLOW_TRACKING_URI=uri
    )
    assert result.returncode == 0, result.stderr[-3000:]
    client = mlflow.MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return client, run


# --- lab processes --------------------------------------------------------------------------------
_server: Any = None
_server_lock = threading.Lock()


def fork_server():
    """The suite's fork server (grpolab.lab.forkserver), started on first use; None on a GPU machine,
    where lab processes start fresh."""
    global _server
    from grpolab.lab import forkserver

    with _server_lock:
        if _server is None and forkserver.available():
            _server = forkserver.ForkServer.start()
            os.environ[forkserver.ENV] = _server.path  # the fresh processes this one starts use it too
        return _server


def stop_fork_server() -> None:
    global _server
    with _server_lock:
        if _server is not None:
            _server.close()
            _server = None


def _default_signals() -> None:
    """A lab as a terminal starts it, even when pytest runs under nohup or in a background job."""
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


class Lab:
    """One lab process, started as `python <script> ARGS` would be (forked from the preloaded parent,
    or a fresh process where there is none), with its own MLflow store (`uri`) and one CPU thread.
    A thread reads its output line by line; `on_line(lab, line)` sees each line as it comes."""

    def __init__(
        self,
        name: str,
        script: Path,
        args: Sequence[str],
        uri: str,
        folder: Path,
        on_line: Callable[[Lab, str], None] | None = None,
        threads: int = 1,
        env: dict[str, str] | None = None,
        nice: int = 0,
    ) -> None:
        self.name, self.folder, self.uri = name, folder, uri
        self.output: Path | None = None  # its --output-dir, where the caller knows it
        self.script, self.args = Path(script), list(args)
        self.lines: list[str] = []
        self.on_line = on_line
        folder.mkdir(parents=True, exist_ok=True)
        self.stderr_path = folder / f"{name}.stderr"
        env = {
            "MLFLOW_TRACKING_URI": uri,
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": str(threads),
            **(env or {}),
        }
        env["PYTHONFAULTHANDLER"] = "1"  # a crash (SIGSEGV) prints every thread's stack to its stderr
        self.started = time.perf_counter()
        self.seconds: float | None = None
        server = fork_server()
        sys.audit("suite.lab_process", name)  # conftest.py: a test that starts one is `slow`
        with open(self.stderr_path, "w") as stderr:
            if server is not None:
                self.process = server.run(
                    self.script, self.args, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=stderr
                )
            else:
                self.process = subprocess.Popen(
                    [sys.executable, str(self.script), *self.args],
                    cwd=REPO_ROOT,
                    env={**os.environ, **env},
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    text=True,
                    preexec_fn=_default_signals,
                )
        if nice:  # a lower priority: the scheduler's share, never a computed bit
            with contextlib.suppress(ProcessLookupError):
                os.setpriority(os.PRIO_PROCESS, self.process.pid, nice)
        self.reader = threading.Thread(target=self._read, name=f"lab-{name}", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        with open(self.folder / f"{self.name}.stdout", "w") as kept:  # for a look after the session
            for line in self.process.stdout:
                self.lines.append(line)
                kept.write(line)
                kept.flush()
                if self.on_line is not None:
                    self.on_line(self, line)

    def wait(self, timeout: float) -> int:
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait(timeout=60)
        self.reader.join(timeout=30)
        if self.seconds is None:
            self.seconds = time.perf_counter() - self.started
        return code

    def send_signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def stdout(self) -> str:
        return "".join(self.lines)

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def log(self) -> str:
        return f"--- {self.name} stdout ---\n{self.stdout[-3000:]}\n--- stderr ---\n{self.stderr[-3000:]}"


def only_run(client, lab: Lab, chapter: str = "grpo-first"):
    """The MLflow run a lab process opened (its run name ends with the process's pid)."""
    experiment = client.get_experiment_by_name(chapter)
    runs = client.search_runs([experiment.experiment_id], max_results=200)
    (run,) = [r for r in runs if r.info.run_name.endswith(f"-{lab.pid}")]
    return run


# --- chapter 1's lab, as the README runs it with flags, and stopped by a signal ---------------------
# The README's lab command with flags, less its --output-dir (each run gets its own).
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
# A stop is never lost: chapter 1's lab, short, stopped at each phase and step it reports -------
STOP_RUN = ["--max-steps", "2", "--eval-prompts", "4"]  # every phase, and a step before another
# The lab prints each phase as it begins (GRPOLAB_SHOW_PHASES) and a line per step: a signal is sent
# the moment a marker is read, so a machine twice as fast or as slow is stopped in the same places.
# The last marker is the lab's last line: a signal then lands as the process ends.
LAST_LINE = "Open it: "
# SIGINT and SIGHUP at two markers each: SIGINT in the model's load (Unsloth's lazy imports once
# swallowed a KeyboardInterrupt there), SIGHUP at a step; each at the process's end.
OTHER_SIGNALS_AT = {
    signal.SIGINT: ("phase: the model's load", LAST_LINE),
    signal.SIGHUP: (f"{STEP_PREFIX}1/", LAST_LINE),
}


def markers(lines: list[str]) -> list[str]:
    """What a lab reported, as markers a signal can be sent at: each phase, each step, its last line."""
    found = [
        ln.rstrip("\n") if ln.startswith(PHASE_PREFIX) else ln.split("/")[0] + "/"  # "step 2/"
        for ln in lines
        if ln.startswith((PHASE_PREFIX, STEP_PREFIX))
    ]
    return [*found, LAST_LINE]


STEPS_BEFORE_SIGNAL = 2
WAVE_TIMEOUT_S = 1800
SIGNALLED = {"SIGTERM": signal.SIGTERM, "SIGHUP": signal.SIGHUP, "SIGKILL": signal.SIGKILL}


def signal_after_steps(signum: int, steps: int = STEPS_BEFORE_SIGNAL):
    """An `on_line` that sends `signum` once the lab has printed `steps` step lines."""
    from grpolab.lab.console import STEP_PREFIX

    seen = {"steps": 0}

    def on_line(lab: Lab, line: str) -> None:
        if line.startswith(STEP_PREFIX):
            seen["steps"] += 1
            if seen["steps"] == steps:
                lab.send_signal(signum)

    return on_line


README_RUNS = "uv run python -m grpolab runs"
README_MATRIX_PLAN = "uv run python -m grpolab.matrix --plan"
README_MATRIX_QUICK = (
    "uv run python -m grpolab.matrix --chapters grpo-first --seeds 0 --contexts forked "
    '--lab-args "--max-steps 4 --eval-prompts 8" --no-claims --out outputs/matrix-quick'
)
README_RECONCILE = "uv run python -m grpolab runs --reconcile"
README_RESUME = "uv run python labs/grpo-first/train.py --resume last"
README_COUNTDOWN = "uv run python labs/grpo-first/train.py --task countdown"
# Chapter 7's three ways in besides its own command (labs/grpo-own-task/README.md): a task file from
# `task new` (trained, and its own tests run), a data file with a checker, a reasoning-gym dataset.
README_TASK_NEW = "uv run python -m task new demo"
README_TASK_TRAIN = "uv run python labs/grpo-first/train.py --task demo.py --max-steps 8"
README_TASK_TEST = "uv run pytest test_demo.py"
README_DATA_TASK = (
    "uv run python labs/grpo-first/train.py --task labs/grpo-own-task/products.jsonl "
    '--task-config \'{"checker": "integer"}\' --max-steps 8'
)
README_GYM_TASK = (
    "uv run python labs/grpo-first/train.py --task reasoning-gym:basic_arithmetic "
    '--task-config \'{"max_terms": 2, "max_digits": 1}\' --max-steps 8'
)


# --- a lab in this process ------------------------------------------------------------------------
@dataclass
class Ended:
    """How a lab ended: its exit code and what it printed (`lab.main(argv)` in this process, or a lab
    process of its own)."""

    code: int
    stdout: str
    stderr: str


def run_in_process(lab_module, argv: Sequence[str], uri: str | None = None, threads: int | None = None):
    """`lab_module.main(argv)` in this process (the `stack` fixture imported the stack here once), with
    its own MLflow store when `uri` is given and torch held to `threads` threads; returns its exit code
    and what it printed. Runs left open are ended and the process's settings put back after."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    import mlflow
    import torch

    from grpolab.lifecycle import tracking

    saved_uri, saved_threads = os.environ.get("MLFLOW_TRACKING_URI"), torch.get_num_threads()
    if uri is not None:
        os.environ["MLFLOW_TRACKING_URI"] = uri
    if threads is not None:
        torch.set_num_threads(threads)
    out, err = io.StringIO(), io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = lab_module.main(list(argv))
            except SystemExit as stop:  # argparse's refusals and --help end the interpreter: their code
                code = stop.code if isinstance(stop.code, int) else 1
    finally:
        while mlflow.active_run():
            mlflow.end_run()
        torch.set_num_threads(saved_threads)
        if uri is not None:
            if saved_uri is None:
                os.environ.pop("MLFLOW_TRACKING_URI", None)
            else:
                os.environ["MLFLOW_TRACKING_URI"] = saved_uri
            tracking.use_store()
    return Ended(code, out.getvalue(), err.getvalue())


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
        import resource

        while lab.process.poll() is None:
            # trainer_state.json is the trainer's last file of a checkpoint: whole once it parses (it
            # exists, empty, while it is written: a snapshot then recorded it as 0 bytes, CI 2026-12-02).
            states = lab.output.glob("grpo-first/*/checkpoint-*/trainer_state.json")
            whole = [p.parent for p in states if _parses(p)]
            if whole:
                self.limit = self.store_db.stat().st_size + 1024**2
                resource.prlimit(lab.pid, resource.RLIMIT_FSIZE, (self.limit, self.limit))
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


# --- figures built by hand ---------------------------------------------------------------------------
def sample_comparison(**overrides):
    """A budget-vs-measured comparison built by hand (grpolab.memory.comparison), in MiB, for its report."""
    from budgets.units import MIB
    from grpolab.memory.comparison import Comparison

    c = Comparison(
        budget={
            "base_weights": 100 * MIB,
            "kv_cache": 300 * MIB,
            "logits": 50 * MIB,
            "train_activations": 80 * MIB,
        },
        measured={"base_weights": 110 * MIB, "kv_cache": 290 * MIB, "logits": 70 * MIB},
        unit="mib",
        total_budget=450 * MIB,
        total_measured=500 * MIB,
        total_label="NVML process peak",
        # logits live in another phase than the peak: their miss does not explain the peak's.
        peak_phase_lines=["base_weights", "kv_cache", "train_activations"],
    )
    for key, value in overrides.items():
        setattr(c, key, value)
    return c


# --- a sketched chapter, picked up by the suite (tests/test_chapters.py) ------------------------------
SKIP_COPYING = {
    ".venv",
    ".git",
    "outputs",
    ".cache",
    "mlruns",
    "mlflow.db",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    "unsloth_compiled_cache",
}
# The shared checks that read every chapter, run on the sketched copy.
SKETCH_CHECKS = [
    "test_every_command_on_every_page_is_exercised",
    "test_every_relative_link_on_every_page_resolves",
    "test_every_chapter_has_its_files",
    "test_there_is_a_notebook_for_every_lab",
]


def what_a_chapter_touches(doc: Path = REPO_ROOT / "docs" / "chapters.md") -> list[str]:
    """The paths docs/chapters.md says a new chapter's author touches (`<name>`, `NN` as written)."""
    section = doc.read_text().split("## The next chapter, sketched", 1)[1].split("\n## ", 1)[0]
    bullets = [line for line in section.splitlines() if line.startswith("- `")]
    return [
        p
        for line in bullets
        for p in re.findall(r"`([^`]+)`", line.split(":", 1)[0])
        if "/" in p or p.endswith(".md")
    ]


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def sketch_chapter(repo: Path, name: str, number: int) -> None:
    """Chapter `number` sketched as a copy of chapter 1: its folder (its lab.toml naming it, its page
    chapter 1's), its notebook pair, its README row after the last one, linking to its page."""
    shutil.copytree(
        repo / "labs" / "grpo-first", repo / "labs" / name, ignore=shutil.ignore_patterns("__pycache__")
    )
    (repo / "labs" / name / "lab.toml").write_text(f'chapter = "{name}"\n')
    for suffix in (".py", ".ipynb"):
        text = (repo / "notebooks" / f"01-grpo-first{suffix}").read_text()
        (repo / "notebooks" / f"{number:02d}-{name}{suffix}").write_text(text.replace("grpo-first", name))
    readme = (repo / "README.md").read_text().splitlines()
    last = max(i for i, line in enumerate(readme) if re.match(r"\| \d+\. ", line))
    row = (
        f"| {number}. [A sketch](labs/{name}/README.md) | `uv run python labs/{name}/train.py` | "
        f"`notebooks/{number:02d}-{name}.ipynb` | not measured yet |"
    )
    (repo / "README.md").write_text("\n".join([*readme[: last + 1], row, *readme[last + 1 :]]) + "\n")


def sketch_and_collect(folder: Path) -> dict[str, Any]:
    """This repository copied into `folder` with chapter 5 sketched (`sketch_chapter`), what that
    touched and what docs/chapters.md allows, then one pytest in the copy: its whole collection and the
    runs it would start, written before `-k` keeps only the shared checks that read a chapter
    (conftest.py: GRPOLAB_SUITE_PLAN), which then run."""
    import json

    repo = folder / "repo"
    shutil.copytree(REPO_ROOT, repo, ignore=lambda _, names: [n for n in names if n in SKIP_COPYING])
    before = files(repo)
    sketch_chapter(repo, "grpo-sketch", 5)
    touched = sorted(path for path, data in files(repo).items() if before.get(path) != data)
    allowed = [p.replace("<name>", "grpo-sketch").replace("NN", "05") for p in what_a_chapter_touches()]
    plan = folder / "plan.json"
    env = {k: v for k, v in os.environ.items() if k != "GRPOLAB_FORKSERVER"} | {
        "GRPOLAB_SUITE_PLAN": str(plan)
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rA",
            "-k",
            " or ".join(SKETCH_CHECKS),
        ],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    collected = json.loads(plan.read_text()) if plan.exists() else {"tests": [], "runs": []}
    return {"touched": touched, "allowed": allowed, "done": done, "collected": collected}
