"""Shared fixtures: every test module runs on all ranks of one tdistrun job (the same
tests in the same order, so collectives line up); the world group is made once."""
import os

import numpy as np
import pytest

import tdist


@pytest.fixture(scope="session", autouse=True)
def world():
    if os.environ.get("TDIST_PYTEST_WORLD") == "0":  # tests that start their own processes
        yield None
        return
    if not tdist.is_initialized():
        tdist.init_process_group()
    yield tdist.GroupMember.WORLD
    if tdist.is_initialized():
        tdist.destroy_process_group()


@pytest.fixture
def rank():
    return tdist.get_rank()


@pytest.fixture
def size():
    return tdist.get_world_size()


# Every dtype the loaded library and NumPy both have (bfloat16 and float8 need ml_dtypes).
def numpy_dtypes():
    from tdist import _types
    out = []
    for name, kind, nbytes, aliases in _types.DTYPES:
        if name not in _types.BY_NAME:
            continue
        try:
            dt = np.dtype(name)
        except TypeError:
            continue
        out.append(dt)
    return out


def job_id():
    """Unique per tdistrun job (the store's URL), the same on every rank."""
    url = os.environ.get("TDIST_STORE_URL") or os.environ.get("MASTER_PORT", "0")
    return url.rsplit(":", 1)[-1]
