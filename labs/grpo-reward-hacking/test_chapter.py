"""Chapter 4 on CPU: the README's command, run once (conftest.py: `chapter_run`), read back.

Every arm nested under the chapter's run and finished; the chapter's claims (claims.py beside this
file: the honest arm learns, the loose arms hack and the doctor names it, a tighter leash lets less
through), which the matrix checks on every seed; KL per arm of the beta sweep; and the parent run
carrying the verdict, the chart and the completions.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from grpolab.judging.claims import quarter_means

from suite import chapter, load_lab_module, table_rows

LAB_DIR = Path(__file__).resolve().parent

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lab():
    return load_lab_module(LAB_DIR)


@pytest.fixture
def cpu_hacking(chapter_run):
    """The chapter's run, its arms' runs nested under it (by arm), and the arms' record it logged."""
    assert chapter_run.code == 0, chapter_run.log()
    (parent,) = [r for r in chapter_run.top if r.data.tags.get("run_kind") == "arms"]
    client, store = chapter_run.client, chapter_run.store
    record = json.loads(
        Path(client.download_artifacts(parent.info.run_id, "arms/arms.json", str(store))).read_text()
    )
    print(f"the chapter's README command took {chapter_run.seconds:.0f} s")
    return {
        "parent": parent,
        "children": {r.data.tags["arm"]: r for r in chapter_run.children(parent)},
        "arms": {a["arm"]: a for a in record["arms"]},
        "client": client,
        "stdout": chapter_run.stdout,
        "seconds": chapter_run.seconds,
        "store": store,
    }


def test_every_arm_ran_nested_under_the_chapters_run(cpu_hacking, lab):
    parent, children = cpu_hacking["parent"], cpu_hacking["children"]
    assert parent.info.status == "FINISHED"
    assert set(children) == {a.name for a in lab.ARMS}
    assert all(r.info.status == "FINISHED" for r in children.values())
    assert {r.data.params["beta"] for r in children.values()} >= {"0.0", "0.02", "0.2"}


def test_the_books_claims_hold_the_honest_reward_learns_and_the_loose_one_hacks(chapter_claims):
    """labs/grpo-reward-hacking/claims.py, which the matrix checks on every seed: the exact arm's held-out
    accuracy rises and the doctor names nothing on it; the loose arms are paid more while held-out
    accuracy falls, the trick generalises to held-out prompts, and the doctor names reward_hacking;
    ten times the book's beta lets less of it through. Held-out figures in prompts (of 64)."""
    print({k: round(v, 3) for k, v in chapter_claims.figures.items()})
    assert chapter_claims.failures == [], chapter_claims.failures


def test_the_doctor_says_where_the_hack_began_and_which_reward_paid_it(cpu_hacking):
    loose = cpu_hacking["arms"]["loose"]
    hack = next(f for f in loose["findings"] if f.startswith("reward_hacking"))
    assert "from step" in hack and "contains_answer_reward" in hack


def test_the_beta_sweep_logs_kl_per_arm(cpu_hacking):
    """Each arm with a reference logs its KL every step; the arm without one (beta 0) trained with no
    KL term, as its trainer's own arguments say, and so has no KL to show."""
    arms, children = cpu_hacking["arms"], cpu_hacking["children"]
    for name in ("loose", "loose-beta0.2", "exact"):
        assert len(arms[name]["kl"]) == len(arms[name]["steps"]) > 0, f"{name}: KL not logged every step"
        assert max(arms[name]["kl"]) > 0, f"{name}: the policy never left its reference"
    assert arms["loose-beta0"]["kl"] == []
    assert {name: float(run.data.params["trainer.beta"]) for name, run in children.items()} == {
        "exact": 0.02,
        "loose": 0.02,
        "loose-beta0": 0.0,
        "loose-beta0.2": 0.2,
    }


def test_the_chapters_run_carries_the_verdict_the_chart_and_the_completions(cpu_hacking):
    parent, client = cpu_hacking["parent"], cpu_hacking["client"]
    note = parent.data.tags["mlflow.note.content"]
    assert "**loose**" in note and "**exact**" in note and "reward_hacking" in note
    assert f"get-artifact?path=arms%2Freward_vs_held_out.png&run_uuid={parent.info.run_id}" in note
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "arms")}
    assert artifacts == {
        "arms/arms.json",
        "arms/completions.md",
        "arms/reward_vs_held_out.png",
        "arms/verdict.md",
    }
    assert "| loose |" in note  # the completions, side by side, in the description


def test_the_pages_quote_this_runs_figures_digit_for_digit(cpu_hacking):
    """The CPU profile computes the same bits on every x86-64 machine (docs/every-machine.md), so the
    chapter's table and the README's row quote this run, whatever machine runs the suite: each arm's paid
    and exact rewards (first and last quarter), its held-out accuracy, its KL and where the doctor saw
    the hack begin. Where a machine computes otherwise, the pages' claim is false there; this says so."""
    table = {row[0].strip("`"): row for row in table_rows(LAB_DIR / "README.md", 6) if row[0].startswith("`")}
    assert set(table) == set(cpu_hacking["arms"]), set(table)
    for name, arm in cpu_hacking["arms"].items():
        paid = "{:.3f} -> {:.3f}".format(*quarter_means(arm["paid"]))
        exact = (
            "the same"
            if arm["exact_metric"] == arm["paid_metric"]
            else "{:.3f} -> {:.3f}".format(*quarter_means(arm["exact"]))
        )
        held_out = " -> ".join(f"{arm['held_out'][w]['accuracy']:.1%}" for w in ("base", "adapter"))
        kl = f"{quarter_means(arm['kl'])[1]:.3f}" if arm["kl"] else "not measured (no reference)"
        began = [re.search(r"from step \d+", f) for f in arm["findings"] if f.startswith("reward_hacking")]
        doctor = f"`reward_hacking` {began[0][0]}" if began else "nothing" if not arm["findings"] else "?"
        assert table[name][1:] == [paid, exact, held_out, kl, doctor], f"the page's {name} row: {table[name]}"
    loose, honest = cpu_hacking["arms"]["loose"], cpu_hacking["arms"]["exact"]
    said = (
        "the loose checker's paid reward climbs {:.2f} -> {:.2f}".format(*quarter_means(loose["paid"]))
        + " while held-out accuracy falls "
        + " -> ".join(f"{loose['held_out'][w]['accuracy']:.1%}" for w in ("base", "adapter"))
        + f", and the doctor names `reward_hacking`; the exact arm's rises to {honest['held_out']['adapter']['accuracy']:.1%}"
    )
    assert said in chapter(LAB_DIR.name).measured, f"the README's row does not quote this run: {said!r}"
