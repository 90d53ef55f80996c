"""Subgroups and a 2 x 2 mesh (the mesh test needs 4 ranks)."""
import numpy as np
import pytest

import tdist


def test_world_info(rank, size):
    w = tdist.GroupMember.WORLD
    assert w.rank() == rank and w.size() == size
    assert tdist.get_backend() == "cpu"
    assert tdist.get_process_group_ranks(w) == list(range(size))


def test_new_group_even_odd(rank, size):
    evens = list(range(0, size, 2))
    odds = list(range(1, size, 2))
    ge = tdist.new_group(evens)
    go = tdist.new_group(odds) if odds else tdist.GroupMember.NON_GROUP_MEMBER
    mine, other = (ge, go) if rank % 2 == 0 else (go, ge)
    members = evens if rank % 2 == 0 else odds
    assert other is tdist.GroupMember.NON_GROUP_MEMBER
    assert tdist.get_rank(mine) == members.index(rank)
    assert tdist.get_world_size(mine) == len(members)
    x = np.array([rank], np.int64)
    tdist.all_reduce(x, group=mine, async_op=True).wait()
    assert x[0] == sum(members)
    # src is a world rank, as in torch; group_src a group rank
    y = np.array([rank], np.int64)
    tdist.broadcast(y, src=members[-1], group=mine)
    assert y[0] == members[-1]
    y[0] = rank
    tdist.broadcast(y, group_src=0, group=mine)
    assert y[0] == members[0]
    # ops on a group this rank is not in do nothing (torch's behaviour)
    assert tdist.all_reduce(x, group=other) is None
    tdist.destroy_process_group(mine)
    with pytest.raises(tdist.InvalidStateError):
        tdist.all_reduce(x, group=mine)


def test_new_group_reversed(rank, size):
    ranks = list(reversed(range(size)))
    g = tdist.new_group(ranks)
    assert g.rank() == size - 1 - rank
    out = np.zeros(size, np.int32)
    tdist.all_gather_into_tensor(out, np.array([rank], np.int32), group=g)
    assert list(out) == ranks
    tdist.destroy_process_group(g)


def test_mesh_2x2(rank, size):
    if size != 4:
        pytest.skip("the 2 x 2 mesh needs 4 ranks")
    mesh = tdist.init_device_mesh((2, 2), mesh_dim_names=("dp", "tp"))
    groups, coords = mesh
    assert coords == (rank // 2, rank % 2)
    assert mesh.get_local_rank("tp") == rank % 2
    # tp groups: {0,1}, {2,3}; dp groups: {0,2}, {1,3}
    assert groups[1].ranks == (2 * (rank // 2), 2 * (rank // 2) + 1)
    assert groups[0].ranks == (rank % 2, rank % 2 + 2)
    x = np.array([rank], np.int64)
    y = np.array([rank], np.int64)
    w1 = tdist.all_reduce(x, group=mesh["tp"], async_op=True)
    w2 = tdist.all_reduce(y, group=mesh.get_group("dp"), async_op=True)
    w1.wait()
    w2.wait()
    assert x[0] == sum(groups[1].ranks) and y[0] == sum(groups[0].ranks)
    for g in groups:
        tdist.destroy_process_group(g)


def test_mesh_three_dims(rank, size):
    mesh = tdist.init_device_mesh((1, size, 1))
    assert mesh.shape == (1, size, 1) and mesh.coords == (0, rank, 0)
    assert mesh.groups[1].size() == size and mesh.groups[0].size() == 1
    for g in mesh.groups:
        tdist.destroy_process_group(g)
    with pytest.raises(tdist.InvalidArgumentError):
        tdist.init_device_mesh((size + 1,))
