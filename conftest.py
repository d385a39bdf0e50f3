"""The suite's shared fixtures, for tests/ and for each chapter's own tests (labs/<name>/test_*.py).

The suite pays for each import once and runs each chapter once:

- **One preloaded parent.** Lab processes are forked from one fork server (grpolab.lab.forkserver) that
  imported torch, TRL, MLflow and Unsloth once; each is still a real process (its pid, signals, exit
  status and resident set). Runs that need no process of their own run in this process
  (`suite.run_in_process`), after the `stack` fixture imported the same stack here.
- **One run per chapter.** Each chapter's README command (the README's chapter table says which) runs
  once, in a store of its own, and every test about the chapter reads that run (`chapter_run`), its
  notebook's included. A chapter whose lab.toml names an environment of its own (verl's) is tested
  there, not here.
- **Started early, read late.** The runs that take minutes (each chapter's command, the wave of lab
  processes every ending needs) start together as soon as the tests are collected, and the tests that
  read them run last: the fast tests run meanwhile. `--collect-only` starts nothing and reports what
  a full run would start.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from grpolab.config import numerics
from grpolab.lab.console import STEP_PREFIX
from grpolab.lifecycle.endings import HOLD_EXIT_ENV, HOLD_PHASE_ENV, PHASE_PREFIX, SHOW_PHASES_ENV

from suite import (
    HAS_CUDA,
    LAB_DIR,
    LAST_LINE,
    OTHER_SIGNALS_AT,
    README_COUNTDOWN,
    README_DATA_TASK,
    README_FLAGS,
    README_GYM_TASK,
    README_MATRIX_QUICK,
    README_RECONCILE,
    README_RESUME,
    README_RUNS,
    README_TASK_NEW,
    README_TASK_TEST,
    README_TASK_TRAIN,
    REPO_ROOT,
    STOP_RUN,
    WAVE_TIMEOUT_S,
    Chapter,
    FileSizeLimit,
    Lab,
    chapter_of,
    chapters,
    command_words,
    fork_server,
    markers,
    script_and_args,
    signal_after_steps,
    stop_fork_server,
)

# The suite's own process computes as a CPU lab does (its in-process runs, the stand-ins it builds, the
# notebooks' kernels and lab processes it starts inherit the variables): before anything computes.
if not HAS_CUDA:
    numerics.pin()

# A chapter with an environment of its own (lab.toml's `environment`) runs its tests there.
collect_ignore_glob = [f"labs/{c.name}/*" for c in chapters() if not c.here]
CHAPTER_TIMEOUT_S = 3600  # one chapter's README command, on a loaded 2-core machine
CHAPTER_NICE = 10  # the chapters' README runs yield the CPU to the tests (run_chapter says why)
# The CPU seconds each long chapter run used in a fresh clone's CI on 2 cores (2026-12-07, at 3436e31:
# the user + system time of its processes, its arms' and cells' included, read from /proc while the
# suite ran; chapter 5's fell from 375 s when the fork server began compiling the masks its arms
# trace). All niced alike, the runs progressed alike and the longest, chapter 8's, ran alone on one
# core for its last 180 s while the other idled (1233 to 1290 s of pytest). Niced by what each
# needs (chapter_nice), the last three ended within 35 and 100 s of one another in the next two CIs,
# with both cores busy until then (1220 and 1289 s: the suite is bound by its CPU, about 2,400 s, not
# by the order it spends it in). A scheduling hint only: the nice level never changes a computed bit,
# and a chapter not named is niced as the short ones are.
CHAPTER_CPU_S = {
    "grpo-stuck": 349,  # 378 at its former 16 steps: a seed-0 cell took 296 s at 14, 321 s at 16
    "grpo-headroom": 245,  # 296 before its CPU host was made smaller: its seed cells took 0.83 as long
    "grpo-reward-hacking": 211,
    "grpo-first": 154,
    "grpo-ship": 43,
}
SHORT_RUN_CPU_S = 120  # a run needing at most this much stays at CHAPTER_NICE


# --- the runs started early -----------------------------------------------------------------------
class Background:
    """The session's long runs: each started once, in a thread of its own, as soon as the tests are
    collected; `result(key)` waits for one (and raises what it raised)."""

    def __init__(self, root: Path, commands: dict[str, str] | None = None) -> None:
        self.root = root
        self.commands = commands or {}  # a chapter's command for the suite, where its tests name one
        self.jobs: dict[str, Future] = {}
        self.started: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.cleanup: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def start(self, key: str) -> Future:
        with self._lock:
            if key not in self.jobs:
                future: Future = Future()
                self.jobs[key], self.started[key] = future, time.perf_counter()
                work = JOBS[key.split(":")[0]]
                threading.Thread(target=self._run, args=(key, work, future), name=key, daemon=True).start()
            return self.jobs[key]

    def _run(self, key: str, work, future: Future) -> None:
        try:
            result = work(self, key.partition(":")[2])
        except BaseException as error:  # the test that reads it reports it
            error.add_note(f"in the suite's background run {key!r}:\n{traceback.format_exc()}")
            self.ended[key] = time.perf_counter()
            future.set_exception(error)
        else:
            self.ended[key] = time.perf_counter()
            future.set_result(result)

    def timeline(self, since: float) -> str:
        """When each run started and ended, in seconds from `since` (the session's start): the suite's
        tail is the run that ends last, and what a change to the suite's time must shorten."""
        spans = [
            f"{key} {self.started[key] - since:.0f}-{self.ended[key] - since:.0f} s"
            if key in self.ended
            else f"{key} {self.started[key] - since:.0f} s-, not ended"
            for key in sorted(self.started, key=lambda k: self.ended.get(k, float("inf")))
        ]
        return "background runs, started-ended: " + ", ".join(spans)

    def result(self, key: str) -> Any:
        return self.start(key).result()

    def folder(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path


@dataclass
class ChapterRun:
    """A chapter's README command, run once: how it ended, what it printed, and its MLflow store."""

    chapter: Chapter
    command: str  # what ran: the README's row, or the chapter's tests' chapter_command
    code: int
    stdout: str
    stderr: str
    seconds: float
    store: Path  # the folder of its mlflow.db
    uri: str
    client: Any
    runs: list = field(default_factory=list)  # every run of the chapter's experiment
    outputs: list[Path] = field(default_factory=list)  # the run folders it wrote under outputs/

    def log(self) -> str:
        return f"--- stdout ---\n{self.stdout[-4000:]}\n--- stderr ---\n{self.stderr[-4000:]}"

    @property
    def top(self) -> list:
        """The chapter's runs that are nobody's child (a lab's run, a sweep's, an arms run's)."""
        return [r for r in self.runs if "mlflow.parentRunId" not in r.data.tags]

    def children(self, parent) -> list:
        return [r for r in self.runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]


def run_chapter(background: Background, name: str) -> ChapterRun:
    """The chapter's README command exactly (its script, its arguments, its default outputs/ folder),
    as a process forked from the preloaded parent, into a store of its own. Its tests may name
    another of the README's commands for it (`pytest.mark.chapter_command`)."""
    import mlflow

    from grpolab.config.paths import OUTPUTS

    chapter = next(c for c in chapters() if c.name == name)
    store = background.folder(f"chapter-{name}")
    uri = f"sqlite:///{store / 'mlflow.db'}"
    if chapter.starts_from is not None:  # its command reads that chapter's README run: a copy of its store
        earlier = background.result(f"chapter:{chapter.starts_from}")
        assert earlier.code == 0, (
            f"{name} starts from {chapter.starts_from}'s run, which failed:\n{earlier.log()}"
        )
        _copy_sqlite(earlier.store / "mlflow.db", store / "mlflow.db")
    script, args = script_and_args(background.commands.get(name, chapter.command))
    before = set((OUTPUTS / name).glob("*"))
    # Niced: the tests run one after another, and while the chapters run beside them each test waits
    # on a share of two cores; the tests first, the chapters on what the tests leave, and the session
    # ends closer to its work over two cores (CI had one core idle for the last 140 s of 917).
    lab = Lab(name, script, args, uri, store, nice=chapter_nice(chapter))
    code = lab.wait(timeout=CHAPTER_TIMEOUT_S)
    written = sorted(set((OUTPUTS / name).glob("*")) - before)
    background.cleanup += [lambda p=p: shutil.rmtree(p, ignore_errors=True) for p in written]
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name(name)
    runs = client.search_runs([experiment.experiment_id], max_results=1000) if experiment else []
    command = background.commands.get(name, chapter.command)
    return ChapterRun(
        chapter, command, code, lab.stdout, lab.stderr, lab.seconds, store, uri, client, runs, written
    )


def chapter_nice(chapter: Chapter) -> int:
    """The nice level of a chapter's README run: CHAPTER_NICE, less a level for each factor of 1.25 by
    which its CPU (with that of a chapter that starts from its run, which waits on it) passes a short
    run's. Linux weighs a process 1.25 times more per level of nice, so each long run's share of what
    the tests leave is in proportion to what it needs. A chapter that starts from another's run has
    that run's level: it is the rest of the same wait."""
    import math

    if chapter.starts_from is not None:
        return chapter_nice(next(c for c in chapters() if c.name == chapter.starts_from))
    seconds = CHAPTER_CPU_S.get(chapter.name, 0)
    seconds += sum(CHAPTER_CPU_S.get(c.name, 0) for c in chapters() if c.starts_from == chapter.name)
    if seconds <= SHORT_RUN_CPU_S:
        return CHAPTER_NICE
    return max(0, CHAPTER_NICE - round(math.log(seconds / SHORT_RUN_CPU_S, 1.25)))


def _copy_sqlite(source: Path, target: Path) -> None:
    """A consistent copy of a SQLite store another test may be writing to (SQLite's backup, not a
    file copy that could catch half a transaction)."""
    import sqlite3

    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)


# --- the wave: chapter 1's lab ended every way a run can end ---------------------------------------
# A process per ending, started together: two that finish, one that runs out of memory and one
# stopped by SIGHUP on one fresh store (which is also the test that first runs on a new store are
# safe), and on stores of their own one whose disk fills and two to resume: one stopped by SIGTERM
# (the harness saves the step it finished as a checkpoint) and one killed by SIGKILL past its last
# checkpoint. The README's command with flags (tests/test_readme.py) is `finish-1`; the two stopped
# runs train the same, so a resumed run can be held against it, bit for bit.
def run_wave(background: Background, _: str) -> dict:
    tmp = background.folder("wave")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"

    def own(name: str) -> str:
        (tmp / name).mkdir(exist_ok=True)
        return f"sqlite:///{tmp / name / 'mlflow.db'}"

    quick = ["--eval-prompts", "0"]
    long = ["--max-steps", "500", *quick]
    script = LAB_DIR / "train.py"

    def lab(name, args, store=uri, on_line=None):
        started = Lab(name, script, ["--output-dir", str(tmp / name), *args], store, tmp, on_line)
        started.output = tmp / name  # its --output-dir (and, for a store of its own, the store's folder)
        return started

    started = time.perf_counter()
    labs = {
        "finish-1": lab("finish-1", README_FLAGS),
        # the README's other task, shortened: two steps, no held-out evaluation
        "finish-2": lab("finish-2", [*script_and_args(README_COUNTDOWN)[1], "--max-steps", "2", *quick]),
        # room for 20 MiB past loading: out of memory
        "oom": lab("oom", ["--profile", "cpu", "--max-steps", "3", "--memory-cap-gib", "0.02", *quick]),
        "SIGHUP": lab("SIGHUP", long, on_line=signal_after_steps(signal.SIGHUP)),
        "SIGTERM": lab("SIGTERM", README_FLAGS, own("SIGTERM"), signal_after_steps(signal.SIGTERM)),
        # a checkpoint every step, so that it dies past its last whole one
        "SIGKILL": lab(
            "SIGKILL",
            [*README_FLAGS, "--save-steps", "1"],
            own("SIGKILL"),
            signal_after_steps(signal.SIGKILL),
        ),
        "disk": lab(
            "disk", [*long, "--save-steps", "2", "--lora-rank", "512", "--max-lora-rank", "512"], own("disk")
        ),
    }
    disk = FileSizeLimit(tmp / "disk" / "mlflow.db")
    disk.watch(labs["disk"])
    codes = {name: lab.wait(timeout=WAVE_TIMEOUT_S) for name, lab in labs.items()}
    print(f"\nthe wave of {len(labs)} labs: {time.perf_counter() - started:.0f} s")
    return {"labs": labs, "codes": codes, "uri": uri, "disk": disk, "tmp": tmp}


@dataclass
class Stopped:
    """One lab sent `signum` the moment it printed `marker` (None: the reference run)."""

    name: str
    signum: int | None
    marker: str | None
    lab: Lab
    code: int = 0
    sent: bool = False  # False: it never printed its marker (it ended first)
    runs: list = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)  # what it left under its --output-dir


def run_stops(background: Background, _: str) -> dict:
    """The reference run, then one run stopped by SIGTERM at each marker it reported, and by SIGINT
    and SIGHUP at two each: three labs at a time, each on a store and folder of its own."""
    import mlflow

    tmp = background.folder("stops")

    def start(name: str, signum: int | None = None, marker: str | None = None) -> Stopped:
        folder = tmp / name
        folder.mkdir(parents=True, exist_ok=True)

        def on_line(lab: Lab, line: str) -> None:
            sending = signum is not None and not getattr(lab, "signal_sent", False)
            if sending and line.startswith(marker) and lab.process.poll() is None:
                lab.send_signal(signum)
                lab.signal_sent = True

        args = ["--output-dir", str(folder / "outputs"), *STOP_RUN]
        env = {SHOW_PHASES_ENV: "1"}
        if marker == LAST_LINE:  # the lab lingers at its end: a signal sent at its last line lands there
            env[HOLD_EXIT_ENV] = str(WAVE_TIMEOUT_S)
        elif marker is not None and marker.startswith(PHASE_PREFIX):  # ... and at its phase's start
            env[HOLD_PHASE_ENV] = marker.removeprefix(PHASE_PREFIX)
        elif marker is not None and marker.startswith(STEP_PREFIX):  # ... and after its step's line
            env[HOLD_PHASE_ENV] = marker
        lab = Lab(name, LAB_DIR / "train.py", args, _sqlite(folder), tmp, on_line, env=env)
        return Stopped(name, signum, marker, lab)

    def finish(case: Stopped) -> Stopped:
        case.code = case.lab.wait(timeout=WAVE_TIMEOUT_S)
        case.sent = getattr(case.lab, "signal_sent", False)
        folder = tmp / case.name
        if (folder / "mlflow.db").exists():
            client = mlflow.MlflowClient(_sqlite(folder))
            experiments = client.search_experiments()
            case.runs = client.search_runs([e.experiment_id for e in experiments]) if experiments else []
        outputs = folder / "outputs"
        case.outputs = (
            sorted(str(p.relative_to(outputs)) for p in outputs.rglob("*")) if outputs.exists() else []
        )
        return case

    reference = finish(start("reference"))
    cases = [(signal.SIGTERM, m) for m in markers(reference.lab.lines)]
    cases += [(s, m) for s, at in OTHER_SIGNALS_AT.items() for m in at]
    done: list[Stopped] = []
    running: list[Stopped] = []
    for i, (signum, marker) in enumerate(cases):
        if len(running) == 3:
            done.append(finish(running.pop(0)))
        running.append(start(f"{signal.Signals(signum).name}-{i}", signum, marker))
    done.extend(finish(case) for case in running)
    return {"reference": reference, "stopped": done, "markers": markers(reference.lab.lines)}


# --- the quick matrix (docs/every-machine.md): chapter 1 shortened, in a plain process and a forked one -
def run_matrix_quick(background: Background, _: str) -> dict:
    """The README's command, its report written to a folder of the session's: its plain cell is a fresh
    process that imports the stack itself, so it runs beside the rest, not in the tests' turn."""
    from suite import run_command

    out = background.folder("matrix-quick")
    fork_server()  # the suite's, which the matrix forks its forked cell from
    # Relative, as the README's is: the command runs in the repository root, and the report lands here.
    relative = os.path.relpath(out, REPO_ROOT)
    result = run_command(
        README_MATRIX_QUICK.replace("outputs/matrix-quick", relative), timeout=WAVE_TIMEOUT_S
    )
    return {"result": result, "out": out}


def _sqlite(folder: Path) -> str:
    return f"sqlite:///{folder / 'mlflow.db'}"


# --- chapter 7's other ways in: a task file `task new` wrote, a data file, a reasoning-gym dataset ----
def run_own_tasks(background: Background, _: str) -> dict:
    """The README commands of chapter 7's page that train a task from outside the repository's task/, each
    a lab forked from the preloaded parent into a store of its own, beside `task new`'s file and its tests
    (run by `uv run pytest` in a process of their own, as a reader runs them)."""
    import subprocess

    folder = background.folder("own-tasks")
    made = subprocess.run(
        [*command_words(README_TASK_NEW), "--dir", str(folder)], cwd=REPO_ROOT, capture_output=True, text=True
    )
    labs = {}
    commands = {
        "file": script_and_args(README_TASK_TRAIN),
        "data": script_and_args(README_DATA_TASK),
        "gym": script_and_args(README_GYM_TASK),
    }
    for key, (script, args) in commands.items():
        args = [str(folder / arg) if arg == "demo.py" else arg for arg in args]
        store = folder / key
        store.mkdir(exist_ok=True)
        labs[key] = Lab(key, script, [*args, "--output-dir", str(store / "outputs")], _sqlite(store), store)
    words = [str(folder / w) if w == "test_demo.py" else w for w in command_words(README_TASK_TEST)]
    tested = subprocess.run(words, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    codes = {key: lab.wait(timeout=CHAPTER_TIMEOUT_S) for key, lab in labs.items()}
    return {"folder": folder, "made": made, "tested": tested, "labs": labs, "codes": codes}


# --- a sketched chapter (tests/test_chapters.py): a copy of the repository and a pytest of its own ------
def run_sketch(background: Background, _: str) -> dict:
    """Minutes of a loaded machine's wall clock, waiting on a subprocess: beside the rest, not in the
    tests' turn."""
    from suite import sketch_and_collect

    return sketch_and_collect(background.folder("sketch"))


JOBS: dict[str, Callable[[Background, str], Any]] = {
    "chapter": run_chapter,
    "wave": run_wave,
    "stops": run_stops,
    "matrix_quick": run_matrix_quick,
    "sketch": run_sketch,
    "own_tasks": run_own_tasks,
}
# Fixtures that read a background run, and the run each reads.
BACKGROUND_FIXTURES = {
    "wave": "wave",
    "stopped": "wave",
    "stops": "stops",
    "matrix_quick": "matrix_quick",
    "sketched": "sketch",
    "own_tasks": "own_tasks",
}


def _background_of(item: pytest.Item) -> list[str]:
    """The background runs a collected test will read."""
    keys = [BACKGROUND_FIXTURES[f] for f in item.fixturenames if f in BACKGROUND_FIXTURES]
    for marker in item.iter_markers("chapter"):
        keys.append(f"chapter:{marker.args[0]}")
    if "chapter_run" in item.fixturenames:
        found = chapter_of(item.path)
        if found is not None:
            keys.append(f"chapter:{found.name}")
    return keys


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SuitePlan(), "suite-plan")
    config.addinivalue_line("markers", "chapter(name): the test reads that chapter's README run")
    config.addinivalue_line(
        "markers",
        "chapter_command(command): the README command the suite runs for the test's chapter, when it is "
        "not the chapter table's (a longer form that covers two README commands, or a shorter one)",
    )


def _commands(items: list) -> dict[str, str]:
    """The command each chapter's tests ask the suite to run for it, where they name one."""
    found: dict[str, str] = {}
    for item in items:
        marker = item.get_closest_marker("chapter_command")
        if marker is None:
            continue
        name = chapter_for(item).name
        if found.setdefault(name, marker.args[0]) != marker.args[0]:
            raise pytest.UsageError(f"{name}: two commands for its run: {found[name]!r}, {marker.args[0]!r}")
    return found


class SuitePlan:
    """With GRPOLAB_SUITE_PLAN=FILE, writes what the whole collection holds (each test, and the runs the
    suite would start for it) before `-k` selects from it: how a sketched chapter is shown picked up by
    the suite (tests/test_chapters.py) at the cost of one collection."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list) -> None:
        plan = os.environ.get("GRPOLAB_SUITE_PLAN")
        if plan:
            runs = sorted({key for item in items for key in _background_of(item)})
            Path(plan).write_text(json.dumps({"tests": [item.nodeid for item in items], "runs": runs}))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    """Start every background run the collected tests read, and run those tests last."""
    needed: dict[str, None] = {}
    for item in items:
        for key in _background_of(item):
            needed.setdefault(key, None)
    order = {key: i for i, key in enumerate(sorted(needed, key=_expected_order))}
    items.sort(key=lambda item: max((order[k] + 1 for k in _background_of(item)), default=0))
    commands = _commands(items)
    config.stash[NEEDED] = [
        f"{key} ({commands.get(key.partition(':')[2], '')})".replace(" ()", "") for key in order
    ]
    if config.option.collectonly or HAS_CUDA or not needed:
        return
    background = Background(config._tmp_path_factory.mktemp("background"), commands)
    config.stash[BACKGROUND] = background
    for key in order:
        background.start(key)


# The background runs in the order they ended in a fresh clone's CI on 2 cores (2026-12-07, at 3436e31:
# the `background runs, started-ended` line it prints). The tests that read a run go in this order, so
# the tests of the runs that ended early (a chapter's notebook, its picture, its MLflow UI) are done
# before the suite waits on the last: in the README's order, the tests of five chapters waited on
# headroom's and chapter 8's runs, then ran one after another on one core, 145 s after the last run
# ended (973 s of pytest). A scheduling hint only: any order gives the same results; a run not named
# here goes last.
ENDS_FIRST = (
    "sketch",
    "wave",
    "own_tasks",
    "matrix_quick",
    "stops",
    "chapter:grpo-own-task",
    "chapter:grpo-first",
    "chapter:grpo-sizing",
    "chapter:grpo-ship",
    "chapter:grpo-headroom",
    "chapter:grpo-reward-hacking",
    "chapter:grpo-stuck",
)


def _expected_order(key: str) -> tuple[int, str]:
    """Tests that read the runs that end first go first (ENDS_FIRST); the rest after, by name."""
    return (ENDS_FIRST.index(key) if key in ENDS_FIRST else len(ENDS_FIRST), key)


def pytest_report_collectionfinish(config: pytest.Config, start_path: Path, items: list) -> list[str]:
    needed = config.stash.get(NEEDED, [])
    return [f"background runs: {', '.join(needed) if needed else 'none'}"]


NEEDED = pytest.StashKey[list]()
BACKGROUND = pytest.StashKey[Background]()
SESSION_START = time.perf_counter()  # this module is imported as the session begins


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    background = config.stash.get(BACKGROUND, None)
    if background is not None and background.started:
        terminalreporter.write_line(background.timeline(SESSION_START))


def pytest_sessionfinish(session: pytest.Session) -> None:
    background = session.config.stash.get(BACKGROUND, None)
    if background is not None:
        for undo in background.cleanup:
            undo()
    stop_fork_server()  # a lab still running (after -x or Ctrl-C) gets SIGTERM, then SIGKILL


@pytest.fixture(scope="session")
def background(request: pytest.FixtureRequest) -> Background:
    if HAS_CUDA:
        pytest.skip("the suite's lab runs run the CPU profile; on a GPU the same commands train Qwen3-4B")
    found = request.config.stash.get(BACKGROUND, None)
    if found is None:  # a test run on its own, by node id, after a collection that needed none
        found = Background(
            request.config._tmp_path_factory.mktemp("background"), _commands(request.session.items)
        )
        request.config.stash[BACKGROUND] = found
    return found


def chapter_for(node: pytest.Item) -> Chapter:
    marker = node.get_closest_marker("chapter")
    found = (
        next(c for c in chapters() if c.name == marker.args[0])
        if marker is not None
        else chapter_of(node.path)
    )
    if found is None:
        raise LookupError(f"{node.nodeid}: not in a chapter's folder and no chapter marker")
    return found


@pytest.fixture
def chapter_run(request: pytest.FixtureRequest, background: Background) -> ChapterRun:
    """The README run of the test's chapter (its folder's, or its `chapter` marker's)."""
    return background.result(f"chapter:{chapter_for(request.node).name}")


@dataclass
class ChapterClaims:
    """A chapter's claims (labs/<chapter>/claims.py) read from its README run: the figures, and the
    claims that fail (none, where the book holds)."""

    figures: dict[str, float]
    failures: list[str]


@pytest.fixture
def chapter_claims(chapter_run: ChapterRun) -> ChapterClaims:
    from grpolab.judging import claims

    assert chapter_run.code == 0, chapter_run.log()
    module = claims.load(chapter_run.chapter.name)
    figures = module.figures(
        claims.ChapterStore(chapter_run.uri, chapter_run.chapter.name, chapter_run.client)
    )
    return ChapterClaims(figures, claims.check(module.CLAIMS, figures))


@pytest.fixture(scope="session")
def wave(background: Background) -> dict:
    return background.result("wave")


@pytest.fixture(scope="session")
def own_tasks(background: Background) -> dict:
    return background.result("own_tasks")


@pytest.fixture(scope="session")
def matrix_quick(background: Background) -> dict:
    return background.result("matrix_quick")


@pytest.fixture(scope="session")
def stops(background: Background) -> dict:
    return background.result("stops")


@pytest.fixture(scope="session")
def sketched(background: Background) -> dict:
    return background.result("sketch")


@pytest.fixture(scope="session")
def stopped(wave: dict, stack: None) -> dict:
    """The wave's two stopped runs and what a user does with them, in order: `python -m grpolab runs`
    lists each store's; on SIGKILL's store `runs --reconcile` ends the dead run KILLED (beside a run of
    a live process and one of another host, planted to be left alone); then each is resumed (SIGTERM's
    with the README's `--resume last`, SIGKILL's by its folder) as a lab process, as the wave's labs
    trained. Not in the background: the resumes continue the wave's stopped runs, which the endings'
    tests read as the stops left them first. tests/test_run_endings.py reads the endings,
    tests/test_run_resume.py the resumes."""
    import mlflow

    from grpolab.lifecycle import tracking

    from suite import Ended, only_run, run_command

    out: dict[str, dict] = {}
    for name in ("SIGTERM", "SIGKILL"):
        lab = wave["labs"][name]
        uri = f"sqlite:///{lab.output / 'mlflow.db'}"
        client = mlflow.MlflowClient(uri)
        before = only_run(client, lab)
        listed = run_command(README_RUNS, MLFLOW_TRACKING_URI=uri)
        planted, reconciled = {}, None
        if name == "SIGKILL":
            tags = before.data.tags
            planted["other host"] = client.create_run(
                before.info.experiment_id,
                run_name="another host's",
                tags={
                    **{k: tags[k] for k in ("process.pid", "process.start_time")},
                    "process.host": "another-host",
                },
            )
            # A live process's run: this one's (not through lab_run, which would reconcile the store itself).
            planted["alive"] = client.create_run(
                before.info.experiment_id, run_name="alive", tags=tracking.process_tags()
            )
            reconciled = run_command(README_RECONCILE, MLFLOW_TRACKING_URI=uri)
        after_stop = client.get_run(before.info.run_id)
        (folder,) = lab.output.glob("grpo-first/*")
        # What reconcile left of the planted runs; then ended, so that the resume sees a tidy store.
        planted_status = {k: client.get_run(r.info.run_id).info.status for k, r in planted.items()}
        for run in planted.values():
            client.set_terminated(run.info.run_id)
        target = ["--resume", str(folder)] if name == "SIGKILL" else script_and_args(README_RESUME)[1]
        # A process of its own, as the run it is held against trained: like with like (a resume in this
        # process would run kernels other tests compiled here first).
        resumed = Lab(f"resume-{name}", LAB_DIR / "train.py", target, uri, lab.output)
        result = Ended(resumed.wait(timeout=WAVE_TIMEOUT_S), resumed.stdout, resumed.stderr)
        out[name] = {
            "lab": lab,
            "code": wave["codes"][name],
            "client": client,
            "uri": uri,
            "before": before,
            "listed": listed,
            "reconciled": reconciled,
            "planted": planted,
            "planted_status": planted_status,
            "after_stop": after_stop,
            "folder": folder,
            "result": result,
            "after": client.get_run(before.info.run_id),
        }
    return out


# --- honest markers ---------------------------------------------------------------------------------
# A test that starts a process (here, on pytest's own thread: a subprocess, a fork, a lab, a notebook's
# kernel, a browser) or reads a run the suite started in the background is `slow`; a test that needs a
# GPU is `gpu`. Checked on every test, after it ran: a marker that lies fails the test that carries it.
_PROCESS_EVENTS = {
    "subprocess.Popen",
    "os.fork",
    "os.forkpty",
    "os.posix_spawn",
    "os.exec",
    "suite.lab_process",
}
# What libraries ask the system once per process, whichever test comes first: not the test's doing
# (MLflow tags a run with `git`, `platform` asks `uname`, ctypes asks `ldconfig`).
_LIBRARY_PROBES = {"git", "uname", "ldconfig", "lsb_release", "nvidia-smi"}
_started_on_main_thread = [0]
_preloading = [False]  # the `stack` fixture's preload: shared by every test that asks for it, not one test's


def _count_processes(event: str, args: tuple) -> None:
    if event not in _PROCESS_EVENTS or threading.current_thread() is not threading.main_thread():
        return
    if event == "subprocess.Popen" and Path(str(args[0] or args[1][0])).name in _LIBRARY_PROBES:
        return
    if _preloading[0]:
        return
    if not _importing():  # an import's own check (Unsloth's) is the import's doing, not the test's
        _started_on_main_thread[0] += 1


def _importing() -> bool:
    return any(
        getattr(getattr(m, "__spec__", None), "_initializing", False) for m in list(sys.modules.values())
    )


sys.addaudithook(_count_processes)
MARKS = pytest.StashKey[int]()


def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[MARKS] = _started_on_main_thread[0]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.when != "teardown" or not report.passed:
        return
    problems = []
    started = _started_on_main_thread[0] - item.stash.get(MARKS, _started_on_main_thread[0])
    if item.get_closest_marker("slow") is None:
        if started:
            problems.append(f"it started {started} process(es): mark it slow")
        elif _background_of(item):
            problems.append(f"it reads {', '.join(_background_of(item))}: mark it slow")
    if item.get_closest_marker("gpu") is None and any(
        "CUDA GPU" in str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif")
    ):
        problems.append("it is skipped without a GPU: mark it gpu (suite.gpu_only)")
    if problems:
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid}: its markers do not say what it does: {'; '.join(problems)}"


# --- this process -----------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def stack() -> None:
    """The stack a lab imports (Unsloth first, then TRL, ...), imported in this process once, for the
    labs that run here (`suite.run_in_process`)."""
    import warnings

    from grpolab.lab import forkserver

    with warnings.catch_warnings():
        # The suite's collection imported transformers, TRL and PEFT before Unsloth: Unsloth says so.
        warnings.filterwarnings("ignore", message=".*Unsloth should be imported before")
        # Preloading asks inductor which vector instructions it may build for, a compile per candidate
        # in processes of its own: the session's, charged to no test (the first fast test to ask for
        # the stack was told to mark itself slow).
        _preloading[0] = True
        try:
            forkserver.preload()
        finally:
            _preloading[0] = False


@pytest.fixture(scope="session")
def lab_module():
    from suite import load_lab_module

    return load_lab_module(LAB_DIR)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A fresh SQLite MLflow store of the test's own, active through MLFLOW_TRACKING_URI; runs left
    open are ended. (A test module with a `store` fixture of its own uses that one.)"""
    import mlflow
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    from grpolab.lifecycle import tracking
    from grpolab.lifecycle.store import new_sqlite_store

    new_sqlite_store(tmp_path / "mlflow.db")  # as a lab's new store starts: the migrated schema, copied
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # Opened once with an artifact root of its own: MLflow gives the Default experiment it makes then
    # the root it is opened with, else `./mlruns`, and a test's run and traces would land in the
    # working folder (the checkout) rather than beside its store.
    SqlAlchemyStore(uri, (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    tracking.use_store()
    yield tmp_path
    while mlflow.active_run():
        mlflow.end_run()
