"""Chapter 8 on CPU: the README's command, run once (conftest.py: `chapter_run`), read back.

Every cause's broken arm and the arm that mends it, nested under the chapter's run and finished; the
chapter's claims (claims.py beside this file: the doctor names each cause and nothing else on its
arm, and the mended arm learns), which the matrix checks on every seed; each mended arm trained with
exactly the next step its broken arm's finding printed; the parent run's table of cause, finding,
fix and held-out accuracy; the page and the README's row quoting this run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from budgets.vocabulary import flag_text
from grpolab.config.settings import lab_settings
from grpolab.judging.doctor import LOGP_GAP, LOGP_METRIC, Finding, next_step, reward_swap

from suite import chapter, cpu_only, load_lab_module, prose

LAB_DIR = Path(__file__).resolve().parent

pytestmark = [pytest.mark.slow, cpu_only("reads the CPU profile's README run; on a GPU it trains Qwen3-4B")]


@pytest.fixture(scope="module")
def lab():
    return load_lab_module(LAB_DIR)


@pytest.fixture
def stuck(chapter_run):
    """The chapter's run, its arms' runs nested under it (by arm), and the arms' record it logged."""
    assert chapter_run.code == 0, chapter_run.log()
    (parent,) = [r for r in chapter_run.top if r.data.tags.get("run_kind") == "arms"]
    record = json.loads(
        Path(
            chapter_run.client.download_artifacts(
                parent.info.run_id, "arms/arms.json", str(chapter_run.store)
            )
        ).read_text()
    )
    print(f"the chapter's README command took {chapter_run.seconds:.0f} s")
    children = {r.data.tags["arm"]: r for r in chapter_run.children(parent)}
    by_id = {r.info.run_id: r for r in children.values()}
    return {
        "parent": parent,
        "children": children,
        # Every arm's run, a mended arm trained as an earlier one (same_run_as) included: that one's.
        "runs": {a["arm"]: by_id[a["run_id"]] for a in record["arms"]},
        "arms": {a["arm"]: a for a in record["arms"]},
        "stdout": chapter_run.stdout,
        "client": chapter_run.client,
    }


def test_every_cause_ran_broken_then_mended_nested_under_the_chapters_run(stuck, lab):
    """Every arm has its run; a mended arm whose reward and settings are an earlier mended arm's (its
    step leads back to the chapter's recipe) has that arm's run, not one of its own."""
    assert stuck["parent"].info.status == "FINISHED"
    expected = {name for a in lab.ARMS for name in (a.name, f"{a.name}-fixed")}
    assert set(stuck["arms"]) == expected
    shared = {name for name, a in stuck["arms"].items() if a["same_run_as"]}
    assert set(stuck["children"]) == expected - shared
    assert all(r.info.status == "FINISHED" for r in stuck["children"].values())
    # The steps back to the recipe (a beta, the rollouts' adapter, the question twice) share the first
    # one's run, cold-fixed's (a temperature): the same settings, to the last param. The still arm's
    # step, the book's learning rate (1e-2), is not the chapter's (7e-3): a run of its own.
    assert shared == {"leashed-fixed", "unsynced-fixed", "solved-fixed", "unreachable-fixed"}
    assert {stuck["arms"][name]["same_run_as"] for name in shared} == {"cold-fixed"}
    for name in shared:
        same = stuck["arms"][name]["same_run_as"]
        assert stuck["arms"][same]["same_run_as"] is None and stuck["arms"][same]["fixes"] is not None
        assert stuck["arms"][name]["run_id"] == stuck["arms"][same]["run_id"]


def test_each_mended_arm_trains_the_next_step_its_broken_arm_printed(stuck, lab):
    """The fix is the doctor's text, read back: the broken arm's finding as its run recorded it, parsed
    here again, is what the mended arm's run was trained with (its MLflow params)."""
    for arm in lab.ARMS:
        broken, mended = stuck["arms"][arm.name], stuck["runs"][f"{arm.name}-fixed"]
        (printed,) = [f for f in broken["findings"] if f.startswith(f"{arm.cause}: ")]
        finding = Finding(arm.cause, printed.split(": ", 1)[1])
        assert printed in stuck["stdout"] and broken["fix"] in stuck["stdout"]
        if (swap := reward_swap(finding)) is not None:  # the reward it said to pay, the break's settings kept
            silent, instead = swap
            assert mended.data.tags["arm.reward"] == arm.reward.replace(silent, instead) != arm.reward
            assert all(mended.data.params[k] == flag_text(v) for k, v in arm.changes.items())
            continue
        step = next_step(finding, lab_settings(LAB_DIR, "cpu"))  # typed as the settings hold them
        for setting, value in step.items():
            assert mended.data.params[setting] == flag_text(value), (
                setting,
                mended.data.params[setting],
                value,
            )
        for setting, value in arm.changes.items():
            if setting not in step:  # the break stays: only the doctor's step is mended
                assert mended.data.params[setting] == flag_text(value)


def test_the_task_check_in_the_run_caught_the_cut_before_a_step_was_trained(stuck):
    """The page says where a cause was catchable before training: the cut arm's own task check, with
    the run's tokenizer and lengths, fails its lengths line; the mended arm's passes."""
    assert stuck["children"]["cut"].data.tags["task_check"] == "failed: lengths"
    assert stuck["children"]["cut-fixed"].data.tags["task_check"] == "passed"


def test_the_held_out_evaluation_before_training_showed_both_no_signal_arms_before_a_step(stuck):
    """The solved and unreachable arms ask other questions of the task (their task_config), each with
    its own prompts; the base's held-out accuracy, measured before the first step, already says there is
    nothing to learn (all right) and nothing to learn from (none right). Their mended arms ask the
    chapter's own question (`{}`)."""
    for name, ask, base in (("solved", "first_digit", 0.9), ("unreachable", "digit_sum", None)):
        run, record = stuck["children"][name], stuck["arms"][name]
        assert json.loads(run.data.params["task_config"]) == {"ask": ask}
        before = record["held_out"]["base"]["accuracy"]
        assert before >= base if base is not None else before <= 0.05, (name, before)
        assert record["questions"][0].startswith(
            f"What is the {'first digit' if ask == 'first_digit' else 'sum of the digits'} of "
        )
        assert stuck["runs"][f"{name}-fixed"].data.params["task_config"] == "{}"


def test_the_task_check_of_the_paid_rewards_caught_the_mistagged_parse_before_a_step_was_trained(stuck):
    """Paid open-r1's `<answer>` reward, the arm's rewards fail chapter 7's reference line (the right
    answer in `<ans>` is paid 0 of 1); the rewards its mended arm is paid pass. The arms on the task's
    own rewards have no such tag: their check is the run's own (`task_check`)."""
    children = stuck["children"]
    assert children["mistagged"].data.tags["task_check_paid"] == "failed: reference"
    assert children["mistagged-fixed"].data.tags["task_check_paid"] == "passed"
    assert children["mistagged"].data.tags["task_check"] == "passed"  # the task itself is sound
    assert "task_check_paid" not in children["cold"].data.tags


def test_the_unsynced_arms_sampler_drifted_from_its_trainer_and_its_mended_arm_sampled_the_adapter(stuck):
    """The gap the doctor read is TRL's metric, logged on the CPU by grpolab.model.rollouts: the
    sampler (the base) and the trainer (the adapter) part as the adapter trains; the mended arm
    samples with the adapter it trains, so there is no second model to measure against."""
    broken, mended = stuck["children"]["unsynced"], stuck["runs"]["unsynced-fixed"]
    history = stuck["client"].get_metric_history(broken.info.run_id, LOGP_METRIC)
    first, last = history[0].value, history[-1].value
    assert first < 0.01 < LOGP_GAP < last, (first, last)  # the adapter starts at zero, then drifts
    assert (
        broken.data.params["rollout_adapter"] == "false" and mended.data.params["rollout_adapter"] == "true"
    )
    assert LOGP_METRIC not in mended.data.metrics


def test_the_books_claims_hold_each_cause_named_and_mended(chapter_claims):
    assert chapter_claims.failures == [], chapter_claims.figures


def test_the_chapters_run_tables_cause_finding_fix_and_held_out_accuracy(stuck, lab):
    note = stuck["parent"].data.tags["mlflow.note.content"]
    assert (
        "| arm | broken by | cause | the doctor named | its next step | held-out, broken | held-out, mended |"
        in note
    )
    assert f"get-artifact?path=arms%2Fbroken_and_mended.png&run_uuid={stuck['parent'].info.run_id}" in note
    for arm in lab.ARMS:
        fix = stuck["arms"][arm.name]["fix"]
        assert f"| {arm.name} | " in note and f"`{fix}`" in note


def test_the_pages_quote_this_runs_figures_digit_for_digit(stuck, lab):
    """The CPU profile computes the same bits on every x86-64 machine (docs/every-machine.md)."""
    page = prose(LAB_DIR / "README.md")
    row = chapter("grpo-stuck").measured
    for arm in lab.ARMS:
        for name in (arm.name, f"{arm.name}-fixed"):
            held = stuck["arms"][name]["held_out"]
            said = f"{held['base']['accuracy']:.1%} -> {held['adapter']['accuracy']:.1%}"
            assert f"| {name} |" in page and said in page, (name, said)
        assert f"`{stuck['arms'][arm.name]['fix']}`" in page
        mended = stuck["arms"][f"{arm.name}-fixed"]["held_out"]
        said = f"held-out accuracy {mended['base']['accuracy']:.1%} -> {mended['adapter']['accuracy']:.1%} on every mended arm"
        assert said in row, (arm.name, said)
