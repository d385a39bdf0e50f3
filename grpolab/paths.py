"""Where things are: the repository and the folders the labs write to by default (one home each)."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE_ROOT = REPO_ROOT / ".cache"  # the tiny CPU model, built once
OUTPUTS = REPO_ROOT / "outputs"  # adapters, checkpoints, the rehearsal checkpoint
DEFAULT_DB = REPO_ROOT / "mlflow.db"  # the MLflow store when MLFLOW_TRACKING_URI is not set
