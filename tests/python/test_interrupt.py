"""Ctrl-C during a blocking wait (issue 41): a SIGINT to rank 0 while it waits for an op
that rank 1 has not joined raises KeyboardInterrupt at once (not at the op's deadline),
the op goes on, and the group stays usable: a later wait on the same Work returns the
op's result once rank 1 joins, and later ops work. Two ranks (tdistrun -n 2); rank 1
joins only when rank 0 tells it to, over a group of its own ("side").

The delay from the signal to the KeyboardInterrupt is printed (the issue asks for
under 1 s; the assertion is a loose sanity bound, for loaded CI machines)."""
import os
import signal
import threading
import time

import numpy as np
import pytest

import tdist

BOUND_S = 5.0  # sanity bound only: the wait wakes every 0.1 s to run signal handlers


@pytest.fixture(scope="module")
def side(world):
    if tdist.get_world_size() != 2:
        pytest.skip("needs exactly 2 ranks")
    return tdist.new_group([0, 1])


def _sigint_later(delay):
    """SIGINT to this process after `delay` s, from a helper thread (as a Ctrl-C comes
    from outside: the main thread is blocked in the wait); returns when it was sent."""
    sent = []

    def fire():
        time.sleep(delay)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)
    t = threading.Thread(target=fire, daemon=True)
    t.start()
    return t, sent


def _interrupted(fn, what):
    t, sent = _sigint_later(0.3)
    with pytest.raises(KeyboardInterrupt):
        fn()
    got = time.monotonic()
    t.join()
    delay = got - sent[0]
    print(f"\n[rank 0] {what}: KeyboardInterrupt {delay * 1000:.1f} ms after SIGINT",
          flush=True)
    assert delay < BOUND_S, f"{what}: KeyboardInterrupt came {delay:.2f} s after SIGINT"


def _eventually(cond, what):
    """An interrupted blocking op has no Work to wait on: it completes in the background
    (ops of one group may run concurrently, so a later op's end does not order it)."""
    end = time.monotonic() + 60
    while not cond():
        assert time.monotonic() < end, f"{what}: the interrupted op never completed"
        time.sleep(0.01)


def _go(side, rank):
    """Rank 0 tells rank 1 to join the pending op (over the side group)."""
    if rank == 0:
        tdist.send(np.ones(1, np.int32), dst=1, group=side)
    else:
        tdist.recv(np.zeros(1, np.int32), src=0, group=side)


def test_ctrl_c_in_work_wait_then_the_same_wait_completes(side, rank):
    x = np.zeros(64, np.float64)
    if rank == 0:
        w = tdist.irecv(x, src=1)
        _interrupted(w.wait, "Work.wait on an irecv")
        assert not w.is_completed()  # the op goes on
        _go(side, rank)
        w.wait()  # the same Work, waited again
        assert (x == np.arange(64)).all()
    else:
        _go(side, rank)
        tdist.send(np.arange(64, dtype=np.float64), dst=0)
    tdist.barrier()


def test_ctrl_c_in_future_wait_and_blocking_all_reduce(side, rank):
    x = np.full(8, rank + 1.0)
    if rank == 0:
        fut = tdist.all_reduce(x, async_op=True).get_future()
        _interrupted(fut.wait, "Future.wait on an all_reduce")
        _go(side, rank)
        assert (fut.wait()[0] == 3.0).all()
    else:
        _go(side, rank)
        tdist.all_reduce(x)
        assert (x == 3.0).all()

    # A blocking (async_op=False) all_reduce and barrier: interrupted on rank 0, they go
    # on in the background; the ops after them on the group complete in order.
    y = np.full(8, rank + 1.0)
    if rank == 0:
        _interrupted(lambda: tdist.all_reduce(y), "blocking all_reduce")
        _interrupted(tdist.barrier, "barrier")
        _go(side, rank)
    else:
        _go(side, rank)
        tdist.all_reduce(y)
        tdist.barrier()
    z = np.full(4, 10.0 * (rank + 1))
    tdist.all_reduce(z)
    assert (z == 30.0).all()
    tdist.barrier()
    if rank == 0:
        _eventually(lambda: (y == 3.0).all(), "blocking all_reduce")


def test_ctrl_c_in_blocking_recv(side, rank):
    buf = np.zeros(16, np.int64)
    if rank == 0:
        _interrupted(lambda: tdist.recv(buf, src=1), "blocking recv")
        _go(side, rank)
        _eventually(lambda: (buf == np.arange(16) * 7).all(), "blocking recv")
    else:
        _go(side, rank)
        tdist.send(np.arange(16, dtype=np.int64) * 7, dst=0)
    tdist.barrier()
