"""Export one run's GPU samples to CSV from the dashboard, through the store's streamed exporter.

The dialog checks the target before it closes; the store writes to a temporary name and renames at the end,
so a failed export never leaves a truncated CSV that looks whole.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from lynxtop.contract.records import RunInfo


class ExportError(Exception):
    """The export could not be written; the message names the path and why."""


def check_target(path_text: str) -> Path:
    """The path to write, or ExportError naming what is wrong with it (nothing is written here)."""
    if not path_text.strip():
        raise ExportError("no path given")
    path = Path(os.path.expanduser(path_text.strip()))
    if path.is_dir():
        raise ExportError(f"{path}: is a directory; give a file name")
    if path.exists():
        raise ExportError(f"{path}: already exists (choose another name; nothing was overwritten)")
    if not path.parent.is_dir():
        raise ExportError(f"{path.parent}: no such directory")
    if not os.access(path.parent, os.W_OK):
        raise ExportError(f"{path.parent}: not writable")
    return path


def export_run_gpu(reader: Any, run: RunInfo, path: Path, now_ms: int) -> int:
    """Write every raw GPU sample of the run's span; returns the number of rows written."""
    from lynxtop.store import export

    start = int(run.started_ms or 0)
    end = int(run.ended_ms or now_ms) + 1
    try:
        return export.export_table(reader, "gpu", "raw", start, end, path, force=False,
                                   progress_stream=io.StringIO())
    except export.ExportError as exc:
        raise ExportError(str(exc)) from exc
    except OSError as exc:
        raise ExportError(f"{path}: {exc.strerror or exc}") from exc
