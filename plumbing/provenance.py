"""Where a result came from: the commit of the code that produced it, recorded in every report and run."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

# The code that makes the numbers, where a change marks a result +dirty; reports/ only renders them.
CODE = (":/plumbing", ":/model", ":/invariants", ":/ablations")


def git_commit() -> str:
    """The short HEAD of the working directory's checkout, with '+dirty' when its code differs from it (uncommitted
    code made the numbers); 'unknown' outside a checkout (an installed package run elsewhere)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode != 0 or not head.stdout.strip():
            return "unknown"
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", *CODE], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.returncode == 1 else "")


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    info = Path("/proc/cpuinfo")
    names = (
        [line.split(":", 1)[1].strip() for line in info.read_text().splitlines() if line.startswith("model name")]
        if info.exists()
        else []
    )
    return names[0] if names else platform.processor()


def machine_line() -> str:
    """'<cpu> (<n> cores)': the machine a result was measured on, for a report's header."""
    return f"{cpu_name()} ({os.cpu_count()} cores)"
