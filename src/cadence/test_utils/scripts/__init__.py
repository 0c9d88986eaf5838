"""Distributed test scripts bundled with Cadence. Each is importable (nothing runs on import) and
runnable on any number of processes: `cadence launch --num_processes 2 --cpu <path of the script>`.
A script exits non-zero, naming the failed check, on the first failure."""
