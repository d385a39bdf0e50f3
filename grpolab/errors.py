"""The harness's one-line refusal: settings (or a chapter, a layout, a folder) that cannot work."""

from __future__ import annotations


class LabSettingsError(ValueError):
    """Settings that cannot work; the message is one line with the fix."""
