"""Rank 1 exits with code 3 before it calls init_process_group (run under tdistrun
--no-fail-fast by run_expect.py, TDIST_TIMEOUT_MS=60000): the launcher records the exit
on its store, and the other ranks' rendezvous fails at once naming rank 1 and its exit
code, instead of waiting the 60 s timeout (ctest's own limit on the test is below it)."""
import os

import tdist

if int(os.environ["RANK"]) == 1:
    os._exit(3)
try:
    tdist.init_process_group(timeout=60)
    raise SystemExit("init_process_group succeeded without rank 1")
except tdist.TdistError as e:
    msg = str(e)
    assert "rank 1 exited with code 3" in msg, msg
    print(f"rank {os.environ['RANK']}: {type(e).__name__}: {msg}")
print(f"rank {os.environ['RANK']}: failed fast OK")
