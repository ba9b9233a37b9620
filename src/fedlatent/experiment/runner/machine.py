"""What a run trained on, in one line for its summary and the report page."""
from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    """This machine's CPU model (``/proc/cpuinfo``, else :mod:`platform`) and its core count."""
    model = ""
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{model or platform.processor() or platform.machine()}, {os.cpu_count()} cores"
