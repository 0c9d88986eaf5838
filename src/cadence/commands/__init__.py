"""The `cadence` command-line interface. Each command lives in its own module; see `cli.py`."""
