"""A backend plug-in from Python: the package loads libtdist.so with RTLD_LOCAL (ctypes), so
the services a plug-in calls are not in the process's global scope until the library puts
itself there when it loads one (core/init/registry.c). The child names the example backend
(examples/backend/loopback.c, found through TDIST_BACKEND_PATH) in a world of one and checks
the collectives' results.

Not under tdistrun: the child makes its own one-rank world over a file store."""
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import numpy as np, sys, tdist
tdist.init_process_group(backend="loopback", init_method="file://" + sys.argv[1], rank=0,
                         world_size=1)
assert tdist.get_world_size() == 1
x = np.arange(8, dtype=np.float32)
y = x.copy()
tdist.all_reduce(y)
assert (y == x).all(), y
w = tdist.broadcast(y, src=0, async_op=True)
w.wait()
tdist.barrier()
tdist.destroy_process_group()
print("plugin OK")
"""


def test_loopback_plugin_from_python():
    plugdir = os.environ["TDIST_TEST_PLUGIN_DIR"]
    assert os.path.exists(os.path.join(plugdir, "libtdist-backend-loopback.so")), plugdir
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["TDIST_BACKEND_PATH"] = plugdir
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.executable, "-c", CHILD, os.path.join(d, "store")], env=env,
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "plugin OK" in r.stdout
