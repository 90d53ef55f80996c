#!/usr/bin/env python3
"""The Python package on a real GPU: all_reduce (SUM) of torch and CuPy CUDA arrays of
every dtype they have, under ``tdistrun -n N --backend nccl``; run by tests/gpu/run.sh.
(JAX is left out: its arrays are immutable and it takes most of the GPU's memory.)

Rank r holds (r + 1) * [1, 2, 4, 1, ...]; the sum over N ranks is N(N+1)/2 times that,
exact in every type at N <= 3 (float8_e5m2 has 2 mantissa bits). The result is compared
byte for byte with the expected values made the same way, so a wrong element type (what
a '<V2' typestr taken for another type would give) cannot pass. bool, int16 and uint16
have no NCCL type: they must be refused (NotSupportedError) before anything is sent.

One line per case, "PYDTYPE <lib> <dtype> PASS|FAIL|REFUSED|SKIP <detail>"; exit 1 if
any case failed.
"""
import os
import sys

import tdist

NOT_IN_NCCL = {"bool", "int16", "uint16"}
COUNT = 7


def values(scale):
    return [scale * (1 << (i % 3)) for i in range(COUNT)]


def torch_cases():
    import torch
    dev = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    torch.cuda.set_device(dev)
    for name in ("bool", "uint8", "int8", "int16", "uint16", "int32", "uint32", "int64",
                 "uint64", "float16", "bfloat16", "float32", "float64", "float8_e4m3fn",
                 "float8_e5m2"):
        dt = getattr(torch, name, None)
        if dt is None:
            yield name, None, "this torch lacks it"
            continue

        def make(scale, dt=dt):
            # through float32 on the GPU: the casts to float8 and the uint types exist there
            t = torch.tensor(values(scale), dtype=torch.float32, device="cuda")
            return t.to(dt)

        def as_bytes(t):
            torch.cuda.synchronize()
            return t.contiguous().view(torch.uint8).cpu().numpy().tobytes()
        yield name, (make, as_bytes), None


def cupy_cases():
    import cupy
    import numpy as np
    cupy.cuda.Device(int(os.environ.get("LOCAL_RANK", "0")) %
                     cupy.cuda.runtime.getDeviceCount()).use()
    for name in ("bool", "uint8", "int8", "int16", "uint16", "int32", "uint32", "int64",
                 "uint64", "float16", "float32", "float64"):
        dt = np.dtype(name)

        def make(scale, dt=dt):
            return cupy.asarray(np.array(values(scale), dtype=dt))

        def as_bytes(a):
            cupy.cuda.Device().synchronize()
            return cupy.asnumpy(a).tobytes()
        yield name, (make, as_bytes), None


def _loaded_cudart():
    """The CUDA runtime file this process has loaded (torch loads its wheel's at import)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if "/libcudart.so" in path:
                    return path
    except OSError:
        pass
    return None


def main():
    # torch first, so that the backend opens the runtime torch loaded rather than a second
    # copy of it (two runtimes in one process share no streams or events)
    for mod in ("torch", "cupy"):
        try:
            __import__(mod)
        except ImportError:
            pass
    rt = _loaded_cudart()
    if rt and os.path.realpath(rt) != os.path.realpath(os.environ.get("TDIST_CUDART_LIBRARY", "")):
        print(f"PYDTYPE - - NOTE TDIST_CUDART_LIBRARY={rt} (the runtime already loaded)",
              flush=True)
        os.environ["TDIST_CUDART_LIBRARY"] = rt
    tdist.init_process_group("nccl")
    rank, size = tdist.get_rank(), tdist.get_world_size()
    total = size * (size + 1) // 2
    failed = 0
    for lib, cases in (("torch", torch_cases), ("cupy", cupy_cases)):
        try:
            it = list(cases())
        except ImportError as e:
            print(f"PYDTYPE {lib} - SKIP not importable ({e})", flush=True)
            continue
        for name, fns, why in it:
            if fns is None:
                print(f"PYDTYPE {lib} {name} SKIP {why}", flush=True)
                continue
            make, as_bytes = fns
            try:
                x, want = make(rank + 1), as_bytes(make(total))
                as_bytes(x)  # every write to x is done before the op reads it
            except Exception as e:  # the library cannot make it on this GPU
                print(f"PYDTYPE {lib} {name} SKIP cannot make it: {type(e).__name__}: {e}",
                      flush=True)
                continue
            try:
                tdist.all_reduce(x, async_op=True).wait()
                got = as_bytes(x)
            except tdist.NotSupportedError as e:
                ok = name in NOT_IN_NCCL
                failed += not ok
                print(f"PYDTYPE {lib} {name} {'REFUSED' if ok else 'FAIL'} {e}", flush=True)
                continue
            except Exception as e:
                failed += 1
                print(f"PYDTYPE {lib} {name} FAIL {type(e).__name__}: {e}", flush=True)
                continue
            if name in NOT_IN_NCCL:
                failed += 1
                print(f"PYDTYPE {lib} {name} FAIL ran, but NCCL has no such type", flush=True)
            elif got != want:
                failed += 1
                print(f"PYDTYPE {lib} {name} FAIL got {got.hex()} want {want.hex()}", flush=True)
            else:
                print(f"PYDTYPE {lib} {name} PASS", flush=True)
    tdist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
