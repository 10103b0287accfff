"""Remove from a CPU image what torch's CUDA wheel brings but a CPU process never loads.

Run after the TORCH=cpu install (Dockerfile.trainer). torch's shared objects name
libcudnn.so.9 as NEEDED, but that library is a small loader: the cuDNN engines, graph, ops and
heuristics libraries (libcudnn_*.so.9, about 850 MB) are opened by it only when a cuDNN
operation runs on a GPU. Headers and static libraries are for compiling against CUDA, which
nothing in the image does. `import torch` and training on CPU are unaffected (the Dockerfile
checks both right after this runs).
"""

import sys
import sysconfig
from pathlib import Path

PATTERNS = ("cudnn/lib/libcudnn_*.so*", "*/include", "*/lib/*.a")


def prune(nvidia: Path) -> int:
    freed = 0
    for pattern in PATTERNS:
        for path in sorted(nvidia.glob(pattern)):
            files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
            freed += sum(f.stat().st_size for f in files)
            for f in files:
                f.unlink()
    return freed


if __name__ == "__main__":
    root = Path(sysconfig.get_paths()["purelib"]) / "nvidia"
    if not root.is_dir():
        sys.exit(f"{root} does not exist: run this after installing torch's CUDA libraries")
    print(f"removed {prune(root) / 2**20:.0f} MiB from {root}")
