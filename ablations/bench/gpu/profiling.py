"""Where a training step's time goes: torch.profiler's top kernels of one step by self device time on a GPU, its top
operators by self CPU time on the CPU, for the reference's eager step and its compiled one (the bench profiles each
after its timed steps, so that one GPU run explains its own figures).

On a GPU only the kernels themselves are ranked (and the copies and fills the device runs), not the operators that
launched them: an operator's device time is its kernels', and counting both would count each kernel twice. The share
is of the step's device time in all; the profiled step is not a timed one (the profiler slows the host)."""

from __future__ import annotations

from typing import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from ablations.bench.gpu.timing import MEASURED, TIME_UP, Deadline, Entry, one_line, synced
from model.batch import Batch

ROWS = 15  # rows of each table


def ranked_events(averages: list, on_device: bool) -> tuple[list, str]:
    """The events that did work (kernels on a GPU, operators with self time on the CPU), most self time first, and the
    name of that time."""
    key = "self_device_time_total" if on_device else "self_cpu_time_total"
    kind = DeviceType.CUDA if on_device else DeviceType.CPU
    events = [e for e in averages if e.device_type == kind and not e.is_user_annotation and getattr(e, key) > 0]
    return sorted(events, key=lambda e: getattr(e, key), reverse=True), key


def top_rows(averages: list, on_device: bool, rows: int = ROWS) -> tuple[list[dict], float]:
    """The `rows` events of most self time (kernels by device time, or operators by CPU time), with their share of
    all such events' self time; and that time in all, in ms."""
    events, key = ranked_events(averages, on_device)
    total_us = sum(getattr(e, key) for e in events)
    top = [
        {"name": e.key, "self_ms": getattr(e, key) / 1e3, "share": getattr(e, key) / total_us, "calls": e.count}
        for e in events[:rows]
    ]
    return top, total_us / 1e3


def launches(averages: list, on_device: bool) -> int:
    """Calls of those events in the step: on a GPU the kernels launched (each a wait for the host between kernels
    when the step is launch-bound), on the CPU the operators that did work."""
    return sum(e.count for e in ranked_events(averages, on_device)[0])


def profile_step(step: Callable[[], object], device: torch.device, rows: int = ROWS) -> dict:
    """One call of `step` under torch.profiler (the device's activity too, on a GPU), waited for: its top rows, the
    total they are shares of, and the step's seconds under the profiler."""
    on_device = device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_device else [])]
    start = synced(device)
    with profile(activities=activities) as prof:
        step()
        synced(device)
    seconds = synced(device) - start
    averages = prof.key_averages()
    top, total_ms = top_rows(averages, on_device, rows)
    what = "kernels by self device time" if on_device else "operators by self CPU time"
    calls = launches(averages, on_device)
    return {"ranked": what, "rows": top, "total_ms": total_ms, "profiled_s": seconds, "launches": calls}


def profile_entry(entry: Entry, size: str, batch: Batch, device: torch.device, deadline: Deadline) -> dict:
    """One more step of a measured entry, profiled under the time limit's alarm; the record says why there is no
    table when there is none."""
    record = {"size": size, "system": entry.system, "mode": entry.mode, "backend": entry.backend}
    if entry.status != MEASURED:
        return {**record, "status": f"not profiled: {entry.status}"}
    if deadline.past():
        return {**record, "status": f"not profiled: {TIME_UP.removeprefix('not measured: ')}"}
    try:
        with deadline.enforced():
            return {**record, "status": MEASURED, **profile_step(lambda: entry.step(batch), device)}
    except Exception as exc:  # noqa: BLE001 - the alarm, or the profiler failing: said, and the bench goes on
        why = TIME_UP.removeprefix("not measured: ") if deadline.rang(exc) else one_line(exc)
        return {**record, "status": f"not profiled: {why}"}
