"""Starting worker processes, everything `cadence launch` does below its command line: the launch plan
(`args`, `settings`, `config_file`, `elastic`, `worker_env`, `plan`, `banner`), starting it (`runner`;
torch elastic's agent extended in `elastic_agent`, `rendezvous_leave`, `rendezvous_store`), the
process each worker starts in (`worker_bootstrap`), the XLA path (`xla_launcher`, `xla_worker`), the
notebook/debug launchers, the environment they give workers, and the launch bounds. `commands/` holds
only the command-line entry points."""
