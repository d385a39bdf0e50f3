"""Chapter 4 on CPU: the README's command, run once (tests/conftest.py: cpu_hacking), read back.

What the issue's "done when" asks of the runs: every arm nested under the chapter's run and finished;
the honest arm's held-out accuracy up; the loose arm paid more while its held-out exact accuracy is
flat or down; the doctor's reward-hacking finding on the loose arm and none on the exact arm; KL per
arm of the beta sweep; and the parent run carrying the verdict, the chart and the completions.
"""

from __future__ import annotations

import pytest
from conftest import load_lab_module

from grpolab.doctor import quarters

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lab():
    from conftest import REPO_ROOT

    return load_lab_module(REPO_ROOT / "labs" / "grpo-reward-hacking")


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
    arms = cpu_hacking["arms"]
    for name in ("loose", "loose-beta0.2", "exact"):
        assert arms[name]["kl"], f"{name}: no KL logged"
    assert arms["loose-beta0"]["beta"] == 0.0


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


def test_the_cpu_command_runs_within_its_budget(cpu_hacking):
    # The README's figure is measured on an idle 2-core machine; a loaded CI machine gets twice that.
    assert cpu_hacking["seconds"] < 2 * 5 * 60, cpu_hacking["seconds"]
