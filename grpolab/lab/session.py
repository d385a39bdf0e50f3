"""The chapter harness: everything a lab run does around its lesson.

A chapter's train.py holds the lesson (its prompts, its GRPO config, the trainer call) in a
function `train(run)`, and hands it to `run_lab`:

    def main(argv=None) -> int:
        return grpolab.run_lab(LAB_DIR, train, argv, doc=__doc__)

`run_lab` reads the flags (grpolab.config.flags), prepares the run before anything loads (grpolab.lab.prepare:
the device, the settings, the budget sheet, a refusal when it does not fit), sets the process up for
CUDA (grpolab.model.cuda_env), then `session` opens the MLflow run, measures while `train` runs, ends the
run with the status it earned (FINISHED, KILLED, FAILED: grpolab.lifecycle.endings decides, grpolab.lifecycle.tracking
writes), saves the adapter and prints what happened. Bad input is one line on stderr and exit code
2, before anything is written; running out of memory is exit code 3 with a FAILED run that names the
line to blame (grpolab.memory.oom).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from budgets import BudgetError
from grpolab.config.errors import refuse
from grpolab.config.flags import parser
from grpolab.config.settings import FLAGS, LabSettingsError
from grpolab.lab.prepare import budget_only, prepare, prompts
from grpolab.lab.run import Run
from grpolab.lifecycle.endings import EXIT_OUT_OF_MEMORY
from grpolab.memory import run_result
from grpolab.memory.names import MEMORY_UNITS, memory_key, memory_unit
from grpolab.memory.oom import OutOfMemory

__all__ = ["Run", "parser", "prepare", "prompts", "records_memory_history", "run_lab", "session"]


def run_lab(lab_dir: Path, train: Callable[[Run], None], argv: list[str] | None = None, doc: str = "") -> int:
    """Parse, check, budget, run `train` inside a measured MLflow run; returns the exit code.

    From here on SIGINT, SIGTERM and SIGHUP are recorded and acted on between phases and steps
    (grpolab.lifecycle.endings.STOPS): inside the run it ends KILLED; before it, nothing is written and the exit
    code is 128 + the signal; after it ended FINISHED, it stays so (all was saved) and the exit code
    says the signal came."""
    args = parser(doc.split("\n\n")[0] if doc else "").parse_args(argv)
    from grpolab.lab import console
    from grpolab.lifecycle import endings

    with endings.STOPS.armed() as stops, console.screen():
        try:
            return _run_lab(lab_dir, train, args, stops)
        except KeyboardInterrupt as stop:
            return endings.exit_after(stop, stops)


def _run_lab(lab_dir: Path, train: Callable[[Run], None], args: argparse.Namespace, stops) -> int:
    from grpolab.lab import console
    from grpolab.lifecycle import endings, store, tracking
    from grpolab.model import cuda_env

    stops.enter("the run's preparation (imports, settings, budget)")
    console.quiet_library_noise()  # before Unsloth's import: its and torch's warnings about themselves

    if args.budget_only and args.resume is not None:
        return refuse(
            LabSettingsError("resume: --budget-only trains nothing: drop --resume, or --budget-only")
        )
    if args.budget_only:  # the sheet alone: no store, no model, nothing written
        try:
            print(budget_only(lab_dir, args))
        except (LabSettingsError, BudgetError) as err:
            return refuse(err)
        return 0
    try:  # first: a wrong tracking URI costs seconds and one line, not a loaded model
        store.require(tracking.tracking_uri())
    except store.StoreError as err:
        return refuse(err)
    try:
        resume = _resume_target(lab_dir, args)
        device, settings, sheet, card_note = prepare(lab_dir, args, resume)
        # Before anything touches CUDA: standby's switch, then Unsloth, which configures the allocator.
        cuda = cuda_env.configure(settings.unsloth_vllm_standby)
    except (LabSettingsError, BudgetError) as err:
        return refuse(err)
    if cuda.note:
        print(cuda.note, flush=True)
    if args.eval_only is not None:
        from grpolab.judging.evaluate import evaluate_saved

        try:
            evaluate_saved(settings, device, args, card_note, cuda)
        except LabSettingsError as err:
            return refuse(err)
        return 0
    stops.enter("the prompts' preparation")
    try:
        dataset = prompts(settings)
    except LabSettingsError as err:  # found only once the tokenizer exists (prompt lengths)
        return refuse(err)
    try:
        with session(settings, sheet, device, args, dataset, card_note, cuda=cuda, resume=resume) as run:
            train(run)
    except OutOfMemory as err:
        print(f"\nerror: {err}", file=sys.stderr)  # on a line of its own, after the progress bar
        return EXIT_OUT_OF_MEMORY
    except endings.DiskFull as err:
        print(f"\nerror: {err}", file=sys.stderr)
        return endings.EXIT_DISK_FULL
    print("\n".join(run.summary))
    stops.check()  # one that came after the run ended FINISHED: the exit code says so
    return 0


def _resume_target(lab_dir: Path, args: argparse.Namespace):
    """The interrupted run `--resume` names (grpolab.lifecycle.resume), or None; refusals are one line."""
    if args.resume is None:
        return None
    from grpolab.config.settings import read_lab_toml
    from grpolab.lifecycle import resume, store, tracking

    for other, given in (("--rehearse", args.rehearse), ("--eval-only", args.eval_only is not None)):
        if given:
            raise LabSettingsError(f"resume: {other} starts a run of its own: drop it, or drop --resume")
    path = store.sqlite_path(tracking.tracking_uri())
    if path is not None and not path.exists():
        raise LabSettingsError(
            f"resume: no MLflow store at {path}: no run to resume (set MLFLOW_TRACKING_URI?)"
        )
    chapter = read_lab_toml(lab_dir).get("chapter", Path(lab_dir).name)
    return resume.find(args.resume, chapter, tracking.client())


@contextmanager
def session(
    settings,
    sheet,
    device,
    args,
    dataset,
    card_note: str = "",
    nested: bool = False,
    cuda=None,
    resume=None,
    name: str | None = None,
) -> Iterator[Run]:
    """An MLflow run around one training: measured, ended with the status it earned, its adapter saved.

    Ctrl-C ends the run KILLED with the adapter trained so far and a checkpoint to resume from; an
    out-of-memory error ends it FAILED with the phase, the peak and the line to blame (and a
    checkpoint), and raises OutOfMemory with the next step. With `resume` (grpolab.lifecycle.resume.Resume) the
    interrupted run's MLflow run is reopened and training continues from its checkpoint.
    """
    from grpolab.judging import task_check
    from grpolab.lab.meter import Meter
    from grpolab.lifecycle import endings, tracking
    from grpolab.memory.oom import is_out_of_memory, log_out_of_memory
    from grpolab.memory.probe import MemoryProbe

    probe = MemoryProbe(device, interval_s=args.memory_sample_ms / 1000).start()
    if device.on_gpu and records_memory_history(args):
        import torch

        # Every allocation's stack, for the out-of-memory snapshot; it slows each step, so only on request
        # (without it the snapshot still shows every segment and block, with no stacks). A run capped to
        # rehearse an out-of-memory asks for it.
        torch.cuda.memory._record_memory_history(max_entries=100_000)
    if resume is not None:
        name, output_dir = resume.run.info.run_name, resume.output_dir
    else:
        # A name of its own when several runs share a process and a second (chapter 4's arms).
        name = name or tracking.run_name(
            ("rehearse-" if getattr(args, "rehearse", False) else "") + settings.profile
        )
        output_dir = args.output_dir / settings.chapter / name
    run = Run(settings, sheet, device, args, dataset, output_dir, Meter(probe, sheet), resume=resume)
    tags = {
        "profile": settings.profile,
        "backend": settings.backend,
        "model_id": settings.model,
        "chapter": settings.chapter,
        "run_kind": "rehearsal" if getattr(args, "rehearse", False) else "train",
        "output_dir": str(Path(output_dir).resolve()),  # where its checkpoints are: --resume finds them
    }
    try:
        with tracking.lab_run(
            settings.chapter,
            name,
            tags,
            args.system_metrics_interval,
            nested,
            getattr(args, "parent_run_id", None),
            resume_run_id=resume.run_id if resume is not None else None,
        ) as mlflow_run:
            run.mlflow_run = mlflow_run
            tracking.log_context(settings, device, card_note, cuda, resumed=resume is not None)
            if device.on_gpu:  # CUDA is up now (the probe measured its context): what the allocator got
                import mlflow

                from grpolab.model.cuda_env import allocator_settings

                mlflow.set_tag("cuda_allocator_settings", allocator_settings())
            if resume is None:
                tracking.log_sheet(sheet, device.on_gpu)
                run.task_check = task_check.log(settings, getattr(args, "ignore_task_check", False))
            else:
                _reopen(run, resume)
            endings.STOPS.now("the run's set-up")  # the lesson's own steps each name their phase
            try:
                yield run
            except KeyboardInterrupt as stop:
                _stopped(run, stop)
                raise
            except Exception as error:
                if endings.is_disk_full(error, run.output_dir):  # a checkpoint the trainer could not write
                    raise _disk_full(error, run) from error
                if not is_out_of_memory(error):
                    tracking.describe_ending(*endings.failed(error, run))
                    raise
                probe.uncap()  # a rehearsed out-of-memory: the ending is recorded with room to do it
                message = log_out_of_memory(run, error, FLAGS)
                again = _resume_line(run, _save_stopped_checkpoint(run), oom=True)
                if again:
                    tracking.add_to_description(again)
                raise OutOfMemory(f"{message}\n{again}" if again else message) from error
            try:
                endings.STOPS.enter("saving the adapter")
                _save_adapter(run)
                if run.adapter_dir is not None:
                    import mlflow

                    mlflow.log_artifacts(str(run.adapter_dir), artifact_path="adapter")
                    run.evaluate("adapter", step=run.trainer.state.global_step)
                endings.STOPS.enter("the final logging")
                doctor = _doctor(run)
                _log_measurement(run, "FINISHED", doctor)
                endings.STOPS.check()
            except KeyboardInterrupt as stop:
                _stopped(run, stop)
                raise
    finally:
        probe.stop()
    run.summary += [
        f"\nAdapter saved to {run.adapter_dir}",
        *[f"Held-out, {result.line()}" for result in run.evals.values()],
        *run.comparison.peak_lines(),
        run.comparison.verdict(),
        doctor,
        f"MLflow run {run.mlflow_run.info.run_id} in {tracking.tracking_uri()}",
        f"Open it: uv run mlflow ui --backend-store-uri {tracking.tracking_uri()}, then {tracking.run_url(run.mlflow_run)}",
    ]


def _stopped(run: Run, stop: KeyboardInterrupt) -> None:
    """Ctrl-C, SIGTERM or SIGHUP: keep what was trained and what was measured, and a checkpoint to
    resume from; the run ends KILLED, its description opening with the signal, the phase and the step."""
    from grpolab.lifecycle import endings, tracking

    ending, cause = endings.stopped(stop, run)
    _save_adapter(run)
    again = _resume_line(run, _save_stopped_checkpoint(run))
    tracking.describe_ending(ending, f"{cause} {again}" if again else cause)
    _log_measurement(run, "KILLED", _doctor(run), ending)
    print(
        f"\n{cause.removesuffix('.')}: run {run.mlflow_run.info.run_id} ends KILLED; the adapter so far is in "
        f"{run.output_dir}" + (f"\n{again}" if again else "")
    )


def _reopen(run: Run, resume) -> None:
    """A resumed run's MLflow run: the resume recorded (tag `resumes`, the description), the sheet
    logged again only where memory settings changed it (at the step it resumes from), the steps the
    run logged after its checkpoint not logged twice."""
    import json

    import mlflow

    from grpolab.lifecycle import resume as resuming
    from grpolab.lifecycle import tracking

    client = tracking.client()
    past = json.loads(resume.tags.get(resuming.TAG, "[]"))
    record = resume.record()
    for line in resume.skipped:
        print(f"resume: {line}", flush=True)
    print(
        f"Resuming run {resume.run_id} ({resume.run.info.run_name}) from {resume.checkpoint.name} "
        f"(step {resume.checkpoint.step} of {run.settings.max_steps}) in {resume.output_dir}",
        flush=True,
    )
    mlflow.set_tags(
        {
            resuming.TAG: json.dumps([*past, record]),
            **{f"resume.changed.{name}": f"{old} -> {new}" for name, (old, new) in resume.changed.items()},
        }
    )
    tracking.describe_resumes(resuming.history_text([*past, record]))
    unit = memory_unit(run.device.on_gpu)
    logged_total = resume.run.data.metrics.get(memory_key("total", "budget", unit))
    if logged_total is None or abs(logged_total - run.sheet.total_bytes / MEMORY_UNITS[unit]) > 1e-9:
        step = resume.checkpoint.step
        tracking.log_sheet(run.sheet, run.device.on_gpu, step=step, suffix=f"-resume-{step}")
    run.meter.logged_through = resume.logged_steps(client)


def _save_stopped_checkpoint(run: Run):
    """The stopped run's checkpoint (grpolab.lifecycle.step_boundary.save_stopped), or the newest whole one; a
    failure to save it is a warning: the run's ending stays what it was."""
    from grpolab.lifecycle import checkpoints, endings, step_boundary

    if run.trainer is None:
        return None
    try:
        return step_boundary.save_stopped(run.trainer, run.boundary)
    except Exception as error:
        removed = endings.remove_partial_checkpoints(run.output_dir)
        print(
            f"warning: could not save a checkpoint of step {run.trainer.state.global_step}: "
            f"{endings.error_line(error)}"
            + (f" (removed the half-written {', '.join(removed)})" if removed else ""),
            file=sys.stderr,
        )
        return checkpoints.latest(run.output_dir)


def _resume_line(run: Run, checkpoint, oom: bool = False) -> str:
    """The command that resumes the run from `checkpoint`, as a sentence ("" without one). After an
    out-of-memory, with the settings a resume may change that give it more room, when there are any."""
    from budgets import advice
    from grpolab.lifecycle import checkpoints, resume

    if checkpoint is None or run.mlflow_run is None:
        return ""
    changes = ""
    if (
        oom
    ):  # the line to blame, as grpolab.memory.oom tagged it; advice that names only what a resume may change
        import mlflow

        line = mlflow.get_run(run.mlflow_run.info.run_id).data.tags.get("oom_line", "")
        changes = advice.for_line(line, run.sheet.inputs, resume.NEUTRAL) if line else ""
        changes = changes if changes.startswith(("lower", "raise", "set")) else ""
    command = checkpoints.command(run.settings.chapter, run.mlflow_run.info.run_id)
    text = f"Resume it from {checkpoint.name} (step {checkpoint.step}): {command}"
    return text + (f" (with more room: {changes})" if changes else "")


def records_memory_history(args: argparse.Namespace) -> bool:
    """Whether the run records every CUDA allocation's stack: when asked, or when it rehearses an
    out-of-memory on purpose (--memory-cap-gib). Recording slows every step the perf/* figures time."""
    return bool(
        getattr(args, "record_memory_history", False) or getattr(args, "memory_cap_gib", None) is not None
    )


def _save_adapter(run: Run) -> None:
    """The adapter, saved atomically; a full disk ends the run FAILED (endings.DiskFull)."""
    from grpolab.lifecycle import endings
    from grpolab.lifecycle.atomic import save_pretrained_atomically

    if not run.trained_past_checkpoint:  # a resumed run stopped before its checkpoint loaded
        saved = run.output_dir / "adapter"
        run.adapter_dir = saved if (saved / "adapter_config.json").is_file() else None
        return
    if run.trainer is not None:
        try:
            run.adapter_dir = save_pretrained_atomically(
                run.trainer.model, run.tokenizer, run.output_dir / "adapter"
            )
        except Exception as error:
            if not endings.is_disk_full(error, run.output_dir):
                raise
            raise _disk_full(error, run) from error


def _disk_full(error: BaseException, run: Run):
    """The DiskFull to raise, its ending recorded in the open run."""
    from grpolab.lifecycle import endings, tracking

    full = endings.disk_full(error, run)
    tracking.describe_ending(full.ending, full.description)
    return full


def _doctor(run: Run) -> str:
    """The run doctor's verdict on what TRL logged and the held-out evaluation."""
    from grpolab.judging import doctor

    # With the profile: a next step may name the book's recipe for it (grpolab/recipe.toml).
    values = {name: getattr(run.settings, name) for name in FLAGS} | {"profile": run.settings.profile}
    before, after = run.evals.get("base"), run.evals.get("adapter")
    # The rewards the trainer really had, with their weights: a chapter may train on a reward its task
    # does not declare and watch the task's own at weight 0 (chapter 4).
    funcs, weights = run.reward_funcs()
    run.findings = doctor.diagnose(
        run.meter.history, values, set(FLAGS), before, after, reward_funcs=funcs, reward_weights=weights
    )
    curves = doctor.trends(run.meter.history, values, funcs, weights)
    steps = len(doctor.step_rows(run.meter.history))
    return doctor.verdict(run.findings, before, after, steps=steps, curves=curves)


def _log_measurement(run: Run, status: str, doctor: str = "", ending: str = "finished") -> None:
    from grpolab.judging import overview
    from grpolab.lifecycle import tracking
    from grpolab.memory import comparison
    from grpolab.memory.probe import MEMORY_LABELS

    meter = run.meter
    run.comparison = c = comparison.compare(
        run.sheet, meter.lines(), meter.probe.process_peak_bytes, run.device.on_gpu
    )
    figure = comparison.chart(c, meter.step_peaks, run.sheet.total_bytes)
    # The Overview: verdict, the rewards per step beside the memory, per-line table, doctor, held-out
    # (grpolab.judging.overview).
    opening = overview.figure(c, meter.history, meter.step_peaks, run.sheet.total_bytes)
    checked = run.task_check.verdict() if run.task_check is not None else ""
    note = overview.description(run.mlflow_run.info.run_id, c, doctor, run.evals, status, task=checked)
    extra = meter.probe.summary()
    if run.device.on_gpu:
        # The phases standby changes, budget beside measured, and vLLM's own start-up figures.
        extra |= comparison.phase_pairs(run.sheet, meter.probe.step_phase_peaks)
        ledger = meter.vllm_ledger()
        extra |= ledger.metrics() if ledger is not None else {}
    overview.log(c, figure, extra, MEMORY_LABELS, note, step=run.measure_step, opening=opening)
    if doctor:  # the doctor read this run (an out-of-memory ends before it can)
        tracking.log_findings(run.findings)
    run_result.write(run, status, c, ending=ending)
