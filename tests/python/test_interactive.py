"""import tdist where the interpreter cannot be restarted: a real interactive session on a
pseudo-terminal (what IPython and `python3 -i` users have) and a long-lived embedded
interpreter that runs cells read from a pipe (a notebook kernel's shape). Each defines state
before `import tdist`, runs collectives, and checks that the state and the process (same
pid) are still there. Run without GLIBC_TUNABLES in the children's environment: the import
must work as it is.

Not under tdistrun: each child makes its own one-rank world (TDIST_PYTEST_WORLD=0)."""
import os
import pty
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def free_port():
    """A port for a store to listen on, drawn below the kernel's ephemeral range: a port
    from bind(0) comes from the range outgoing connections use, so a test running beside
    this one could take it before the store listens (as tests/support/mp.c)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        lo = 32768
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(256 if lo - 12000 >= 1000 else 0):
        p = rng.randrange(12000, lo)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("", p))
                return p
            except OSError:
                continue
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env():
    env = {k: v for k, v in os.environ.items()
           if k not in ("GLIBC_TUNABLES", "PYTHONSTARTUP", "TDIST_PYTEST_WORLD")
           and not k.startswith("PYTEST")}
    env["PYTHONPATH"] = os.path.join(REPO, "python")
    env["TDIST_STORE_HOSTED"] = "0"
    env["TERM"] = "dumb"
    return env


def cells(port):
    """The session, cell by cell. Markers are printed as "RES" + "ULT" so that the
    terminal's echo of the input never matches them."""
    return [
        "before = {'answer': 41}; import os, threading; pid0 = os.getpid()",
        "import numpy as np, tdist",
        f"tdist.init_process_group(backend='cpu', init_method='tcp://127.0.0.1:{port}', "
        "rank=0, world_size=1, timeout=60)",
        "x = np.full(8, 3.0); tdist.all_reduce(x); fut = tdist.all_reduce(x, "
        "async_op=True).get_future(); seen = []",
        "fut.then(lambda f: seen.append(threading.current_thread().name)).wait(); "
        "w = tdist.barrier(async_op=True); w.wait()",
        "print('RES' + 'ULT', before['answer'] + 1, os.getpid() == pid0, float(x.sum()), "
        "fut.wait()[0] is x, tdist.version_string() != '', flush=True)",
        "tdist.destroy_process_group(); print('DO' + 'NE', flush=True)",
    ]


def read_until(fd, marker, timeout, buf, count=1):
    """Read the terminal until `marker` appeared `count` times in the whole output."""
    deadline = time.monotonic() + timeout
    while buf[0].count(marker) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no {marker!r} within {timeout} s; output so far:\n{buf[0]}")
        r, _, _ = select.select([fd], [], [], left)
        if r:
            try:
                data = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                data = b""
            if not data:
                raise AssertionError(f"EOF before {marker!r}; output:\n{buf[0]}")
            buf[0] += data.decode("utf-8", "replace")
    return buf[0]


def result_line(out):
    for line in out.replace("\r", "").splitlines():
        if line.startswith("RESULT "):
            return line
    raise AssertionError(out)


def test_interactive_session_on_a_pty():
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-q", "-i"], stdin=slave, stdout=slave, stderr=slave,
                         env=child_env(), cwd=REPO, close_fds=True, start_new_session=True)
    os.close(slave)
    buf = [""]
    try:
        assert os.isatty(master)
        read_until(master, ">>> ", 30, buf)
        for cell in cells(free_port()):
            prompts = buf[0].count(">>> ")
            os.write(master, cell.encode() + b"\n")
            read_until(master, ">>> ", 60, buf, prompts + 1)  # the cell ran: a new prompt
        out = read_until(master, "DONE", 30, buf)
        assert result_line(out) == "RESULT 42 True 24.0 True True", out
        os.write(master, b"exit()\n")
        assert p.wait(30) == 0
        assert p.pid  # the same process all along (pid0 == os.getpid() above)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        os.close(master)


PY_KERNEL = r'''
import sys
ns = {"__name__": "__main__"}
cell = []
for line in sys.stdin:
    if line == "#%%END\n":
        try:
            exec(compile("".join(cell), "<cell>", "exec"), ns)
            print("#%%DONE ok", flush=True)
        except BaseException as e:
            print(f"#%%DONE error {e!r}", flush=True)
        cell = []
    else:
        cell.append(line)
'''

C_KERNEL = r'''
/* A host program with an embedded interpreter: cells come from stdin, end with
 * "#%%END"; the GIL is released between cells, as a kernel's event loop does. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
  Py_Initialize();
  PyObject *ns = PyModule_GetDict(PyImport_AddModule("__main__"));
  PyThreadState *ts = PyEval_SaveThread();
  size_t cap = 1 << 20, len = 0;
  char *cell = malloc(cap), line[65536];
  while (fgets(line, sizeof line, stdin)) {
    if (strcmp(line, "#%%END\n") == 0) {
      cell[len] = 0;
      PyGILState_STATE g = PyGILState_Ensure();
      PyObject *r = PyRun_String(cell, Py_file_input, ns, ns);
      if (!r) PyErr_Print(); else Py_DECREF(r);
      PyRun_SimpleString("import sys; sys.stdout.flush(); sys.stderr.flush()");
      PyGILState_Release(g);
      printf("#%%%%DONE %s\n", r ? "ok" : "error"); /* "#%%DONE" */
      fflush(stdout);
      len = 0;
      continue;
    }
    size_t l = strlen(line);
    if (len + l + 1 < cap) { memcpy(cell + len, line, l); len += l; }
  }
  PyEval_RestoreThread(ts);
  free(cell);
  return Py_FinalizeEx() < 0 ? 1 : 0;
}
'''


def _build_c_kernel(tmp_path):
    # the -config of this interpreter (its libpython, its site-packages with NumPy)
    here = os.path.dirname(sys.executable)
    ver = f"{sys.version_info[0]}.{sys.version_info[1]}"
    cands = [os.path.join(here, f"python{ver}-config"), os.path.join(here, "python3-config"),
             os.path.join(here, f"{sys.implementation._multiarch}-python{ver}-config")
             if hasattr(sys.implementation, "_multiarch") else ""]
    cfg = next((c for c in cands if c and os.path.exists(c)), "")
    cc = shutil.which(os.environ.get("CC", "cc"))
    if not cc or not os.path.exists(cfg):
        pytest.skip("no C compiler or pythonX.Y-config (python3-dev) for an embedded interpreter")
    try:
        flags = subprocess.run([cfg, "--cflags", "--embed", "--ldflags"], check=True,
                               capture_output=True, text=True).stdout.split()
    except subprocess.CalledProcessError:
        pytest.skip("python3-config --embed failed")
    src, exe = tmp_path / "kernel.c", tmp_path / "kernel"
    src.write_text(C_KERNEL)
    r = subprocess.run([cc, "-o", str(exe), str(src)] + flags, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot build the embedded kernel: {r.stderr[-500:]}")
    return [str(exe)]


@pytest.mark.parametrize("kind", ["python_kernel", "embedded_c_kernel"])
def test_long_lived_kernel_reading_cells_from_a_pipe(kind, tmp_path):
    if kind == "python_kernel":
        argv = [sys.executable, "-c", PY_KERNEL]
    else:
        argv = _build_c_kernel(tmp_path)
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, env=child_env(), cwd=str(tmp_path), text=True,
                         bufsize=1)
    out = []
    try:
        for cell in cells(free_port()):
            p.stdin.write(cell + "\n#%%END\n")
            p.stdin.flush()
            deadline = time.monotonic() + 60
            while True:
                assert time.monotonic() < deadline, "".join(out)
                line = p.stdout.readline()
                assert line, f"the kernel ended early:\n{''.join(out)}"
                out.append(line)
                if line.startswith("#%%DONE"):
                    assert line.strip() == "#%%DONE ok", "".join(out)
                    break
        text = "".join(out)
        assert result_line(text) == "RESULT 42 True 24.0 True True", text
        p.stdin.close()
        assert p.wait(30) == 0, "".join(out) + p.stdout.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
