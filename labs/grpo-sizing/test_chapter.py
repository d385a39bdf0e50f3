"""Chapter 2 (labs/grpo-sizing): the book's tables from the budget, the sweep's sizing, and the CPU
sweep run once as the README runs it (conftest.py: `chapter_run`), read back through MLflow's client.
The suite runs the README's `--run-refused` form, which is the README's sweep and, after it, the
refused cell run anyway: both of the chapter's README commands in one run.

The book's numbers are the book's (its hardware chapter); each test computes the sheet's own figure
through the budget API and holds it against the published one within a stated tolerance.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from budgets import Plan, compute, load_shape
from grpolab.chapters import sweep
from grpolab.config.settings import LabSettingsError, lab_settings

from suite import load_lab_module

LAB = Path(__file__).resolve().parent
README_SWEEP = "uv run python labs/grpo-sizing/train.py"
README_SWEEP_REFUSED = "uv run python labs/grpo-sizing/train.py --run-refused"
# The suite's run of this chapter: the README's sweep, then its refused cell run anyway.
pytestmark = pytest.mark.chapter_command(README_SWEEP_REFUSED)
GB = 1e9

# --- the book's tables, from the budget ------------------------------------------------------------
BOOK_KV_KIB_PER_TOKEN = {"llama-3.1-8b": 128, "qwen3-32b": 256, "llama-3.3-70b": 320}
# Rollouts an 8B holds on a 96 GB card at each vLLM share. The three counts imply rollouts of
# 4,608 tokens (512 prompt + 4,096 completion) on 96 x 10^9 bytes less the bf16 weights: the only
# whole-block rollout length in that range (602.6-606.7 MB per rollout at 128 KiB per token).
BOOK_ROLLOUTS = {0.3: 21, 0.5: 52, 0.92: 119}
BOOK_PROMPT, BOOK_COMPLETION, BOOK_CARD_BYTES = 512, 4096, 96 * GB
BOOK_SYNC_GB, BOOK_SYNC_S, BOOK_LINK_GBPS = 141, 2.2, 64 * 8  # 64 GB/s = 512 Gb/s


def rollouts_plan(util: float, layout: str) -> Plan:
    cards = {"gpus": 2, "vllm_gpus": 1} if layout == "server" else {}
    return Plan(
        model="llama-3.1-8b",
        gpu="rtx-pro-6000",
        load_in_4bit=False,
        optim="adamw_torch",
        layout=layout,
        gpu_memory_utilization=util,
        max_prompt_length=BOOK_PROMPT,
        max_completion_length=BOOK_COMPLETION,
        num_generations=8,
        per_device_train_batch_size=8,
        **cards,
    )


@pytest.mark.parametrize("model", sorted(BOOK_KV_KIB_PER_TOKEN))
def test_kv_cache_per_token_is_the_books(model):
    sheet = compute(Plan(model=model, gpu="h200", load_in_4bit=False, layout="colocate"))
    s = load_shape(model)
    assert sheet.metrics["kv_cache_bytes_per_token"] == 2 * s.layers * s.kv_heads * s.head_dim * 2
    assert sheet.metrics["kv_cache_bytes_per_token"] == BOOK_KV_KIB_PER_TOKEN[model] * 1024  # exact


@pytest.mark.parametrize("util", sorted(BOOK_ROLLOUTS))
def test_rollouts_vllm_holds_for_an_8b_on_a_96_gb_card(util):
    """The book's arithmetic, (util x 96 GB - the weights) / (rollout tokens x KV per token), fed the
    sheet's exact weights and per-token bytes, gives the book's count exactly; the sheet's own count
    (the catalog's RTX PRO 6000: 97,887 MiB, less vLLM's profiling pass and CUDA graphs, in whole
    16-token blocks) is within 10% of it, under TRL's server layout."""
    sheet = compute(rollouts_plan(util, "server"))
    weights = next(ln for card in sheet.per_card for ln in card.lines if ln.name == "vllm_weights").bytes
    per_rollout = (BOOK_PROMPT + BOOK_COMPLETION) * sheet.metrics["kv_cache_bytes_per_token"]
    assert math.floor((util * BOOK_CARD_BYTES - weights) / per_rollout) == BOOK_ROLLOUTS[util]
    held = sheet.metrics["vllm"]["rollouts_in_kv"]
    assert abs(held - BOOK_ROLLOUTS[util]) <= 0.10 * BOOK_ROLLOUTS[util], (held, BOOK_ROLLOUTS[util])


def test_colocate_holds_as_many_until_vllm_cannot_start_beside_the_trainer():
    """Colocated, the trainer's weights are on the card first: at 0.92 vLLM's share is no longer free."""
    held = {u: compute(rollouts_plan(u, "colocate")).metrics["vllm"] for u in BOOK_ROLLOUTS}
    assert held[0.3]["starts"] and held[0.5]["starts"] and not held[0.92]["starts"]
    assert abs(held[0.3]["rollouts_in_kv"] - 21) <= 3 and abs(held[0.5]["rollouts_in_kv"] - 52) <= 6


@pytest.mark.parametrize("model", sorted(BOOK_KV_KIB_PER_TOKEN))
def test_full_fine_tuning_costs_16_bytes_a_parameter_and_lora_stays_small(model):
    n = load_shape(model).total_params()
    common = dict(model=model, gpu="h200", load_in_4bit=False, optim="adamw_torch", layout="colocate")
    full = compute(Plan(**common, full_finetuning=True, lora_rank=None))
    lora = compute(Plan(**common, lora_rank=16))
    assert full.metrics["train_state_bytes"] == 16 * n  # fp32 weights 4 + grads 4 + Adam's two moments 8
    adapter_states = lora.metrics["train_state_bytes"] - lora.line("base_weights").bytes
    assert adapter_states == 16 * lora.metrics["trainable_params"]  # the same 16 B, on the adapter only
    assert adapter_states < 0.01 * full.metrics["train_state_bytes"]


def test_a_server_layout_syncs_141_gb_a_step_for_a_70b():
    sheet = compute(
        Plan(
            model="llama-3.3-70b",
            gpu="h100-sxm",
            load_in_4bit=False,
            layout="server",
            gpus=8,
            vllm_gpus=4,
            link_gbps=BOOK_LINK_GBPS,
            gpu_memory_utilization=0.9,
        )
    )
    assert sheet.metrics["weight_sync_bytes_per_step"] == 2 * load_shape("llama-3.3-70b").total_params()
    assert sheet.metrics["weight_sync_bytes_per_step"] / GB == pytest.approx(BOOK_SYNC_GB, rel=0.01)
    assert sheet.metrics["weight_sync_seconds"] == pytest.approx(BOOK_SYNC_S, abs=0.05)


# --- the sweep's sizing, before anything runs ------------------------------------------------------
def test_the_gpu_grid_fits_a_16_gb_card_up_to_its_edge():
    """Qwen3-4B in 4-bit on an RTX 5080: every cell of the chapter's GPU grid fits, and the first past
    its largest (the group doubled) is refused, naming its line."""
    grids = load_lab_module(LAB).GRIDS
    host = sweep.Host("gpu", None, 0.0, "rtx-5080 (lab.toml)")
    planned, edge = sweep.plan_sweep(LAB, host, {}, grids["gpu"])
    grid = [p for p in planned if p.where == "grid"]
    assert len(grid) == len(grids["gpu"].cells()) and all(p.fits for p in grid)
    assert edge is not None and not edge.fits and edge.binding == "train_activations"
    largest = max(grid, key=lambda p: p.sheet.total_bytes).cell
    assert edge.cell == largest.doubled()


def test_the_cpu_host_refuses_the_edge_of_the_cpu_grid():
    module = load_lab_module(LAB)
    host = sweep.cpu_host(LAB, {}, module.CPU_MEMORY_CAP_GIB)
    planned, edge = sweep.plan_sweep(LAB, host, {}, module.GRIDS["cpu"])
    assert [p.cell for p in planned if p.fits] == module.GRIDS["cpu"].cells()
    assert edge is not None and edge.binding == "train_activations" and edge.where == "past the grid"
    # The host is the sheet's start phase and kernel caches plus the cap: the edge's step needs more.
    start = edge.sheet.phases["start"] + edge.sheet.line("host_shape_caches").bytes
    assert edge.sheet.capacity_bytes == start + int(module.CPU_MEMORY_CAP_GIB * 1024**3)


def test_a_grid_with_refused_cells_has_its_edge_inside():
    host = sweep.Host("gpu", None, 0.0, "rtx-5080 (lab.toml)")
    planned, edge = sweep.plan_sweep(LAB, host, {}, sweep.Grid((1,), (16, 32), (512, 768)))
    refused = [p for p in planned if not p.fits]
    assert refused and edge in refused and all(p.where == "grid" for p in planned)
    assert edge.sheet.total_bytes == min(p.sheet.total_bytes for p in refused)


def test_a_cell_is_lab_settings_under_their_own_names():
    cell = sweep.Cell(prompts_per_step=4, num_generations=8, max_completion_length=32)
    s = lab_settings(LAB, "cpu", cell.settings())
    assert (s.num_generations, s.per_device_train_batch_size, s.max_completion_length) == (8, 32, 32)
    assert cell.flags() == [
        "--num-generations",
        "8",
        "--per-device-train-batch-size",
        "32",
        "--max-completion-length",
        "32",
    ]
    with pytest.raises(LabSettingsError, match="max_completion_length"):
        sweep.plan_cell(LAB, sweep.Host("cpu"), {}, sweep.Cell(1, 8, 512))  # longer than the sequence


def test_the_sweep_refuses_a_cell_setting_and_names_the_grid_flag(capsys):
    assert load_lab_module(LAB).main(["--num-generations", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: num_generations") and "--grid-num-generations" in err and "\n" not in err


def test_every_cell_runs_to_its_full_completion_length(tmp_path):
    """The sheet budgets full-length completions: a cell holds the end of sequence off until then,
    through the argument each generation backend really takes."""
    import importlib.metadata

    from transformers import GenerationConfig

    module = load_lab_module(LAB)
    cpu = lab_settings(LAB, "cpu")
    config = module.grpo_config(cpu, tmp_path, {"bf16": False, "fp16": False, "use_cpu": True})
    assert config.generation_kwargs == {"min_new_tokens": cpu.max_completion_length}
    assert GenerationConfig(**config.generation_kwargs).min_new_tokens == cpu.max_completion_length
    gpu = lab_settings(LAB, "gpu")
    assert module.full_length(gpu) == {"min_tokens": gpu.max_completion_length}
    # vLLM's SamplingParams, read from its installed source (importing vLLM wants a GPU build, and
    # other tests hide the module from imports: sys.modules["vllm"] = None).
    source = Path(importlib.metadata.distribution("vllm").locate_file("vllm/sampling_params.py"))
    assert "min_tokens: int" in source.read_text(), "vLLM's SamplingParams takes min_tokens"


# --- the CPU sweep, run once as the README runs it (conftest.py: chapter_run) ---------------------
@pytest.fixture
def cpu_sweep(chapter_run):
    """The sweep's run, its cells' runs nested under it, and the cells' record it logged."""
    assert chapter_run.code == 0, chapter_run.log()
    assert chapter_run.chapter.command == README_SWEEP  # the README's row, run with --run-refused
    (parent,) = [r for r in chapter_run.top if r.data.tags.get("run_kind") == "sweep"]
    client, store = chapter_run.client, chapter_run.store
    cells = json.loads(
        Path(client.download_artifacts(parent.info.run_id, "sweep/cells.json", str(store))).read_text()
    )
    return {
        "parent": parent,
        "children": chapter_run.children(parent),
        "cells": cells,
        "client": client,
        "stdout": chapter_run.stdout,
        "seconds": chapter_run.seconds,
        "store": store,
    }


@pytest.mark.slow
def test_the_sweep_says_its_numbers_are_the_tiny_models(cpu_sweep):
    out = cpu_sweep["stdout"]
    assert "CPU stand-in" in out and "tiny model's" in out and "No vLLM" in out
    assert out.index("Sizing") < out.index("=== cell")  # every sheet before any cell starts
    grid_cells = [c for c in cpu_sweep["cells"]["cells"] if c["status"] == "ran"]
    seconds = (
        max(cpu_sweep["client"].get_run(c["run_id"]).info.end_time for c in grid_cells)
        - cpu_sweep["parent"].info.start_time
    )
    print(
        f"CPU sweep: {seconds / 1000:.0f} s to the last cell that fits, {cpu_sweep['seconds']:.0f} s with the "
        f"refused cell run anyway (load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
    )


@pytest.mark.slow
def test_one_parent_run_and_a_child_run_per_cell(cpu_sweep):
    parent, children, cells = cpu_sweep["parent"], cpu_sweep["children"], cpu_sweep["cells"]["cells"]
    assert parent.info.status == "FINISHED" and parent.data.tags["profile"] == "cpu"
    grid = load_lab_module(LAB).GRIDS["cpu"]
    ran = [c for c in cells if c["status"] == "ran"]
    assert [(c["prompts_per_step"], c["num_generations"], c["max_completion_length"]) for c in ran] == [
        (c.prompts_per_step, c.num_generations, c.max_completion_length) for c in grid.cells()
    ]
    by_id = {r.info.run_id: r for r in children}
    assert len(children) == len(ran) + 1  # the cells that fit, and the refused one run anyway
    for cell in ran:
        child = by_id[cell["run_id"]]
        assert child.info.status == "FINISHED"
        assert child.info.run_name == f"cell {cell['name']}" and child.data.tags["sweep.cell"] == cell["name"]
        params = child.data.params
        assert params["num_generations"] == str(cell["num_generations"])
        assert params["per_device_train_batch_size"] == str(
            cell["prompts_per_step"] * cell["num_generations"]
        )
        assert params["max_completion_length"] == str(cell["max_completion_length"])


@pytest.mark.slow
def test_each_child_carries_chapter_ones_budget_and_measured_names(cpu_sweep):
    client = cpu_sweep["client"]
    for cell in [c for c in cpu_sweep["cells"]["cells"] if c["status"] == "ran"]:
        run = client.get_run(cell["run_id"])
        m = run.data.metrics
        sheet = json.loads(
            Path(
                client.download_artifacts(run.info.run_id, "budget/sheet.json", str(cpu_sweep["store"]))
            ).read_text()
        )
        for line in sheet["lines"]:
            assert m[f"{line['name']}/budget_mib"] == pytest.approx(line["bytes"] / 1024**2)
        for name in ("lora_params", "optimizer_states", "host_runtime", "base_weights"):
            for part in ("measured_mib", "diff_mib", "rel_error"):
                assert f"{name}/{part}" in m, (cell["name"], name, part)
        for key in ("total/budget_mib", "total/measured_mib", "total/capacity_mib", "total/unattributed_mib"):
            assert key in m, key
        assert m["total/measured_mib"] == pytest.approx(cell["figures"]["measured_gib"] * 1024)
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "memory")}
        assert {"memory/budget_vs_measured.md", "memory/budget_vs_measured.png"} <= artifacts
        # Every completion ran to its full length: the worst case the sheet budgets.
        assert m["completions/mean_length"] == cell["max_completion_length"]


@pytest.mark.slow
def test_the_parent_holds_the_grids_chart_table_and_verdict(cpu_sweep):
    parent, client = cpu_sweep["parent"], cpu_sweep["client"]
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "sweep")}
    assert {"sweep/budget_vs_measured.png", "sweep/budget_vs_measured.md", "sweep/cells.json"} <= artifacts
    table = Path(
        client.download_artifacts(parent.info.run_id, "sweep/budget_vs_measured.md", str(cpu_sweep["store"]))
    ).read_text()
    for cell in cpu_sweep["cells"]["cells"]:
        assert f"| {cell['name']} |" in table
    assert "no vLLM (CPU" in table and "tiny model's" in table
    note = parent.data.tags["mlflow.note.content"]
    assert (
        note.startswith(
            f"Across {len(load_lab_module(LAB).GRIDS['cpu'].cells())} cells the sheet's peak was off by"
        )
        and "The line that missed most:" in note
    )
    m = parent.data.metrics
    for key in (
        "verdict/total_rel_error_mean",
        "verdict/total_rel_error_worst",
        "verdict/line_mean_abs_diff_gib",
    ):
        assert key in m
    history = client.get_metric_history(parent.info.run_id, "sweep/total_measured_gib")
    assert len(history) == len(load_lab_module(LAB).GRIDS["cpu"].cells())  # one point per cell, by index


@pytest.mark.slow
def test_the_books_claims_hold_the_cells_fit_or_are_refused_as_the_sheet_says(chapter_claims):
    """claims.py beside this file, which the matrix checks on every seed: every cell the sheet lets
    through finishes under the CPU host's cap, and the edge it refuses runs out of memory run anyway."""
    print({k: round(v, 3) for k, v in chapter_claims.figures.items()})
    assert chapter_claims.failures == [], chapter_claims.failures


@pytest.mark.slow
def test_the_edge_is_refused_by_the_sheet_and_runs_out_of_memory_when_run_anyway(cpu_sweep):
    parent, client = cpu_sweep["parent"], cpu_sweep["client"]
    (edge,) = [c for c in cpu_sweep["cells"]["cells"] if c["edge"]]
    assert not edge["fits"] and edge["binding"] == "train_activations" and edge["where"] == "past the grid"
    assert parent.data.tags["sweep.refused"] == f"{edge['name']}: train_activations"
    assert "sweep/refused/" + edge["name"] + ".txt" in {
        a.path for a in client.list_artifacts(parent.info.run_id, "sweep/refused")
    }
    run = client.get_run(edge["run_id"])
    assert run.info.status == "FAILED" and edge["status"] == "ran anyway"
    assert run.data.tags["oom_phase"] in {"generate", "train_step", "train"}
    assert run.data.tags["oom_line"] and run.data.metrics["oom/peak_gib"] > 0
    assert "ran out of memory" in parent.data.tags["mlflow.note.content"]
    (started,) = [ln for ln in cpu_sweep["stdout"].splitlines() if ln.startswith(f"=== cell {edge['name']}:")]
    cap = load_lab_module(LAB).CPU_MEMORY_CAP_GIB
    assert f"--ignore-budget --memory-cap-gib {cap:g}" in started  # under the CPU host's own cap


def test_a_standby_sweep_passes_standby_to_every_cell_and_its_sheets_follow():
    """On a GPU `--unsloth-vllm-standby true` sweeps the grid with standby: every cell's sheet releases
    the KV cache while training, and every cell's process is given the flag. The CPU stand-in, with no
    vLLM, refuses it in one line."""
    cell = sweep.Cell(1, 8, 512)
    off = sweep.plan_cell(LAB, sweep.Host("gpu"), {}, cell).sheet
    on = sweep.plan_cell(LAB, sweep.Host("gpu"), {"unsloth_vllm_standby": True}, cell).sheet
    assert "train" in off.line("kv_cache").phases and "train" not in on.line("kv_cache").phases
    assert on.phases["train"] < off.phases["train"]
    words = sweep._forwarded(Path("/out"), {"unsloth_vllm_standby": True})
    assert words[words.index("--unsloth-vllm-standby") + 1] == "true"
    with pytest.raises(LabSettingsError, match="fast_inference is false"):
        sweep.plan_cell(LAB, sweep.Host("cpu"), {"unsloth_vllm_standby": True}, sweep.Cell(4, 8, 32))
