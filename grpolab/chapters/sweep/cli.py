"""The sweep's command line: its flags, then sizing every cell before any runs, then the loop.

Bad input (a flag, a grid, a setting the sweep sets per cell, a card with no GPU) is one line on
stderr and exit code 2, before anything is run or logged.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from budgets import BudgetError
from budgets.vocabulary import OneLineErrorParser
from grpolab.chapters.sweep.grid import CELL_SETTINGS, KNOBS, Grid, Planned, plan_sweep
from grpolab.chapters.sweep.host import Host, find_host
from grpolab.chapters.sweep.loop import run_sweep
from grpolab.config.errors import refuse
from grpolab.config.flags import add_profile
from grpolab.config.paths import OUTPUTS
from grpolab.config.settings import FLAGS, LabSettingsError, add_flags, overrides_from


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive whole numbers, got {text!r}")
    return values


def parser(description: str, grids: dict[str, Grid], cpu_cap_gib: float) -> argparse.ArgumentParser:
    """The sweep's flags: the profile, a grid per knob, the edge, the CPU host's cap, and every
    other setting of lab.toml, passed on to every cell."""
    ap = OneLineErrorParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_profile(ap, "the real grid", "the tiny stand-in's grid")
    sweep = ap.add_argument_group("the sweep")
    for knob in KNOBS:
        shown = {profile: ",".join(map(str, getattr(g, knob))) for profile, g in grids.items()}
        sweep.add_argument(
            f"--grid-{knob.replace('_', '-')}",
            type=_ints,
            metavar="N,N,...",
            help=f"the {knob} values to sweep (gpu: {shown.get('gpu')}; cpu: {shown.get('cpu')})",
        )
    sweep.add_argument(
        "--run-refused",
        action="store_true",
        help="also run the first cell past the largest that fits, which the sheet refuses, to record how it "
        "runs out of memory (a FAILED cell with the peak, the phase and the line to blame)",
    )
    sweep.add_argument(
        "--memory-cap-gib",
        type=float,
        help=f"CPU: the sweep's small host lets a cell's step add this much once the model is loaded (default "
        f"{cpu_cap_gib:g}); the refused cell runs anyway under it. GPU: the card is the limit; if given, the "
        "refused cell runs anyway under this cap as well",
    )
    sweep.add_argument("--output-dir", type=Path, default=OUTPUTS, help="each cell's adapter, as a lab run's")
    add_flags(ap)
    return ap


def main(
    lab_dir: Path, grids: dict[str, Grid], argv: list[str] | None, doc: str = "", cpu_cap_gib: float = 0.5
) -> int:
    """Plan every cell, run those that fit (and, with --run-refused, the edge), log the grid."""
    args = parser(doc.split("\n\n")[0] if doc else "", grids, cpu_cap_gib).parse_args(argv)
    overrides = overrides_from(args)
    given = sorted(set(overrides) & set(CELL_SETTINGS))
    if given:
        grid_flag = {"per_device_train_batch_size": "--grid-prompts-per-step"}
        return refuse(
            f"{given[0]}: the sweep sets it per cell; pass "
            f"{grid_flag.get(given[0], '--grid-' + given[0].replace('_', '-'))} with the values to sweep"
        )
    try:
        cap = cpu_cap_gib if args.memory_cap_gib is None else args.memory_cap_gib
        host = find_host(lab_dir, args.profile, overrides, cap)
        if host.profile == "gpu":
            host.memory_cap_gib = args.memory_cap_gib  # the card is the limit; a cap only if asked for
        base = grids[host.profile]
        grid = Grid(*(getattr(args, f"grid_{knob}") or getattr(base, knob) for knob in KNOBS))
        planned, edge = plan_sweep(lab_dir, host, overrides, grid)
    except (LabSettingsError, BudgetError) as err:
        return refuse(str(err))
    announce(host, planned[0].settings, planned, edge)
    return run_sweep(lab_dir, args, host, grid, planned, edge, overrides)


def announce(host: Host, settings, planned: list[Planned], edge: Planned | None) -> None:
    """Every cell's sheet, printed before any cell starts; on a CPU, first what its numbers are."""
    if host.profile == "cpu":
        print(
            "\n=== No CUDA GPU: sweeping the CPU stand-in ===\n"
            f"  model: {settings.model} (a tiny random-weight Qwen3, not Qwen3-4B): every number below is the tiny "
            "model's.\n"
            "  No vLLM on a CPU: no KV-cache rollouts to read; generation is transformers' generate.\n"
            f"  The host: {host.note} (the sweep's cap: the real machine would refuse nothing).\n",
            flush=True,
        )
    print(
        f"Sizing {len(planned)} cells (prompts x group x completion tokens) on {host.note}, before any runs:"
    )
    for p in planned:
        print("  " + p.summary())
    if edge is not None:
        print(f"\nThe edge: cell {edge.cell.name}, refused by its sheet:\n")
        print(edge.sheet.table(accepts=FLAGS))
    print(flush=True)
