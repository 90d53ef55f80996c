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
