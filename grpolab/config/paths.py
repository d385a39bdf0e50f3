"""Where things are: the repository and the folders the labs write to by default (one home each)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
LABS = REPO_ROOT / "labs"  # the chapters, a folder each
CACHE_ENV = "GRPOLAB_CACHE"  # another folder for the stand-ins (the matrix builds one per context)


def cache_root() -> Path:
    """What the labs build once and reuse (the tiny CPU models, MLflow's migrated schema, shipped
    adapters): `.cache/`, or $GRPOLAB_CACHE when it is set."""
    return Path(os.environ.get(CACHE_ENV) or REPO_ROOT / ".cache")


OUTPUTS = REPO_ROOT / "outputs"  # adapters, checkpoints, the rehearsal checkpoint
DEFAULT_DB = REPO_ROOT / "mlflow.db"  # the MLflow store when MLFLOW_TRACKING_URI is not set
