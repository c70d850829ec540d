"""The progress watchdog: a rank that stops beating for train.fault_timeout_s exits, naming itself; a rank waiting in
one of vlgrpo's collectives gets a grace, so the rank that blocked elsewhere fires first and is the one named."""

import time

from vlgrpo.trainer.watchdog import EXIT_HUNG, WAITING_GRACE, Watchdog, waiting_for_ranks


def _fired_after(waiting: bool, timeout: float = 0.4) -> float:
    """Seconds from the last beat to the watchdog's exit (its exit replaced by a recorder)."""
    fired = []
    dog = Watchdog(timeout, rank=1, poll_s=0.02, exit=lambda code: fired.append((code, time.monotonic())))
    dog.start()
    t0 = time.monotonic()
    dog.beat("update")
    try:
        if waiting:
            with waiting_for_ranks("a test all-reduce"):
                while not fired and time.monotonic() - t0 < 5:
                    time.sleep(0.01)
        else:
            while not fired and time.monotonic() - t0 < 5:
                time.sleep(0.01)
    finally:
        dog.stop()
    assert fired and fired[0][0] == EXIT_HUNG
    return fired[0][1] - t0


def test_a_rank_waiting_for_the_others_fires_after_the_rank_that_blocked(capfd):
    alone = _fired_after(waiting=False)
    waiting = _fired_after(waiting=True)
    assert 0.4 <= alone < 0.4 * WAITING_GRACE  # the rank that blocked: at its timeout
    assert waiting >= 0.4 * WAITING_GRACE  # the one waiting in the collective: after the grace
    err = capfd.readouterr().err
    assert "rank 1 made no progress" in err and "waiting for the other ranks in a test all-reduce" in err


def test_beats_from_inside_a_long_phase_keep_a_rank_alive_and_name_its_last_progress(capfd):
    from vlgrpo import heartbeat

    fired = []
    dog = Watchdog(0.3, rank=0, poll_s=0.02, exit=lambda code: fired.append(time.monotonic()))
    dog.start()
    dog.beat("eval")
    t0 = time.monotonic()
    try:
        for batch in range(1, 9):  # 0.8 s of one phase, more than twice the timeout, with a beat every 0.1 s
            time.sleep(0.1)
            heartbeat.beat(f"eval batch {batch}")
        assert not fired
        while not fired and time.monotonic() - t0 < 5:  # the beats stop: it fires
            time.sleep(0.01)
    finally:
        dog.stop()
    assert fired and fired[0] - t0 >= 0.8 + 0.3
    assert "phase 'eval' (last progress: eval batch 8)" in capfd.readouterr().err
    heartbeat.beat("after the watchdog stopped")  # no listener left: nothing happens
