"""How a run ends, whatever ends it: signals, a process that died, a full disk.

Every MLflow run of a lab ends in a status that tells the truth, with the cause in its tag `ending`
and at the top of its description (`mlflow.note.content`):

- **Catchable signals.** Python turns only SIGINT into KeyboardInterrupt; SIGTERM (kill, timeout,
  docker stop, a scheduler, a closed cloud session) and SIGHUP (a closed terminal) end the process
  on the spot and leave its run RUNNING forever. A lab records all three (`STOPS`) and acts on them
  only at points the harness owns: between the phases of a run and at each step boundary. There it
  raises `Interrupted`, a KeyboardInterrupt that names its signal and the phase it arrived in, and
  the harness ends the run KILLED with what was measured and the adapter trained so far, or, before
  the MLflow run exists, exits 128 + the signal leaving nothing. Why not raise where the signal
  lands: an exception thrown into foreign code can be swallowed. Unsloth's lazy imports catch every
  exception (a SIGTERM 3 s into the model's load was taken for a failed import of OpenAI, and the
  run trained to the end, FINISHED); so may any `except BaseException` in transformers, datasets or
  MLflow. The same signal a second time stops at once, as Ctrl-C twice does in most tools. A save
  in progress finishes first even then (`signals_deferred`, used by `grpolab.lifecycle.atomic`): the old
  adapter or the new one, never half of one.
- **Endings no process survives.** SIGKILL (kill -9, the Linux OOM killer when host memory runs out)
  and a power loss leave nothing to catch. Every run records its process (tags process.host,
  process.pid, process.start_time); `reconcile` ends KILLED the runs left RUNNING whose process is gone
  from this host, with the last step and the peak memory they logged. Runs of live processes and of
  other hosts are never touched. Each lab reconciles its store when it starts;
  `python -m grpolab runs --reconcile` does it by hand.
- **A full disk.** `is_disk_full` recognises it in the errors of the adapter save and of the
  trainer's checkpoints; `disk_full` removes the half-written checkpoint and ends the run FAILED with
  one line naming the folder and its free space.
"""

from __future__ import annotations

import errno
import os
import re
import resource
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from budgets.units import GIB, MIB
from grpolab.config.errors import EXIT_BAD_INPUT
from grpolab.config.paths import LABS

# Exit codes: bad input (grpolab.config.errors), out of memory, a full disk; a signal exits 128 + its number
# (130 for Ctrl-C).
EXIT_OUT_OF_MEMORY, EXIT_DISK_FULL = 3, 4
__all__ = ["EXIT_BAD_INPUT", "EXIT_DISK_FULL", "EXIT_OUT_OF_MEMORY"]

# The signals a run ends on, with who usually sends them (for the run's description).
CATCHABLE = {
    signal.SIGINT: "Ctrl-C",
    signal.SIGTERM: "kill, timeout, docker stop, a scheduler or a closed cloud session",
    signal.SIGHUP: "its terminal or SSH session closed",
}


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP, acted on: handled like Ctrl-C, naming its signal and the phase
    it arrived in ("during the model's load"; empty when unknown)."""

    def __init__(self, signum: int = signal.SIGINT, where: str = "") -> None:
        self.signum = signal.Signals(signum)
        self.where = where
        super().__init__(self.signum.name)


class DiskFull(RuntimeError):
    """No room to save the adapter or a checkpoint; the message is the one-line error, `description`
    what opens the run's description."""

    ending = "disk full"

    def __init__(self, message: str, description: str = "") -> None:
        super().__init__(message)
        self.description = description or f"{message}."


# --- catchable signals ----------------------------------------------------------------------------
def signal_of(stop: BaseException) -> signal.Signals:
    """The signal that stopped the run (a bare KeyboardInterrupt is Ctrl-C)."""
    return getattr(stop, "signum", signal.SIGINT)


def exit_code(stop: BaseException) -> int:
    """What a shell reports for a process a signal ended: 128 + the signal (130 for Ctrl-C)."""
    return 128 + signal_of(stop)


def stop_cause(stop: BaseException, run: Any = None) -> str:
    """The cause, as in "Stopped by SIGTERM (who sends it) at step 12 of 500"; no step without a run."""
    sig = signal_of(stop)
    verb = "Interrupted" if sig == signal.SIGINT else "Stopped"
    where = [w for w in (getattr(stop, "where", ""), at_step(run) if run is not None else "") if w]
    text = f"{verb} by {sig.name} ({CATCHABLE.get(sig, 'a signal')})"
    return f"{text} {', '.join(where)}" if where else text


def at_step(run: Any) -> str:
    """Where a lab run was when it ended: "at step 12 of 500", or before training started."""
    trainer = getattr(run, "trainer", None)
    if trainer is None:
        return "before training started"
    return f"at step {trainer.state.global_step} of {run.settings.max_steps}"


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()  # only it may set handlers


def _install(handler) -> dict:
    # A signal ignored stays ignored: nohup ignores SIGHUP, a shell's background job SIGINT.
    return {
        signum: signal.signal(signum, handler)
        for signum in CATCHABLE
        if signal.getsignal(signum) != signal.SIG_IGN
    }


def _restore(previous: dict) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, signal.SIG_DFL if handler is None else handler)


SHOW_PHASES_ENV = "GRPOLAB_SHOW_PHASES"
PHASE_PREFIX = "phase: "
# A test's: the phase (the start of its name) at whose start a lab shown its phases waits, at most
# HOLD_PHASE_S, for the signal the test sends when it reads that phase's line; or a step line's start
# (`step 1/`), after which it waits the same way. A phase or step shorter than the signal's way from
# the test to the lab (the stand-in's load, a 2-step run's last step, on a loaded machine) then still
# receives it, on any machine, and the run names it.
HOLD_PHASE_ENV = "GRPOLAB_HOLD_PHASE"
HOLD_PHASE_S = 120.0


class Stops:
    """Where a lab's SIGINT, SIGTERM and SIGHUP land: recorded when they arrive, acted on where the
    harness says (`check`), never raised into code the harness does not own.

    - `armed()`: the process's handlers record; the previous ones come back after. A lab arms at
      its start (`grpolab.lab.session.run_lab`); `run_open()` arms too, for code that opens a run alone.
    - `phase(what)`: what the process is doing now, as a noun phrase ("the model's load"); a stop
      recorded before it is acted on as it starts, one that arrives during it as it ends. The first
      signal says on stderr what it waits for ("SIGTERM received during the model's load: stopping
      after it"); phases that take long on a GPU (a model load, a first step) are where it matters.
    - `check()`: raise `Interrupted` for a recorded stop, naming the phase it arrived in. Inside a
      run the run ends KILLED; before it, the lab exits 128 + the signal, leaving nothing.
    - The same signal a second time is acted on at once, wherever the process is; so is any signal
      inside `at_once()` (harness code that only waits: a sweep on its cell). `signals_deferred`
      still holds a save in progress whole.
    """

    def __init__(self) -> None:
        self.pending: tuple[signal.Signals, str] | None = None
        self.doing = "the run's start"
        self.until = ""  # what the first signal waits for, when not the phase's end
        self.opened = 0  # MLflow runs opened while armed (tracking.lab_run counts them)
        self._previous: dict | None = None
        self._at_once = 0
        self._held = False  # HOLD_PHASE_ENV's phase was held already

    @property
    def is_armed(self) -> bool:
        return self._previous is not None

    @contextmanager
    def armed(self) -> Iterator[Stops]:
        if self.is_armed or not _on_main_thread():
            yield self
            return
        self.pending, self.opened, self._previous = None, 0, _install(self._arrived)
        ends_the_process = _lab_entry_point()
        try:
            yield self
        finally:
            previous, self._previous = self._previous, None
            if ends_the_process:
                # A lab's entry point ends through exit_process: its handlers take over here, leaving no
                # instant under Python's own between the run's end and the process's (a SIGINT sent as
                # the lab printed its last line raised KeyboardInterrupt there, 2026-12-04).
                _install(_after_the_run)
            else:
                _restore(previous)
            # Read once the handlers are swapped: read before, a signal landing in between was recorded
            # and then dropped (the process exited 0, or a test's held exit waited for it in vain:
            # a fresh clone's CI, 2026-12-07).
            pending, self.pending = self.pending, None
        if ends_the_process and pending is not None:  # one that came after the last check: not dropped
            _after_the_run(pending[0], None)

    def enter(self, doing: str, until: str = "") -> None:
        """The next phase begins (what came before is done): a stop recorded so far is acted on."""
        self.check()
        self.now(doing, until)

    def now(self, doing: str, until: str = "") -> None:
        """What the process is doing from here, acting on nothing (a run has just ended). With
        GRPOLAB_SHOW_PHASES=1 each phase is printed as it begins (`phase: the model's load`): where a
        run spends its time, and where a test lands a signal whatever the machine's speed."""
        self.doing, self.until = doing, until
        if os.environ.get(SHOW_PHASES_ENV) == "1":
            print(f"{PHASE_PREFIX}{doing}", flush=True)
            self._hold(doing)

    def hold_after(self, line: str) -> None:
        """A line the lab printed (a step's): held as a phase's start is, when HOLD_PHASE_ENV names it."""
        if os.environ.get(SHOW_PHASES_ENV) == "1":
            self._hold(line)

    def _hold(self, what: str) -> None:
        held = os.environ.get(HOLD_PHASE_ENV)
        if held and what.startswith(held) and self.is_armed and not self._held:
            self._held = True  # once: a later phase of the same name runs on
            deadline = time.monotonic() + HOLD_PHASE_S
            while self.pending is None and time.monotonic() < deadline:
                time.sleep(0.01)  # the signal's handler runs between these

    @contextmanager
    def phase(self, doing: str, until: str = "") -> Iterator[None]:
        """A phase inside another: stops are acted on as it starts and as it ends."""
        self.check()
        before = self.doing, self.until
        self.doing, self.until = doing, until
        try:
            yield
        finally:
            self.doing, self.until = before
        self.check()  # not in `finally`: an error that ends the phase ends the run, not the stop

    def check(self) -> None:
        if self.pending is not None:
            sig, doing = self.pending
            self.pending = None
            raise Interrupted(sig, f"during {doing}")

    @contextmanager
    def at_once(self) -> Iterator[None]:
        self.check()
        self._at_once += 1
        try:
            yield
        finally:
            self._at_once -= 1

    def _arrived(self, signum, frame) -> None:
        sig = signal.Signals(signum)
        if self._at_once or (self.pending is not None and self.pending[0] == sig):
            self.pending = None
            raise Interrupted(sig, f"during {self.doing}")
        if self.pending is None:
            self.pending = (sig, self.doing)
            os.write(
                2,
                f"\n{sig.name} received during {self.doing}: stopping after {self.until or 'it'} "
                f"({sig.name} again stops at once)\n".encode(),
            )


STOPS = Stops()
AFTER_THE_RUN = "the end of the process, after its run ended"


def exit_after(stop: BaseException, stops: Stops = STOPS) -> int:
    """An entry point's exit code once a stop ended it (128 + the signal: 130, 143, 129 as a shell
    reports them), after saying on stderr what no run's description says: that it stopped before any
    MLflow run opened (nothing written), or after its run had ended."""
    if not stops.opened:
        print(f"\n{stop_cause(stop)}: no MLflow run was opened, nothing written", file=sys.stderr)
    elif getattr(stop, "where", "") == f"during {AFTER_THE_RUN}":
        print(f"\n{stop_cause(stop)}: the run had ended, all saved", file=sys.stderr)
    return exit_code(stop)


# A test's: seconds a lab lingers once its run has ended, its handlers set, so that a signal sent as
# it prints its last line lands at its end on any machine, not after it exited.
HOLD_EXIT_ENV = "GRPOLAB_HOLD_EXIT_S"


def _after_the_run(signum, frame) -> None:
    """A signal once a lab's run has ended: say so, and exit 128 + the signal at once."""
    code = exit_after(Interrupted(signal.Signals(signum), f"during {AFTER_THE_RUN}"))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _lab_entry_point() -> bool:
    """Whether this process runs a chapter's `train.py` as its main script (`python labs/<chapter>/
    train.py`, and the fork server's children): a process that ends through `exit_process`."""
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    return main is not None and Path(main).name == "train.py" and Path(main).resolve().parent.parent == LABS


def exit_process(code: int) -> NoReturn:
    """End an entry point's process with `code` once its run has ended; from here a signal exits
    128 + the signal, saying the run had ended (all saved). Left to Python's own handlers, the same
    signal in the shutdown ended the process by where it landed: SIGINT's KeyboardInterrupt in a
    thread's join exited 1, another signal killed it. The shutdown itself runs as Python runs it (the
    libraries' atexit handlers, a profiler's report); only in its last instant, after Python has reset
    the handlers, does a signal kill the process as it would any, which a shell reports as the same
    128 + the signal."""

    if _on_main_thread():
        _install(_after_the_run)  # a lab's are in place since its run ended (`Stops.armed`)
        hold = os.environ.get(HOLD_EXIT_ENV)
        if hold and code == 0:  # not once a signal has ended the run (code 128 + N): it came already
            time.sleep(float(hold))  # a signal ends the sleep, and the process, through the handler
    sys.exit(code)


@contextmanager
def catching_signals() -> Iterator[Stops]:
    """SIGINT, SIGTERM and SIGHUP recorded inside (`STOPS`), acted on at its checks; a stop recorded
    before is acted on as the block starts."""
    with STOPS.armed():
        STOPS.check()
        yield STOPS


class DeferredSignals:
    """Hold SIGINT, SIGTERM and SIGHUP from `hold()` until `release()`, then deliver them to the
    handler that was there before (Interrupted inside a run, the default action outside one). For a
    window that opens in one place and closes in another: a training step's bookkeeping opens in one
    trainer callback and closes in the next (grpolab.lifecycle.checkpoints.StepBoundary).

    `release(deliver=False)` drops what was held: when the window ends in an error, the error ends the
    run. SIGKILL and SIGQUIT (Ctrl-\\) still stop the process at once.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self.received: list[int] = []
        self._previous: dict | None = None

    @property
    def holding(self) -> bool:
        return self._previous is not None

    def hold(self) -> None:
        if self.holding or not _on_main_thread():
            return
        self.received = []
        self._previous = _install(self._hold)

    def _hold(self, signum, frame) -> None:
        if not self.received and self._previous.get(signum) != STOPS._arrived:  # STOPS says it on delivery
            name = signal.Signals(signum).name
            os.write(
                2,
                f"\n{name} received: finishing {self.what} first (Ctrl-\\ or kill -9 stops at once)\n".encode(),
            )
        self.received.append(signum)

    def release(self, deliver: bool = True) -> None:
        if not self.holding:
            return
        _restore(self._previous)
        self._previous = None
        received, self.received = self.received, []
        if deliver:
            for signum in dict.fromkeys(received):
                signal.raise_signal(signum)


@contextmanager
def signals_deferred(what: str) -> Iterator[None]:
    """Signals that arrive inside wait until `what` is done, then are delivered to the handler that
    was there before (Interrupted inside a run, the default action outside one).

    If the block itself fails, its error goes on and the waiting signals are dropped: the error
    ends the run. SIGKILL and SIGQUIT (Ctrl-\\) still stop the process at once.
    """
    deferred = DeferredSignals(what)
    deferred.hold()
    try:
        yield
    except BaseException:
        deferred.release(deliver=False)
        raise
    deferred.release()


def stopped(stop: BaseException, run: Any) -> tuple[str, str]:
    """A run a signal stopped: removes the checkpoint the signal cut short, and returns the run's
    ending (the signal's name) and the cause that opens its description (tracking writes both)."""
    cause = stop_cause(stop, run)
    remove_partial_checkpoints(run.output_dir)
    return signal_of(stop).name, f"{cause}."


def failed(error: BaseException, run: Any) -> tuple[str, str]:
    """A run an exception ended: its ending and the error with where it happened."""
    return "exception", f"Failed {at_step(run)}: {error_line(error)}."


def error_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300]}" if text else type(error).__name__


def ending_of(error: BaseException) -> str:
    """The tag `ending` of a run that an error ended."""
    from grpolab.memory.oom import is_out_of_memory

    if isinstance(error, KeyboardInterrupt):
        return signal_of(error).name
    if getattr(error, "ending", None):
        return error.ending
    chain = list(_chain(error))
    if type(error).__name__ == "OutOfMemory" or any(is_out_of_memory(e) for e in chain):
        return "out of memory"
    if is_disk_full(error):
        return "disk full"
    return "exception"


# --- a full disk ----------------------------------------------------------------------------------
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_OS_ERROR = re.compile(r"os error (\d+)")  # how safetensors (Rust) reports an errno
# torch.save reports a failed write without its errno ("unexpected pos 576 vs 534", "file write
# failed"): it counts as a full disk when the disk is nearly full or a file-size limit is set.
_TORCH_WRITE_FAILED = ("PytorchStreamWriter failed", "file write failed", "unexpected pos", "iostream error")
NEARLY_FULL_BYTES = 64 * 1024**2


def _chain(error: BaseException | None) -> Iterator[BaseException]:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def disk_errno(error: BaseException, folder: Path | None = None) -> int | None:
    """ENOSPC, EDQUOT or EFBIG (a file-size limit) if `error` or one it came from is a failed write
    for want of room, else None."""
    for e in _chain(error):
        if isinstance(e, OSError) and e.errno in DISK_ERRNOS:
            return e.errno
        found = _OS_ERROR.search(str(e))
        if found and int(found.group(1)) in DISK_ERRNOS:
            return int(found.group(1))
        if isinstance(e, RuntimeError) and any(s in str(e) for s in _TORCH_WRITE_FAILED):
            if resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY:
                return errno.EFBIG
            if folder is not None and free_bytes(folder) < NEARLY_FULL_BYTES:
                return errno.ENOSPC
    return None


def is_disk_full(error: BaseException, folder: Path | None = None) -> bool:
    return disk_errno(error, folder) is not None


def free_bytes(folder: Path) -> int:
    """Free bytes on the disk that holds `folder` (or its nearest existing parent)."""
    folder = Path(folder).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def _size(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.1f} MiB"


def is_checkpoint(path: Path) -> bool:
    return path.is_dir() and re.fullmatch(r"checkpoint-\d+", path.name) is not None


def partial_checkpoints(output_dir: Path) -> list[Path]:
    """Checkpoint folders a save did not finish. transformers 5.17's `Trainer._save_checkpoint`
    writes straight into checkpoint-N (the model, then optimizer, scheduler, RNG state) and
    trainer_state.json last, so a folder without it was cut short; `resume_from_checkpoint` would
    pick it as the latest. Earlier checkpoints are never touched by a failed save."""
    if not Path(output_dir).is_dir():
        return []
    return sorted(
        p for p in Path(output_dir).iterdir() if is_checkpoint(p) and not (p / "trainer_state.json").exists()
    )


def remove_partial_checkpoints(output_dir: Path) -> list[str]:
    """Remove the checkpoints a save did not finish; returns their names. Each is first renamed out
    of the checkpoint-N pattern, so even a removal cut short leaves nothing a resume would load."""
    removed = []
    for path in partial_checkpoints(output_dir):
        doomed = path.with_name(f".{path.name}.partial-{os.getpid()}")
        path.rename(doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        removed.append(path.name)
    return removed


def disk_full(error: BaseException, run: Any) -> DiskFull:
    """A full disk: removes the half-written checkpoint and returns the DiskFull to raise, whose
    message is the one-line error and whose description opens the run's (tracking writes it)."""
    output_dir = Path(run.output_dir)
    partial = partial_checkpoints(output_dir)
    folder = partial[-1] if partial else output_dir / "adapter"
    what = f"the checkpoint {folder.name}" if partial else "the adapter"
    code = disk_errno(error, output_dir) or errno.ENOSPC
    free = free_bytes(folder)  # before the half-written files go: what the save ran into
    if code == errno.EFBIG:
        reason = f"{os.strerror(code)}: a file-size limit (ulimit -f) stopped the write"
        fix = "raise the file-size limit (ulimit -f unlimited), or pass --output-dir on another disk"
    else:
        reason = os.strerror(code)
        fix = "free some space, or pass --output-dir on a disk with room"
    removed = remove_partial_checkpoints(output_dir)
    kept = sorted((p.name for p in output_dir.glob("checkpoint-*") if is_checkpoint(p)), key=_step_of)
    aftermath = []
    if removed:
        aftermath.append(f"the half-written {', '.join(removed)} was removed")
    if kept:
        aftermath.append(f"{kept[-1]} is intact")
    message = f"no room to save {what} in {folder} ({reason}; {_size(free)} free on that disk): {fix}" + (
        f" ({'; '.join(aftermath)})" if aftermath else ""
    )
    return DiskFull(message, f"Failed {at_step(run)}: {message}.")


def _step_of(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


# --- runs whose process died ----------------------------------------------------------------------
def process_state(tags: dict[str, str]) -> str:
    """Whether a run's process lives: alive, dead, other host, or unknown (no process tags: never
    touched)."""
    import psutil

    host, pid, started = (tags.get(f"process.{k}") for k in ("host", "pid", "start_time"))
    if not (host and pid and started):
        return "unknown"
    if host != socket.gethostname():
        return "other host"
    try:
        process = psutil.Process(int(pid))
        alive = process.status() != psutil.STATUS_ZOMBIE and abs(process.create_time() - float(started)) < 1.0
    except psutil.NoSuchProcess:
        alive = False
    except psutil.AccessDenied:
        alive = True  # it exists and is not ours to inspect
    return "alive" if alive else "dead"


def open_runs(client) -> list[tuple[Any, str, str]]:
    """(run, experiment name, process state) of every run left RUNNING in the store."""
    experiments = {e.experiment_id: e.name for e in client.search_experiments()}
    if not experiments:
        return []
    runs = client.search_runs(list(experiments), "attributes.status = 'RUNNING'", max_results=1000)
    return [(r, experiments[r.info.experiment_id], process_state(r.data.tags)) for r in runs]


def end_dead_run(client, run) -> str:
    """End KILLED a run whose process died without closing it; returns a line for the terminal."""
    tags = run.data.tags
    peaks = client.get_metric_history(run.info.run_id, "memory/step_peak_gib")
    if peaks:
        last = max(peaks, key=lambda p: (p.step, p.timestamp))
        logged = (
            f"Last step logged: {last.step}; peak memory logged: {max(p.value for p in peaks):.2f} GiB "
            "(memory/step_peak_gib)"
        )
        end_ms = max(p.timestamp for p in peaks)
    else:
        logged, end_ms = "No step was logged before it died", int(time.time() * 1000)
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(tags["process.start_time"])))
    note = (
        f"The process (pid {tags['process.pid']} on {tags['process.host']}, started {started}) died without "
        "closing its run: SIGKILL (kill -9, or the Linux OOM killer when host memory ran out) or a power "
        f"loss. {logged}. Ended KILLED by reconciliation on {time.strftime('%Y-%m-%d %H:%M:%S')}."
    )
    if tags.get("mlflow.note.content"):
        note += f"\n\nIts description before: {tags['mlflow.note.content']}"
    from grpolab.lifecycle.checkpoints import resume_hint

    again = resume_hint(run)  # a checkpoint it saved before it died
    note += f"\n\n{again}" if again else ""
    client.set_tag(run.info.run_id, "ending", "process died")
    client.set_tag(run.info.run_id, "mlflow.note.content", note)
    client.set_terminated(run.info.run_id, "KILLED", end_time=end_ms)
    return (
        f"Ended run {run.info.run_name} ({run.info.run_id}) KILLED: its process {tags['process.pid']} died "
        f"without closing it. {logged}." + (f"\n  {again}" if again else "")
    )


def reconcile(client) -> list[str]:
    """End KILLED every run of this host left RUNNING by a process that no longer exists; returns a
    line per run ended."""
    return [end_dead_run(client, run) for run, _, state in open_runs(client) if state == "dead"]
