"""The chapter harness: everything a lab run does around its lesson.

A chapter's train.py holds the lesson (its prompts, its GRPO config, the trainer call) in a
function `train(run)`, and hands it to `run_lab`:

    def main(argv=None) -> int:
        return grpolab.run_lab(LAB_DIR, train, argv, doc=__doc__)

`run_lab` reads the flags and lab.toml, finds the device, prints the budget sheet and refuses a
plan that does not fit, builds the task's prompts, opens the MLflow run, measures while `train`
runs, ends the run with the status it earned (FINISHED, KILLED, FAILED), saves the adapter and
prints what happened. Bad input is one line on stderr and exit code 2, before anything is written;
running out of memory is exit code 3 with a FAILED run that names the line to blame.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from budgets import BudgetError
from grpolab import run_result
from grpolab.settings import (
    FLAGS,
    LabSettings,
    LabSettingsError,
    add_flags,
    check,
    lab_settings,
    overrides_from,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
EXIT_BAD_INPUT, EXIT_OUT_OF_MEMORY, EXIT_INTERRUPTED = 2, 3, 130


class OutOfMemory(RuntimeError):
    """Memory ran out; the message is the one-line next step."""


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse whose errors are one line and exit 2, like every other bad input of a lab."""

    def error(self, message: str):
        print(f"error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def parser(description: str) -> argparse.ArgumentParser:
    """The flags every chapter has: the profile, the run's options, and one flag per setting."""
    ap = OneLineErrorParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--profile",
        choices=("auto", "gpu", "cpu"),
        default="auto",
        help="gpu: the real run (fails at once without CUDA); cpu: the tiny stand-in; auto: gpu if present",
    )
    run = ap.add_argument_group("the run")
    run.add_argument(
        "--output-dir", type=Path, default=REPO_ROOT / "outputs", help="adapters and checkpoints"
    )
    run.add_argument("--ignore-budget", action="store_true", help="start even when the budget says no")
    run.add_argument("--memory-sample-ms", type=float, default=5.0, help="how often the memory probe samples")
    run.add_argument(
        "--system-metrics-interval",
        type=float,
        default=2.0,
        help="seconds between MLflow's system metrics samples (too coarse for peaks: the probe catches those)",
    )
    run.add_argument(
        "--memory-cap-gib",
        type=float,
        help="let memory grow by at most this much after loading (GPU: torch's allocator beyond what it "
        "holds; CPU: address space), to rehearse an out-of-memory",
    )
    run.add_argument(
        "--parent-run-id",
        metavar="RUN_ID",
        help="open this run as a child of that MLflow run, held open by another process (a sweep's cell)",
    )
    run.add_argument(
        "--rehearse",
        action="store_true",
        help="before downloading anything: the lab's model shape with random weights (built offline, "
        "saved in 4-bit), a few steps, every budget line measured",
    )
    run.add_argument(
        "--rehearsal-dir",
        type=Path,
        metavar="DIR",
        help="where --rehearse builds the random checkpoint (default: <output-dir>/rehearsal); it needs room "
        "for a 16-bit staging copy and the 4-bit checkpoint, checked before it starts",
    )
    run.add_argument(
        "--record-memory-history",
        action="store_true",
        help="GPU: record the stack of every CUDA allocation for the whole run (slows each step; an "
        "out-of-memory snapshot then says who allocated what, for pytorch.org/memory_viz)",
    )
    run.add_argument(
        "--eval-only",
        type=Path,
        metavar="ADAPTER",
        help="train nothing: score a saved adapter (and the base) on the held-out prompts",
    )
    add_flags(ap)
    return ap


@dataclass
class Run:
    """One lab run, as the lesson sees it: its settings, the prompts, the policy loader, and
    `train(trainer)`, which measures the trainer while it trains."""

    settings: LabSettings
    sheet: Any
    device: Any
    options: argparse.Namespace
    train_dataset: Any
    output_dir: Path
    meter: Any = None
    mlflow_run: Any = None
    trainer: Any = None
    tokenizer: Any = None
    adapter_dir: Path | None = None
    comparison: Any = None
    evals: dict[str, Any] = field(default_factory=dict)  # "base" before training, "adapter" after
    summary: list[str] = field(default_factory=list)

    @property
    def task(self):
        from task import get_task

        return get_task(self.settings.task)

    def load_policy(self):
        """The 4-bit base with its LoRA adapter, loaded and measured as the "load" phase."""
        from grpolab import policy
        from grpolab.unsloth_trainer import grpo_trainer_class
        from grpolab.vllm_ledger import capture

        with self.meter.probe.phase("load"), capture() as vllm_lines:
            model, self.tokenizer = policy.load_policy(self.settings)
        self.meter.vllm_log = vllm_lines  # vLLM's start-up lines, for what its engine does not keep
        # From here `from trl import GRPOTrainer` is Unsloth's generated trainer on both profiles: on a
        # GPU `import unsloth` swaps it in; on the CPU stand-in an internal import does the same.
        grpo_trainer_class()
        if self.options.memory_cap_gib is not None:
            self.meter.probe.cap(self.options.memory_cap_gib)  # rehearse an out-of-memory on purpose
        return model, self.tokenizer

    def precision(self, model) -> dict[str, bool]:
        """bf16 / fp16 as the model was really loaded (fp16 on a T4), and use_cpu on the CPU stand-in."""
        from grpolab.precision import model_dtype, trainer_precision

        return {
            **trainer_precision(model_dtype(model), self.device.on_gpu),
            "use_cpu": not self.device.on_gpu,
        }

    def train(self, trainer) -> None:
        """Train, with every generation and training pass measured; logs what really trains."""
        import mlflow

        from grpolab import tracking

        self.trainer = trainer
        self.meter.attach(trainer)
        tracking.log_trainer_args(trainer.args)
        mlflow.set_tag("trainer_class", type(trainer).__name__)
        self.evaluate("base", step=0)  # the adapter starts at zero: this is the base model
        with self.meter.probe.phase("train"):
            trainer.train()

    def evaluate(self, which: str, step: int) -> None:
        """Held-out accuracy, format rate and length of `which` ("base" or "adapter"), logged as eval/*."""
        from grpolab.evaluate import evaluate

        if self.settings.eval_prompts == 0 or self.trainer is None:
            return
        with self.meter.probe.phase(f"eval_{which}"):
            result = evaluate(self.trainer.model, self.tokenizer, self.settings, which, self.adapter_dir)
        self.evals[which] = result
        log_eval(result, step)


def run_lab(lab_dir: Path, train: Callable[[Run], None], argv: list[str] | None = None, doc: str = "") -> int:
    """Parse, check, budget, run `train` inside a measured MLflow run; returns the exit code."""
    args = parser(doc.split("\n\n")[0] if doc else "").parse_args(argv)
    from grpolab import cuda_env, endings, store, tracking

    try:  # first: a wrong tracking URI costs seconds and one line, not a loaded model
        store.require(tracking.tracking_uri())
    except store.StoreError as err:
        return _refuse(err)
    try:
        device, settings, sheet, card_note = prepare(lab_dir, args)
        # Before anything touches CUDA: standby's switch, then Unsloth, which configures the allocator.
        cuda = cuda_env.configure(settings.unsloth_vllm_standby)
    except (LabSettingsError, BudgetError) as err:
        return _refuse(err)
    if cuda.note:
        print(cuda.note, flush=True)
    if args.eval_only is not None:
        return evaluate_saved(settings, device, args, card_note, cuda)
    try:
        dataset = prompts(settings)
    except LabSettingsError as err:  # found only once the tokenizer exists (prompt lengths)
        return _refuse(err)
    try:
        with session(settings, sheet, device, args, dataset, card_note, cuda=cuda) as run:
            train(run)
    except OutOfMemory as err:
        print(f"\nerror: {err}", file=sys.stderr)  # on a line of its own, after the progress bar
        return EXIT_OUT_OF_MEMORY
    except endings.DiskFull as err:
        print(f"\nerror: {err}", file=sys.stderr)
        return endings.EXIT_DISK_FULL
    except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM, SIGHUP: 130, 143, 129 as a shell reports them
        return endings.exit_code(stop)
    print("\n".join(run.summary))
    return 0


def log_eval(result, step: int) -> None:
    """A held-out result as eval/* at `step` (a curve over the run) and as eval/<which>_* (its value,
    side by side with the other's in the run's metrics)."""
    import mlflow

    mlflow.log_metrics(result.metrics(), step=step)
    mlflow.log_metrics(
        {f"eval/{result.which}_{k.removeprefix('eval/')}": v for k, v in result.metrics().items()}
    )


def evaluate_saved(settings, device, args, card_note: str, cuda=None) -> int:
    """`--eval-only ADAPTER`: the base and a saved adapter on the held-out prompts, in a run of
    its own (tag run_kind=eval); nothing is trained or saved."""
    from grpolab import policy  # Unsloth first: it patches transformers and TRL

    # isort: split
    import mlflow

    from grpolab import tracking
    from grpolab.evaluate import evaluate, load_adapter

    adapter = args.eval_only.expanduser().resolve()
    if not (adapter / "adapter_model.safetensors").is_file():
        return _refuse(
            LabSettingsError(f"eval-only: no adapter at {adapter}: pass the adapter folder a lab run saved")
        )
    settings = settings.replace(eval_prompts=settings.eval_prompts or 32)
    tags = {
        "profile": settings.profile,
        "chapter": settings.chapter,
        "run_kind": "eval",
        "adapter": str(adapter),
    }
    with tracking.lab_run(
        settings.chapter, f"eval-{tracking.run_name(settings.profile)}", tags
    ) as mlflow_run:
        tracking.log_context(settings, device, card_note, cuda)
        model, tokenizer = policy.load_policy(settings)
        load_adapter(model, adapter)
        results = [evaluate(model, tokenizer, settings, which, adapter) for which in ("base", "adapter")]
        for step, result in enumerate(results):
            log_eval(result, step)
        note = " ".join(f"Held-out, {r.line()}." for r in results)
        mlflow.set_tag("mlflow.note.content", note)
    print("\n".join(f"Held-out, {r.line()}" for r in results))
    print(f"MLflow run {mlflow_run.info.run_id}: {tracking.run_url(mlflow_run)}")
    return 0


def _refuse(err: Exception) -> int:
    print(f"error: {err}", file=sys.stderr)
    return EXIT_BAD_INPUT


def prepare(lab_dir: Path, args: argparse.Namespace):
    """Device, settings and sheet, checked before anything loads; prints the sheet."""
    from budgets import compute, get_card
    from budgets.cards import card_for_device
    from grpolab.device import DeviceError, detect, resolve_other_processes

    try:
        device = detect()
    except DeviceError as err:
        raise LabSettingsError(str(err)) from None
    if args.profile == "gpu" and not device.on_gpu:
        raise LabSettingsError(
            "--profile gpu needs a CUDA GPU and torch sees none: run on a machine with an NVIDIA GPU, or drop "
            "--profile to use the CPU stand-in"
        )
    profile = (
        "gpu"
        if args.profile == "auto" and device.on_gpu
        else ("cpu" if args.profile == "auto" else args.profile)
    )
    settings = lab_settings(lab_dir, profile, overrides_from(args))
    check(settings)
    cannot: list[str] = []
    if args.rehearse:
        from grpolab.rehearsal import rehearsal_settings

        settings, cannot = rehearsal_settings(settings)
    plan = settings.plan()
    card_note = f"{settings.gpu} (lab.toml)"
    if device.on_gpu and "gpu" not in settings.overridden:
        # The card the run is really on, and what other processes already hold on it: measured
        # before this process touched CUDA, and never below what the user gave.
        card, card_note = card_for_device(device.name, device.total_bytes)
        given_by = "--other-processes-gib" if "other_processes_gib" in settings.overridden else "lab.toml"
        other_gib, other_note = resolve_other_processes(device, settings.other_processes_gib, given_by)
        print(other_note, flush=True)
        plan = plan.with_(gpu=card, other_processes_gib=other_gib)
    elif profile == "gpu":
        card_note = f"{get_card(settings.gpu).name} (--gpu)" if "gpu" in settings.overridden else card_note
    sheet = compute(plan)
    print(sheet.table(accepts=FLAGS), f"\nbudget card: {card_note}", flush=True)
    if not args.ignore_budget:
        sheet.require_fits(accepts=FLAGS)
    if profile == "cpu" and not args.rehearse:
        announce_cpu(settings)
    if args.rehearse:
        settings = rehearse(settings, cannot, args.rehearsal_dir or args.output_dir / "rehearsal")
    return device, settings, sheet, card_note


def rehearse(s: LabSettings, cannot: list[str], root: Path) -> LabSettings:
    """Build (or reuse) the rehearsal checkpoint of the lab's model and point the settings at it."""
    from grpolab import rehearsal

    print(
        f"\n=== Rehearsal: {s.model} with random weights, built offline, {s.max_steps} steps ===\n"
        "  The shapes, the loader, the trainer and every budget line are the real run's; the rewards mean\n"
        "  nothing (random weights), and every completion runs to max_completion_length (the worst case).",
        flush=True,
    )
    for line in cannot:
        print(f"  {line}", flush=True)
    path, source = rehearsal.build(s.model, root)
    print(f"  shape: {source}\n  checkpoint: {path}\n", flush=True)
    return s.replace(model=str(path))


def announce_cpu(s: LabSettings) -> None:
    print(
        "\n"
        "=== No CUDA GPU found: running the CPU stand-in of this lab ===\n"
        f"  model:   {s.model} (a tiny Qwen3 built offline: random weights, briefly warm-started; not Qwen3-4B)\n"
        f"  backend: {s.backend} (bitsandbytes 4-bit layers on CPU, generation by transformers, no vLLM)\n"
        "  The loop, the rewards, the tracking and the budget are the real ones;\n"
        "  the numbers (reward, memory, speed) are the tiny model's, not Qwen3-4B's.\n",
        flush=True,
    )


def prompts(s: LabSettings):
    """The task's prompts, keeping those that leave room for a full completion.

    TRL 1.x has no max_prompt_length: a prompt is bounded by dropping the ones that do not fit in
    max_seq_length - max_completion_length before training. Unsloth is imported first: it patches
    transformers and TRL, which must not be imported before it.
    """
    from grpolab import policy

    # isort: split
    from transformers import AutoTokenizer

    from task import get_task

    tokenizer = AutoTokenizer.from_pretrained(policy.resolve_model_path(s.model))
    dataset = get_task(s.task).build_dataset(s.num_prompts, s.seed)

    def prompt_tokens(row: dict) -> dict:
        text = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        return {"prompt_tokens": len(tokenizer(text, add_special_tokens=False)["input_ids"])}

    dataset = dataset.map(prompt_tokens)
    kept = dataset.filter(lambda row: row["prompt_tokens"] <= s.prompt_room)
    if len(kept) == 0:
        raise LabSettingsError(
            f"max_completion_length: every prompt is longer than max_seq_length - max_completion_length = "
            f"{s.prompt_room} tokens (longest: {max(dataset['prompt_tokens'])}): lower "
            "--max-completion-length or raise --max-seq-length"
        )
    return kept


@contextmanager
def session(
    settings, sheet, device, args, dataset, card_note: str = "", nested: bool = False, cuda=None
) -> Iterator[Run]:
    """An MLflow run around one training: measured, ended with the status it earned, its adapter saved.

    Ctrl-C ends the run KILLED with the adapter trained so far; an out-of-memory error ends it FAILED
    with the phase, the peak and the line to blame, and raises OutOfMemory with the next step.
    """
    from grpolab import endings, tracking
    from grpolab.meter import Meter
    from grpolab.oom import is_out_of_memory
    from grpolab.probe import MemoryProbe

    probe = MemoryProbe(device, interval_s=args.memory_sample_ms / 1000).start()
    if device.on_gpu and records_memory_history(args):
        import torch

        # Every allocation's stack, for the out-of-memory snapshot; it slows each step, so only on request
        # (without it the snapshot still shows every segment and block, with no stacks). A run capped to
        # rehearse an out-of-memory asks for it.
        torch.cuda.memory._record_memory_history(max_entries=100_000)
    name = tracking.run_name(("rehearse-" if getattr(args, "rehearse", False) else "") + settings.profile)
    run = Run(
        settings, sheet, device, args, dataset, args.output_dir / settings.chapter / name, Meter(probe, sheet)
    )
    tags = {
        "profile": settings.profile,
        "backend": settings.backend,
        "model_id": settings.model,
        "chapter": settings.chapter,
        "run_kind": "rehearsal" if getattr(args, "rehearse", False) else "train",
    }
    try:
        with tracking.lab_run(
            settings.chapter,
            name,
            tags,
            args.system_metrics_interval,
            nested,
            getattr(args, "parent_run_id", None),
        ) as mlflow_run:
            run.mlflow_run = mlflow_run
            tracking.log_context(settings, device, card_note, cuda)
            if device.on_gpu:  # CUDA is up now (the probe measured its context): what the allocator got
                import mlflow

                from grpolab.cuda_env import allocator_settings

                mlflow.set_tag("cuda_allocator_settings", allocator_settings())
            tracking.log_sheet(sheet)
            try:
                yield run
            except KeyboardInterrupt as stop:
                # Ctrl-C, SIGTERM or SIGHUP: keep what was trained and what was measured; the run ends
                # KILLED, its description opening with the signal and the step.
                cause = endings.record_stop(stop, run)
                _save_adapter(run)
                _log_measurement(run, "KILLED", _doctor(run))
                print(
                    f"\n{cause}: run {mlflow_run.info.run_id} ends KILLED; the adapter so far is in {run.output_dir}"
                )
                raise
            except Exception as error:
                if endings.is_disk_full(error, run.output_dir):  # a checkpoint the trainer could not write
                    raise endings.disk_full(error, run) from error
                if not is_out_of_memory(error):
                    endings.record_failure(error, run)
                    raise
                raise OutOfMemory(_log_out_of_memory(run, error)) from error
            _save_adapter(run)
            if run.adapter_dir is not None:
                import mlflow

                mlflow.log_artifacts(str(run.adapter_dir), artifact_path="adapter")
                run.evaluate("adapter", step=run.trainer.state.global_step)
            doctor = _doctor(run)
            _log_measurement(run, "FINISHED", doctor)
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


def records_memory_history(args: argparse.Namespace) -> bool:
    """Whether the run records every CUDA allocation's stack: when asked, or when it rehearses an
    out-of-memory on purpose (--memory-cap-gib). Recording slows every step the perf/* figures time."""
    return bool(
        getattr(args, "record_memory_history", False) or getattr(args, "memory_cap_gib", None) is not None
    )


def _save_adapter(run: Run) -> None:
    """The adapter, saved atomically; a full disk ends the run FAILED (endings.DiskFull)."""
    from grpolab import endings
    from grpolab.atomic import save_pretrained_atomically

    if run.trainer is not None:
        try:
            run.adapter_dir = save_pretrained_atomically(
                run.trainer.model, run.tokenizer, run.output_dir / "adapter"
            )
        except Exception as error:
            if not endings.is_disk_full(error, run.output_dir):
                raise
            raise endings.disk_full(error, run) from error


def _doctor(run: Run) -> str:
    """The run doctor's verdict on what TRL logged and the held-out evaluation."""
    from grpolab import doctor

    values = {name: getattr(run.settings, name) for name in FLAGS}
    before, after = run.evals.get("base"), run.evals.get("adapter")
    findings = doctor.diagnose(run.meter.history, values, set(FLAGS), before, after)
    return doctor.verdict(findings, before, after, steps=len(doctor.step_rows(run.meter.history)))


def _log_measurement(run: Run, status: str, doctor: str = "") -> None:
    from grpolab import comparison, tracking
    from grpolab.probe import MEMORY_LABELS

    meter = run.meter
    run.comparison = c = comparison.compare(
        run.sheet, meter.lines(), meter.probe.process_peak_bytes, run.device.on_gpu
    )
    note = c.verdict() + ("" if status == "FINISHED" else f" (run ended {status}: figures so far)")
    note += f"\n\n{doctor}" if doctor else ""
    figure = comparison.chart(c, meter.step_peaks, run.sheet.total_bytes)
    extra = meter.probe.summary()
    if run.device.on_gpu:
        # The phases standby changes, budget beside measured, and vLLM's own start-up figures.
        extra |= comparison.phase_pairs(run.sheet, meter.probe.step_phase_peaks)
        ledger = meter.vllm_ledger()
        extra |= ledger.metrics() if ledger is not None else {}
    tracking.log_comparison(c, figure, extra, MEMORY_LABELS, note)
    run_result.write(run, status, c)


def _log_out_of_memory(run: Run, error: BaseException) -> str:
    """The FAILED run's record of an out-of-memory error: peak, phase, the line to blame, a CUDA
    snapshot; returns the one-line next step."""
    import tempfile

    import mlflow

    from grpolab import comparison, oom

    probe = run.meter.probe
    phase = probe.failed_phase or probe.current_phase
    c = comparison.compare(run.sheet, run.meter.lines(), probe.process_peak_bytes, run.device.on_gpu)
    line = oom.blame(phase, {n: c.rel_error(n) for n in c.paired}, c.budget)
    advice = oom.next_step(line, run.sheet.inputs, FLAGS)
    peak_gib = probe.process_peak_bytes / 1024**3
    mlflow.log_metrics({**probe.summary(), "oom/peak_gib": peak_gib})
    mlflow.log_metrics({f"{name}/measured": c.measured[name] / 1024**3 for name in c.paired})
    mlflow.set_tags(
        {
            "oom_phase": phase,
            "oom_line": line,
            "oom_error": str(error).splitlines()[0][:500] if str(error) else type(error).__name__,
            "mlflow.note.content": (
                f"Out of memory during {phase} at a peak of {peak_gib:.2f} GiB; budget line most exceeded: "
                f"{line}. Next step: {advice}."
            ),
        }
    )
    if run.device.on_gpu:
        import torch

        path = Path(tempfile.mkdtemp(prefix="memory-")) / "cuda_memory_snapshot.pickle"
        torch.cuda.memory._dump_snapshot(str(path))
        mlflow.log_artifact(str(path), artifact_path="memory")
    run_result.write(run, "FAILED", c, oom={"phase": phase, "line": line, "peak_gib": peak_gib})
    return f"out of memory during {phase} at {peak_gib:.2f} GiB (budget line most exceeded: {line}): {advice}"
