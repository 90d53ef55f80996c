"""Blocking waits release the GIL: another Python thread keeps counting meanwhile."""
import threading
import time

import numpy as np
import pytest

import tdist


class Counter(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.n = 0
        self.stop = False

    def run(self):
        while not self.stop:
            self.n += 1


def _counted(fn):
    c = Counter()
    c.start()
    time.sleep(0.05)
    n0 = c.n
    t0 = time.monotonic()
    fn()
    dt = time.monotonic() - t0
    n1 = c.n
    c.stop = True
    c.join()
    return n1 - n0, dt


@pytest.mark.parametrize("how", ["work_wait", "blocking_recv", "blocking_all_reduce"])
def test_wait_releases_gil(how, rank, size):
    if size < 2:
        pytest.skip("needs 2 ranks")
    hold = 0.6  # rank 1 holds the op back this long
    x = np.zeros(1)
    if rank == 0:
        tdist.barrier()
        if how == "work_wait":
            w = tdist.irecv(x, src=1)
            counted, dt = _counted(w.wait)
        elif how == "blocking_recv":
            counted, dt = _counted(lambda: tdist.recv(x, src=1))
        else:
            counted, dt = _counted(lambda: tdist.all_reduce(x))
        assert dt >= hold * 0.5, "the op did not block"
        # A thread that gets the GIL counts millions per second; one starved by a wait that
        # holds the GIL counts nothing (it might run only between switch intervals).
        assert counted > 10000, f"{counted} counts in {dt:.2f} s: the GIL was held"
    else:
        tdist.barrier()
        time.sleep(hold)
        if rank == 1 and how != "blocking_all_reduce":
            tdist.send(np.ones(1), dst=0)
        elif how == "blocking_all_reduce":
            tdist.all_reduce(x)


def _hold_gil(seconds):
    """Keep the GIL for `seconds`: a C sleep called through PyDLL, which does not release it
    (no other Python thread runs meanwhile, the callback thread included)."""
    import ctypes
    ctypes.PyDLL(None).usleep(int(seconds * 1e6))


def test_gil_held_delays_no_completion_and_no_abort(rank, size):
    """Rank 0 has Python callbacks on pending work and an abort handler on a subgroup, then
    holds the GIL for 3 s. Meanwhile its peers complete that work, abort the subgroup and run
    a world all_reduce with rank 0: none of that may wait for rank 0's GIL (tdist's progress
    thread never takes it). Then rank 0's callbacks run, on the callback thread."""
    if size < 2:
        pytest.skip("needs 2 ranks")
    hold = 3.0
    sub = tdist.new_group(list(range(size)), timeout=30)
    x, y = np.zeros(1), np.ones(1)
    if rank == 0:
        events = []
        aborted = threading.Event()
        done = threading.Event()
        sub.on_abort(lambda g, exc: (events.append(("abort", type(exc).__name__)), aborted.set()))
        w = tdist.irecv(x, src=1)
        w.add_done_callback(lambda w: (events.append(("recv", float(x[0]))), done.set()))
        tdist.barrier()
        ar = tdist.all_reduce(y, async_op=True)  # the peers join it while the GIL is held
        ar_done = threading.Event()
        ar.add_done_callback(lambda w: (events.append(("all_reduce", float(y[0]))),
                                        ar_done.set()))
        t0 = time.monotonic()
        _hold_gil(hold)
        held = time.monotonic() - t0
        # the C side finished both ops during the hold; the Python callbacks come after it
        assert w.is_completed() and ar.is_completed()
        assert done.wait(10) and aborted.wait(10) and ar_done.wait(10)
        assert ("recv", 5.0) in events and ("abort", "AbortedError") in events
        assert ("all_reduce", float(size)) in events
        assert held >= hold * 0.9
        tdist.barrier()
    else:
        tdist.barrier()
        time.sleep(0.2)  # rank 0 is holding the GIL now
        t0 = time.monotonic()
        if rank == 1:
            tdist.send(np.array([5.0]), dst=0)
            sub.abort("abort while rank 0 holds its GIL")
        tdist.all_reduce(y)
        took = time.monotonic() - t0
        # rank 0's progress thread ran the completions and the abort without the GIL;
        # the all_reduce would otherwise wait out the rest of the 3 s hold
        assert took < 1.5, f"the peers waited {took:.2f} s for rank 0's GIL"
        assert y[0] == size
        tdist.barrier()
    tdist.destroy_process_group(sub)
