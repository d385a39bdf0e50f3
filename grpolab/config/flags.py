"""The flags every chapter has: the profile, the run's options, the budget's output, and one flag per
setting (grpolab.config.settings, with the vocabulary's help). Bad flags are one line and exit 2."""

from __future__ import annotations

import argparse
from pathlib import Path

from budgets.vocabulary import OneLineErrorParser
from grpolab.config.paths import OUTPUTS
from grpolab.config.settings import add_flags


def add_profile(ap: argparse.ArgumentParser, real: str, stand_in: str) -> None:
    """--profile, as every chapter's command takes it: gpu (`real`), cpu (`stand_in`) or auto."""
    ap.add_argument(
        "--profile",
        choices=("auto", "gpu", "cpu"),
        default="auto",
        help=f"gpu: {real} (fails at once without CUDA); cpu: {stand_in}; auto: gpu if present",
    )


def parser(description: str) -> argparse.ArgumentParser:
    """The flags every chapter has: the profile, the run's options, and one flag per setting."""
    ap = OneLineErrorParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_profile(ap, "the real run", "the tiny stand-in")
    run = ap.add_argument_group("the run")
    run.add_argument("--output-dir", type=Path, default=OUTPUTS, help="adapters and checkpoints")
    run.add_argument("--ignore-budget", action="store_true", help="start even when the budget says no")
    run.add_argument(
        "--ignore-task-check",
        action="store_true",
        help="train even when the task check fails (its tag task_check says so)",
    )
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
        "holds; CPU: the memory it writes to, RLIMIT_DATA), to rehearse an out-of-memory",
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
        "--resume",
        metavar="RUN",
        help="continue an interrupted run (`last`: this chapter's latest; a run id; or its folder) from its "
        "newest whole checkpoint, in the same MLflow run, with the settings it logged",
    )
    run.add_argument(
        "--eval-only",
        type=Path,
        metavar="ADAPTER",
        help="train nothing: score a saved adapter (and the base) on the held-out prompts",
    )
    budget = ap.add_argument_group("the budget alone (nothing loads, nothing is written)")
    budget.add_argument(
        "--budget-only",
        action="store_true",
        help="print the sheet this run would be checked against and stop (the gpu profile's unless --profile "
        "cpu, on the card found or lab.toml's)",
    )
    budget.add_argument("--json", action="store_true", help="with --budget-only: the sheet as JSON")
    budget.add_argument(
        "--headroom",
        action="store_true",
        help="with --budget-only: the largest group, completion and batch that fit",
    )
    budget.add_argument(
        "--suggest-util",
        action="store_true",
        help="with --budget-only: the gpu_memory_utilization to use here",
    )
    add_flags(ap)
    return ap
