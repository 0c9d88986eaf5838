"""The end-to-end check that `cadence test` launches on the configured processes."""
