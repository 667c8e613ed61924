"""Which operators stop the host on a CUDA device: the census's host-sync names, checked on a GPU.

guard's census names some ops as host syncs (guard.model.format.HOST_SYNCS): on a CPU they are
just ops, on a GPU each one waits for the device. This script runs each pattern on a CUDA tensor
under torch.profiler (CPU and CUDA activity) and prints, per pattern, the aten ops it issued and
the CUDA runtime calls that block or copy device-to-host (cudaStreamSynchronize,
cudaMemcpyAsync/cudaMemcpy, cudaDeviceSynchronize). Needs a CUDA device; torch only.

    python3 benchmarks/host_syncs_cuda.py
"""

from __future__ import annotations

import collections
import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile

BLOCKING = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaMemcpy", "cudaEventSynchronize")


def patterns(x: torch.Tensor, mask: torch.Tensor):
    return {
        ".item()": lambda: x.sum().item(),
        "nonzero": lambda: torch.nonzero(mask),
        "boolean-mask read x[mask]": lambda: x[mask],
        "boolean-mask write x[mask] = 0": lambda: x.__setitem__(mask, 0.0),
        "index write x[idx] = 0 (tensor index)": lambda: x.__setitem__(torch.arange(4, device=x.device), 0.0),
        ".tolist()": lambda: x[:8].tolist(),
        ".cpu()": lambda: x.cpu(),
        "host-to-device copy": lambda: torch.ones(1024).to(x.device),
        "x * 2 (no sync: control)": lambda: x * 2,
    }


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 1
    dev = torch.device("cuda")
    x = torch.randn(4096, device=dev)
    mask = x > 0
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "patterns": {}}
    for name, fn in patterns(x.clone(), mask).items():
        fn()  # warm: first calls allocate and load kernels
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
        torch.cuda.synchronize()
        ops = collections.Counter(e.name for e in prof.events() if e.name.startswith("aten::"))
        runtime = collections.Counter(e.name for e in prof.events() if e.name in BLOCKING)
        out["patterns"][name] = {"aten": dict(ops), "blocking_runtime_calls": dict(runtime)}
        print(f"{name:40} sync/copy: {dict(runtime) or '-'}")
        print(f"{'':40} aten: {', '.join(f'{k} {v}' for k, v in sorted(ops.items()))}")
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
