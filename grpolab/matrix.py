"""The book's CPU claims on every seed, and on every machine this one can stand in for.

    uv run python -m grpolab.matrix                       # the contexts once (chapter 1, seed 0), then seeds 0-4
    uv run python -m grpolab.matrix --chapters grpo-first --seeds 0-2 --contexts none
    uv run python -m grpolab.matrix --plan                # the cells it would run; nothing runs

A cell is one chapter's README command (`labs/<chapter>/train.py`, with what its claims add:
`MATRIX_ARGS`) and `--seed N`, in a context: the environment another machine would give it. Its core
count (`OMP_NUM_THREADS`, and torch started with that many threads), its SIMD width
(`ATEN_CPU_CAPABILITY`), a CI job (`CI=true`), a process forked from a preloaded server (the suite's
way). Each cell is a process of its own, with an MLflow store and an outputs folder of its own; a
context also makes its stand-ins in a cache of its own, so their bytes are compared too.

The lab pins its arithmetic (grpolab.config.numerics), so every context should compute the same: the matrix
shows it once, a fingerprint per cell (the stand-ins' sha256, the saved adapters' bytes), and then
runs the seeds in one context. It prints, and writes to `<out>/matrix.md` and `matrix.json`, every
claim's min / median / max over the seeds (`labs/<chapter>/claims.py`) and each cell where one fails.

The top of the harness: it runs the chapters as processes, and nothing imports it.

May import: task, budgets, grpolab.config, grpolab.memory, grpolab.lifecycle, grpolab.tiny_model,
grpolab.model, grpolab.judging, grpolab.lab.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from grpolab.config.paths import CACHE_ENV, LABS, OUTPUTS, REPO_ROOT
from grpolab.judging import claims

# The machines one machine can stand in for: each an environment, and how the lab's process starts.
CONTEXTS: dict[str, dict[str, str]] = {
    "plain": {},
    "threads-1": {"OMP_NUM_THREADS": "1"},
    "threads-2": {"OMP_NUM_THREADS": "2"},
    "threads-4": {"OMP_NUM_THREADS": "4"},
    "aten-default": {"ATEN_CPU_CAPABILITY": "default"},
    "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "aten-avx512": {"ATEN_CPU_CAPABILITY": "avx512"},
    "ci": {"CI": "true"},
    "forked": {},  # a child of a fork server that imported the stack first, as the suite runs labs
}
SEED_CONTEXT = "plain"  # where the seeds run
# Cheapest first: chapter 1 is also where the contexts run by default.
CHAPTERS = (
    "grpo-first",
    "grpo-sizing",
    "grpo-headroom",
    "grpo-reward-hacking",
    "grpo-own-task",
    "grpo-stuck",
)
# torch starts with as many threads as OMP_NUM_THREADS asks, up to the cores it sees: on a 2-core
# machine a "4-core" context must ask torch itself, before the lab runs (what a 4-core machine does).
LAUNCH = (
    "import os, runpy, sys, torch; threads = os.environ.get('OMP_NUM_THREADS');"
    "threads and torch.set_num_threads(int(threads)); sys.argv = sys.argv[1:];"
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


@dataclass(frozen=True)
class Cell:
    chapter: str
    seed: int
    context: str

    @property
    def name(self) -> str:
        return f"{self.chapter}/{self.context}-seed{self.seed}"


@dataclass
class Result:
    cell: Cell
    code: int
    seconds: float
    figures: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    standins: dict[str, str] = field(default_factory=dict)  # stand-in folder -> sha256 of its weights
    adapters: str = ""  # one sha256 over every adapter the cell saved
    error: str = ""

    @property
    def fingerprint(self) -> str:
        figures = json.dumps(self.figures, sort_keys=True)
        return hashlib.sha256(f"{self.adapters}{figures}".encode()).hexdigest()[:12]


def plan(
    chapters: list[str], seeds: list[int], contexts: list[str], context_chapters: list[str]
) -> list[Cell]:
    """The contexts at the first seed for `context_chapters`, then every seed in the seed context."""
    cells = [Cell(ch, seeds[0], ctx) for ch in context_chapters for ctx in contexts]
    cells += [Cell(ch, s, SEED_CONTEXT) for ch in chapters for s in seeds]
    return list(dict.fromkeys(cells))  # once each, in order


def run_cell(cell: Cell, out: Path, server=None, lab_args: list[str] | None = None) -> Result:
    """The chapter's README command in the cell's context, in a folder of its own; then its figures."""
    folder = out / "cells" / cell.chapter / f"{cell.context}-seed{cell.seed}"
    shutil.rmtree(folder, ignore_errors=True)  # a cell run before: its store would hold two runs
    folder.mkdir(parents=True)
    module = claims.load(cell.chapter)
    script = LABS / cell.chapter / "train.py"
    argv = [
        *getattr(module, "MATRIX_ARGS", []),
        *(lab_args or []),
        "--seed",
        str(cell.seed),
        "--output-dir",
        str(folder / "outputs"),
    ]
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    env = {
        "MLFLOW_TRACKING_URI": uri,
        "PYTHONUNBUFFERED": "1",
        # A context builds its own stand-ins (their bytes are part of what it computes); the seeds share one.
        CACHE_ENV: str(out / f"cache-{cell.context}"),
        **CONTEXTS[cell.context],
    }
    started = time.perf_counter()
    with open(folder / "log", "w") as log:
        print(
            f"{cell.name}: {script.relative_to(REPO_ROOT)} {shlex.join(argv)} with {CONTEXTS[cell.context]}",
            file=log,
            flush=True,
        )
        if cell.context == "forked":
            code = server.run(
                script, argv, env=env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT
            ).wait()
        else:
            command = [sys.executable, "-c", LAUNCH, str(script), *argv]
            code = subprocess.run(
                command, cwd=REPO_ROOT, env={**os.environ, **env}, stdout=log, stderr=log
            ).returncode
    result = Result(cell, code, time.perf_counter() - started)
    try:
        book = claims.ChapterStore(uri, cell.chapter)
        result.figures = module.figures(book)
        result.failures = claims.check(module.CLAIMS, result.figures)
    except Exception as error:  # a cell that did not finish has no figures: the report says why
        result.error = f"{type(error).__name__}: {error}"
    result.standins = _standins(out / f"cache-{cell.context}")
    result.adapters = _adapters(folder / "outputs")
    return result


def _standins(cache: Path) -> dict[str, str]:
    from grpolab.tiny_model import weights_sha256

    return {
        p.name: weights_sha256(p)
        for p in sorted(cache.glob("tiny-qwen3-*"))
        if (p / "model.safetensors").exists()
    }


def _adapters(outputs: Path) -> str:
    files = sorted(
        hashlib.sha256(p.read_bytes()).hexdigest() for p in outputs.rglob("adapter_model.safetensors")
    )
    return hashlib.sha256("".join(files).encode()).hexdigest() if files else ""


# --- the report ---------------------------------------------------------------------------------------
def by_chapter(results: list[Result]) -> dict[str, list[Result]]:
    chapters: dict[str, list[Result]] = {}
    for r in results:
        chapters.setdefault(r.cell.chapter, []).append(r)
    return chapters


def contexts_of(rs: list[Result]) -> list[Result]:
    """A chapter's cells at its first seed, the seed context's first: the machines compared."""
    first = [r for r in rs if r.cell.seed == rs[0].cell.seed]
    return sorted(first, key=lambda r: r.cell.context != SEED_CONTEXT)


def disagree(results: list[Result]) -> list[str]:
    """The chapters whose contexts computed more than one result (empty: every context agreed)."""
    return [ch for ch, rs in by_chapter(results).items() if len({r.fingerprint for r in contexts_of(rs)}) > 1]


def report(results: list[Result], command: str) -> str:
    """Markdown: the contexts (one fingerprint each, the stand-ins' bytes), then per chapter every
    claim's min / median / max over the seeds and the cells where it failed."""
    lines = [f"Measured {date.today().isoformat()} with `{command}`.", ""]
    for chapter, rs in by_chapter(results).items():
        contexts = contexts_of(rs)
        if len(contexts) > 1:
            prints = {r.fingerprint for r in contexts}
            lines += [
                f"**{chapter}, seed {rs[0].cell.seed}, {len(contexts)} contexts: "
                f"{'one result' if len(prints) == 1 else f'{len(prints)} different results'}.**",
                "",
                "| context | exit | seconds | stand-ins (sha256) | adapters (sha256) | fingerprint |",
                "|---|---|---|---|---|---|",
            ]
            for r in contexts:
                standins = ", ".join(sha[:12] for sha in r.standins.values()) or "-"
                lines.append(
                    f"| {r.cell.context} | {r.code} | {r.seconds:.0f} | {standins} | {r.adapters[:12] or '-'} | "
                    f"{r.fingerprint} |"
                )
            lines.append("")
        seeds = [r for r in rs if r.cell.context == SEED_CONTEXT]
        if not seeds:
            continue
        module = claims.load(chapter)
        lines += [
            f"**{chapter}, seeds {', '.join(str(r.cell.seed) for r in seeds)}** "
            f"({statistics.median(r.seconds for r in seeds):.0f} s a run, median):",
            "",
            "| claim | needs | min | median | max | fails |",
            "|---|---|---|---|---|---|",
        ]
        for c in module.CLAIMS:
            values = [r.figures[c.figure] for r in seeds if c.figure in r.figures]
            failed = [str(r.cell.seed) for r in seeds if c.figure not in r.figures or not c.holds(r.figures)]
            spread = (
                [f"{min(values):.3g}", f"{statistics.median(values):.3g}", f"{max(values):.3g}"]
                if values
                else ["-"] * 3
            )
            fails = f"seed {', '.join(failed)}" if failed else "none"
            lines.append(f"| {c.text} | {c.bound()} | {' | '.join(spread)} | {fails} |")
        broken = [r for r in rs if r.error or r.code != 0]
        lines += [""] + [f"- {r.cell.name}: exit {r.code} {r.error}" for r in broken] + [""]
    return "\n".join(lines)


def parse_seeds(text: str) -> list[int]:
    """`0-4` or `0,3,7`."""
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpolab.matrix", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--chapters", default=",".join(CHAPTERS), help="chapters whose seeds run (comma-separated)"
    )
    parser.add_argument("--seeds", default="0-4", help="seeds: 0-4, or 0,3,7")
    parser.add_argument(
        "--contexts",
        default=",".join(CONTEXTS),
        help=f"contexts at the first seed, or none ({', '.join(CONTEXTS)})",
    )
    parser.add_argument("--context-chapters", default=CHAPTERS[0], help="the chapters the contexts run for")
    parser.add_argument("--jobs", type=int, default=2, help="cells at once (each computes on one thread)")
    parser.add_argument(
        "--out", type=Path, default=OUTPUTS / "matrix", help="where the cells and the report go"
    )
    parser.add_argument(
        "--lab-args",
        default="",
        help="flags added to every cell's command, to try a recipe: '--learning-rate 5e-3'",
    )
    parser.add_argument(
        "--no-claims",
        action="store_true",
        help="succeed when every cell ran and the contexts agree, whatever the claims (a shortened run's)",
    )
    parser.add_argument("--plan", action="store_true", help="print the cells; run nothing")
    args = parser.parse_args(argv)
    chapters = [c for c in args.chapters.split(",") if c]
    contexts = [] if args.contexts == "none" else args.contexts.split(",")
    context_chapters = [c for c in args.context_chapters.split(",") if c] if contexts else []
    unknown = [c for c in contexts if c not in CONTEXTS] + [
        c for c in {*chapters, *context_chapters} if claims.load(c) is None
    ]
    if unknown:
        print(
            f"error: no such context, or no labs/<chapter>/claims.py: {', '.join(unknown)}", file=sys.stderr
        )
        return 2
    cells = plan(chapters, parse_seeds(args.seeds), contexts, context_chapters)
    if args.plan:
        print("\n".join(c.name for c in cells))
        return 0
    # Each cell's store is a sqlite URI and its lab runs in the repository root: a relative --out
    # (the README's `outputs/matrix-quick`) is read from where the command was typed.
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    server = None
    if any(c.context == "forked" for c in cells):
        from grpolab.lab.forkserver import ForkServer

        server = ForkServer.connect() or ForkServer.start()  # the suite's, when it runs the matrix
    try:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = []
            lab_args = shlex.split(args.lab_args)
            for r in pool.map(lambda c: run_cell(c, args.out, server, lab_args), cells):
                print(
                    f"{r.cell.name}: exit {r.code}, {r.seconds:.0f} s, {r.fingerprint} {r.failures or ''}",
                    flush=True,
                )
                results.append(r)
    finally:
        if server is not None:
            server.close()
    command = "uv run python -m grpolab.matrix" + (f" {' '.join(argv)}" if argv else "")
    text = report(results, command)
    (args.out / "matrix.md").write_text(text)
    (args.out / "matrix.json").write_text(
        json.dumps(
            [{**r.__dict__, "cell": r.cell.__dict__, "fingerprint": r.fingerprint} for r in results], indent=1
        )
    )
    print(text)
    broken = any(r.error or r.code for r in results) or disagree(results)
    return 1 if broken or (not args.no_claims and any(r.failures for r in results)) else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
