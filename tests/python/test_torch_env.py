"""tdist.torch under a torchrun-style environment and no tdistrun: 3 ranks started here by
hand with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT only."""
import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("torch")


def test_env_only():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TDIST_STORE", "TDIST_HOST_AGENT", "RANK", "WORLD_SIZE",
                                "LOCAL_RANK", "MASTER_"))}
    script = os.path.join(os.path.dirname(__file__), "torch_envonly.py")
    n = 3
    procs = [subprocess.Popen([sys.executable, script],
                              env=dict(env, RANK=str(r), WORLD_SIZE=str(n),
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(n)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"rank {r} OK" in out, f"rank {r}:\n{out}"
