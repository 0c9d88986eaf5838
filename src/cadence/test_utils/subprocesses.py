"""Running commands for tests: `execute_subprocess_async`, `run_command`, ports and paths.

Re-exported by `cadence.test_utils.testing` (Accelerate's path).
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# The installed package's folder (what path_in_accelerate_package resolves against).
PACKAGE_DIR = Path(__file__).resolve().parent.parent


class _RunOutput:
    """Exit code and output lines of a finished subprocess."""

    def __init__(self, returncode: int, stdout: list[str], stderr: list[str]) -> None:
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


async def _pump(stream: Any, sink: list[str], echo_to: Any, label: str, quiet: bool) -> None:
    while True:
        line = await stream.readline()
        if not line:
            return
        text = line.decode("utf-8", errors="replace").rstrip()
        sink.append(text)
        if not quiet:
            print(label, text, file=echo_to)


async def _run(
    cmd: list[str], env: Any, stdin: Any, timeout: float | None, quiet: bool, echo: bool
) -> _RunOutput:
    if echo:
        print("\nRunning: ", " ".join(cmd))
    process = await asyncio.create_subprocess_exec(
        cmd[0],
        *cmd[1:],
        stdin=stdin,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out: list[str] = []
    err: list[str] = []
    readers = [
        asyncio.create_task(_pump(process.stdout, out, sys.stdout, "stdout:", quiet)),
        asyncio.create_task(_pump(process.stderr, err, sys.stderr, "stderr:", quiet)),
    ]
    try:
        await asyncio.wait_for(asyncio.gather(*readers), timeout=timeout)
    except asyncio.TimeoutError:
        process.kill()
        await process.wait()
        raise RuntimeError(f"'{' '.join(cmd)}' timed out after {timeout} seconds") from None
    return _RunOutput(await process.wait(), out, err)


def execute_subprocess_async(
    cmd: list[Any],
    env: dict[str, str] | None = None,
    stdin: Any = None,
    timeout: float = 180,
    quiet: bool = False,
    echo: bool = True,
) -> _RunOutput:
    """Run `cmd`, echoing its output live, and return its exit code and output lines.

    Raises:
        RuntimeError: the command exits with a non-zero code (the message holds its stderr) or
            runs longer than `timeout` seconds (it is killed).

    Example:
        >>> execute_subprocess_async(get_launch_command(num_processes=2, cpu=True) + ["train.py"])  # doctest: +SKIP

    Args:
        cmd (list[Any]): The command and its arguments (each turned into text).
        env (dict[str, str] | None): The command's environment; None passes this process's.
        stdin (Any): The command's standard input, as `asyncio.create_subprocess_exec` takes it (a file
            object, `subprocess.PIPE`, or None to inherit this one's).
        timeout (float): Seconds before the command is killed (default 180).
        quiet (bool): Do not echo the output lines as they come (default False).
        echo (bool): Print the command before running it (default True).

    Returns:
        The result, with `returncode`, `stdout` and `stderr` (lists of lines).
    """
    cmd = [str(part) for part in cmd]
    result = asyncio.run(_run(cmd, env, stdin, timeout, quiet, echo))
    if result.returncode != 0:
        stderr = "\n".join(result.stderr)
        raise RuntimeError(
            f"'{' '.join(cmd)}' failed with returncode {result.returncode}\n\n"
            f"The combined stderr from workers follows:\n{stderr}"
        )
    return result


def pytest_xdist_worker_id() -> int:
    """This pytest-xdist worker's number (0 without xdist)."""
    return int(re.sub(r"^gw", "", os.environ.get("PYTEST_XDIST_WORKER", "gw0")))


def get_torch_dist_unique_port() -> int:
    """A master port for launched tests: 29500 plus the xdist worker number."""
    return 29500 + pytest_xdist_worker_id()


class SubprocessCallException(Exception):
    """A command run by `run_command` failed; the message holds its output."""


def run_command(
    command: list[Any], return_stdout: bool = False, env: dict[str, str] | None = None
) -> Any:
    """Run `command` (stderr merged into stdout); return the output when `return_stdout`.

    Raises:
        SubprocessCallException: the command failed (with its output).

    Args:
        command (list[Any]): The command and its arguments (each turned into text).
        return_stdout (bool): Return the output, decoded (default False: return None).
        env (dict[str, str] | None): The command's environment; None passes a copy of this process's.
    """
    command = [str(part) for part in command]
    try:
        output = subprocess.check_output(
            command, stderr=subprocess.STDOUT, env=env or os.environ.copy()
        )
    except subprocess.CalledProcessError as error:
        raise SubprocessCallException(
            f"Command `{' '.join(command)}` failed with the following error:\n\n{error.output.decode()}"
        ) from error
    return output.decode("utf-8") if return_stdout else None


def path_in_accelerate_package(*components: str) -> Path:
    """A path inside the installed `cadence` package, e.g. the bundled test scripts.

    Example:
        >>> path_in_accelerate_package("test_utils", "scripts", "test_script.py").is_file()
        True

    Args:
        *components (str): The path's parts below the package folder.

    Returns:
        Path: The path (whether or not it exists).
    """
    return PACKAGE_DIR.joinpath(*components)


# The same helper under the package's own name (scripts translated from the reference use it).
path_in_cadence_package = path_in_accelerate_package


@contextmanager
def assert_exception(
    exception_class: type[BaseException], msg: str | None = None
) -> Iterator[None]:
    """Assert the block raises `exception_class` (with `msg` in its message when given).

    Example:
        >>> with assert_exception(ValueError, "bad"):
        ...     raise ValueError("bad input")

    Args:
        exception_class (type[BaseException]): The exception the block must raise.
        msg (str | None): Text its message must contain; None checks the type only.

    Raises:
        AssertionError: The block raised nothing, another exception, or one without `msg`.
    """
    try:
        yield
    except Exception as error:
        assert isinstance(error, exception_class), (
            f"Expected exception of type {exception_class} but got {type(error)}"
        )
        if msg is not None:
            assert msg in str(error), (
                f"Expected message '{msg}' to be in exception but got '{error}'"
            )
        return
    raise AssertionError(f"Expected exception of type {exception_class} but ran without issue.")


def capture_call_output(func: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """What `func(*args, **kwargs)` prints to stdout.

    Example:
        >>> capture_call_output(print, "hi")
        'hi\\n'

    Args:
        func (Callable[..., Any]): The function to call.
        *args: Its positional arguments.
        **kwargs: Its keyword arguments.

    Returns:
        str: Everything it printed.
    """
    captured = io.StringIO()
    original, sys.stdout = sys.stdout, captured
    try:
        func(*args, **kwargs)
    finally:
        sys.stdout = original
    return captured.getvalue()


# Keep pytest from collecting helpers whose names start with "test".
__test__ = False
