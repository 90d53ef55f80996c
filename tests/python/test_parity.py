"""torch.distributed parity (issue 27), at 1 to 4 ranks: any-source receives that return
the sender, all_to_all_single with uneven splits, the exception hierarchy, Work futures
with then() and wait() whose value is the output, new_group's torch keywords."""
import builtins
import datetime
import threading

import numpy as np
import pytest

import tdist


def need2(size):
    if size < 2:
        pytest.skip("needs 2 ranks")


def test_recv_without_src_returns_the_sender(rank, size):
    need2(size)
    if rank == 0:
        got = set()
        for _ in range(size - 1):
            x = np.zeros(2, np.int64)
            src = tdist.recv(x)  # any source, as torch's recv(t) without src
            assert x[0] == src and x[1] == 100 + src
            got.add(src)
        assert got == set(range(1, size))
    else:
        tdist.send(np.array([rank, 100 + rank], np.int64), dst=0)
    tdist.barrier()


def test_irecv_without_src_names_the_sender(rank, size):
    need2(size)
    x = np.zeros(3, np.float32)
    w = tdist.irecv(x)  # any source
    s = tdist.isend(np.full(3, rank, np.float32), dst=(rank + 1) % size)
    w.wait()
    s.wait()
    prev = (rank - 1) % size
    assert w.source_rank() == prev and w._source_rank() == prev
    assert (x == prev).all()
    assert w.get_future().wait()[0] is x


def test_irecv_any_source_in_a_subgroup_gives_world_ranks(rank, size):
    need2(size)
    ranks = list(reversed(range(size)))  # group rank i is world rank size-1-i
    g = tdist.new_group(ranks)
    x = np.zeros(1, np.int64)
    w = tdist.irecv(x, group=g)
    nxt = ranks[(g.rank() + 1) % size]  # world rank of the next group rank
    tdist.send(np.array([rank], np.int64), dst=nxt, group=g)
    w.wait()
    assert w.source_rank() == x[0] == ranks[(g.rank() - 1) % size]
    tdist.destroy_process_group(g)


def _a2a_inputs(rank, size, row=2):
    """Rank i sends rank j (i + j + 1) rows of `row` elements valued 100 i + j."""
    send = [rank + j + 1 for j in range(size)]
    recv = [i + rank + 1 for i in range(size)]
    inp = np.concatenate([np.full((send[j], row), 100 * rank + j, np.float64)
                          for j in range(size)])
    out = np.full((sum(recv), row), -1.0)
    return inp, out, send, recv


def _a2a_check(out, rank, size, recv):
    at = 0
    for i in range(size):
        assert (out[at:at + recv[i]] == 100 * i + rank).all(), (i, out)
        at += recv[i]


def test_all_to_all_single_uneven(rank, size):
    inp, out, send, recv = _a2a_inputs(rank, size)
    assert tdist.all_to_all_single(out, inp, recv, send) is None
    _a2a_check(out, rank, size, recv)


def test_all_to_all_single_uneven_async_future(rank, size):
    inp, out, send, recv = _a2a_inputs(rank, size, row=3)
    w = tdist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send,
                                async_op=True)
    val = w.get_future().wait()
    assert val[0] is out
    _a2a_check(out, rank, size, recv)


def test_all_to_all_single_one_side_given(rank, size):
    # input splits given, output split equally (every rank sends each peer 2 rows)
    inp = np.repeat(np.arange(size, dtype=np.int32) + 10 * rank, 2)
    out = np.zeros(2 * size, np.int32)
    tdist.all_to_all_single(out, inp, None, [2] * size)
    assert list(out) == [10 * i + rank for i in range(size) for _ in range(2)]


def test_all_to_all_single_validation(rank, size):
    with pytest.raises(ValueError, match="sum"):
        tdist.all_to_all_single(np.zeros(size), np.zeros(size), [1] * size, [2] * size)
    with pytest.raises(ValueError, match="sizes"):
        tdist.all_to_all_single(np.zeros(size), np.zeros(size), [1] * (size + 1), None)


def test_all_to_all_single_disagreement_is_mismatch(rank, size):
    need2(size)
    g = tdist.new_group(list(range(size)), timeout=20)
    send = [1] * size
    recv = [1] * size
    if rank == 0:  # expects two rows from rank 1, which sends one
        recv = [0, 2] + [1] * (size - 2)
    if rank == 0:  # the rank whose expectation is wrong learns it, named
        with pytest.raises(tdist.MismatchError, match="rank"):
            tdist.all_to_all_single(np.zeros(sum(recv)), np.zeros(size), recv, send, group=g)
    else:  # a rank whose own exchanges agree may finish first, else it sees the abort
        try:
            tdist.all_to_all_single(np.zeros(sum(recv)), np.zeros(size), recv, send, group=g)
        except tdist.TdistError as e:
            assert isinstance(e, (tdist.MismatchError, tdist.AbortedError)), e
    tdist.destroy_process_group(g)


def test_exceptions_are_runtime_errors():
    from tdist import _errors
    for code, cls in _errors._by_code.items():
        assert issubclass(cls, RuntimeError), cls
    assert issubclass(tdist.TimeoutError, builtins.TimeoutError)
    assert issubclass(tdist.InProgressError, builtins.TimeoutError)
    assert tdist.DistBackendError is tdist.TdistError and tdist.DistError is tdist.TdistError
    assert issubclass(tdist.DistNetworkError, ConnectionError)
    e = _errors.error(-3, "all_reduce timed out")
    assert isinstance(e, RuntimeError) and isinstance(e, builtins.TimeoutError)
    assert str(e) == "all_reduce timed out" and e.code == -3


def test_timeout_caught_as_builtin_timeout(rank, size):
    need2(size)
    g = tdist.new_group(list(range(size)), timeout=datetime.timedelta(seconds=0.5))
    if rank == 0:
        with pytest.raises(builtins.TimeoutError):
            tdist.all_reduce(np.zeros(1), group=g)  # nobody else joins
    tdist.barrier()
    tdist.destroy_process_group(g)


def test_future_then_and_wait(rank, size):
    x = np.full(5, rank + 1.0)
    w = tdist.all_reduce(x, async_op=True)
    fut = w.get_future()
    seen = []
    chained = fut.then(lambda f: f.value()[0].sum()).then(lambda f: f.wait() * 2)
    fut.add_done_callback(lambda f: seen.append(threading.current_thread().name))
    total = 5 * size * (size + 1) / 2
    assert chained.wait() == 2 * total
    assert fut.wait()[0] is x and fut.done() and fut.value()[0] is x
    assert len(seen) == 1
    assert w.result()[0] is x
    # an error in a then() callback fails the chained future, not the original
    bad = fut.then(lambda f: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        bad.wait()
    # a failed op: wait() raises its error
    f2 = tdist.Future()
    f2.set_exception(tdist.AbortedError("x", -4, "TDIST_ERR_ABORTED"))
    with pytest.raises(tdist.AbortedError):
        f2.wait()


def test_future_waited_from_another_thread(rank, size):
    need2(size)
    x = np.zeros(1)
    if rank == 0:
        fut = tdist.irecv(x, src=1).get_future()
        out = []
        t = threading.Thread(target=lambda: out.append(fut.then(lambda f: f.value()[0][0]).wait()))
        t.start()
        tdist.barrier()
        t.join(30)
        assert out == [7.0]
    else:
        tdist.barrier()
        if rank == 1:
            tdist.send(np.array([7.0]), dst=0)


def test_new_group_torch_keywords(rank, size):
    g = tdist.new_group(list(range(size)), timeout=datetime.timedelta(seconds=30),
                        backend="gloo", pg_options=None, use_local_synchronization=False,
                        group_desc="parity_group")
    assert g.name == "parity_group" and g.timeout == 30
    x = np.ones(1)
    tdist.all_reduce(x, group=g)
    assert x[0] == size
    tdist.destroy_process_group(g)
    with pytest.raises(NotImplementedError, match="pg_options"):
        tdist.new_group(list(range(size)), pg_options=object())
    with pytest.raises(NotImplementedError, match="use_local_synchronization"):
        tdist.new_group(list(range(size)), use_local_synchronization=True)
    with pytest.raises(ValueError, match="backend"):
        tdist.new_group(list(range(size)), backend="nccl")
    # the refusals happen before any collective: the world still works
    tdist.barrier()
