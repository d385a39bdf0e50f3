"""A stop is never lost: SIGTERM, SIGINT or SIGHUP at any moment ends the run KILLED, naming the
phase it arrived in, or, before the MLflow run exists, leaves nothing and exits 128 + the signal.

The harness records a signal where it arrives and acts on it at points it owns (grpolab.lifecycle.endings.STOPS):
an exception thrown into foreign code can be swallowed (Unsloth's lazy imports catch everything: a
SIGTERM during the model's load once let a run train to the end, FINISHED).

The slow tests read one background sweep (conftest.py `run_stops`): chapter 1's lab, short (2 steps,
4 held-out prompts), run once printing each phase as it begins (GRPOLAB_SHOW_PHASES) and a line per
step; then once per phase and step it reported, each stopped by SIGTERM the moment it reports that
marker, and at two markers each by SIGINT and SIGHUP. Signals follow the lab, not the clock: a
machine twice as fast or twice as slow is stopped in the same places. Each lab is a real process
forked from the suite's preloaded parent (so the imports themselves are the parent's: a fresh lab
signalled during them dies of the signal, Python's default, with nothing written either).
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from grpolab.lab.console import STEP_PREFIX
from grpolab.lifecycle import endings, tracking
from grpolab.lifecycle.endings import PHASE_PREFIX

from suite import LAST_LINE, OTHER_SIGNALS_AT, cpu_only

ON_CPU = cpu_only("runs the CPU profile; on a GPU the same command runs Qwen3-4B")
PHASE = re.compile(r" during (.+?)(?:, at step \d+ of \d+|, before training started)?\.")


# --- recorded, then acted on (in this process) ------------------------------------------------------
@pytest.fixture(autouse=True)
def as_a_terminal_starts_it():
    """This process's SIGINT and SIGHUP as a terminal starts it, even when pytest runs under nohup or
    in a background job, which start it with them ignored: a signal already ignored stays ignored (the
    harness keeps it so), and the tests below would send theirs into nothing."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGHUP)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def swallowing(seconds: float) -> None:
    """Foreign code that takes any exception for its own failure, as Unsloth's lazy imports do."""
    try:  # noqa: SIM105 (written as the foreign code it stands for is)
        time.sleep(seconds)
    except BaseException:
        pass


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_in_foreign_code_is_kept_for_the_harness_check(signum, capfd):
    with endings.catching_signals() as stops:
        stops.enter("the model's load")
        os.kill(os.getpid(), signum)
        swallowing(0.2)  # were it raised here, it would be lost
        with pytest.raises(endings.Interrupted) as stopped:
            stops.enter("the trainer's construction")
    assert (stopped.value.signum, stopped.value.where) == (signum, "during the model's load")
    assert endings.exit_code(stopped.value) == 128 + signum
    name = signal.Signals(signum).name
    assert f"{name} received during the model's load: stopping after it ({name} again stops at once)" in (
        capfd.readouterr().err
    )


def test_a_labs_entry_point_hands_its_signals_to_the_process_end_as_its_run_ends(monkeypatch):
    """In a chapter's train.py run as a script, the run's recording handlers give way straight to the
    process end's (`exit_process`'s): no instant under Python's own, where a SIGINT sent as the lab
    printed its last line raised KeyboardInterrupt in the shutdown; and a stop recorded after the
    run's last check is acted on there, not dropped. Anywhere else (a notebook, this process) the
    handlers that were there come back."""
    acted: list[int] = []
    monkeypatch.setattr(endings, "_after_the_run", lambda signum, frame: acted.append(signum))
    before = signal.getsignal(signal.SIGTERM)
    try:
        monkeypatch.setattr(endings, "_lab_entry_point", lambda: True)
        with endings.Stops().armed():
            os.kill(os.getpid(), signal.SIGTERM)  # recorded: the run has ended, nothing checks again
            swallowing(0.05)
        assert signal.getsignal(signal.SIGTERM) is endings._after_the_run
        assert acted == [signal.SIGTERM]
        monkeypatch.setattr(endings, "_lab_entry_point", lambda: False)
        signal.signal(signal.SIGTERM, before)
        with endings.Stops().armed():
            pass
        assert signal.getsignal(signal.SIGTERM) is before
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_same_signal_twice_stops_at_once_and_another_waits():
    with endings.catching_signals() as stops:
        stops.enter("training", until="the step in progress")
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)  # another kind: the stop already pending stands
        swallowing(0.05)
        with pytest.raises(endings.Interrupted) as stopped:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # raised before this ends
    assert stopped.value.signum == signal.SIGTERM and stopped.value.where == "during training"


def test_a_stop_before_a_phase_is_acted_on_as_it_starts_and_the_handlers_come_back():
    before = {s: signal.getsignal(s) for s in endings.CATCHABLE}
    with endings.catching_signals() as stops:
        stops.enter("the prompts' preparation")
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(0.05)
        with pytest.raises(endings.Interrupted) as stopped, stops.phase("the base's held-out evaluation"):
            pytest.fail("the phase began although a stop was pending")
    assert stopped.value.where == "during the prompts' preparation"
    assert {s: signal.getsignal(s) for s in endings.CATCHABLE} == before


def test_a_stop_during_the_run_ends_it_killed_naming_the_phase(tmp_path, monkeypatch):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    with pytest.raises(endings.Interrupted), tracking.lab_run("stops", "term", {}) as run:
        endings.STOPS.enter("the final logging")
        os.kill(os.getpid(), signal.SIGTERM)
        swallowing(0.05)
    ended = mlflow.MlflowClient().get_run(run.info.run_id)
    assert (ended.info.status, ended.data.tags["ending"]) == ("KILLED", "SIGTERM")
    assert ended.data.tags["mlflow.note.content"].startswith("Stopped by SIGTERM (kill, timeout") and (
        "during the final logging" in ended.data.tags["mlflow.note.content"]
    )


# --- the sweep: real lab processes, stopped at each phase and step they report ----------------------
def sent(stops: dict) -> list:
    return [case for case in stops["stopped"] if case.sent]


def named_phase(run) -> str | None:
    found = PHASE.search(run.data.tags.get("mlflow.note.content", ""))
    return found.group(1) if found else None


def in_teardown(case) -> bool:
    """Sent at the lab's last line: the run had ended and the process was ending."""
    return case.marker == LAST_LINE


@pytest.mark.slow
@ON_CPU
def test_the_reference_run_finishes_and_reports_every_phase_and_step(stops):
    reference = stops["reference"]
    assert reference.code == 0, reference.lab.log()
    assert [r.info.status for r in reference.runs] == ["FINISHED"]
    phases = [m.removeprefix(PHASE_PREFIX) for m in stops["markers"] if m.startswith(PHASE_PREFIX)]
    assert phases[0].startswith("the run's preparation") and phases[-1] == endings.AFTER_THE_RUN, phases
    for phase in (
        "the MLflow run's start",
        "the base's held-out evaluation",
        "training",
        "saving the adapter",
    ):
        assert phase in phases, phases
    assert [m for m in stops["markers"] if m.startswith(STEP_PREFIX)] == ["step 1/", "step 2/"]
    assert len(stops["stopped"]) == len(stops["markers"]) + 4  # SIGTERM at each, SIGINT and SIGHUP at two


@pytest.mark.slow
@ON_CPU
def test_no_stop_is_lost_none_ends_finished_or_running(stops):
    """Every signal sent: exit 128 + the signal; one KILLED run naming its signal and phase, or no run
    and nothing written; FINISHED only where the run had ended before the signal came (it says so)."""
    assert all(case.sent for case in stops["stopped"]), [c.name for c in stops["stopped"] if not c.sent]
    for case in stops["stopped"]:
        log = f"{case.name} at {case.marker!r}:\n{case.lab.log()}"
        statuses = [r.info.status for r in case.runs]
        assert "RUNNING" not in statuses, log
        assert case.code == 128 + case.signum, log
        if not case.runs:
            assert case.outputs == [], log
            assert "no MLflow run was opened, nothing written" in case.lab.stderr, log
            continue
        (run,) = case.runs
        if run.info.status == "FINISHED":
            assert "the run had ended, all saved" in case.lab.stderr, log
            continue
        assert run.info.status == "KILLED" and run.data.tags["ending"] == signal.Signals(case.signum).name, (
            log
        )
        note = run.data.tags["mlflow.note.content"]
        verb = "Interrupted" if case.signum == signal.SIGINT else "Stopped"
        assert note.startswith(f"{verb} by {signal.Signals(case.signum).name} (") and PHASE.search(note), note


@pytest.mark.slow
@ON_CPU
def test_each_stop_names_the_phase_it_was_sent_in(stops):
    """A signal sent as a phase began is acted on at that phase's end: the run names that phase, on any
    machine. The signal is sent by what the lab reports, and the lab holds at the start of the phase
    the test stops it in, or after the step line it stops it at, until the signal arrives
    (endings.HOLD_PHASE_ENV): a phase shorter than the signal's way from the test to the lab (the
    stand-in's load, on a loaded 2-core machine under OMP_NUM_THREADS=1, 2026-12-04; the last of two
    steps, 8 s, in a fresh clone's CI, 2026-12-06) is still the one it lands in."""
    order = [m.removeprefix(PHASE_PREFIX) for m in stops["markers"] if m.startswith(PHASE_PREFIX)]
    named_exactly = set()
    for case in [c for c in sent(stops) if c.marker.startswith(PHASE_PREFIX) and c.runs]:
        (run,) = case.runs
        # The phase the marker begins (a marker may be the start of a phase's name: "the model's load").
        phase = next(p for p in order if p.startswith(case.marker.removeprefix(PHASE_PREFIX)))
        if run.info.status == "FINISHED":
            assert phase == endings.AFTER_THE_RUN, case.lab.log()
            continue
        assert named_phase(run) == phase, (phase, named_phase(run), case.lab.log())
        named_exactly.add(phase)
    assert {"the model's load (Unsloth's patching included)", "training"} <= named_exactly, named_exactly
    steps = [c for c in sent(stops) if c.marker.startswith(STEP_PREFIX) and c.signum == signal.SIGTERM]
    for case in steps:
        (run,) = case.runs
        assert run.info.status == "KILLED" and named_phase(run) == "training", case.lab.log()
    told = [c for c in sent(stops) if " received during " in c.lab.stderr]
    assert told and all("again stops at once" in c.lab.stderr for c in told)


@pytest.mark.slow
@ON_CPU
def test_a_signal_as_the_lab_ends_leaves_its_run_finished_and_exits_as_any_stop_does(stops):
    """After the lab's last line the run has ended, all saved; a signal as the process ends exits
    128 + the signal and says so (grpolab.exit_process), never Python's KeyboardInterrupt in the
    shutdown, which exited 1. The lab lingers at its end here (GRPOLAB_HOLD_EXIT_S), so the signal
    lands there on any machine, not after the process exited."""
    cases = [c for c in stops["stopped"] if in_teardown(c)]
    assert {c.signum for c in cases} == {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    for case in cases:
        (run,) = case.runs
        assert run.info.status == "FINISHED", case.lab.log()
        assert case.code == 128 + case.signum, case.lab.log()
        assert "the run had ended, all saved" in case.lab.stderr, case.lab.log()


@pytest.mark.slow
@ON_CPU
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])
def test_sigint_and_sighup_end_as_sigterm_does(stops, signum):
    cases = [c for c in stops["stopped"] if c.signum == signum]
    assert [c.marker for c in cases] == list(OTHER_SIGNALS_AT[signum])
    for case in cases:
        assert case.sent, case.lab.log()
        assert case.code == 128 + signum, case.lab.log()
        assert all(r.info.status in ("KILLED", "FINISHED") for r in case.runs), case.lab.log()


def test_a_signal_as_the_run_ends_is_acted_on_not_dropped(monkeypatch):
    """A signal that lands as a lab's run has ended, while its handlers are swapped for the process's
    end, still ends the process 128 + the signal: read before the swap, it was recorded and dropped
    (the process exited 0, and a test's held exit waited 30 minutes for a signal that had come)."""
    acted: list[int] = []
    stops = endings.Stops()

    def install(handler):  # no real handler in the test's process: only the instant between them
        if handler is after_the_run:
            stops._arrived(signal.SIGHUP, None)  # the signal lands as the handlers change
        return {}

    def after_the_run(signum, frame):
        acted.append(signum)

    monkeypatch.setattr(endings, "_install", install)
    monkeypatch.setattr(endings, "_after_the_run", after_the_run)
    monkeypatch.setattr(endings, "_lab_entry_point", lambda: True)
    with stops.armed():
        stops.now(endings.AFTER_THE_RUN)
    assert acted == [signal.SIGHUP]
    assert stops.pending is None
