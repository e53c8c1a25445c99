"""Where a result came from: the commit of the code that produced it, recorded in every report and run."""
from __future__ import annotations

import subprocess

CODE = (":/model", ":/invariants", ":/ablations")  # the code that makes the numbers; reports/ only renders them


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
