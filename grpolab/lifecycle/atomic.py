"""Writing a model folder so that it appears whole or not at all."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from grpolab.lifecycle.endings import signals_deferred


def save_pretrained_atomically(model, tokenizer, final: Path, progress_bar: bool = True) -> Path:
    """`save_pretrained` both into a staging folder beside `final`, then swap it into place.

    An interrupted or failed save (a full disk) leaves `final` as it was, whole, and no staging
    folder; a save that succeeds replaces it whole. Ctrl-C, SIGTERM and SIGHUP wait for the save to
    end (`signals_deferred`), so a second Ctrl-C while the interrupted run saves its adapter does not
    cut the save short; a failure (or SIGKILL) during it leaves at most a hidden `.<name>-*` folder.
    `progress_bar=False` hides transformers' "Writing model shards" bar (a copy nobody asked to watch).
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    with signals_deferred(f"saving {final}"):
        staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
        try:
            with _progress_bars(progress_bar):
                model.save_pretrained(str(staging))
            tokenizer.save_pretrained(str(staging))
            _swap(staging, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return final


def _swap(staging: Path, final: Path) -> None:
    """Two renames: the old folder out of the way (kept until the new one is in place), the new in."""
    if not final.exists():
        staging.rename(final)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{final.name}-old-", dir=final.parent))
    old.rmdir()
    final.rename(old)
    try:
        staging.rename(final)
    except BaseException:
        old.rename(final)  # put the old one back
        raise
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def _progress_bars(shown: bool) -> Iterator[None]:
    """transformers' progress bars shown or not while the block runs, then as they were."""
    from transformers.utils import logging

    was = logging.is_progress_bar_enabled()
    (logging.enable_progress_bar if shown else logging.disable_progress_bar)()
    try:
        yield
    finally:
        (logging.enable_progress_bar if was else logging.disable_progress_bar)()
