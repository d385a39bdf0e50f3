"""The harness's one-line refusal: settings (or a chapter, a layout, a folder) that cannot work, said
on one line of stderr, with exit code 2 and nothing written."""

from __future__ import annotations

import sys

EXIT_BAD_INPUT = 2


class LabSettingsError(ValueError):
    """Settings that cannot work; the message is one line with the fix."""


def refuse(reason: Exception | str) -> int:
    """Say why, on one line of stderr, and return the exit code of bad input."""
    print(f"error: {reason}", file=sys.stderr)
    return EXIT_BAD_INPUT
