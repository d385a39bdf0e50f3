"""Chapter 6's harness: the training run's adapter through every stage, each scored, in one MLflow run."""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from grpolab.config.errors import LabSettingsError, refuse
from grpolab.config.paths import REPO_ROOT

CHAPTER = "grpo-ship"
FIRST_DIR = REPO_ROOT / "labs" / "grpo-first"


def parser(description: str) -> argparse.ArgumentParser:
    """Every chapter's flags (the settings apply to the short form trained when there is no run to
    ship), and the shipping's own."""
    from grpolab.config.flags import parser as lab_parser

    ap = lab_parser(description)
    ship = ap.add_argument_group("shipping")
    ship.add_argument(
        "--from",
        dest="source",
        default="last",
        metavar="RUN",
        help="what to ship: `last` (chapter 1's latest FINISHED run in the store), a training run's id, or "
        "the adapter folder it saved",
    )
    ship.add_argument("--port", type=int, default=0, help="the scoring server's port (0: any free one)")
    ship.add_argument(
        "--llama-cpp",
        type=Path,
        metavar="DIR",
        help="a llama.cpp checkout whose convert_hf_to_gguf.py writes the GGUF file (default: $LLAMA_CPP)",
    )
    return ap


def main(lab_dir: Path, train: Callable, argv: list[str] | None, doc: str) -> int:
    from grpolab.lifecycle import endings

    args = parser(doc.split("\n\n")[0] if doc else "").parse_args(argv)
    with endings.STOPS.armed() as stops:
        try:
            return _main(lab_dir, train, args, stops)
        except KeyboardInterrupt as stop:
            return endings.exit_after(stop, stops)


def _main(lab_dir: Path, train: Callable, args: argparse.Namespace, stops) -> int:
    from budgets.shipping import merge_cost
    from grpolab.chapters.ship import serve
    from grpolab.chapters.ship import source as sources
    from grpolab.config.settings import check, lab_settings, overrides_from
    from grpolab.lab import console
    from grpolab.lifecycle import store, tracking
    from grpolab.memory import device as devices

    stops.enter("the ship's preparation (imports, the run to ship)")
    console.quiet_library_noise()
    other = [f for f in _TRAINING_ONLY if getattr(args, f.removeprefix("--").replace("-", "_"))]
    if other:
        return refuse(
            f"ship: {other[0]} is for a training run (chapter 1's command); the ship takes a finished one: "
            "drop it, and name the run with --from"
        )
    try:
        store.require(tracking.tracking_uri())
        device = devices.detect()
        profile = ("gpu" if device.on_gpu else "cpu") if args.profile == "auto" else args.profile
        if profile == "gpu" and not device.on_gpu:
            raise LabSettingsError("--profile gpu needs a CUDA GPU and torch sees none: drop --profile")
        if profile == "cpu":
            from grpolab.config import numerics

            numerics.pin()  # before torch computes: the same answers on every machine
        short_form = lab_settings(lab_dir, profile, overrides_from(args))
        check(short_form)
        if args.port:
            serve.check_port(args.port)
    except (LabSettingsError, devices.DeviceError) as err:
        return refuse(err)
    cost = merge_cost(short_form.model if profile == "gpu" else "tiny-qwen3")
    print(f"The ship's sheet (budgets/shipping.py):\n  {cost.line()}", flush=True)
    if args.budget_only:
        return 0
    client = tracking.client()
    try:
        try:
            found = sources.find(args.source, client, FIRST_DIR, args.profile)
        except sources.NoFinishedRun as none:
            if profile != "cpu":
                raise
            print(
                f"{none}\nOn a CPU, chapter 6 trains chapter 1's short form first "
                f"({short_form.max_steps} steps), then ships it.",
                flush=True,
            )
            code = _train_short_form(train, short_form, args)
            if code != 0:
                return code
            found = sources.find("last", client, FIRST_DIR, args.profile)
        sources.check_shape(found)
        _check_disk(args.output_dir, cost)
    except LabSettingsError as err:
        return refuse(err)
    return _ship(found, profile, args, cost)


# Flags every chapter has that mean nothing to a ship (it resumes, rehearses and evaluates nothing).
_TRAINING_ONLY = (
    "--resume",
    "--rehearse",
    "--eval-only",
    "--parent-run-id",
    "--json",
    "--headroom",
    "--suggest-util",
)


def _train_short_form(train: Callable, short_form, args) -> int:
    """Chapter 1's lesson with this chapter's lab.toml (fewer steps), as a run of chapter 1."""
    from budgets.vocabulary import flag, flag_text
    from grpolab.lab.session import run_lab

    argv = ["--profile", "cpu", "--output-dir", str(args.output_dir)]
    for name in ("max_steps", *sorted(short_form.overridden)):
        argv += [flag(name), flag_text(getattr(short_form, name))]
    return run_lab(FIRST_DIR, train, argv, doc="")


def _check_disk(output_dir: Path, cost) -> None:
    from budgets.units import human_bytes
    from grpolab.lifecycle.endings import free_bytes

    folder = Path(output_dir).expanduser().resolve()
    free = free_bytes(folder)
    if free < cost.disk_bytes:
        raise LabSettingsError(
            f"ship: {folder} has {human_bytes(free)} free and the merge needs {human_bytes(cost.disk_bytes)} "
            "(the 16-bit merge, its GGUF file and MLflow's copy): free some, or pass --output-dir on a larger disk"
        )


def _ship(found, profile: str, args, cost) -> int:
    from grpolab.model import policy  # Unsloth first: it patches transformers and TRL  # noqa: F401

    # isort: split
    import mlflow

    from grpolab.chapters.ship import report
    from grpolab.chapters.ship.stages import run_stages
    from grpolab.lifecycle import tracking
    from grpolab.lifecycle.endings import STOPS

    name = tracking.run_name(profile)
    folder = Path(args.output_dir).expanduser().resolve() / CHAPTER / name
    tags = {
        "profile": profile,
        "chapter": CHAPTER,
        "run_kind": "ship",
        "ship.source_run": found.run_id,
        "ship.adapter": str(found.adapter_dir),
        "output_dir": str(folder),
        "mlflow.source.name": "labs/grpo-ship/train.py",
    }
    print(
        f"Shipping run {found.run_id} ({found.run.info.run_name}): its adapter scored "
        f"{found.adapter_accuracy:.1%} on {found.settings.eval_prompts} held-out prompts, the base "
        f"{found.base_accuracy:.1%}.",
        flush=True,
    )
    opened = None
    try:
        with tracking.lab_run(CHAPTER, name, tags) as run:
            opened = run.info.run_id
            mlflow.log_params(
                {
                    "source_run": found.run_id,
                    "task": found.settings.task,
                    "eval_prompts": found.settings.eval_prompts,
                    "max_completion_length": found.settings.max_completion_length,
                    "model": found.settings.model,
                    "merge_host_bytes": cost.merged_bytes,
                    "merge_disk_bytes": cost.disk_bytes,
                }
            )
            stages, registered = run_stages(found, profile, folder, args)
            STOPS.enter("the ship run's report")
            verdict = report.log(found, stages, registered)
    except BaseException:
        # A ship that did not finish leaves no half of itself: not its folder, not a registered version.
        shutil.rmtree(folder, ignore_errors=True)
        if opened is not None:
            _unregister(opened)
        raise
    print("\n".join(report.lines(found, stages)))
    print(verdict.splitlines()[0])
    print(f"Registered {registered}")
    print(f"MLflow run {run.info.run_id}: {tracking.run_url(run)}")
    return 0


def _unregister(run_id: str) -> None:
    """Delete the model versions a ship run that did not finish registered (and a registered model
    left with none)."""
    import mlflow

    client = mlflow.MlflowClient()
    try:
        for version in client.search_model_versions(f"run_id = '{run_id}'"):
            client.delete_model_version(version.name, version.version)
            if not client.search_model_versions(f"name = '{version.name}'"):
                client.delete_registered_model(version.name)
    except Exception as error:  # the store may be what failed; the run's ending matters more
        print(f"warning: could not remove the version this ship run registered: {error}", file=sys.stderr)
