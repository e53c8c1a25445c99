"""What every bench report carries (the CPU bench, the GPU bench, the GPU check): where it is written, the command line
as it is shown, the machine it ran on."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import torch

from plumbing.files import writable_folder
from plumbing.provenance import cpu_name, git_commit


def output_path(option: str) -> Path:
    """The --out file, checked before any measuring (not after minutes of it): not a folder, in a folder that is or
    can be made writable."""
    out = Path(option)
    if out.is_dir():
        raise ValueError(f"--out {option} is a folder; give a file such as reports/bench.md")
    writable_folder(out.parent)
    return out


SHOWN_AS = "AIAYN_SHOWN_AS"  # NAME=folder, joined by os.pathsep: a parent's folders (the GPU check's WORK and OUT)


def shown_args(argv: list[str], names: dict[str, str] | None = None) -> str:
    """The command line as a report shows it, so that committed reports carry no machine's folders: a folder of
    `names` (folder -> NAME; default: from $AIAYN_SHOWN_AS) as its name, another absolute path relative to the working
    directory."""
    if names is None:
        pairs = (entry.split("=", 1) for entry in os.environ.get(SHOWN_AS, "").split(os.pathsep) if "=" in entry)
        names = {folder: name for name, folder in pairs}

    def shown(arg: str) -> str:
        for folder, name in names.items():
            arg = arg.replace(folder, name)
        return os.path.relpath(arg) if os.path.isabs(arg) else arg

    return " ".join(shown(a) for a in argv)


def machine() -> dict:
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
