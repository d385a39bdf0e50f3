"""MLflow tracking for the labs: where runs go, what every run records, how a run ends.

Runs go to `MLFLOW_TRACKING_URI` when it is set, else to `mlflow.db` (SQLite) at the repository
root; a SQLite store keeps its artifacts beside it under `mlruns/<chapter>`. The README's UI
command opens that same store. One experiment per chapter.

A run that does not finish never says FINISHED: `lab_run` ends it as KILLED on Ctrl-C, SIGTERM or
SIGHUP and FAILED on any exception, keeping what was logged before, with the cause in its tag `ending`
and at the top of its description; runs whose process died without closing them are reconciled when
the next lab starts (`grpolab.lifecycle.endings`). A new SQLite store is created and migrated under a lock, so
two first runs started at once cannot race in MLflow's schema migration. Each budget line is logged
as a section of its own (`kv_cache/budget_gib`, `kv_cache/measured_gib`, ...) so the UI's metrics view
shows the pair together, in the run's memory unit (`memory_unit`: GiB on a GPU, MiB on the CPU
stand-in), named in every key. The figures a reader looks at first are also in the section that
MLflow lists first, `at a glance` (`glance`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from grpolab.config.paths import DEFAULT_DB, REPO_ROOT
from grpolab.memory.names import MEMORY_UNITS, memory_key, memory_unit

LIBRARIES = (
    "torch",
    "transformers",
    "trl",
    "peft",
    "unsloth",
    "unsloth_zoo",
    "vllm",
    "vllm-bnb-plugin",
    "bitsandbytes",
    "datasets",
    "mlflow",
)


# MLflow 3's UI reads the experiment's kind from this tag; "custom_model_development" is its Model
# training kind (the UI's ExperimentKind enum), against "genai_development".
EXPERIMENT_KIND, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"

# How MLflow's exporter writes a trace. By default it writes each span as the batch holding it ends,
# then the trace: the spans' write has already made the trace's row, so the trace's INSERT collides
# and MLflow falls back to merging its assessments one at a time (a SELECT and an INSERT each, about
# 26 for a group of 8). Written whole (`write_traces_whole`), as MLflow writes a trace to a store
# that keeps no spans: one INSERT of the trace with its assessments, its spans the trace's data file
# beside the run's artifacts. 80 group traces of 8 beside a busy main thread took 5.4 to 6.9 s of CPU
# the first way, 1.1 s whole (2026-12-07, a 2-core AMD EPYC): about 55 ms less a trace, a few per cent
# of a CPU lab. What the Traces tab and `search_traces` show is the same. The spans reach the
# exporter at most TRACE_SPAN_BATCH at a time, at least every TRACE_SPAN_INTERVAL_MS (MLflow's 5 s
# would leave a process that dies, SIGKILL or the OOM killer, without the traces of its last steps).
TRACE_SPAN_BATCH = 512
TRACE_SPAN_INTERVAL_MS = 200


def write_traces_whole() -> None:
    """Make MLflow write each trace once, whole, when its root span ends: its assessments with it, its
    spans as its data file (`traces.json` under the experiment's artifacts), never span by span. It
    is the path MLflow itself takes for a store that cannot log spans (its exporter's
    `_store_supports_log_spans`, cleared here on each exporter it makes); read back, a trace is the
    same. Idempotent."""
    from mlflow.tracing import provider
    from mlflow.tracing.export.mlflow_v3 import MlflowV3SpanExporter

    made = MlflowV3SpanExporter.__init__
    if getattr(made, "writes_traces_whole", False):
        return

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        self._store_supports_log_spans = False

    __init__.writes_traces_whole = True  # type: ignore[attr-defined]
    MlflowV3SpanExporter.__init__ = __init__
    provider.reset()  # an exporter made before this one (tracing already set up) is made again


def isolate_trace_ids() -> None:
    """Trace ids from a generator of MLflow's own (`MLFLOW_TRACE_USE_ISOLATED_RANDOM_ID_GENERATOR`,
    unless set). OpenTelemetry's draws them from Python's `random`, which every lab seeds: two runs of
    one seed in one store wrote the same ids, and the later run took the earlier one's traces (its
    Traces tab empty, their assessments added up). Read when MLflow next makes its tracer."""
    from mlflow.tracing import provider

    os.environ.setdefault("MLFLOW_TRACE_USE_ISOLATED_RANDOM_ID_GENERATOR", "true")

    # The generator forgets itself in a set its module holds; collected as the interpreter exits,
    # after the module's globals are cleared, it printed "Exception ignored in ... __del__" at the end
    # of every lab.
    def __del__(self) -> None:
        generators = provider._private_random_generators
        if generators is not None:
            generators.discard(self._random)

    provider._IsolatedRandomIdGenerator.__del__ = __del__


def tracking_uri() -> str:
    """The store every lab, notebook and the README's UI command share."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{DEFAULT_DB}"


def use_store() -> str:
    """Point MLflow at the lab store; returns its URI."""
    import mlflow

    # Read when the tracking URI (re)starts MLflow's tracer; a value the user set stays.
    os.environ.setdefault("MLFLOW_ASYNC_TRACE_LOGGING_MAX_SPAN_BATCH_SIZE", str(TRACE_SPAN_BATCH))
    os.environ.setdefault("MLFLOW_ASYNC_TRACE_LOGGING_MAX_INTERVAL_MILLIS", str(TRACE_SPAN_INTERVAL_MS))
    isolate_trace_ids()
    write_traces_whole()  # after isolate_trace_ids: it makes MLflow's tracer again
    uri = tracking_uri()
    mlflow.set_tracking_uri(uri)
    return uri


def client():
    """MLflow's client on the lab store. A new SQLite store is created here, under
    `store.setup_lock`: two processes that open a new store at once would otherwise both migrate it
    and one would die ("duplicate column name: step"). It starts as a copy of the migrated schema
    (`store.new_sqlite_store`)."""
    import mlflow

    from grpolab.lifecycle.store import new_sqlite_store, setup_lock, sqlite_path

    uri = use_store()
    with setup_lock(uri):
        path = sqlite_path(uri)
        if path is not None and not path.exists():
            new_sqlite_store(path)
        found = mlflow.MlflowClient(uri)
        found.search_experiments(max_results=1)  # opens the store: creates and migrates a new one
    return found


def experiment_id(chapter: str) -> str:
    """The chapter's experiment, created on first use (artifacts under mlruns/ for the default store);
    under the store's set-up lock, so two first runs do not both create it."""
    import mlflow

    from grpolab.lifecycle.store import setup_lock

    uri = use_store()
    with setup_lock(uri):
        found = mlflow.get_experiment_by_name(chapter)
        if found is not None:
            if found.tags.get(EXPERIMENT_KIND) != MODEL_TRAINING:  # a store from before the tag
                mlflow.MlflowClient().set_experiment_tag(found.experiment_id, EXPERIMENT_KIND, MODEL_TRAINING)
            return found.experiment_id
        try:
            return mlflow.create_experiment(
                chapter,
                artifact_location=artifact_location(uri, chapter),
                tags={EXPERIMENT_KIND: MODEL_TRAINING},
            )
        except mlflow.exceptions.MlflowException:  # a tracking server: another lab created it first
            found = mlflow.get_experiment_by_name(chapter)
            if found is None:
                raise
            return found.experiment_id


def artifact_location(uri: str, chapter: str) -> str | None:
    """Artifacts beside a SQLite store (mlruns/<chapter> next to the .db file), wherever the
    lab was started from; a tracking server, or a database in memory, decides for itself (None).
    A relative store (`sqlite:///mlflow.db`, MLflow's own example) is read from the working folder."""
    from grpolab.lifecycle.store import sqlite_path

    path = sqlite_path(uri)
    return None if path is None else (path.resolve().parent / "mlruns" / chapter).as_uri()


def process_tags() -> dict[str, str]:
    """What identifies the process that owns a run: whether it is still alive can be checked later."""
    import psutil

    me = psutil.Process()
    return {
        "process.host": socket.gethostname(),
        "process.pid": str(me.pid),
        "process.start_time": f"{me.create_time():.2f}",
    }


@contextmanager
def lab_run(
    chapter: str,
    run_name: str,
    tags: dict[str, str],
    system_metrics_interval_s: float | None = None,
    nested: bool = False,
    parent_run_id: str | None = None,
    resume_run_id: str | None = None,
) -> Iterator[Any]:
    """Start an MLflow run and end it with the status it earned, and why: FINISHED; KILLED on Ctrl-C,
    SIGTERM or SIGHUP (recorded by `endings.STOPS`, acted on at the harness's checks: the last one
    just before the run would end FINISHED); FAILED on any exception. The tag `ending` names the
    cause (finished, SIGTERM, exception, out of memory, disk full, ...); a run whose ending nobody
    described gets its description opened with it.

    First, runs of this host's store left RUNNING by a process that died are ended KILLED, a line
    each. With `system_metrics_interval_s`, MLflow's own system metrics (CPU, RAM, and GPU memory
    through NVML) are sampled at that interval beside the lab's probe. With `parent_run_id` the run
    is nested under that run, which another process holds open (a sweep's cell under its sweep).
    With `resume_run_id` that run is reopened (RUNNING again, this process's tags, its old ending
    cleared) and ends with the status this process earns.
    """
    from grpolab.lifecycle import endings

    stops = endings.STOPS
    with stops.armed():
        stops.enter("the MLflow run's start")  # a stop from before leaves no run
        run = _start(chapter, run_name, tags, system_metrics_interval_s, nested, parent_run_id, resume_run_id)
        stops.opened += 1
        try:
            stops.check()  # one that arrived while the run opened
            yield run
            stops.check()  # ... or during the run's last records: it has not ended yet
        except KeyboardInterrupt as stop:
            _end(run, "KILLED", endings.ending_of(stop), f"{endings.stop_cause(stop)}.")
            raise
        except BaseException as error:
            _end(run, "FAILED", endings.ending_of(error), f"Failed: {endings.error_line(error)}.")
            raise
        else:
            _end(run, "FINISHED", "finished")
        finally:
            stops.now(endings.AFTER_THE_RUN if not nested else "the parent run's bookkeeping")


def _start(chapter, run_name, tags, system_metrics_interval_s, nested, parent_run_id, resume_run_id):
    import mlflow

    from grpolab.lifecycle import endings

    for line in endings.reconcile(client()):
        print(line, flush=True)
    if system_metrics_interval_s is not None:
        mlflow.set_system_metrics_sampling_interval(system_metrics_interval_s)
    if resume_run_id is not None:
        run = mlflow.start_run(
            run_id=resume_run_id,
            tags={**tags, **process_tags()},
            log_system_metrics=system_metrics_interval_s is not None,
        )
        if "ending" in mlflow.get_run(resume_run_id).data.tags:
            mlflow.delete_tag("ending")  # the old ending is history now: the resumes tag keeps it
    else:
        run = mlflow.start_run(
            experiment_id=experiment_id(chapter),
            run_name=run_name,
            tags={**tags, **process_tags()},
            log_system_metrics=system_metrics_interval_s is not None,
            nested=nested,
            parent_run_id=parent_run_id,  # a run of another process (a sweep's cell): tag mlflow.parentRunId
        )
    return run


# Why each run of this process ended, as the harness described it: it opens the run's description.
_ENDINGS: dict[str, str] = {}
# A resumed run's resumes, as its description lists them after the ending.
_RESUMES: dict[str, str] = {}


def description(run_id: str, body: str = "") -> str:
    """The run's description: why it ended, its resumes, then `body` (the Overview's verdict and tables)."""
    return "\n\n".join(part for part in (_ENDINGS.get(run_id), _RESUMES.get(run_id), body) if part)


def describe_ending(ending: str, text: str) -> None:
    """Tag the active run with its ending and open its description with `text` (the description
    written later, the Overview's (grpolab.judging.overview.log), keeps it at the top). A second ending (a full disk
    while an interrupted run saves) adds to the first."""
    import mlflow

    run_id = mlflow.active_run().info.run_id
    _ENDINGS[run_id] = f"{_ENDINGS[run_id]} Then: {text}" if run_id in _ENDINGS else text
    mlflow.set_tags({"ending": ending, "mlflow.note.content": description(run_id)})


def describe_stop(stop: BaseException, progress: str) -> None:
    """A parent run a signal stopped (a sweep, chapter 4's or 5's arms): its ending, and a description
    opening with the signal and `progress` (which of its runs finished), said on stderr too."""
    from grpolab.lifecycle import endings

    text = f"{endings.stop_cause(stop)}. {progress}"
    describe_ending(endings.signal_of(stop).name, text)
    print(f"\n{text}", file=sys.stderr)


def describe_resumes(text: str) -> None:
    """A resumed run's resumes (grpolab.lifecycle.resume.history_text), kept in its description after the ending."""
    import mlflow

    run_id = mlflow.active_run().info.run_id
    _RESUMES[run_id] = text
    mlflow.set_tag("mlflow.note.content", description(run_id))


def add_to_description(text: str) -> None:
    """`text` after what the active run's description already says."""
    import mlflow

    run_id = mlflow.active_run().info.run_id
    before = mlflow.get_run(run_id).data.tags.get("mlflow.note.content", "")
    mlflow.set_tag("mlflow.note.content", f"{before}\n\n{text}" if before else text)


def _end(run, status: str, ending: str, cause: str | None = None) -> None:
    """End the run; tag its ending and describe it when nothing else did. A signal that arrives
    meanwhile waits until the run is closed."""
    import mlflow

    from grpolab.lifecycle import endings

    with endings.signals_deferred("closing the MLflow run"):
        try:
            tags = mlflow.get_run(run.info.run_id).data.tags
            if "ending" not in tags:
                mlflow.set_tag("ending", ending)
                note = tags.get("mlflow.note.content")
                if cause and (not note or status == "KILLED"):  # a stop after the last records: above them
                    mlflow.set_tag("mlflow.note.content", f"{cause}\n\n{note}" if note else cause)
        except Exception as error:  # the store may be what failed; ending the run matters more
            print(f"warning: could not record why the run ended: {error}", file=sys.stderr)
        mlflow.end_run(status=status)


def run_url(run, host: str = "http://127.0.0.1:5000") -> str:
    """The run's Overview (its description: chart, verdict, table; grpolab.judging.overview) in the README's UI
    command, in the UI's Model training view: MLflow 3 opens in its GenAI view unless the URL asks for
    `workflowType=machine_learning`."""
    return (
        f"{host}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}?workflowType=machine_learning"
    )


def lock_hash(path: Path = REPO_ROOT / "uv.lock") -> str:
    """sha256 of uv.lock: which exact environment produced the run."""
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "missing"


def library_versions() -> dict[str, str]:
    versions = {}
    for name in LIBRARIES:
        try:
            versions[f"version/{name}"] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[f"version/{name}"] = "not installed"
    return versions


def log_context(settings, device, card_note: str, cuda=None, resumed: bool = False) -> None:
    """Everything needed to reproduce and read the run: the settings, the environment (the allocator
    configuration and standby switch it really ran with, `cuda`: a grpolab.model.cuda_env.CudaEnv), the device.
    A resumed run keeps the settings it logged (a param cannot change: what a resume changed is a tag);
    its environment and device are this process's."""
    import mlflow

    from grpolab.config import numerics

    if not resumed:
        mlflow.log_params(settings.as_params())
    mlflow.set_tags(
        {
            "uv_lock_sha256": lock_hash(),
            **library_versions(),
            **device.tags(),
            **(cuda.tags() if cuda is not None else {}),
            **(numerics.current().tags() if not device.on_gpu else {}),
            "budget_card": card_note,
            "overridden": ",".join(sorted(settings.overridden)) or "none",
        }
    )


def log_trainer_args(args, resumed_from: int | None = None) -> None:
    """The trainer's effective arguments (what really trains, after Unsloth's and TRL's defaults); a
    resumed run's go beside the first ones as an artifact (params cannot change)."""
    import mlflow

    effective = {k: v for k, v in args.to_dict().items() if not k.startswith("_") and "token" not in k}
    if resumed_from is not None:
        mlflow.log_dict(effective, f"trainer/effective_args-resume-{resumed_from}.json")
        return
    mlflow.log_dict(effective, "trainer/effective_args.json")
    params = {
        f"trainer.{k}": str(v)[:500] for k, v in effective.items() if isinstance(v, (int, float, str, bool))
    }
    mlflow.log_params(params)


# MLflow's metrics view lists one section per key prefix, sorted by name: these copies of the figures
# a reader wants first go in a section that sorts before every other (`at a glance/reward`, ...).
GLANCE = "at a glance"
GLANCE_KEYS = {
    "reward": "reward",
    "kl": "kl",
    "completions/clipped_ratio": "clipped_ratio",
    "eval/accuracy": "held-out accuracy",
    "eval/format_rate": "held-out format_rate",
}


def glance(metrics: dict[str, float], unit: str | None = None) -> dict[str, float]:
    """The `at a glance` copies of what `metrics` holds: the reward and each reward's mean, KL, the
    clipped share, held-out accuracy and format, the total's budget and measured peak."""
    out = {f"{GLANCE}/{GLANCE_KEYS[k]}": v for k, v in metrics.items() if k in GLANCE_KEYS}
    out |= {
        f"{GLANCE}/{k.removeprefix('rewards/').removesuffix('/mean')}": v
        for k, v in metrics.items()
        if k.startswith("rewards/") and k.endswith("/mean")
    }
    if unit is not None:
        for figure in ("budget", "measured"):
            if (key := memory_key("total", figure, unit)) in metrics:
                out[f"{GLANCE}/total {figure}_{unit}"] = metrics[key]
    return out


def log_sheet(sheet, on_gpu: bool, step: int = 0, suffix: str = "") -> None:
    """Every line as `<line>/budget_<unit>` (`memory_unit`: GiB on a GPU, MiB on the CPU), the total
    and capacity, and the sheet as artifacts (`budget/sheet<suffix>.txt`); at `step`, for a resumed
    run whose memory settings changed it."""
    import mlflow

    unit = memory_unit(on_gpu)
    size = MEMORY_UNITS[unit]
    metrics = {memory_key(line.name, "budget", unit): line.bytes / size for line in sheet.lines}
    metrics[memory_key("total", "budget", unit)] = sheet.total_bytes / size
    metrics[memory_key("total", "capacity", unit)] = sheet.capacity_bytes / size
    mlflow.log_metrics(metrics | glance(metrics, unit), step=step)
    mlflow.set_tags({"budget_fits": str(sheet.fits), "memory_unit": unit})
    mlflow.log_text(sheet.table(), f"budget/sheet{suffix}.txt")
    mlflow.log_dict(sheet.to_dict(), f"budget/sheet{suffix}.json")


def log_findings(findings) -> None:
    """The run doctor's findings by name (`doctor_findings`: "none", or "kl_climbing,reward_hacking"), for
    a search over runs and for the chapters' claims; the verdict itself opens the description."""
    import mlflow

    mlflow.set_tag("doctor_findings", ",".join(f.name for f in findings) or "none")


def run_name(profile: str) -> str:
    """Unique even for two runs started in the same second."""
    return f"{profile}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
