"""The memory probe on CPU, the tensor accounting against bitsandbytes, and MLflow run endings."""

from __future__ import annotations

import contextlib
import os
import resource
import time

import mlflow
import pytest
import torch

from grpolab.lifecycle import tracking
from grpolab.memory.device import Device
from grpolab.memory.oom import blame, is_out_of_memory
from grpolab.memory.probe import MemoryProbe
from grpolab.memory.tensors import model_bytes_by_kind, optimizer_state_bytes, quant_state_bytes

CPU = Device("cpu")


def held_for_samples(probe: MemoryProbe, samples: int = 2, timeout_s: float = 60) -> None:
    """Wait until the probe's thread has sampled `samples` times: a peak that lasts that long is one it
    must catch, however busy the machine (on a loaded one, 50 ms can pass between two samples)."""
    sampler = probe._sampler
    wanted, deadline = sampler.samples + samples, time.monotonic() + timeout_s
    while sampler.samples < wanted and time.monotonic() < deadline:
        time.sleep(0.001)
    assert sampler.samples >= wanted, "the probe's thread never sampled"


def test_probe_catches_a_short_peak_inside_its_phase():
    probe = MemoryProbe(CPU, interval_s=0.002).start()
    try:
        with probe.phase("idle") as idle:
            held_for_samples(probe)
        with probe.phase("spike") as spike:
            block = torch.ones(64 * 1024 * 1024 // 4)  # 64 MiB, touched so it is resident
            held_for_samples(probe)  # a spike two samples long: gone before the phase's own read
            del block
        assert spike.process_bytes - idle.process_bytes > 48 * 1024**2
        assert [p.name for p in probe.phases] == ["idle", "spike"]
        assert probe.host_runtime_bytes and probe.host_runtime_bytes > 0
    finally:
        probe.stop()


@pytest.mark.slow  # it forks a child
def test_the_resident_set_is_read_as_psutil_reads_it_in_the_process_that_asks():
    """The probe keeps its /proc/<pid>/statm open; a child forked after a read (every forked lab)
    reads its own resident set, not its parent's."""
    import psutil

    from grpolab.memory.probe import _rss_bytes

    assert abs(_rss_bytes() - psutil.Process().memory_info().rss) < 4 * 1024**2
    _rss_bytes()  # the parent's descriptor is open when the child is forked
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        before = _rss_bytes()
        block = torch.ones(96 * 1024 * 1024 // 4)  # 96 MiB, touched so it is resident
        os.write(write, f"{before} {_rss_bytes()} {psutil.Process().memory_info().rss}".encode())
        del block
        os._exit(0)
    os.close(write)
    before, after, by_psutil = map(int, os.read(read, 100).split())
    os.waitpid(pid, 0)
    assert abs(after - by_psutil) < 4 * 1024**2
    assert after - before > 64 * 1024**2, "the child read a resident set that did not hold its block"


def test_nested_phases_credit_the_peak_to_both_and_remember_the_failing_phase():
    probe = MemoryProbe(CPU, interval_s=0.002).start()
    try:
        with pytest.raises(RuntimeError), probe.phase("train") as outer:
            with probe.phase("train_step", keep=False) as inner:
                block = torch.ones(32 * 1024 * 1024 // 4)
                held_for_samples(probe)
                del block
            raise RuntimeError("boom")
        assert outer.process_bytes >= inner.process_bytes > 0
        assert probe.failed_phase == "train_step" or probe.failed_phase == "train"
        assert [p.name for p in probe.phases] == ["train"]
    finally:
        probe.stop()


def test_four_bit_bytes_are_what_bitsandbytes_allocates():
    import bitsandbytes as bnb

    layer = bnb.nn.Linear4bit(256, 512, bias=False, quant_type="nf4", compress_statistics=True)
    layer.weight = bnb.nn.Params4bit(torch.randn(512, 256), requires_grad=False, quant_type="nf4")
    layer.weight._quantize("cpu")
    packed = layer.weight.data.numel() * layer.weight.data.element_size()
    assert packed == 512 * 256 // 2
    qs = layer.weight.quant_state
    expected = sum(t.numel() * t.element_size() for t in (qs.absmax, qs.code))
    expected += sum(t.numel() * t.element_size() for t in (qs.state2.absmax, qs.state2.code))
    if qs.offset is not None:
        expected += qs.offset.numel() * qs.offset.element_size()
    assert quant_state_bytes(layer.weight) == expected > 0
    assert model_bytes_by_kind(layer)["base_weights"] == packed + expected


def test_lora_and_ref_adapter_bytes_are_split_by_kind():
    from peft import LoraConfig, get_peft_model

    from grpolab.tiny_model import build_model

    model = get_peft_model(build_model(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    model.add_adapter("ref", model.peft_config["default"])  # what TRL does when beta > 0
    kinds = model_bytes_by_kind(model)
    lora = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".default." in n)
    assert kinds["lora_params"] == lora
    assert kinds["reference_policy"] == lora


def test_optimizer_states_are_counted_once_per_tensor():
    p = torch.nn.Parameter(torch.randn(10, 10))
    opt = torch.optim.AdamW([p])
    p.grad = torch.ones_like(p)
    opt.step()
    assert optimizer_state_bytes(opt) == 2 * 100 * 4


def test_out_of_memory_errors_are_recognised():
    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes")
    )
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))


def test_a_memory_error_inside_torch_compile_is_out_of_memory():
    """Seen under --memory-cap-gib with Unsloth's trainer: dynamo wraps the MemoryError it hit."""
    from torch._dynamo.exc import InternalTorchDynamoError

    try:
        try:
            raise MemoryError()
        except MemoryError as inner:
            raise InternalTorchDynamoError("MemoryError: ") from inner
    except InternalTorchDynamoError as error:
        assert is_out_of_memory(error)
    try:
        try:
            raise ValueError("bad shape")
        except ValueError as inner:
            raise InternalTorchDynamoError("ValueError: bad shape") from inner
    except InternalTorchDynamoError as error:
        assert not is_out_of_memory(error)


def test_a_onednn_kernel_that_cannot_be_built_is_out_of_memory_only_under_a_memory_limit(monkeypatch):
    # Seen under --memory-cap-gib: the JIT kernel's allocation fails inside oneDNN, not torch's allocator.
    error = RuntimeError("could not create a primitive")
    unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    monkeypatch.setattr(resource, "getrlimit", lambda which: unlimited)
    assert not is_out_of_memory(error)
    monkeypatch.setattr(resource, "getrlimit", lambda which: (2 * 1024**3, resource.RLIM_INFINITY))
    assert is_out_of_memory(error)
    assert not is_out_of_memory(ValueError("could not create a primitive"))


@pytest.mark.parametrize(
    ("error", "status"),
    [(None, "FINISHED"), (ValueError("crash"), "FAILED"), (KeyboardInterrupt(), "KILLED")],
)
def test_a_run_ends_with_the_status_it_earned_and_keeps_what_it_logged(store, error, status):
    expectation = pytest.raises(type(error)) if error else contextlib.nullcontext()
    with expectation, tracking.lab_run("test-chapter", "r", {"profile": "cpu"}) as run:
        mlflow.log_metric("reward", 0.5)
        if error:
            raise error
    finished = mlflow.get_run(run.info.run_id)
    assert finished.info.status == status
    assert finished.data.metrics["reward"] == 0.5
    # Why it ended: a tag to filter on, and the cause as the description of a run that did not finish.
    ending = {"FINISHED": "finished", "FAILED": "exception", "KILLED": "SIGINT"}[status]
    assert finished.data.tags["ending"] == ending
    note = {"FAILED": "Failed: ValueError: crash.", "KILLED": "Interrupted by SIGINT (Ctrl-C)."}.get(status)
    assert finished.data.tags.get("mlflow.note.content") == note
    # Whose run it is: enough to tell later whether its process still lives.
    assert finished.data.tags["process.pid"] == str(os.getpid())
    assert float(finished.data.tags["process.start_time"]) > 0


def test_the_line_to_blame_for_an_out_of_memory():
    budget = {"kv_cache": 1, "train_activations": 1, "base_weights": 1}
    # A line measured well over its budget is the culprit, whatever the phase.
    assert blame("generate", {"base_weights": 0.3, "kv_cache": 0.01}, budget) == "base_weights"
    # Otherwise the line that grows in the phase that ran out; without vLLM, generate's own cache.
    assert blame("generate", {"base_weights": 0.01}, budget) == "kv_cache"
    assert blame("generate", {}, {"generate_kv_cache": 1}) == "generate_kv_cache"
    assert blame("train_step", {}, budget) == "train_activations"


def test_the_default_store_is_the_repository_sqlite_file(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking.tracking_uri() == f"sqlite:///{tracking.REPO_ROOT / 'mlflow.db'}"


def test_a_relative_store_keeps_its_artifacts_beside_it(tmp_path, monkeypatch):
    """`MLFLOW_TRACKING_URI=sqlite:///mlflow.db`, MLflow's own example, is a file in the working
    folder: a chapter's first run there made its experiment with `mlruns/<chapter>` beside it, not
    "relative path can't be expressed as a file URI" (the README's quick matrix met that too)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db")
    tracking.client()
    found = tracking.client().get_experiment(tracking.experiment_id("grpo-first"))
    assert found.artifact_location == (tmp_path / "mlruns" / "grpo-first").as_uri()
    assert tracking.artifact_location("sqlite:///:memory:", "grpo-first") is None


def schema(path) -> list:
    """A SQLite store's tables, indexes and rows, as a list to compare (its experiments' times and
    artifact folders left out: they are the store's own). A statement's clauses are compared as a
    set: MLflow's migrations write a table's constraints in an order that changes from one process to
    the next (they come from a set of names, and Python salts each process's string hashes)."""
    import sqlite3

    def clauses(sql: str | None) -> list[str]:
        return sorted(line.strip().rstrip(",").strip() for line in (sql or "").splitlines())

    with contextlib.closing(sqlite3.connect(path)) as db:
        found = sorted(
            (t, n, clauses(sql)) for t, n, sql in db.execute("SELECT type, name, sql FROM sqlite_master")
        )
        names = [n for t, n, _ in found if t == "table" and n != "experiments"]
        rows = [(n, sorted(map(repr, db.execute(f'SELECT * FROM "{n}"')))) for n in names]
        experiments = sorted(db.execute("SELECT experiment_id, name, lifecycle_stage FROM experiments"))
    return [found, rows, experiments]


@pytest.mark.slow
def test_a_new_store_is_the_migrated_schema_copied_and_mlflow_opens_it_as_its_own(tmp_path, monkeypatch):
    """A lab's new store starts as a copy of MLflow's migrated schema: the same tables, indexes and
    rows as a store MLflow creates itself, its Default experiment made by MLflow as it opens the copy,
    and no migration run once the template exists."""
    from mlflow.store.db import utils as db_utils

    from grpolab.config.paths import CACHE_ENV
    from grpolab.lifecycle import store

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    (tmp_path / "mlflow").mkdir()
    (own,) = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}").search_experiments()

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'first' / 'mlflow.db'}")
    (tmp_path / "first").mkdir()
    tracking.client().search_experiments()  # builds the template, then copies it
    assert schema(tmp_path / "first" / "mlflow.db") == schema(tmp_path / "mlflow" / "mlflow.db")
    assert [p.name for p in (tmp_path / "cache" / "mlflow-schema").iterdir()] == [
        store.schema_template().name
    ], "one template, nothing partial beside it"

    def migrate(engine):
        raise AssertionError("a new store was migrated, not copied")

    monkeypatch.setattr(db_utils, "_initialize_tables", migrate)
    second = tmp_path / "second"
    second.mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{second / 'mlflow.db'}")
    (default,) = tracking.client().search_experiments()
    assert (default.name, default.artifact_location) == ("Default", own.artifact_location)
    assert sorted(p.name for p in second.iterdir()) == ["mlflow.db"], "the copy was renamed into place"


def test_run_context_records_versions_and_the_lock(store):
    versions = tracking.library_versions()
    assert versions["version/trl"] == "1.15.0"
    assert len(tracking.lock_hash()) == 64


def test_a_peak_reset_by_vllm_during_the_load_still_counts_for_the_load(monkeypatch):
    """vLLM resets torch's peak counters while it starts (torch.accelerator's reset in its memory
    profiling, torch.cuda's through its platform): the probe credits the peak to the open phases first.
    torch.cuda's counters are stand-ins here (no GPU); NVML's figure comes from the device."""
    from types import SimpleNamespace

    counters = {"allocated": 0, "peak": 0}

    def allocate(n):
        counters["allocated"] += n
        counters["peak"] = max(counters["peak"], counters["allocated"])

    def reset(*args, **kwargs):
        counters["peak"] = counters["allocated"]

    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: counters["peak"])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a: counters["peak"])
    for owner in (torch.cuda, torch.cuda.memory, torch.accelerator):
        monkeypatch.setattr(owner, "reset_peak_memory_stats", reset)
    used = {"bytes": 0}
    card = SimpleNamespace(
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=used["bytes"]),
        nvmlDeviceGetComputeRunningProcesses=lambda h: [],
    )
    probe = MemoryProbe(Device("cuda", _nvml=card, _handle=None))
    probe.guard_peak_resets()
    try:
        with probe.phase("load") as load:
            allocate(5 << 30)  # the weights and the profiling pass: a 5 GiB peak ...
            counters["allocated"] -= 4 << 30  # ... freed again
            torch.accelerator.reset_peak_memory_stats()  # vLLM's memory profiling starts
            allocate(1 << 29)
            torch.cuda.reset_peak_memory_stats(0)  # and its platform's reset
        assert load.torch_allocated_bytes == 5 << 30
    finally:
        probe.stop()
    assert torch.accelerator.reset_peak_memory_stats is reset  # put back
