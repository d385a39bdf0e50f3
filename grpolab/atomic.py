"""Writing a model folder so that it appears whole or not at all."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path


def save_pretrained_atomically(model, tokenizer, final: Path) -> Path:
    """`save_pretrained` both into a staging folder beside `final`, then rename it into place.

    An interrupted save leaves no half-written folder that a later run would load.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        model.save_pretrained(str(staging))
        tokenizer.save_pretrained(str(staging))
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final
