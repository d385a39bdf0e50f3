"""How chapter 8 turns a broken arm's finding into the arm that mends it, on findings built here (the
README run's are read in test_chapter.py)."""

from __future__ import annotations

from pathlib import Path

from grpolab.chapters.arms import NOTE_LIMIT, Arm, causes_table, fit_note, fixed_arm
from grpolab.config.settings import lab_settings
from grpolab.judging.doctor import Finding, reward_swap

from suite import load_lab_module

LAB_DIR = Path(__file__).resolve().parent
CUT = Arm("cut", "task", {"max_completion_length": 2, "max_steps": 12}, cause="cut_before_the_tag")


def test_the_mended_arm_keeps_the_break_and_applies_the_printed_step():
    printed = Finding(
        "cut_before_the_tag", "62% of completions were cut: raise --max-completion-length (now 2) to >= 13"
    )
    other = Finding("kl_climbing", "KL rose: lower --learning-rate (now 0.007) or raise --beta (now 0.02)")
    settings = lab_settings(LAB_DIR, "cpu").replace(max_completion_length=2, max_steps=12)
    mended = fixed_arm(CUT, [other, printed], settings)
    assert mended == Arm("cut-fixed", "task", {"max_completion_length": 13, "max_steps": 12}, fixes="cut")


def test_no_mended_arm_when_the_cause_is_not_named_or_its_step_has_no_value(capsys):
    settings = lab_settings(LAB_DIR, "cpu")
    assert (
        fixed_arm(CUT, [Finding("no_diversity", "raise --temperature (now 0.05) to >= 1")], settings) is None
    )
    vague = Finding("cut_before_the_tag", "cut: raise --max-completion-length (now 2)")
    assert fixed_arm(CUT, [vague], settings) is None
    assert "names no setting with a value" in capsys.readouterr().out


MISTAGGED = Arm("mistagged", "answer_tag_reward+format_reward", cause="reward_never_pays")
SWAP = Finding(
    "reward_never_pays",
    "answer_tag_reward paid nothing in 16 steps while 85% of completions held something that looks like "
    "the answer tag: the reward's parse rejects what the model writes: pay the task's own "
    "correctness_reward in place of answer_tag_reward (it paid 0.262 on the same completions: ...)",
)


def test_the_mended_arm_pays_the_reward_the_doctor_named_in_place_of_the_silent_one():
    settings = lab_settings(LAB_DIR, "cpu")
    assert reward_swap(SWAP) == ("answer_tag_reward", "correctness_reward")
    mended = fixed_arm(MISTAGGED, [SWAP], settings)
    assert mended == Arm("mistagged-fixed", "correctness_reward+format_reward", {}, fixes="mistagged")


def test_a_swap_the_arms_key_does_not_name_gives_no_mended_arm(capsys):
    """Chapter 4's keys (`loose`) name no reward: a swap there is shown, not guessed at."""
    loose = Arm("loose", "loose", cause="reward_never_pays")
    assert fixed_arm(loose, [SWAP], lab_settings(LAB_DIR, "cpu")) is None
    assert "its key 'loose' does not name" in capsys.readouterr().out
    assert reward_swap(Finding("reward_never_pays", "fix the parse or what the prompt asks for")) is None


def test_the_mistagged_arms_rewards_pay_its_key_and_watch_the_tasks_own():
    """Its trainer gets open-r1's parse and the format, paid, and the task's correctness beside them at
    weight 0, logged on the same completions: what the doctor reads the swap from."""
    import task
    from task.mistagged import answer_tag_reward

    lab = load_lab_module(LAB_DIR)
    funcs, weights = lab.rewards(task.LASTDIGIT, MISTAGGED.reward)
    assert [f.__name__ for f in funcs] == ["answer_tag_reward", "format_reward", "correctness_reward"]
    assert weights == [1.0, 1.0, 0.0] and funcs[0] is answer_tag_reward
    funcs, weights = lab.rewards(task.LASTDIGIT, "correctness_reward+format_reward")
    assert [f.__name__ for f in funcs] == ["correctness_reward", "format_reward"] and weights == [1.0, 1.0]
    assert lab.rewards(task.LASTDIGIT, "task") == (list(task.LASTDIGIT.reward_funcs), None)


def test_the_table_pairs_each_broken_arm_with_its_mended_one():
    def result(arm, cause, fixes, names, fix, before, after):
        held = {"base": {"accuracy": before}, "adapter": {"accuracy": after}}
        return {
            "arm": arm,
            "cause": cause,
            "fixes": fixes,
            "changes": {"temperature": 0.05},
            "finding_names": names,
            "fix": fix,
            "held_out": held,
        }

    table = causes_table(
        [
            result("cold", "no_diversity", None, ["no_diversity"], "--temperature 1", 0.734, 0.719),
            result("cold-fixed", None, "cold", [], None, 0.734, 1.0),
            result("exact", None, None, [], None, 0.5, 0.6),  # an arm broken on purpose only is tabled
        ]
    )
    rows = table.splitlines()
    assert len(rows) == 3
    assert rows[2] == (
        "| cold | temperature 0.05 | no_diversity | no_diversity | `--temperature 1` | 73.4% -> 71.9% | 73.4% -> 100.0% |"
    )
    assert causes_table([result("exact", None, None, [], None, 0.5, 0.6)]) == ""


def test_every_arm_passes_the_settings_check_on_both_profiles():
    """The chapter checks every arm's settings before the first loads anything, so one arm that cannot
    run on a profile refuses the whole chapter there: the unsynced arm breaks the trainer's own
    generation, which a GPU run has only with vLLM off (`rollout_adapter` false is refused with it)."""
    from grpolab.config.settings import check

    lab = load_lab_module(LAB_DIR)
    for profile in ("cpu", "gpu"):
        for arm in lab.ARMS:
            check(lab_settings(LAB_DIR, profile).replace(**arm.changes))


def test_the_overview_keeps_each_part_whole_or_names_its_artifact_within_mlflows_limit():
    from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

    assert NOTE_LIMIT == MAX_TAG_VAL_LENGTH  # past it MLflow cuts the description's end silently
    table, verdict = "| arm |\n" + "| x |\n" * 10, "v" * 90
    parts = [(table, None), (verdict, "the verdict: arms/verdict.md"), ("tail", None)]
    assert fit_note(parts, limit=120) == f"{table}\n\nthe verdict: arms/verdict.md\n\ntail"
    assert fit_note(parts, limit=1000) == f"{table}\n\n{verdict}\n\ntail"
    assert fit_note(parts, limit=10) == "tail"  # a part too long with no stand-in is left out


def test_the_budget_prints_each_arms_own_sheet_on_the_16_gb_card(capsys, tmp_path, monkeypatch):
    """`--budget-only` (the page's command): the chapter's sheet on lab.toml's RTX 5080, then a verdict
    per arm from the arm's own settings, which the arm's run is checked against before any arm loads:
    the cut arm holds two tokens a completion, the unsynced arm no vLLM (it generates with the trainer)."""
    import re

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    lab = load_lab_module(LAB_DIR)
    assert lab.main(["--budget-only"]) == 0
    out = capsys.readouterr().out
    chapter = float(re.search(r"^verdict: fits: peak ([\d.]+) GiB of 15.92 GiB", out, re.M).group(1))
    peaks = {
        m.group(1): float(m.group(2))
        for m in re.finditer(r"^  (\S+) .*: fits: peak ([\d.]+) GiB of 15.92 GiB", out, re.M)
    }
    assert peaks.keys() == {arm.name for arm in lab.ARMS}, out
    assert peaks["cut"] < chapter and peaks["unsynced"] < peaks["cut"], peaks
    assert (
        peaks["cold"] == peaks["still"] == peaks["leashed"] == chapter
    )  # sampling and step settings hold no memory
    assert not (tmp_path / "mlflow.db").exists()
