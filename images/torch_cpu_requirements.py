"""Print the requirements that torch's PyPI wheel needs to import and run on CPU.

PyPI's Linux torch wheel is the CUDA build. Its shared objects (libtorch_cpu, libtorch_cuda,
libtorch_python) are linked against the CUDA runtime libraries, so `import torch` fails without
them even on a machine without a GPU. This script reads the installed torch's own requirements
(so it follows the torch version) and keeps:
  - the pure-Python ones (sympy, networkx, ...);
  - the CUDA libraries that torch's shared objects name as NEEDED (checked with readelf on the
    2.15 wheel): cudart, cupti, cublas(Lt), cufft, cufile, cusparse, nvrtc, cuDNN, cuSPARSELt,
    NCCL, NVSHMEM.
It drops what is only loaded on demand or only used by the compiler stack: triton (torch.compile),
cuda-bindings, and the cuda-toolkit parts cusolver (CUDA linalg, loaded lazily), nvjitlink and
nvtx. Run it with the interpreter that has torch installed (with --no-deps).
"""

import importlib.metadata
import re

DROP = {"triton", "cuda-bindings"}
TOOLKIT_PARTS = {"cublas", "cudart", "cufft", "cufile", "cupti", "cusparse", "nvrtc"}


def requirements() -> list[str]:
    out = []
    for req in importlib.metadata.requires("torch") or []:
        spec, _, marker = req.partition(";")
        if "extra ==" in marker:
            continue
        name = re.match(r"[A-Za-z0-9._-]+", spec.strip())
        if name is None or name.group(0).lower() in DROP:
            continue
        if name.group(0).lower() == "cuda-toolkit":
            extras = re.search(r"\[([^\]]*)\]", spec)
            keep = [e for e in (extras.group(1).split(",") if extras else []) if e in TOOLKIT_PARTS]
            spec = re.sub(r"\[[^\]]*\]", "[" + ",".join(sorted(keep)) + "]", spec)
        out.append(spec.strip() + (f"; {marker.strip()}" if marker.strip() else ""))
    return out


if __name__ == "__main__":
    print("\n".join(requirements()))
