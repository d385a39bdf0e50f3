"""How chapter 8 turns a broken arm's finding into the arm that mends it, on findings built here (the
README run's are read in test_chapter.py)."""

from __future__ import annotations

from pathlib import Path

from grpolab.chapters.arms import Arm, causes_table, fixed_arm
from grpolab.config.settings import lab_settings
from grpolab.judging.doctor import Finding

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
