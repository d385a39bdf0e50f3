"""Chapter 6's claims, read from the suite's one run of its README command (the root conftest.py's
`chapter_run`), which ships chapter 1's README run: the suite runs it after chapter 1's, on a copy of
that store (lab.toml's `starts_from`). Each stage scored against the training run's logged accuracy, the
16-bit merge loadable by transformers alone, the 4-bit merge's loss measured, the GGUF file equal to
the merge tensor for tensor, the registered version served over HTTP, and the verdict on the Overview.

Two more lab processes: the chapter's command on an empty store (it trains chapter 1's short form
first, and says so) stopped by SIGTERM as its server starts, which ends the ship run KILLED with
nothing of it left: no folder, no registered version. The refusals, one line each, in this process.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from grpolab.config.errors import LabSettingsError
from grpolab.lifecycle.endings import HOLD_PHASE_ENV, PHASE_PREFIX, SHOW_PHASES_ENV

from suite import (
    Lab,
    chapter,
    cpu_only,
    gpu_only,
    load_lab_module,
    prose,
    run_in_process,
    script_and_args,
    table_rows,
)

LAB_DIR = Path(__file__).resolve().parent
README_FROM_RUN = "uv run python labs/grpo-ship/train.py --from <run id>"
README_BUDGET = "uv run python labs/grpo-ship/train.py --budget-only"
STAGES = ("reload", "merged_16bit", "merged_4bit", "gguf", "served")

CPU_RUN = cpu_only("reads the CPU profile's ship run; on a GPU the same command ships Qwen3-4B's adapter")


@pytest.fixture(scope="module")
def lab():
    return load_lab_module(LAB_DIR)


@pytest.fixture
def shipped(chapter_run):
    """The ship run, the chapter 1 run it shipped (the only one in the copied store), and its figures."""
    assert chapter_run.code == 0, chapter_run.log()
    (ship,) = chapter_run.top
    first = chapter_run.client.get_experiment_by_name("grpo-first")
    (trained,) = chapter_run.client.search_runs([first.experiment_id])
    return chapter_run, ship, trained


def right(accuracy: float, prompts: int = 64) -> int:
    return round(accuracy * prompts)


@pytest.mark.slow
@CPU_RUN
def test_it_ships_chapter_1s_finished_run_in_a_ship_run_that_names_it(shipped):
    chapter_run, ship, trained = shipped
    assert ship.info.status == "FINISHED"
    tags = ship.data.tags
    assert (tags["run_kind"], tags["ship.source_run"], tags["profile"]) == (
        "ship",
        trained.info.run_id,
        "cpu",
    )
    assert trained.info.status == "FINISHED" and trained.data.tags["run_kind"] == "train"
    assert f"Shipping run {trained.info.run_id}" in chapter_run.stdout
    # The sheet's line for the merge, before anything loads: the stand-in's parameters at 2 bytes.
    assert "merged_16bit  157.38 KiB of host memory" in chapter_run.stdout
    assert int(ship.data.params["merge_host_bytes"]) == 80_576 * 2


@pytest.mark.slow
@CPU_RUN
def test_each_stage_is_scored_against_the_adapters_logged_accuracy(shipped):
    _, ship, trained = shipped
    logged = trained.data.metrics["eval/adapter_accuracy"]
    m = ship.data.metrics
    assert m["ship/adapter/accuracy"] == logged
    for stage in STAGES:
        assert m[f"ship/{stage}/accuracy_diff"] == pytest.approx(m[f"ship/{stage}/accuracy"] - logged), stage
    # The reload is the same weights, loaded as a user loads them: exactly what was logged.
    assert m["ship/reload/accuracy"] == logged
    assert m["ship/reload/answers_changed"] == 0
    # Within one held-out prompt: the 16-bit merge, its GGUF file, and the registered version served.
    for stage in ("merged_16bit", "gguf", "served"):
        assert abs(right(m[f"ship/{stage}/accuracy"]) - right(logged)) <= 1, stage
    # The training it ships learned something the stages could lose (chapter 1's claims say how much).
    assert right(logged) - right(trained.data.metrics["eval/base_accuracy"]) >= 16


@pytest.mark.slow
@CPU_RUN
def test_the_16_bit_merge_is_a_folder_transformers_loads_alone_with_its_chat_template(shipped):
    _, ship, _ = shipped
    merged = Path(ship.data.tags["output_dir"]) / "merged_16bit"
    assert (merged / "config.json").is_file() and json.loads((merged / "config.json").read_text())[
        "dtype"
    ] == "float16"
    assert 0 < ship.data.metrics["ship/merged_16bit/max_logit_diff"] < 1
    # A fresh interpreter in which PEFT, Unsloth and bitsandbytes cannot be imported at all.
    probe = (
        "import sys\n"
        "for blocked in ('peft', 'unsloth', 'unsloth_zoo', 'bitsandbytes'): sys.modules[blocked] = None\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        f"model = AutoModelForCausalLM.from_pretrained({str(merged)!r})\n"
        f"tokenizer = AutoTokenizer.from_pretrained({str(merged)!r})\n"
        "print(type(model).__name__, bool(tokenizer.chat_template), model.dtype)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-3:] == ["Qwen3ForCausalLM", "True", "torch.float16"]


@pytest.mark.slow
@CPU_RUN
def test_the_4_bit_merge_is_measured_and_what_it_changed_explained(shipped):
    _, ship, trained = shipped
    m = ship.data.metrics
    below, same = m["ship/merged_4bit/delta_below_half_step"], m["ship/merged_4bit/delta_rounded_away"]
    # The explanation, as measured: most of the adapter's changes are under half a 4-bit step, and
    # requantizing gives most of those weights back the base's code; its logits move far more than the
    # 16-bit merge's, and it answers held-out prompts differently from the adapter.
    assert below > 0.5 and same > 0.5 and m["ship/merged_4bit/median_delta_over_half_step"] < 1
    assert m["ship/merged_4bit/max_logit_diff"] > 10 * m["ship/merged_16bit/max_logit_diff"]
    assert m["ship/merged_4bit/answers_changed"] > m["ship/merged_16bit/answers_changed"]
    # The verdict says what it did to the score: kept within a prompt, lost, or another model (higher).
    diff = right(m["ship/merged_4bit/accuracy"]) - right(trained.data.metrics["eval/adapter_accuracy"])
    first = ship.data.tags["mlflow.note.content"].split("\n")[0]
    said = (
        "Lost it: merged_4bit"
        if diff < -1
        else "Another model than the one trained: merged_4bit"
        if diff > 1
        else None
    )
    assert said is None or said in first, first
    assert "of the adapter's" in ship.data.tags["mlflow.note.content"]


@pytest.mark.slow
@CPU_RUN
def test_the_pages_quote_this_runs_figures_digit_for_digit(shipped):
    """The CPU profile computes the same bits on every x86-64 machine (docs/every-machine.md), so the
    chapter's table and the README's row quote this ship run wherever the suite runs: each stage's
    held-out score and changed answers, and what the 4-bit merge rounded away. Where a machine computes
    otherwise, the pages' claim is false there, and this says so."""
    _, ship, trained = shipped
    m, n = ship.data.metrics, 64
    adapter = right(trained.data.metrics["eval/adapter_accuracy"])
    table = {row[0]: row[1:4] for row in table_rows(LAB_DIR / "README.md", 5) if row[0] in STAGES}
    assert set(table) == set(STAGES), set(table)
    for stage in STAGES:
        got = right(m[f"ship/{stage}/accuracy"])
        said = [
            f"{got}/{n} ({got / n:.1%})",
            f"{got - adapter:+d} prompts",
            f"{m[f'ship/{stage}/answers_changed']:.0f}",
        ]
        assert table[stage] == said, stage
    kept = [s for s in STAGES if s != "merged_4bit" and m[f"ship/{s}/answers_changed"] == 0]
    assert len(kept) == 4, kept  # the row's "answers all 64 as trained"
    below, away = m["ship/merged_4bit/delta_below_half_step"], m["ship/merged_4bit/delta_rounded_away"]
    row = chapter(LAB_DIR.name).measured
    assert (
        f"chapter 1's adapter ({adapter} of {n} held-out prompts)" in row
        and f"answers all {n} as trained" in row
    )
    four_bit = f"merged in 4 bit, {away:.0%} of its weight changes round away and {m['ship/merged_4bit/answers_changed']:.0f} answers change"
    assert four_bit in row, f"the README's row does not quote this run: {four_bit!r}"
    page = prose(LAB_DIR / "README.md")
    assert (
        f"{below:.1%} of the adapter's" in page
        and f"are under half a 4-bit step, {away:.1%} of those weights kept" in page
    )


@pytest.mark.slow
@CPU_RUN
def test_the_gguf_file_holds_the_merge_tensor_for_tensor(shipped):
    _, ship, _ = shipped
    m = ship.data.metrics
    assert m["ship/gguf/tensors"] == 24  # 2 layers x 11, the embeddings and the final norm; tied: no output
    assert m["ship/gguf/max_tensor_diff"] == 0
    gguf = Path(ship.data.tags["output_dir"]) / "model-f16.gguf"
    assert gguf.is_file() and gguf.read_bytes()[:4] == b"GGUF"
    assert "llama.cpp's converter is not installed" in ship.data.tags["mlflow.note.content"]


@pytest.mark.slow
@CPU_RUN
def test_the_merge_is_registered_with_its_training_run_and_served_over_http(shipped):
    chapter_run, ship, trained = shipped
    uri = ship.data.tags["ship.registered_model"]
    name, _, version = uri.removeprefix("models:/").partition("/")
    found = chapter_run.client.get_model_version(name, version)
    assert found.tags["training_run"] == trained.info.run_id and found.tags["ship_run"] == ship.info.run_id
    assert found.run_id == ship.info.run_id and trained.info.run_id in found.description
    assert "mlflow models serve --env-manager local" in ship.data.tags["mlflow.note.content"]


@pytest.mark.slow
@CPU_RUN
def test_the_overview_opens_with_the_verdict_and_logs_the_chart(shipped):
    chapter_run, ship, _ = shipped
    note = ship.data.tags["mlflow.note.content"]
    assert note.startswith("Kept what GRPO taught")
    kept = note.split("\n")[0].partition(":")[2].partition(".")[0]
    assert all(stage in kept for stage in ("reload", "merged_16bit", "gguf", "served"))
    assert "| stage | held-out right |" in note
    files = {f.path for f in chapter_run.client.list_artifacts(ship.info.run_id, "ship")}
    assert {"ship/accuracy_by_stage.png", "ship/stages.json"} <= files
    assert note.split("\n")[0] in chapter_run.stdout


# --- a stop, on a store with no run to ship -----------------------------------------------------------
@pytest.mark.slow
@CPU_RUN
def test_on_an_empty_store_it_trains_the_short_form_and_a_stop_leaves_nothing_half_shipped(tmp_path):
    """The chapter's command where chapter 1 never ran: it says so, trains chapter 1's short form (two
    steps here) as a run of chapter 1, then SIGTERM as its server starts (the merge registered by then)
    ends the ship run KILLED and removes its folder and the version it registered."""
    import mlflow

    def stop_at_the_server(lab: Lab, line: str) -> None:
        if line.startswith(f"{PHASE_PREFIX}the server's start") and not getattr(lab, "sent", False):
            lab.sent = True
            lab.send_signal(signal.SIGTERM)

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "out"
    lab = Lab(
        "ship-empty",
        LAB_DIR / "train.py",
        ["--max-steps", "2", "--eval-prompts", "8", "--output-dir", str(out)],
        uri,
        tmp_path,
        on_line=stop_at_the_server,
        env={SHOW_PHASES_ENV: "1", HOLD_PHASE_ENV: "the server's start"},
    )
    code = lab.wait(timeout=900)
    assert code == 128 + signal.SIGTERM, lab.log()
    assert "no FINISHED run of grpo-first in this store" in lab.stdout
    assert "trains chapter 1's short form first (2 steps)" in lab.stdout
    client = mlflow.MlflowClient(uri)
    (trained,) = client.search_runs([client.get_experiment_by_name("grpo-first").experiment_id])
    assert trained.info.status == "FINISHED" and trained.data.params["max_steps"] == "2"
    (ship,) = client.search_runs([client.get_experiment_by_name("grpo-ship").experiment_id])
    assert (ship.info.status, ship.data.tags["ending"]) == ("KILLED", "SIGTERM")
    assert ship.data.tags["ship.source_run"] == trained.info.run_id
    assert not (out / "grpo-ship").exists() or not any((out / "grpo-ship").iterdir())
    assert "merged_16bit" in lab.stdout and "gguf" in lab.stdout  # it got as far as the registration
    assert client.search_registered_models() == []


# --- refusals: one line, exit 2, nothing written -------------------------------------------------------
@pytest.mark.slow
@CPU_RUN
def test_the_budget_line_alone_loads_nothing(lab, tmp_path):
    _, args = script_and_args(README_BUDGET)
    ended = run_in_process(lab, args, uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert ended.code == 0, ended.stderr
    assert "merged_16bit  157.38 KiB of host memory and 472.12 KiB of disk" in ended.stdout
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
@CPU_RUN
def test_a_run_id_the_store_does_not_have_is_one_line(lab, shipped, tmp_path):
    chapter_run, _, _ = shipped
    _, args = script_and_args(README_FROM_RUN.replace("<run id>", "0123456789abcdef"))
    ended = run_in_process(lab, args, uri=chapter_run.uri)
    assert ended.code == 2 and ended.stderr.strip().count("\n") == 0, ended.stderr
    assert "'0123456789abcdef' is neither a run id of this store nor a folder" in ended.stderr


@pytest.mark.slow
@CPU_RUN
def test_a_port_in_use_is_refused_before_anything_loads(lab, tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        ended = run_in_process(lab, ["--port", str(port)], uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert ended.code == 2, ended.stderr
    assert (
        ended.stderr.strip()
        == f"error: ship: port {port} is in use: pass another --port, or 0 for any free one"
    )
    assert not (tmp_path / "mlflow.db").exists()  # refused before the store was opened


@pytest.mark.parametrize(
    "flag", [["--resume", "last"], ["--rehearse"], ["--eval-only", "x"], ["--budget-only", "--json"]]
)
def test_a_training_flag_is_refused_in_one_line(lab, tmp_path, flag):
    ended = run_in_process(lab, flag, uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert ended.code == 2 and ended.stderr.strip().count("\n") == 0, ended.stderr
    assert ended.stderr.startswith(
        f"error: ship: {flag[-1] if flag[-1].startswith('--') else flag[0]} is for a training run"
    )
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
@CPU_RUN
def test_an_adapter_of_another_shape_and_a_full_disk_are_one_line(shipped, tmp_path):
    import shutil

    from budgets.shipping import MergeCost
    from grpolab.chapters.ship import lab as ship_lab
    from grpolab.chapters.ship import source

    chapter_run, _, trained = shipped
    found = source.find(trained.info.run_id, chapter_run.client, ship_lab.FIRST_DIR, "cpu")
    other = tmp_path / "adapter"
    shutil.copytree(found.adapter_dir, other)
    config = json.loads((other / "adapter_config.json").read_text())
    (other / "adapter_config.json").write_text(json.dumps({**config, "r": config["r"] * 2}))
    found.adapter_dir = other
    with pytest.raises(
        LabSettingsError, match=r"holds another LoRA shape \(r \d+ \(run: \d+\)\) than run \w+ trained"
    ):
        source.check_shape(found)
    with pytest.raises(
        LabSettingsError, match=r"free and the merge needs .* pass --output-dir on a larger disk"
    ):
        ship_lab._check_disk(tmp_path, MergeCost("huge", 1, 1 << 60, 3))


@pytest.mark.slow
@CPU_RUN
def test_an_adapter_whose_folder_is_gone_is_fetched_from_its_runs_artifacts(shipped, tmp_path, monkeypatch):
    from types import SimpleNamespace

    from grpolab.chapters.ship import source

    chapter_run, _, trained = shipped
    monkeypatch.setenv("GRPOLAB_CACHE", str(tmp_path / "cache"))
    original = Path(trained.data.tags["output_dir"]) / "adapter"
    gone = SimpleNamespace(
        info=trained.info,
        data=SimpleNamespace(tags={**trained.data.tags, "output_dir": str(tmp_path / "gone")}),
    )
    fetched = source._adapter_of(gone, chapter_run.client)
    assert fetched == tmp_path / "cache" / "adapters" / trained.info.run_id
    for name in source.ADAPTER_FILES:
        assert (fetched / name).read_bytes() == (original / name).read_bytes()
    assert source._adapter_of(gone, chapter_run.client) == fetched  # fetched once, then the cache's
    assert [p.name for p in fetched.parent.iterdir()] == [trained.info.run_id]  # nothing half-fetched


@pytest.mark.slow
@CPU_RUN
def test_the_reload_check_names_an_adapter_that_is_not_the_saved_one(shipped, stack, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from grpolab.chapters.ship import lab as ship_lab
    from grpolab.chapters.ship import source, stages

    chapter_run, _, trained = shipped
    found = source.find(trained.info.run_id, chapter_run.client, ship_lab.FIRST_DIR, "cpu")
    model, _ = stages.load_adapter_as_a_user_does(found.adapter_dir, found.settings)
    assert stages.adapter_applied(model, found.adapter_dir) == ""
    # Another adapter's tensors on disk: one of them differs from what the model holds.
    other = tmp_path / "adapter"
    shutil.copytree(found.adapter_dir, other)
    weights = load_file(str(other / "adapter_model.safetensors"))
    first = sorted(weights)[0]
    weights[first] = weights[first] + 1
    save_file(weights, str(other / "adapter_model.safetensors"))
    said = stages.adapter_applied(model, other)
    assert (
        said
        == f"only {len(weights) - 1} of the adapter's {len(weights)} tensors are the saved ones: another adapter answered"
    )
    with model.disable_adapter():
        assert (
            stages.adapter_applied(model, found.adapter_dir)
            == "the adapter is attached but disabled: the base answered"
        )


def test_no_finished_run_is_said_in_one_line_with_what_to_do(tmp_path):
    import mlflow

    from grpolab.chapters.ship import lab as ship_lab
    from grpolab.chapters.ship import source

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    with pytest.raises(source.NoFinishedRun) as refused:
        source.find("last", client, ship_lab.FIRST_DIR, "gpu")
    assert str(refused.value).startswith(
        "ship: no FINISHED run of grpo-first in this store: run `uv run python"
    )


# --- on a GPU ---------------------------------------------------------------------------------------
@pytest.mark.slow
@gpu_only(
    "chapter 1's short form on Qwen3-4B (5 steps), then its adapter shipped: reload through Unsloth's "
    "vLLM engine equal to the logged accuracy, Unsloth's save_pretrained_merged(merged_16bit) within one "
    "held-out prompt, the GGUF file equal to the merge, and `vllm serve` on the merge scored over HTTP"
)
def test_on_a_gpu_it_ships_qwen3_4b_with_unsloth_merges_and_vllm_serves(tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = Lab(
        "first",
        LAB_DIR.parent / "grpo-first" / "train.py",
        ["--max-steps", "5", "--eval-prompts", "8", "--output-dir", str(tmp_path / "out")],
        uri,
        tmp_path,
    )
    assert first.wait(timeout=3600) == 0, first.log()
    ship = Lab("ship", LAB_DIR / "train.py", ["--output-dir", str(tmp_path / "out")], uri, tmp_path)
    assert ship.wait(timeout=3600) == 0, ship.log()
    client = mlflow.MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("grpo-ship").experiment_id])
    m = run.data.metrics
    assert m["ship/reload/accuracy_diff"] == 0
    assert abs(m["ship/merged_16bit/accuracy_diff"]) * 8 <= 1 and m["ship/gguf/max_tensor_diff"] == 0
    assert "vLLM's OpenAI-compatible server" in run.data.tags["mlflow.note.content"]
