"""`Accelerator.profile`: run `torch.profiler` around a block and export a Chrome trace per process."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

PROFILE_PATTERN_NAME = "profile_{suffix}.json"
SCHEDULE_KEYS = ("wait", "warmup", "active", "repeat", "skip_first")


def _activity_map() -> dict[str, torch.profiler.ProfilerActivity]:
    activity = torch.profiler.ProfilerActivity
    available = {"cpu": activity.CPU, "cuda": activity.CUDA}
    for name, member, device in (
        ("xpu", "XPU", "xpu"),
        ("mtia", "MTIA", "mtia"),
        ("hpu", "HPU", "hpu"),
    ):
        module = getattr(torch, device, None)
        is_available = getattr(module, "is_available", None)
        if hasattr(activity, member) and callable(is_available) and is_available():
            available[name] = getattr(activity, member)
    return available


def profiler_activity(name: str) -> torch.profiler.ProfilerActivity:
    """The `torch.profiler.ProfilerActivity` for `"cpu"`, `"cuda"`, or an available `"xpu"`/`"mtia"`/`"hpu"`."""
    available = _activity_map()
    if name not in available:
        raise ValueError(f"Invalid profiler activity: {name!r}. Must be one of {list(available)}.")
    return available[name]


def build_profiler(handler: Any) -> torch.profiler.profile:
    """A `torch.profiler.profile` configured from a `ProfileKwargs` (not started); None: the defaults."""
    if handler is None:
        return torch.profiler.profile()
    activities = None
    if handler.activities is not None:
        activities = [profiler_activity(name) for name in handler.activities]
    schedule = None
    if handler.schedule_option is not None:
        unknown = sorted(set(handler.schedule_option) - set(SCHEDULE_KEYS))
        if unknown:
            raise TypeError(
                f"ProfileKwargs.schedule_option has unknown keys {unknown}; allowed: {list(SCHEDULE_KEYS)}."
            )
        schedule = torch.profiler.schedule(**handler.schedule_option)
    return torch.profiler.profile(
        activities=activities,
        schedule=schedule,
        on_trace_ready=handler.on_trace_ready,
        record_shapes=handler.record_shapes,
        profile_memory=handler.profile_memory,
        with_stack=handler.with_stack,
        with_flops=handler.with_flops,
        with_modules=handler.with_modules,
    )


def trace_path(output_trace_dir: str | os.PathLike, process_index: int) -> str:
    """Where process `process_index` writes its Chrome trace."""
    return os.path.join(output_trace_dir, PROFILE_PATTERN_NAME.format(suffix=process_index))


@contextmanager
def profile(handler: Any, state: Any) -> Iterator[torch.profiler.profile]:
    """Profile the block; with `handler.output_trace_dir`, each process then writes
    `profile_<process index>.json` there and waits for the others.

    `state` gives `process_index` and `wait_for_everyone()` (a `PartialState` or `AcceleratorState`).
    """
    profiler = build_profiler(handler)
    with profiler:
        yield profiler
    if handler is None or handler.output_trace_dir is None:
        return
    os.makedirs(handler.output_trace_dir, exist_ok=True)
    profiler.export_chrome_trace(trace_path(handler.output_trace_dir, state.process_index))
    state.wait_for_everyone()
