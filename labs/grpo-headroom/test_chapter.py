"""Chapter 5's claims, read from the suite's one run of its README command (the root conftest.py's
`chapter_run`): every arm nested and finished in a process of its own, its sheet's peak beside its
measured one, its held-out accuracy before and after and its time; the chart and the verdict on the
chapter's Overview. The GPU arms' sheets and the refusals need nothing loaded: they run here.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from suite import chapter, cpu_only, load_lab_module, prose, table_rows

LAB_DIR = Path(__file__).resolve().parent
README_GPU_SHEETS = "uv run python labs/grpo-headroom/train.py --budget-only --profile gpu"
ARMS = ["recipe", "group", "length", "batch"]


@pytest.fixture(scope="module")
def lab():
    return load_lab_module(LAB_DIR)


# --- the chapter's run --------------------------------------------------------------------------------
@pytest.fixture
def arms(chapter_run):
    assert chapter_run.code == 0, chapter_run.log()
    (parent,) = chapter_run.top
    return chapter_run, parent, {r.data.tags["headroom.arm"]: r for r in chapter_run.children(parent)}


@pytest.mark.slow
@cpu_only("reads the CPU profile's run; on a GPU the same command trains Qwen3-4B per arm")
def test_every_arm_is_nested_finished_and_its_own_process(arms):
    _, parent, children = arms
    assert (parent.info.status, parent.data.tags["run_kind"]) == ("FINISHED", "headroom")
    assert sorted(children) == sorted(ARMS), sorted(children)
    assert all(c.info.status == "FINISHED" for c in children.values())
    pids = {c.data.tags["process.pid"] for c in children.values()}
    assert len(pids) == len(ARMS) and parent.data.tags["process.pid"] not in pids  # a process each


@pytest.mark.slow
@cpu_only("reads the CPU profile's run; on a GPU the same command trains Qwen3-4B per arm")
def test_each_arm_logs_its_peak_pair_held_out_accuracy_and_time(arms):
    run, parent, children = arms
    record = {
        r["arm"]: r
        for r in json.loads(
            (Path(run.client.download_artifacts(parent.info.run_id, "headroom/arms.json"))).read_text()
        )["arms"]
    }
    for name, child in children.items():
        metrics = child.data.metrics
        assert "total/budget_mib" in metrics and "total/measured_mib" in metrics, name
        assert {"eval/base_accuracy", "eval/adapter_accuracy"} <= set(metrics), name
        r = record[name]
        assert r["accuracy_base"] == metrics["eval/base_accuracy"]
        assert r["accuracy_adapter"] == metrics["eval/adapter_accuracy"]
        assert r["train_minutes"] > 0 and r["tokens_per_s"] > 0, r
        assert abs(r["measured_gib"] * 1024 - metrics["total/measured_mib"]) < 1e-6 * 1024, r
    # The same base and the same held-out prompts for every arm: the same accuracy before.
    assert len({round(r["accuracy_base"], 6) for r in record.values()}) == 1, record
    # Each knob went up from the recipe, and its arm's sheet spends more than the recipe's.
    recipe = record["recipe"]
    for name in ("group", "length", "batch"):
        before, after, most = record[name]["values"]
        assert before < after <= most, record[name]
        assert record[name]["budget_gib"] > recipe["budget_gib"], record[name]


@pytest.mark.slow
@cpu_only("reads the CPU profile's run; on a GPU the same command trains Qwen3-4B per arm")
def test_the_books_claim_holds_every_arm_learns(chapter_claims):
    """claims.py beside this file, which the matrix checks on every seed: whatever an arm spent the
    headroom on, its held-out accuracy rises from the same base (in prompts, of 32)."""
    print({k: round(v, 3) for k, v in chapter_claims.figures.items()})
    assert chapter_claims.failures == [], chapter_claims.failures


@pytest.mark.slow
@cpu_only("reads the CPU profile's run; on a GPU the same command trains Qwen3-4B per arm")
def test_the_pages_quote_this_runs_figures_digit_for_digit(arms, tmp_path):
    """The CPU profile computes the same bits on every x86-64 machine (docs/every-machine.md), so the
    chapter's table and the README's row quote this run wherever the suite runs: each arm's sheet peak,
    held-out accuracy and points per GiB (computed from those two), and the arm that bought the most.
    The measured peaks and the minutes are the machine's own; the pages say so, and they are not read."""
    run, parent, _ = arms
    fetched = run.client.download_artifacts(parent.info.run_id, "headroom/arms.json", str(tmp_path))
    record = {r["arm"]: r for r in json.loads(Path(fetched).read_text())["arms"]}
    table = {row[0]: row for row in table_rows(LAB_DIR / "README.md", 8) if row[0] in ARMS}
    assert set(table) == set(ARMS), set(table)
    for name, r in record.items():
        per_gib = "-" if r["gain_per_gib"] is None else f"{r['gain_per_gib']:+.1f}"
        held_out = f"{r['accuracy_base']:.1%} -> {r['accuracy_adapter']:.1%}"
        assert [table[name][i] for i in (2, 4, 6)] == [f"{r['budget_gib']:.2f} GiB", held_out, per_gib], name
    best = max((r for r in record.values() if r["gain_per_gib"] is not None), key=lambda r: r["gain_per_gib"])
    bought = f"{best['gain_over_recipe']:+.1f} points beyond the recipe for {best['spent_gib']:.2f} GiB"
    said = f"({best['accuracy_base']:.1%} -> {best['accuracy_adapter']:.1%}, {bought})"
    assert said in chapter(LAB_DIR.name).measured, f"the README's row does not quote this run: {said!r}"
    assert f"the {best['arm']} bought the most per GiB ({bought})" in prose(LAB_DIR / "README.md")


VERDICT_BY_GIB = (
    r"\*\*Most learning per GiB: (?P<most>\w+)\*\*"
    r"|\*\*No arm bought learning with its GiB\*\*: none gained more than the recipe \(the nearest, (?P<nearest>\w+):"
)
VERDICT_PER_MINUTE = r"\*\*Most per minute: (\w+)\*\*"


def arm_result(arm: str, gain: float, spent_gib: float, minutes: float) -> dict:
    """An arm's figures as the chapter's report holds them, from its gain and what it spent."""
    over = gain - 40.0  # the recipe's gain below
    return {
        "arm": arm,
        "gain": gain,
        "budget_gib": 1.55 + spent_gib,
        "spent_gib": spent_gib,
        "gain_over_recipe": over,
        "gain_per_gib": over / spent_gib if spent_gib else None,
        "gain_per_minute": gain / minutes,
    }


@pytest.mark.parametrize(
    ("batch_gain", "says"),
    [
        (60.0, "**Most learning per GiB: batch** (+400.0 points of held-out accuracy per GiB: +20.0 points"),
        (40.0, "**No arm bought learning with its GiB**: none gained more than the recipe (the nearest, "),
    ],
)
def test_the_verdict_names_an_arm_most_only_where_its_gib_bought_more_than_the_recipe(batch_gain, says):
    """An arm whose GiB bought a gain beyond the recipe's is "most per GiB"; where none did (a tie, or
    every arm below the recipe), the verdict says so and names the nearest, instead of crowning it."""
    from grpolab.chapters.headroom import verdict
    from grpolab.chapters.sweep.host import Host

    results = [
        arm_result("recipe", 40.0, 0.0, 0.25),
        arm_result("group", 30.0, 0.10, 1.0),
        arm_result("batch", batch_gain, 0.05, 0.5),
    ]
    text = verdict(results, Host("cpu"))
    assert text.startswith(says), text
    assert re.match(VERDICT_BY_GIB, text) and re.search(VERDICT_PER_MINUTE, text).group(1) == "recipe", text
    if batch_gain == 40.0:
        assert "the nearest, batch: +0.0 points beyond the recipe's gain for +0.05 GiB)." in text, text


@pytest.mark.slow
@cpu_only("reads the CPU profile's run; on a GPU the same command trains Qwen3-4B per arm")
def test_the_overview_opens_with_the_verdict_and_the_chart(arms):
    run, parent, _ = arms
    note = parent.data.tags["mlflow.note.content"]
    by_gib, per_minute = re.match(VERDICT_BY_GIB, note), re.search(VERDICT_PER_MINUTE, note)
    assert by_gib and per_minute, note
    best = by_gib.group("most") or by_gib.group("nearest")
    assert {best, per_minute.group(1)} <= set(ARMS), note
    assert best != "recipe"  # the recipe spends nothing: it has no price per GiB
    assert "get-artifact?path=headroom%2Fgain_per_gib_and_minute.png" in note
    artifacts = {a.path for a in run.client.list_artifacts(parent.info.run_id, "headroom")}
    assert {"headroom/arms.json", "headroom/arms.md", "headroom/gain_per_gib_and_minute.png"} <= artifacts
    # The verdict's arm is the one whose logged figure is the largest, called "most" only where it
    # gained more than the recipe.
    per_gib = {a: parent.data.metrics.get(f"headroom/{a}/gain_per_gib") for a in ARMS}
    priced = {a: v for a, v in per_gib.items() if v is not None}
    assert max(priced, key=priced.get) == best, priced
    bought = parent.data.metrics[f"headroom/{best}/gain_over_recipe"] > 0
    assert bought == (by_gib.group("most") is not None), note
    assert "the stand-in's, on this CPU host" in note
    assert "| arm | cell" in run.stdout and "Most learning per GiB" in run.stdout


# --- the sheets and the refusals, nothing loaded -------------------------------------------------------
def test_the_gpu_arms_each_spend_about_half_the_headroom_on_the_16_gb_card(lab, capsys):
    words = shlex.split(README_GPU_SHEETS)
    assert lab.main(words[words.index("labs/grpo-headroom/train.py") + 1 :]) == 0
    out = capsys.readouterr().out
    peaks = dict(re.findall(r"^  (\w+) +\S+  peak +([\d.]+) GiB", out, flags=re.M))
    assert set(peaks) == {*ARMS, "standby"}, out[:2000]
    recipe, card = float(peaks["recipe"]), 15.92
    target = recipe + lab.FRACTION * (card - recipe)
    for name in ("group", "length", "batch"):
        spent = float(peaks[name]) - recipe
        # at most the share, and at least two thirds of it (the batch moves by whole groups)
        assert (target - recipe) * 0.66 <= spent <= (target - recipe) + 0.01, (name, spent, out[:1500])
    assert "rtx-5080" in out and "REFUSED" not in out
    assert out.count("=== arm ") == 5  # each arm's whole sheet


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--num-generations", "4"], "num_generations: the arms set it"),
        (["--fraction", "0"], "fraction: must be in (0, 1]"),
        (["--memory-cap-gib", "0.001"], "the recipe does not fit"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(lab, capsys, argv, says):
    assert lab.main([*argv, "--profile", "cpu", "--budget-only"]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err
