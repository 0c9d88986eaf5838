"""The watchdog's rules and settings, on hand-made rank states (no processes needed)."""

from datetime import timedelta

import pytest

from cadence.diagnostics.settings import WatchSettings, parse_seconds, resolve_watch_settings
from cadence.diagnostics.verdict import judge, rank_list

NOW = 1_000_000.0


def waiting(
    rank, seq=7, op="gather", site="train.py:120", shapes="float32[8, 10]", waited=10.0, **extra
):
    return {
        "rank": rank, "beat": NOW, "phase": "collective", "seq": seq, "op": op, "site": site,
        "shapes": shapes, "since": NOW - waited, "timeout": None, "done": seq - 1,
        "last_op": "gather", "where": site, **extra,
    }  # fmt: skip


def running(rank, where="train.py:88 in step()", done=6, **extra):
    return {
        "rank": rank, "beat": NOW, "phase": "running", "done": done, "last_op": "gather",
        "where": where, **extra,
    }  # fmt: skip


SETTINGS = WatchSettings(stuck_timeout=5.0, explicit=True, process_group_timeout=1800.0)


def test_rank_outside_the_collective_is_reported_after_the_stuck_timeout():
    states = [waiting(0), running(1), waiting(2), waiting(3)]
    verdict = judge(0, states, NOW, SETTINGS)
    assert verdict.kind == "stuck"
    assert verdict.culprits == [1]
    assert verdict.headline == (
        "rank 1 is at train.py:88 in step() (not in a collective); "
        "ranks 0, 2, 3 wait in gather #7 at train.py:120"
    )
    assert "float32[8, 10]" in verdict.report and "stuck timeout of 5 s" in verdict.report
    assert "CADENCE_STUCK_TIMEOUT" in verdict.report  # says how to allow more time


def test_ranks_in_one_collective_are_one_group_however_long_each_waited():
    # Ranks reach the same gather a little apart (a loaded machine): one line, with the range of
    # their waits, not one line per rank (the stalled-rank job test failed so at load 4).
    states = [waiting(0, waited=6.2), waiting(1, waited=6.1), running(2), waiting(3, waited=6.2)]
    verdict = judge(0, states, NOW, SETTINGS)
    assert verdict.headline.endswith("ranks 0, 1, 3 wait in gather #7 at train.py:120")
    assert (
        "  ranks 0, 1, 3 wait in gather #7 at train.py:120 with float32[8, 10], for 6.1-6.2 s"
        in (verdict.report)
    )
    same = judge(0, [waiting(0, waited=6.2), waiting(1, waited=6.2), running(2)], NOW, SETTINGS)
    assert "ranks 0, 1 wait in gather #7 at train.py:120 with float32[8, 10], for 6.2 s" in (
        same.report
    )


def test_nothing_is_reported_before_the_timeout():
    states = [waiting(0, waited=4.0), running(1)]
    assert judge(0, states, NOW, SETTINGS) is None


def test_barrier_gets_the_process_group_timeout_unless_the_stuck_timeout_was_chosen():
    # Rank 0 saves a checkpoint while rank 1 waits in wait_for_everyone: legitimate for a long time.
    states = [
        running(0, where="train.py:200 in save()"),
        waiting(1, op="wait_for_everyone", shapes="", waited=600),
    ]
    default = WatchSettings(stuck_timeout=300.0, explicit=False, process_group_timeout=1800.0)
    assert judge(1, states, NOW, default) is None
    late = [states[0], waiting(1, op="wait_for_everyone", shapes="", waited=1801)]
    assert "process-group timeout of 1800 s" in judge(1, late, NOW, default).report
    chosen = WatchSettings(stuck_timeout=300.0, explicit=True, process_group_timeout=1800.0)
    assert judge(1, states, NOW, chosen).kind == "stuck"


def test_wait_for_everyone_with_a_timeout_uses_that_timeout():
    states = [running(0), waiting(1, op="wait_for_everyone", shapes="", waited=3.0, timeout=1.0)]
    verdict = judge(1, states, NOW, WatchSettings(None, True, 1800.0))
    assert verdict.kind == "stuck" and "its timeout of 1 s" in verdict.report


def test_different_collectives_at_the_same_call_are_reported_without_waiting_for_the_timeout():
    states = [waiting(0, waited=2.0), waiting(1, op="reduce", site="train.py:130", waited=2.0)]
    verdict = judge(0, states, NOW, SETTINGS)
    assert verdict.kind == "mismatch"
    assert "rank 0 waits in gather #7 at train.py:120" in verdict.headline
    assert "rank 1 waits in reduce #7 at train.py:130" in verdict.headline


def test_same_collective_with_other_shapes_is_a_mismatch_only_where_shapes_must_agree():
    states = [waiting(0, waited=2.0), waiting(1, shapes="float32[8, 11]", waited=2.0)]
    verdict = judge(1, states, NOW, SETTINGS)
    assert verdict.kind == "mismatch" and "float32[8, 11]" in verdict.report
    padded = [
        waiting(r, op="pad_across_processes", shapes=f"float32[{r + 1}]", waited=2.0)
        for r in (0, 1)
    ]
    assert judge(0, padded, NOW, SETTINGS) is None


def test_a_rank_that_exited_without_joining_is_reported_at_once():
    states = [waiting(0, waited=2.0), running(1, done=6, phase="exited")]
    verdict = judge(0, states, NOW, SETTINGS)
    assert verdict.kind == "ended" and verdict.culprits == [1]
    assert "rank 1 has exited" in verdict.headline


def test_ranks_out_of_step_are_reported_once_it_lasts():
    states = [waiting(0, seq=7, waited=6.0), waiting(1, seq=8, op="reduce", waited=6.0)]
    verdict = judge(0, states, NOW, SETTINGS)
    assert verdict.kind == "out_of_step" and verdict.culprits == [1]
    # A peer that just finished the call (a transfer still completing here) is not judged at once.
    assert judge(0, [waiting(0, seq=7, waited=1.5), running(1, done=7)], NOW, SETTINGS) is None


def test_every_rank_in_the_same_collective_for_too_long_blames_the_backend():
    states = [waiting(0), waiting(1)]
    verdict = judge(0, states, NOW, SETTINGS)
    assert verdict.kind == "backend" and "ranks 0, 1 wait in gather #7" in verdict.headline


def test_silent_and_missing_ranks_are_named():
    silent = running(1)
    silent["beat"] = NOW - 60
    verdict = judge(0, [waiting(0), silent, None], NOW, SETTINGS)
    assert verdict.culprits == [1, 2]
    assert "no heartbeat for 60 s" in verdict.report
    assert "rank 2 has not reported" in verdict.report


def test_a_rank_not_in_a_collective_judges_nothing():
    assert judge(1, [waiting(0), running(1)], NOW, SETTINGS) is None


def test_rank_lists():
    assert rank_list([3]) == "rank 3"
    assert rank_list([2, 0, 3]) == "ranks 0, 2, 3"
    assert rank_list([0, 1, 2, 3, 7]) == "ranks 0-3, 7"


def test_stuck_timeout_sources_and_precedence():
    launch = {"stuck_timeout": 40}
    assert resolve_watch_settings(None, {}, env={}).stuck_timeout == 300.0
    assert resolve_watch_settings(None, {}, env={}).explicit is False
    assert resolve_watch_settings(None, launch, env={}).stuck_timeout == 40.0
    assert (
        resolve_watch_settings(None, launch, env={"CADENCE_STUCK_TIMEOUT": "20"}).stuck_timeout
        == 20.0
    )
    chosen = resolve_watch_settings(
        timedelta(seconds=5), launch, env={"CADENCE_STUCK_TIMEOUT": "20"}
    )
    assert chosen.stuck_timeout == 5.0 and chosen.explicit
    assert resolve_watch_settings(0, {}, env={}).stuck_timeout is None  # 0 turns the check off


@pytest.mark.parametrize("value", ["soon", -1, float("nan"), [3]])
def test_bad_stuck_timeouts_say_what_to_give(value):
    with pytest.raises(ValueError, match="CADENCE_STUCK_TIMEOUT=.*seconds"):
        parse_seconds(value, "CADENCE_STUCK_TIMEOUT")


def test_bad_stuck_timeout_fails_before_any_process_group_is_made(monkeypatch):
    from cadence import InitProcessGroupKwargs
    from cadence.state import PartialState, reset_state

    with pytest.raises(ValueError, match="InitProcessGroupKwargs.stuck_timeout"):
        InitProcessGroupKwargs(stuck_timeout="later")
    monkeypatch.setenv("CADENCE_STUCK_TIMEOUT", "later")
    reset_state()
    with pytest.raises(ValueError, match="CADENCE_STUCK_TIMEOUT='later'"):
        PartialState()
    assert not PartialState._shared_state.get("device")
    reset_state()
