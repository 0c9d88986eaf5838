"""Starting worker processes: the notebook/debug launchers, the environment they give workers, the
launch bounds (timeouts, restarts) and the rendezvous store."""
