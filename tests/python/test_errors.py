"""Errors raised as the right exception on every rank (each case on a fresh subgroup, so
the world stays usable), and the exception table against include/tdist/errors.h."""
import os
import re
import time

import numpy as np
import pytest

import tdist

HEADER = os.path.join(os.path.dirname(__file__), "..", "..", "include", "tdist", "errors.h")


def test_every_code_has_a_class():
    from tdist import _errors
    names = re.findall(r"X\((\w+), (-\d+),", open(HEADER).read())
    assert names, "errors.h table not found"
    for name, code in names:
        cls = _errors._by_code.get(int(code))
        assert cls is not None and issubclass(cls, tdist.TdistError), name
        e = _errors.error(int(code), "m")
        assert e.code == int(code) and e.name == "TDIST_ERR_" + name and str(e) == "m"
    assert _errors._by_code[-3] is tdist.TimeoutError
    assert _errors._by_code[-5] is tdist.RemoteFailure
    assert _errors._by_code[-6] is tdist.MismatchError
    assert _errors._by_code[-4] is tdist.AbortedError
    assert issubclass(tdist.InvalidArgumentError, ValueError)
    e = tdist.RemoteFailure("all_reduce seq 3 of group 'world' (rank 0/3): rank 2 (world rank "
                            "5, 127.0.0.1:4000) is gone", -5, "TDIST_ERR_REMOTE_FAILED")
    assert (e.rank, e.world_rank) == (2, 5)
    # relayed by another member: the failed rank is the one blamed, not the relay
    e = tdist.RemoteFailure("rank 0 (world rank 4) aborted the group: rank 2 (world rank 5, "
                            "127.0.0.1:4000) closed its connection", -5, "TDIST_ERR_REMOTE_FAILED")
    assert (e.rank, e.world_rank) == (2, 5)
    # aborted on demand by a member: that member (issue 41: the world rank too)
    e = tdist.AbortedError("recv seq 0 of group 'g' (rank 1/2): rank 0 (world rank 3) aborted "
                           "the group: aborted on demand: uncaught ValueError: x", -4,
                           "TDIST_ERR_ABORTED")
    assert (e.rank, e.world_rank) == (0, 3)
    assert tdist.AbortedError("group destroyed with the op pending", -4).rank is None


def fresh(size):
    return tdist.new_group(list(range(size)), timeout=20)


def test_mismatch_count(rank, size):
    if size < 2:
        pytest.skip("needs 2 ranks")
    g = fresh(size)
    x = np.zeros(4 + (rank == 1), np.float32)  # rank 1 sends one element more
    w = None
    with pytest.raises(tdist.MismatchError) as ei:
        # a rank slow to submit may find the group already aborted by a faster
        # peer's report: then the submit itself raises the same error
        w = tdist.all_reduce(x, group=g, async_op=True)
        w.wait()
    assert ei.value.code == -6 and "count" in str(ei.value).lower() or "mismatch" in str(ei.value)
    if w is not None:
        assert isinstance(w.exception(), tdist.MismatchError)
    # the group is aborted: a later op fails at once with the same cause
    with pytest.raises(tdist.TdistError):
        tdist.all_reduce(np.zeros(1), group=g)
    tdist.destroy_process_group(g)


def test_mismatch_dtype_sync(rank, size):
    if size < 2:
        pytest.skip("needs 2 ranks")
    g = fresh(size)
    x = np.zeros(4, np.float32 if rank else np.int32)
    with pytest.raises(tdist.MismatchError):
        tdist.all_reduce(x, group=g)  # the blocking form raises the same class
    tdist.destroy_process_group(g)


def test_timeout(rank, size):
    """Rank 0 waits for a collective the others never join: TimeoutError on rank 0; the
    others see the group aborted."""
    if size < 2:
        pytest.skip("needs 2 ranks")
    g = fresh(size)
    g.timeout = 0.5
    if rank == 0:
        t0 = time.monotonic()
        with pytest.raises(tdist.TimeoutError) as ei:
            tdist.all_reduce(np.zeros(1), group=g, async_op=True).wait()
        assert ei.value.code == -3 and time.monotonic() - t0 < 15
    tdist.barrier()  # on the world, which is unaffected
    if rank != 0:
        deadline = time.monotonic() + 10
        while not g.is_aborted() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert g.is_aborted()
        with pytest.raises(tdist.TdistError):
            tdist.all_reduce(np.zeros(1), group=g)
    tdist.destroy_process_group(g)


def test_barrier_timeout_aborts_the_group(rank, size):
    """barrier(timeout=) is the barrier op's deadline, not a wait's: when it expires the
    group is aborted (as for any op past its timeout) on every rank, rank 0 gets
    TimeoutError, and every later op on the group raises the abort (docs/python.md); a
    wait's own timeout (Work.wait(timeout)) is the one that leaves the op running."""
    if size < 2:
        pytest.skip("needs 2 ranks")
    g = fresh(size)
    if rank == 0:
        with pytest.raises(tdist.TimeoutError) as ei:
            tdist.barrier(group=g, timeout=0.5)  # the others never enter it
        assert ei.value.code == -3
        assert g.is_aborted()
        with pytest.raises(tdist.AbortedError):  # the abort's status: a timeout's
            tdist.barrier(group=g)
        with pytest.raises(tdist.AbortedError):
            tdist.all_reduce(np.zeros(1), group=g)
    tdist.barrier()  # on the world, which is unaffected
    if rank != 0:
        deadline = time.monotonic() + 10
        while not g.is_aborted() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert g.is_aborted()  # rank 0's abort reached them
        with pytest.raises(tdist.TdistError):
            tdist.barrier(group=g)
    tdist.destroy_process_group(g)


def test_wait_timeout_is_in_progress(rank, size):
    if size < 2:
        pytest.skip("needs 2 ranks")
    y = np.zeros(1)
    if rank == 0:
        w = tdist.irecv(y, src=1)
        with pytest.raises(tdist.InProgressError) as ei:
            w.wait(timeout=0.05)
        assert isinstance(ei.value, tdist.TimeoutError) and not w.is_completed()
        tdist.barrier()
        w.wait()
        assert y[0] == 42
    elif rank == 1:
        tdist.barrier()
        tdist.send(np.array([42.0]), dst=0)
    else:
        tdist.barrier()
