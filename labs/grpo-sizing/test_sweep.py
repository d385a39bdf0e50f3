"""The sweep's seams, without running a cell's process: the result file a lab run writes, the
sweep reading it back (and a cell that left none), and the report on hand-built cell results.

The harness writing the file at each ending is tests/test_run_endings.py's; the CPU sweep end to end
is this chapter's test_chapter.py's (slow).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from budgets.units import GIB, MIB
from grpolab.chapters import sweep
from grpolab.chapters.sweep import cells, report
from grpolab.chapters.sweep.cells import Exited
from grpolab.memory import comparison, run_result
from grpolab.memory.probe import PhasePeak

LAB = Path(__file__).resolve().parent
CAP_GIB = 0.32  # the chapter's CPU_MEMORY_CAP_GIB: two cells fit, the edge past them does not


@pytest.fixture(scope="module")
def planned():
    """The CPU grid's cells on the CPU sweep's capped host: 4x8x32 and 4x16x32 fit, 4x32x32 does not."""
    host = sweep.cpu_host(LAB, {}, CAP_GIB)
    cells_, edge = sweep.plan_sweep(LAB, host, {}, sweep.Grid((4,), (8, 16), (32,)))
    assert [p.fits for p in cells_] == [True, True, False] and edge is cells_[-1]
    return host, cells_


def fake_run(sheet, output_dir: Path, run_id: str = "run-1", seconds=(3.0, 1.0, 2.0), load=None):
    """What run_result.write reads of a lab run (grpolab.lab.session.Run), built by hand."""
    phases = [PhasePeak("load", load if load is not None else sheet.phases["start"])]
    return SimpleNamespace(
        sheet=sheet,
        meter=SimpleNamespace(probe=SimpleNamespace(phases=phases), step_generation_seconds=list(seconds)),
        mlflow_run=SimpleNamespace(info=SimpleNamespace(run_id=run_id, run_name=f"cpu-{run_id}")),
        adapter_dir=None,
        output_dir=output_dir,
    )


def measured_result(p, off: float, lines_off: dict[str, int], tmp_path: Path, status: str = "FINISHED"):
    """A cell's result as its run would write it: the peak `off` (relative) from the sheet's, each line
    of `lines_off` off by that many bytes, host_runtime exact."""
    sheet = p.sheet
    measured = {"host_runtime": sheet.line("host_runtime").bytes}
    measured |= {name: sheet.line(name).bytes + extra for name, extra in lines_off.items()}
    c = comparison.compare(sheet, measured, round(sheet.total_bytes * (1 + off)), on_gpu=False)
    return run_result.result_of(fake_run(sheet, tmp_path, p.cell.name), status, c)


# --- the result file ------------------------------------------------------------------------------
def test_a_result_holds_every_line_in_bytes_and_the_report_reads_it_in_gib(planned, tmp_path):
    p = planned[1][0]
    result = measured_result(p, 0.10, {"train_activations": 8 * MIB}, tmp_path)
    assert set(result["lines"]) == {line.name for line in p.sheet.lines}  # every budget line, measured or not
    assert result["lines"]["logits"] == {
        "budget_bytes": p.sheet.line("logits").bytes,
        "measured_bytes": None,
        "rel_error": None,
    }
    assert (result["status"], result["ending"], result["oom"]) == ("FINISHED", "finished", None)
    assert json.loads(json.dumps(result)) == result  # plain JSON
    f = report.figures(result)
    assert f["measured_gib"] == pytest.approx(p.sheet.total_bytes * 1.1 / GIB)
    assert f["rel_error"] == pytest.approx(0.10, abs=1e-9)
    assert set(f["lines"]) == {"host_runtime", "train_activations"}  # the measured ones only
    assert f["lines"]["train_activations"]["diff_gib"] == pytest.approx(8 / 1024)
    assert f["generation_seconds_measured"] == 1.5  # median of the steady steps: the first one warms up
    assert f["growth_after_load_gib"] == pytest.approx(
        (p.sheet.total_bytes * 1.1 - p.sheet.phases["start"]) / GIB
    )
    assert f["vllm"] is False and f["rollouts_in_kv_measured"] is None and f["oom_phase"] is None


def test_an_out_of_memory_result_has_its_peak_and_no_comparison(planned, tmp_path):
    edge = planned[1][-1]
    sheet = edge.sheet
    c = comparison.compare(sheet, {"host_runtime": sheet.line("host_runtime").bytes + MIB}, 0, on_gpu=False)
    oom = {"phase": "train_step", "line": "train_activations", "peak_gib": 1.75}
    result = run_result.result_of(fake_run(sheet, tmp_path), "FAILED", c, oom)
    assert result["oom"] == {
        "phase": "train_step",
        "line": "train_activations",
        "peak_bytes": int(1.75 * GIB),
    }
    f = report.figures(result)
    # As the run's metrics have it: its peak (oom/peak_gib) and what each line reached, no relative errors.
    assert (f["measured_gib"], f["oom_peak_gib"], f["oom_phase"]) == (1.75, 1.75, "train_step")
    assert f["rel_error"] is f["unattributed_gib"] is f["growth_after_load_gib"] is None
    assert f["lines"]["host_runtime"]["rel_error"] is None
    assert f["lines"]["host_runtime"]["diff_gib"] == pytest.approx(1 / 1024)


def test_the_generation_seconds_are_those_of_the_steps_that_ended(planned, monkeypatch):
    """As perf/generation_seconds has them: a generation whose step never ended (out of memory in
    the training pass after it) is not a step's."""
    import mlflow

    from grpolab.lab.meter import Meter
    from grpolab.memory.device import Device
    from grpolab.memory.probe import MemoryProbe

    logged = []
    monkeypatch.setattr(mlflow, "log_metrics", lambda metrics, step=None: logged.append(metrics))
    trainer = SimpleNamespace(
        _generate=lambda prompts: (None, [[1, 2, 3]] * len(prompts)),
        compute_loss=lambda *args, **kwargs: 0.0,
        add_callback=lambda callback: None,
    )
    meter = Meter(MemoryProbe(Device("cpu")), planned[1][0].sheet)
    meter.attach(trainer)
    trainer._generate(["a prompt", "another"])
    meter.on_step_end(None, SimpleNamespace(global_step=1), None)
    trainer._generate(["the next step's"])  # and its training pass runs out of memory
    assert meter.step_generation_seconds == [logged[0]["perf/generation_seconds"]]


def test_the_file_appears_whole_and_a_missing_one_reads_as_none(planned, tmp_path):
    p = planned[1][0]
    c = comparison.compare(p.sheet, {}, p.sheet.total_bytes, on_gpu=False)
    folder = tmp_path / "cell" / "grpo-sizing" / "cpu-1"
    path = run_result.write(fake_run(p.sheet, folder), "FINISHED", c)
    assert path == folder / "result.json" and [q.name for q in folder.iterdir()] == ["result.json"]
    assert run_result.read(path)["run_id"] == "run-1"
    assert cells.result_path(tmp_path / "cell", "grpo-sizing") == path
    assert run_result.read(tmp_path / "nothing.json") is None
    assert cells.result_path(tmp_path / "empty", "grpo-sizing") is None
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the run's folder should be")
    assert run_result.write(fake_run(p.sheet, blocked), "FINISHED", c) is None  # a warning, not a failure


# --- read back by the sweep ------------------------------------------------------------------------
class Client:
    """MLflow's client as cells.outcome uses it: runs found by their tags, renamed and tagged."""

    def __init__(self, runs=()):
        self.runs, self.searches, self.names, self.tags = list(runs), [], {}, {}

    def search_runs(self, experiment_ids, filter_string):
        self.searches.append(filter_string)
        return [
            r for r in self.runs if all(f"`{k}` = '{v}'" in filter_string for k, v in r.data.tags.items())
        ]

    def update_run(self, run_id, name):
        self.names[run_id] = name

    def set_tag(self, run_id, key, value):
        self.tags.setdefault(run_id, {})[key] = value


PARENT = SimpleNamespace(info=SimpleNamespace(experiment_id="1", run_id="sweep-run"))


def test_the_sweep_reads_a_cells_result_from_the_cells_own_folder(planned, tmp_path):
    _, (small, _, edge) = planned
    folder = tmp_path / small.cell.name  # what the sweep gives the cell as --output-dir
    run = fake_run(small.sheet, folder / "grpo-sizing" / "cpu-20250101-000000-7", "child-1")
    run_result.write(run, "FINISHED", comparison.compare(small.sheet, {}, small.sheet.total_bytes, False))
    client = Client()
    o = cells.outcome(client, PARENT, small, Exited(0, "Open it: ...", 7), folder)
    assert (o.status, o.run_id, o.run_status, o.exit_code) == ("ran", "child-1", "FINISHED", 0)
    assert o.figures["measured_gib"] == pytest.approx(small.sheet.total_bytes / GIB)
    assert client.searches == []  # the file says which run it was: MLflow is not searched
    assert client.names == {"child-1": f"cell {small.cell.name}"}
    assert client.tags["child-1"] == {"sweep.cell": small.cell.name, "sweep.status": "ran"}

    # The edge run anyway, out of memory: its run ended FAILED, as the sheet said it would.
    folder = tmp_path / edge.cell.name
    c = comparison.compare(edge.sheet, {}, 0, on_gpu=False)
    oom = {"phase": "train_step", "line": "train_activations", "peak_gib": 1.9}
    run_result.write(fake_run(edge.sheet, folder / "grpo-sizing" / "cpu-x", "child-2"), "FAILED", c, oom)
    o = cells.outcome(client, PARENT, edge, Exited(3, "error: out of memory during train_step", 8), folder)
    assert (o.status, o.run_status, o.figures["oom_phase"]) == ("ran anyway", "FAILED", "train_step")
    assert (
        client.tags["child-2"]["sweep.status"]
        == "refused (train_activations); ran anyway: out of memory in train_step"
    )


def test_a_cell_that_left_no_result_is_reported_by_its_exit_code_and_last_line(planned, tmp_path):
    small = planned[1][0]
    client = Client()
    o = cells.outcome(
        client, PARENT, small, Exited(2, "error: max_completion_length: too long", 4242), tmp_path
    )
    assert (o.status, o.run_id, o.figures) == ("refused by its own sheet", None, {})
    assert report.status_text(o) == "refused by its own sheet: error: max_completion_length: too long"
    o = cells.outcome(
        client, PARENT, small, Exited(1, "ValueError: a reward function crashed", 4242), tmp_path
    )
    assert (o.status, o.run_id) == ("failed", None) and client.names == {}
    # A process that opened its run and died (SIGKILL): its run is the sweep's child with its process's tags.
    tags = {"mlflow.parentRunId": "sweep-run", "process.pid": "4242", "process.host": socket.gethostname()}
    orphan = SimpleNamespace(
        info=SimpleNamespace(run_id="child-3", status="RUNNING"), data=SimpleNamespace(tags=tags)
    )
    client = Client([orphan])
    o = cells.outcome(client, PARENT, small, Exited(-9, "step 1", 4242), tmp_path)
    assert (o.status, o.run_id, o.run_status, o.figures) == ("failed", "child-3", "RUNNING", {})
    assert (
        client.names == {"child-3": f"cell {small.cell.name}"} and report.status_text(o) == "failed: step 1"
    )
    assert cells.outcome(client, PARENT, small, Exited(-9, "step 1", 4343), tmp_path).run_id is None


# --- the report, on hand-built results --------------------------------------------------------------
def outcomes_of(planned, tmp_path, edge_status: str = "refused"):
    host, cells_ = planned
    small, large, edge = cells_
    ran = [
        report.Outcome(
            small,
            "ran",
            0,
            "a",
            "FINISHED",
            figures=report.figures(measured_result(small, 0.05, {"train_activations": 4 * MIB}, tmp_path)),
        ),
        report.Outcome(
            large,
            "ran",
            0,
            "b",
            "FINISHED",
            figures=report.figures(measured_result(large, -0.01, {"train_activations": 12 * MIB}, tmp_path)),
        ),
    ]
    if edge_status == "refused":
        return host, [*ran, report.Outcome(edge, "refused")]
    sheet = edge.sheet
    c = comparison.compare(
        sheet, {"train_activations": sheet.line("train_activations").bytes}, 0, on_gpu=False
    )
    oom = {"phase": "train_step", "line": "train_activations", "peak_gib": 1.9}
    result = run_result.result_of(fake_run(sheet, tmp_path), "FAILED", c, oom)
    last = "error: out of memory during train_step"
    return host, [*ran, report.Outcome(edge, "ran anyway", 3, "c", "FAILED", last, report.figures(result))]


def test_the_verdict_says_how_far_the_sheet_was_off_and_on_which_line(planned, tmp_path):
    _, outcomes = outcomes_of(planned, tmp_path)
    text, metrics = report.verdict(outcomes, outcomes[-1])
    assert text.startswith(
        "Across 2 cells the sheet's peak was off by +2.0% on average (3.0% in size) and +5.0% at worst (cell 4x8x32); the budget held in 1 of 2."
    )
    assert (
        "The line that missed most: train_activations, by +8.00 MiB on average" in text
        and "at worst +12.00 MiB in cell 4x16x32" in text
    )
    assert text.endswith("; not run (--run-refused runs it anyway).")
    assert metrics["verdict/cells_ran"] == 2
    assert metrics["verdict/total_rel_error_mean"] == pytest.approx(0.02)
    assert metrics["verdict/total_rel_error_worst"] == pytest.approx(0.05)
    assert metrics["verdict/line_mean_abs_diff_gib"] == pytest.approx(8 / 1024)
    text, _ = report.verdict(
        outcomes_of(planned, tmp_path, "oom")[1], outcomes_of(planned, tmp_path, "oom")[1][-1]
    )
    assert (
        "run anyway it ran out of memory during train_step at 1.90 GiB (line blamed: train_activations)."
        in text
    )
    nothing, metrics = report.verdict([report.Outcome(planned[1][0], "failed", 1, last_line="boom")], None)
    assert nothing.startswith("No cell ran to the end") and f"within {sweep.WALK_LIMIT} doublings" in nothing
    assert metrics == {"verdict/cells_ran": 0}


def test_the_table_has_a_row_per_cell_and_a_row_per_line(planned, tmp_path):
    host, outcomes = outcomes_of(planned, tmp_path, "oom")
    text = report.table(outcomes, host, "The verdict.")
    rows = {
        line.split(" | ")[0].removeprefix("| "): line for line in text.splitlines() if line.startswith("| 4x")
    }
    assert set(rows) == {"4x8x32", "4x16x32", "4x32x32"}
    assert "| ran | " in rows["4x8x32"] and "| +5.0% | train_activations (+4.00 MiB) |" in rows["4x8x32"]
    assert "no vLLM (CPU: transformers' generate)" in rows["4x8x32"] and "/ 1.5 |" in rows["4x8x32"]
    assert "refused (train_activations); ran anyway: out of memory in train_step" in rows["4x32x32"]
    assert "| 1.900 |" in rows["4x32x32"] and "not measured" in rows["4x32x32"]  # a peak, no comparison
    assert "| train_activations | 2 | +8.00 MiB |" in text  # the per-line table, over the cells that ran
    assert text.startswith("The verdict.\n") and "tiny model's" in text and f"cap {CAP_GIB:g}" in text


def test_the_cpu_chart_spreads_its_cells_along_the_group_the_gpu_chart_along_the_length(planned, tmp_path):
    """The peaks are plotted against the knob the grid varies: the CPU grid holds every cell at 32
    tokens and varies the group (8, 16, and the edge's 32), so its cells spread along the group, one
    series per prompts and length; a GPU grid (256, 512, 768 tokens) keeps its length axis, a series
    per prompts x group. Real matplotlib, the plotted data read back."""
    host, outcomes = outcomes_of(planned, tmp_path, "oom")
    assert report.chart_axis(outcomes) == "num_generations"
    peaks, _ = report.chart(outcomes, host).axes
    assert peaks.get_xlabel() == "num_generations (completions per prompt)"
    assert list(peaks.get_xticks()) == [8, 16, 32]
    drawn = {line.get_label(): list(line.get_xdata()) for line in peaks.get_lines()}
    assert drawn["4 prompt(s) at 32 tokens: measured (budget dashed)"] == [8, 16]
    crosses = [line for line in peaks.get_lines() if line.get_marker() == "x"]
    assert [list(line.get_xdata()) for line in crosses] == [[32]]  # the refused edge, run anyway
    # A GPU grid's cells, three lengths per group: the axis stays the completion length.
    sheet = planned[1][0].sheet
    gpu = [
        report.Outcome(sweep.Planned(sweep.Cell(1, g, length), None, sheet), "refused")
        for g in (4, 8)
        for length in (256, 512, 768)
    ]
    assert report.chart_axis(gpu) == "max_completion_length"
    peaks, _ = report.chart(gpu, host).axes
    assert peaks.get_xlabel() == "max_completion_length (tokens)"
    assert list(peaks.get_xticks()) == [256, 512, 768]
    labels = [line.get_label() for line in peaks.get_lines() if not line.get_label().startswith("_")]
    assert labels[:2] == ["1 prompt(s) x 4: budget", "1 prompt(s) x 8: budget"]
    # One cell, or cells that differ only in prompts per step.
    assert report.chart_axis(gpu[:1]) == "max_completion_length"
    apart = [report.Outcome(sweep.Planned(sweep.Cell(p, 8, 32), None, sheet), "refused") for p in (1, 2)]
    assert report.chart_axis(apart) == "prompts_per_step"


def test_the_chart_and_the_grid_as_data(planned, tmp_path):
    host, outcomes = outcomes_of(planned, tmp_path, "oom")
    fig = report.chart(outcomes, host)
    peaks, misses = fig.axes
    assert "budget (dashed) vs measured (solid)" in peaks.get_title()
    # Each line's miss: a bar per line and per cell that ran; the edge ran anyway and is left out.
    assert [t.get_text() for t in misses.get_legend().get_texts()] == ["4x8x32", "4x16x32"]
    record = report.cells_record(outcomes, host, "The verdict.", outcomes[-1])
    assert json.loads(json.dumps(record)) == record
    assert [c["status_text"] for c in record["cells"]] == [
        "ran",
        "ran",
        "refused (train_activations); ran anyway: out of memory in train_step",
    ]
    assert [c["edge"] for c in record["cells"]] == [False, False, True]
