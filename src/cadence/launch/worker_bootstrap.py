"""Run the user's script (or `--module name`) as one worker of `cadence launch`.

`python -m cadence.launch.worker_bootstrap [--module] target [args...]` behaves like
`python target args...` (or `python -m target`), and in addition:

- an uncaught exception is written to the JSON error file torch elastic names in
  ``TORCHELASTIC_ERROR_FILE`` (the format torch elastic's own error handler writes, plus a precise
  ``cadence`` section), so the launcher can report which rank failed first and why;
- on Linux the worker asks the kernel to send it SIGKILL when its launcher dies, so a launcher killed
  with SIGKILL leaves no orphans, frozen or stuck ones included.

It imports nothing heavy: the user's script decides whether torch is loaded.
"""

from __future__ import annotations

import builtins
import faulthandler
import io
import json
import os
import sys
import time
import traceback
import types

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        # SIGKILL, not SIGTERM: a SIGTERM stays pending on a frozen (SIGSTOPped) worker forever,
        # and a worker stuck in C code may never run its handler; the job is over either way.
        libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the launcher died before prctl took effect
        sys.exit("cadence worker: the launcher exited before this worker started.")


def _listen_to_interrupts() -> None:
    # A launcher started in the background inherits an ignored SIGINT and passes it on; the launcher
    # forwards Ctrl-C on purpose, so the worker must see it as KeyboardInterrupt like a foreground script.
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _whole_lines() -> None:
    # The workers share the launcher's stdout and stderr. Under `python -u` a print is two writes (the
    # text, then the newline), so two ranks' lines could run together ("rank 1 ...rank 0 ...");
    # buffering each line and writing it whole keeps them apart, and `-u` still sends it at once.
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(line_buffering=True, write_through=False)
            except (ValueError, io.UnsupportedOperation):
                pass  # a replaced stream (a test harness's) keeps its own buffering


def _die_by_sigint() -> None:
    # Like `python script.py` on Ctrl-C: end by the signal itself, so the parent sees "killed by SIGINT".
    import signal

    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


def _strip_own_frames(error: BaseException) -> None:
    """Start the traceback at the user's code, as if the script had been run by `python` directly."""
    tb = error.__traceback__
    while tb is not None and (
        tb.tb_frame.f_code.co_filename == __file__
        or tb.tb_frame.f_code.co_filename.endswith("runpy.py")
    ):
        tb = tb.tb_next
    if tb is not None:
        error.__traceback__ = tb


def write_error_file(error: BaseException, path: str) -> None:
    """Record `error` where the launcher will look for it."""
    now = time.time()
    callstack = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    data = {
        "message": {
            "message": f"{type(error).__name__}: {error}",
            "extraInfo": {"py_callstack": callstack, "timestamp": str(int(now))},
        },
        "cadence": {
            "time": now,
            "exception": type(error).__name__,
            "rank": os.environ.get("RANK"),
        },
    }
    try:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(data, handle)
    except OSError:
        pass  # reporting must never hide the user's own error


def _run_script(path: str, args: list[str]) -> None:
    sys.argv = [path, *args]
    # As `python script.py` does: the script's (resolved) folder first on sys.path instead of the
    # current directory, and an absolute __file__.
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    filename = os.path.abspath(path)
    with io.open_code(filename) as handle:
        code = compile(handle.read(), filename, "exec")
    main = types.ModuleType("__main__")
    main.__dict__.update({"__file__": filename, "__cached__": None, "__builtins__": builtins})
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _run_module(name: str, args: list[str]) -> None:
    import runpy

    sys.argv = [name, *args]
    runpy.run_module(name, run_name="__main__", alter_sys=True)


def _exit_code(stop: SystemExit) -> int:
    """The status `python` exits with for `sys.exit(code)` (a message is printed, status 1)."""
    code = stop.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _end_process(code: int) -> None:
    """End the worker as the interpreter's shutdown would, then exit before finalization.

    Why: torch's DDP keeps the gloo process group alive in native code after
    `destroy_process_group` (nothing Python-side holds it), so its worker threads (`pt_gloo_runloop`,
    `gloo_tcp_loop`) outlive everything Python can end. When the interpreter finalizes while one of
    them still drops a finished collective's tensors, that thread takes the GIL of a finalizing
    interpreter and is unwound out of a C++ destructor: std::terminate, "terminate called without an
    active exception", SIGABRT after training ended. Here the steps of a normal shutdown run while
    the interpreter is fully alive, in its order (non-daemon threads joined, atexit handlers, the
    script's globals released so open files close), and the process then ends without finalization:
    no native thread can meet a half-torn-down interpreter.
    """
    # Read by exit handlers that act only on a script that ended well (a fault-tolerant group tells
    # the others it finished; one that failed must look lost, so its agent restarts it).
    os.environ["CADENCE_SCRIPT_EXIT_CODE"] = str(code)
    if os.environ.get("CADENCE_FINALIZE_AT_EXIT", "").strip().lower() in ("1", "true", "yes", "on"):
        # The switch back to a plain Python exit, interpreter finalization included
        # (docs/differences.md).
        raise SystemExit(code)
    import atexit
    import gc
    import threading

    shutdown = getattr(threading, "_shutdown", None)  # waits for non-daemon threads, as exit does
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    main = sys.modules.get("__main__")
    if main is not None and main.__dict__ is not globals():
        # The script's objects: open files flush and close, __del__ runs. (In module mode runpy
        # has put this module back as __main__: its globals are still needed here.)
        main.__dict__.clear()
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _alias_if_asked() -> None:
    # `cadence launch --as-accelerate` (or the variable): the wheel's startup hook already did this
    # where Cadence is installed; here it also holds for a source checkout on PYTHONPATH.
    if os.environ.get("CADENCE_AS_ACCELERATE", "").strip().lower() in ("1", "true", "yes", "on"):
        import cadence.alias.startup  # noqa: F401  # deferred: only when the alias is asked for


def main(argv: list[str] | None = None) -> None:
    """Run a worker's target script or module (`--module`) given in `argv`, tied to its parent."""
    argv = sys.argv[1:] if argv is None else argv
    as_module = bool(argv) and argv[0] == "--module"
    if as_module:
        argv = argv[1:]
    if not argv:
        sys.exit("usage: python -m cadence.launch.worker_bootstrap [--module] target [args...]")
    _die_with_parent()
    _listen_to_interrupts()
    _whole_lines()
    faulthandler.enable(all_threads=True)
    _alias_if_asked()
    target, args = argv[0], argv[1:]
    try:
        if as_module:
            _run_module(target, args)
        else:
            _run_script(target, args)
    except SystemExit as stop:
        _end_process(_exit_code(stop))
    except Exception as error:
        _strip_own_frames(error)
        error_file = os.environ.get(ERROR_FILE_ENV)
        if error_file:
            write_error_file(error, error_file)
        sys.excepthook(type(error), error, error.__traceback__)
        _end_process(1)
    except KeyboardInterrupt as interrupt:
        _strip_own_frames(interrupt)
        sys.excepthook(type(interrupt), interrupt, interrupt.__traceback__)
        _die_by_sigint()
        return
    _end_process(0)


if __name__ == "__main__":
    main()
