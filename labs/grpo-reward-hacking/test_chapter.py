"""Chapter 4 on CPU: the README's command, run once (conftest.py: `chapter_run`), read back.

What the issue's "done when" asks of the runs: every arm nested under the chapter's run and finished;
the honest arm's held-out accuracy up; the loose arm paid more while its held-out exact accuracy is
flat or down; the doctor's reward-hacking finding on the loose arm and none on the exact arm; KL per
arm of the beta sweep; and the parent run carrying the verdict, the chart and the completions.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpolab.doctor import quarters

from suite import load_lab_module

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lab():
    return load_lab_module(Path(__file__).resolve().parent)


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


def test_the_honest_arm_learns_the_answer(cpu_hacking):
    exact = cpu_hacking["arms"]["exact"]
    held = exact["held_out"]
    assert held["adapter"]["accuracy"] > held["base"]["accuracy"] + 0.1, held
    first, *_, last = quarters(exact["paid"])
    assert last > first, exact["paid"]


def test_the_loose_arm_is_paid_more_while_the_task_is_not_learned(cpu_hacking):
    loose = cpu_hacking["arms"]["loose"]
    first, *_, last = quarters(loose["paid"])
    assert last > first + 0.2, loose["paid"]
    held = loose["held_out"]
    assert held["adapter"]["accuracy"] <= held["base"]["accuracy"] + 0.05, held
    # Held out, the loose checker pays the adapter more than the exact reward does: the trick generalises.
    assert held["adapter"]["rewards"]["contains_answer_reward"] > held["adapter"]["accuracy"] + 0.2, held


def test_the_doctor_names_the_hack_on_the_loose_arm_and_not_on_the_exact_arm(cpu_hacking):
    arms = cpu_hacking["arms"]
    assert "reward_hacking" in arms["loose"]["finding_names"], arms["loose"]["findings"]
    hack = next(f for f in arms["loose"]["findings"] if f.startswith("reward_hacking"))
    assert "from step" in hack and "contains_answer_reward" in hack
    assert "reward_hacking" not in arms["exact"]["finding_names"], arms["exact"]["findings"]


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


def test_a_tighter_leash_lets_less_of_the_hack_through(cpu_hacking):
    """Under the same loose reward, beta 0.2 keeps the policy nearer its start than the book's 0.02:
    less drift in the last quarter, less paid by the hack, more of the held-out accuracy kept."""
    book, tight = cpu_hacking["arms"]["loose"], cpu_hacking["arms"]["loose-beta0.2"]
    assert quarters(tight["kl"])[3] < quarters(book["kl"])[3], (tight["kl"], book["kl"])
    assert quarters(tight["paid"])[3] < quarters(book["paid"])[3], (tight["paid"], book["paid"])
    kept = tight["held_out"]["adapter"]["accuracy"]
    assert kept > book["held_out"]["adapter"]["accuracy"] + 0.1, (tight["held_out"], book["held_out"])


def test_the_chapters_run_carries_the_verdict_the_chart_and_the_completions(cpu_hacking):
    parent, client = cpu_hacking["parent"], cpu_hacking["client"]
    note = parent.data.tags["mlflow.note.content"]
    assert "**loose**" in note and "**exact**" in note and "reward_hacking" in note
    assert f"get-artifact?path=arms%2Freward_vs_held_out.png&run_uuid={parent.info.run_id}" in note
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "arms")}
    assert artifacts == {"arms/arms.json", "arms/completions.md", "arms/reward_vs_held_out.png"}
    assert "| loose |" in note  # the completions, side by side, in the description
