"""The tracking store, checked before anything loads.

A wrong `MLFLOW_TRACKING_URI` used to cost minutes: MLflow's client retries an unreachable server
with exponential backoff (7 retries, about 4 minutes per request, mlflow 3.17's defaults) after the
lab has spent a minute loading. `require` answers within a few seconds, before the device is
detected or a model loads, with one line that says what is wrong and how to fix it, and writes
nothing:

- a tracking server (http, https): GET <uri>/health with a 3 s timeout must answer. Once it does,
  MLflow's own retries are bounded for the rest of the process (MLFLOW_HTTP_REQUEST_MAX_RETRIES 2,
  BACKOFF_FACTOR 1, TIMEOUT 30 unless set), so a server that dies mid-run costs seconds per call,
  not minutes;
- a SQLite store: its folder exists and can be written; an existing file opens as a SQLite database
  (read-write, never created by the check), is not damaged (PRAGMA quick_check) and is not held
  locked by another program (a write lock is taken and released within a 2 s busy timeout);
- a file store (file:, a plain path): its folder, or the nearest one that exists, can be written.

Other schemes (databricks, postgresql, ...) are left to MLflow. Creating a new SQLite store is
`grpolab.lifecycle.tracking`'s job, under `setup_lock`, which the check here respects (a store another lab
is creating right now is not "locked"). It starts from a copy of MLflow's migrated schema
(`new_sqlite_store`), built once per MLflow version and schema revision.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from urllib.parse import urlparse

SERVER_TIMEOUT_S = 3.0
BUSY_TIMEOUT_S = 2.0
# MLflow's HTTP client for the rest of the run (mlflow/environment_variables.py): a few quick retries.
HTTP_LIMITS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}


class StoreError(Exception):
    """The store cannot be used; the message is one line: what is wrong and how to fix it."""


def require(uri: str) -> None:
    """Raise StoreError unless the store at `uri` can be used; bound MLflow's HTTP retries."""
    scheme = urlparse(uri).scheme
    if scheme in ("http", "https"):
        _check_server(uri)
        for name, value in HTTP_LIMITS.items():
            os.environ.setdefault(name, value)
    elif scheme == "sqlite":
        path = sqlite_path(uri)
        if path is not None:
            _check_sqlite(uri, path)
    elif scheme in ("", "file"):
        _check_folder(uri, Path(urlparse(uri).path if scheme else uri), create=True)


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///` URI (relative to the working folder with three slashes,
    absolute with four); None for anything else, an in-memory database included."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///").split("?")[0]
    return Path(path) if path and path != ":memory:" else None


@contextmanager
def setup_lock(uri: str) -> Iterator[None]:
    """An exclusive lock held while a SQLite store is created, migrated and given its experiments.

    Two processes that open a new SQLite store at once both run MLflow's schema migration and one
    dies ("duplicate column name: step"); MLflow's tracking store takes no lock of its own
    (mlflow/store/tracking/sqlalchemy_store.py). The lock is flock on the store's folder: nothing
    is written, and it goes away with the process that held it. Other stores need none.
    """
    path = sqlite_path(uri)
    if path is None:
        yield
        return
    fd = os.open(path.resolve().parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def new_sqlite_store(path: Path) -> None:
    """Create the SQLite store `path` (which does not exist yet) as MLflow's schema migration leaves a
    new one: its tables at the latest revision, no experiment (MLflow adds its Default experiment,
    with this store's artifact root, when it first opens the store). A copy of a store migrated once
    and kept under the cache folder (`schema_template`): the migration runs some sixty steps, about
    1 s of CPU, for every new store (2026-12-07, this repository's 2-core machine), and the test
    suite's labs start a hundred. The copy lands whole or not at all (written beside, then renamed):
    a lab stopped meanwhile leaves no store, or an empty one."""
    import shutil

    path = path.resolve()
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    os.close(fd)
    try:
        shutil.copyfile(schema_template(), partial)
        os.replace(partial, path)
    finally:
        with suppress(FileNotFoundError):
            os.unlink(partial)


def schema_template() -> Path:
    """An empty SQLite store at MLflow's latest schema revision (mlflow.store.db.utils'
    `_initialize_tables`, what MLflow's store runs on a new database), built once for each MLflow
    version and revision under the cache folder; built anew if missing. Two processes that build it
    at once each write a whole one; the last rename wins."""
    import mlflow
    import sqlalchemy
    from mlflow.store.db.utils import _get_latest_schema_revision, _initialize_tables

    from grpolab.config.paths import cache_root

    folder = cache_root() / "mlflow-schema"
    template = folder / f"mlflow-{mlflow.__version__}-{_get_latest_schema_revision()}.db"
    if template.exists():
        return template
    folder.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=folder, prefix=f".{template.name}.", suffix=".partial")
    os.close(fd)
    try:
        engine = sqlalchemy.create_engine(f"sqlite:///{partial}")
        try:
            _initialize_tables(engine)
        finally:
            engine.dispose()
        os.replace(partial, template)
    finally:
        with suppress(FileNotFoundError):
            os.unlink(partial)
    return template


# --- the checks -----------------------------------------------------------------------------------
def _unset_hint() -> str:
    return (
        "unset MLFLOW_TRACKING_URI to use the lab's mlflow.db" if "MLFLOW_TRACKING_URI" in os.environ else ""
    )


def _fix(*options: str) -> str:
    return ", or ".join(o for o in (*options, _unset_hint()) if o)


def _check_server(uri: str) -> None:
    url = uri.rstrip("/") + "/health"
    port = urlparse(uri).port or (443 if uri.startswith("https") else 80)
    try:
        with urllib.request.urlopen(url, timeout=SERVER_TIMEOUT_S) as answer:
            status = answer.status
    except urllib.error.HTTPError as error:
        status = error.code
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        reason = getattr(reason, "strerror", None) or str(reason)
        start = f"start it (uv run mlflow server --backend-store-uri sqlite:///mlflow.db --port {port})"
        raise StoreError(
            f"the MLflow tracking server at {uri} does not answer ({reason}): "
            + _fix(start, "correct MLFLOW_TRACKING_URI")
        ) from None
    if status == 404 or status >= 500:
        raise StoreError(
            f"{uri} answers, but not as a working MLflow tracking server (GET /health: HTTP {status}): "
            + _fix("correct MLFLOW_TRACKING_URI")
        )


def _check_folder(uri: str, path: Path, create: bool = False) -> Path:
    """The folder that will hold `path` exists (or, for a store MLflow creates, its nearest
    existing ancestor) and accepts a new file; returns it."""
    folder = path.expanduser().absolute().parent
    if create:
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
    if not folder.exists():
        raise StoreError(
            f"the folder {folder} of the MLflow store {uri} does not exist: "
            + _fix(f"create it (mkdir -p {folder})", "pick another path")
        )
    if not folder.is_dir():
        raise StoreError(
            f"{folder}, the folder of the MLflow store {uri}, is not a folder: " + _fix("pick another path")
        )
    try:
        with tempfile.TemporaryFile(dir=folder):  # O_TMPFILE: no name is ever visible
            pass
    except OSError as error:
        raise StoreError(
            f"cannot write in {folder}, the folder of the MLflow store {uri} ({error.strerror}): "
            + _fix("pick another path in MLFLOW_TRACKING_URI")
        ) from None
    return folder


def _check_sqlite(uri: str, path: Path) -> None:
    folder = _check_folder(uri, path)
    if not path.exists():
        return  # a new store: MLflow creates it under tracking's setup lock
    if not path.is_file():
        raise StoreError(f"{path}, the MLflow store of {uri}, is not a file: " + _fix("pick another path"))
    if not os.access(path, os.R_OK | os.W_OK):
        raise StoreError(
            f"cannot write to the MLflow store {path} (permission denied): " + _fix("pick another path")
        )
    busy = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(busy, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another lab is creating or migrating this store right now: not a lock to report
        _open_sqlite(path)
    finally:
        os.close(busy)


def _open_sqlite(path: Path) -> None:
    move_aside = f"move it aside (mv {path} {path}.damaged) to start a new store"
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=rw", uri=True, timeout=BUSY_TIMEOUT_S)
    except sqlite3.Error as error:
        raise StoreError(
            f"cannot open the MLflow store {path} ({error}): " + _fix("pick another path")
        ) from None
    try:
        (result,) = db.execute("PRAGMA quick_check").fetchone()
        if result != "ok":
            raise StoreError(
                f"the MLflow store {path} is damaged ({result[:120]}): "
                + _fix(move_aside, "pick another path")
            )
        db.execute("BEGIN IMMEDIATE")  # the write lock a run needs; nothing is written
        db.execute("ROLLBACK")
    except sqlite3.DatabaseError as error:
        text = str(error)
        if "locked" in text or "busy" in text:
            raise StoreError(
                f"the MLflow store {path} is locked by another program ({text} after {BUSY_TIMEOUT_S:.0f} s): "
                + _fix(
                    "close the program that holds it (a sqlite3 shell, a database browser, a stuck process)",
                    "pick another path",
                )
            ) from None
        raise StoreError(
            f"the MLflow store {path} is not a readable SQLite database ({text}): "
            + _fix(move_aside, "pick another path")
        ) from None
    finally:
        db.close()
