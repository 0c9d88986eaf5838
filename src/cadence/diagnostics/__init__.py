"""No silent hangs: cross-rank diagnosis of failures, stuck ranks and mismatched collectives.

Always on when a job has more than one process (started by PartialState):

- the **ledger** (ledger.py): each Cadence collective and barrier, and each backward pass that
  all-reduces gradients, is numbered and remembered with its inputs and caller (cheap: a counter and
  references; described only when needed);
- the **watchdog** (watchdog.py): a daemon thread per rank that publishes the rank's state through the
  store the process group was created with (a side channel that works while the group is blocked) and
  stops every rank with a report when the job cannot go on: ranks in different collectives, a rank
  that ended, ranks out of step, or ranks waiting in a collective that another rank has not joined
  within the stuck timeout — "rank 1 is at train.py:88 (not in a collective); ranks 0, 2, 3 wait in
  gather #1042 at train.py:120";
- **fail fast** (hooks.py): an uncaught exception on one rank is recorded, and the other ranks stop
  within a watchdog tick saying "rank k failed: ..."; under a launcher they give it a moment to stop
  them first, so the launcher sees the failing rank end first;
- opt-in on gloo (`CADENCE_HANDSHAKE=1`), a 4-number **handshake** before each Cadence collective
  (precheck.py), so mismatched calls raise `DistributedOperationException` on every rank instead of
  crashing the backend (SIGABRT). It is off by default because it doubles the latency of small
  collectives; without it the watchdog still stops and reports diverging ranks within seconds.

Settings:

- stall report (default 30 s; 0 turns it off): `CADENCE_STALL_REPORT` > `stall_report` in the launch
  config. A rank that has waited that long in a collective another rank has not joined prints, once per
  stall for the whole job, where every rank is; nothing is stopped;
- stuck timeout (default 300 s; 0 turns the stuck-rank stop off): `InitProcessGroupKwargs(stuck_timeout=...)`
  > `CADENCE_STUCK_TIMEOUT` > `stuck_timeout` in the launch config. With the default, barriers
  (`wait_for_everyone`, `main_process_first`) may wait as long as the process-group timeout, since
  waiting for a slower rank is their purpose (a rank saving a checkpoint); a chosen timeout applies
  to them too;
- `wait_for_everyone(timeout=...)`: that barrier's own limit (gloo raises at it; the watchdog enforces
  it on NCCL);
- the process-group timeout: `InitProcessGroupKwargs(timeout=...)` or `process_group_timeout` in the
  launch config, default 30 minutes;
- debug mode (`CADENCE_DEBUG=1`, `cadence launch --debug`): every rank swaps the full description of
  each collective before it runs, on every backend;
- `CADENCE_HANDSHAKE=1` turns the gloo handshake on; `CADENCE_LEDGER=0` turns all of the above off;
- `CADENCE_JOB_TOKEN`: the per-job secret the watchdog's records are signed with (signing.py); records
  that do not verify are ignored. The launchers set it; without it records are unsigned and trusted.
"""
