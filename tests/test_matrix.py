"""The matrix (grpolab.matrix): the book's CPU claims on every seed and on the machines one machine
can stand in for. Its full run takes hours (docs/every-machine.md gives its table); here its plan,
its report on figures built by hand, and the quick form that page gives: chapter 1, shortened, in a
plain process and in one forked from the suite's preloaded parent, which must compute the same.
"""

from __future__ import annotations

import json
import re

import pytest

from grpolab import matrix
from grpolab.judging import claims

import suite
from suite import README, README_MATRIX_PLAN, REPO_ROOT, cpu_only, run_command


@pytest.mark.slow
def test_the_plan_runs_the_contexts_once_then_every_seed():
    result = run_command(README_MATRIX_PLAN)
    assert result.returncode == 0, result.stderr[-2000:]
    cells = result.stdout.split()
    contexts = [f"grpo-first/{c}-seed0" for c in matrix.CONTEXTS]
    assert cells[: len(contexts)] == contexts  # the machines once, at the first seed, on chapter 1
    for chapter in matrix.CHAPTERS:
        assert [c for c in cells if c.startswith(f"{chapter}/plain-")] == [
            f"{chapter}/plain-seed{s}" for s in range(5)
        ], chapter
    assert len(cells) == len(set(cells)) == len(contexts) + 5 * len(matrix.CHAPTERS) - 1


def test_the_front_page_quotes_the_matrix_table_row_for_row():
    """README.md's table of the claims over the seeds is a selection of docs/every-machine.md's, row for
    row, with every chapter the matrix runs in it: one measurement on two pages, so a figure changed on
    one and not on the other fails here."""

    def rows(page) -> list[str]:
        return [line for line in page.read_text().splitlines() if re.match(r"\| \d+, seeds ", line)]

    front, reference = rows(README), rows(REPO_ROOT / "docs" / "every-machine.md")
    assert front and not set(front) - set(reference), set(front) - set(reference)
    assert {int(row[2:].split(",")[0]) for row in front} == {suite.chapter(c).number for c in matrix.CHAPTERS}


def test_every_chapter_the_matrix_runs_states_its_claims():
    for chapter in matrix.CHAPTERS:
        module = claims.load(chapter)
        assert module is not None and module.CLAIMS, chapter
        assert all(c.at_least is not None or c.at_most is not None for c in module.CLAIMS), chapter


def fake(chapter: str, seed: int, context: str, **figures: float) -> matrix.Result:
    return matrix.Result(matrix.Cell(chapter, seed, context), 0, 10.0, figures, adapters="a" * 64)


def test_the_report_gives_each_claims_spread_and_the_seeds_that_fail():
    cells = [
        fake(
            "grpo-first",
            s,
            "plain",
            correctness_climb=c,
            held_out_rise=r,
            adapter_format=60,
            doctor_findings=0,
        )
        for s, c, r in ((0, 0.5, 30), (1, 0.25, 40), (2, 0.4, 20))
    ]
    for r in cells:
        r.failures = claims.check(claims.load("grpo-first").CLAIMS, r.figures)
    text = matrix.report(cells, "uv run python -m grpolab.matrix --chapters grpo-first --seeds 0-2")
    climb = next(line for line in text.splitlines() if line.startswith("| correctness_reward climbs"))
    assert climb.endswith("| >= 0.3 | 0.25 | 0.4 | 0.5 | seed 1 |"), climb
    rise = next(line for line in text.splitlines() if line.startswith("| held-out accuracy rises"))
    assert rise.endswith("| >= 16 | 20 | 30 | 40 | none |"), rise


def test_contexts_that_compute_otherwise_are_reported():
    plain = fake("grpo-first", 0, "plain", correctness_climb=0.5)
    other = fake("grpo-first", 0, "threads-4", correctness_climb=0.5)
    assert matrix.disagree([plain, other]) == []
    other.adapters = "b" * 64  # the same figures, other bytes: not the same run
    assert matrix.disagree([plain, other]) == ["grpo-first"]
    assert "2 contexts: 2 different results" in matrix.report([plain, other], "m")


@pytest.mark.slow
@cpu_only("runs the CPU profile's chapter 1 twice; on a GPU a cell would run Qwen3-4B")
def test_the_readme_quick_matrix_a_plain_and_a_forked_process_compute_the_same(matrix_quick):
    """Chapter 1 shortened (4 steps, 8 held-out prompts), seed 0, in a fresh process and in one forked
    from the suite's parent (the matrix forks from it): the same stand-in bytes, the same adapter, the
    same figures. A shortened run claims nothing: `--no-claims`. Run in the background from the
    collection on (conftest.py `run_matrix_quick`): its fresh processes import the stack themselves."""
    result, tmp_path = matrix_quick["result"], matrix_quick["out"]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    cells = {c["cell"]["context"]: c for c in json.loads((tmp_path / "matrix.json").read_text())}
    assert set(cells) == {"plain", "forked"}
    plain, forked = cells["plain"], cells["forked"]
    assert plain["code"] == forked["code"] == 0 and not plain["error"] and not forked["error"]
    assert plain["adapters"] and plain["adapters"] == forked["adapters"]
    assert plain["standins"] and plain["standins"] == forked["standins"]
    assert plain["figures"] == forked["figures"] and plain["fingerprint"] == forked["fingerprint"]
    assert "grpo-first, seed 0, 2 contexts: one result." in (tmp_path / "matrix.md").read_text()


def test_a_figure_the_run_did_not_measure_fails_its_claim_in_one_line():
    """Chapter 8's mended arm exists only when the doctor named its cause: a seed where it did not
    has no figure for it, and that claim fails (it said the arm learns) rather than the matrix."""
    claim = claims.Claim("the cold arm mended learns", "cold-fixed_rise", at_least=7)
    assert claims.check([claim], {"cold-fixed_rise": 16}) == []
    (line,) = claims.check([claim], {"cold_named": 0})
    assert (
        line
        == "the cold arm mended learns: cold-fixed_rise was not measured (its run is not there), needs >= 7"
    )
