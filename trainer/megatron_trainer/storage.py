"""Where checkpoints live: a directory (a mounted volume) or object storage (msc://PROFILE/PATH).

The checkpointer, the pruner, `mjob export --hf`, `checkpoint.init` and the profilers see one small
interface; the two implementations differ only where the media do:
  - a directory writes the tracker to a temporary file and renames it over the old one;
  - object storage has no rename, but one PUT is atomic (a reader sees the old object or the new
    one), so the tracker is simply written, last, after every shard and both metadata files.
Either way "the newest complete checkpoint" means the same: a directory with `.metadata`,
`metadata.json` and `common.pt` and every shard `.metadata` names, at full length.

Megatron-Core reads and writes msc:// paths itself through multi-storage-client (its
`MultiStorageClientFeature`); `use_msc` turns that on for an msc:// checkpoint and off for a
directory, so a directory job never goes through MSC. MSC finds its profiles in `MSC_CONFIG`.

`python -m megatron_trainer.storage upload SRC URL` copies a local file to storage: the launcher
(which imports nothing but the standard library) uses it for nsys reports.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from megatron_contract.config import is_msc_url


class Storage(Protocol):
    """Paths are strings: a local path, or an msc:// URL."""

    def join(self, base: str, *parts: str) -> str: ...

    def exists(self, path: str) -> bool: ...

    def is_dir(self, path: str) -> bool: ...

    def names(self, path: str) -> list[str]:
        """The names of a directory's entries (files and subdirectories); [] when absent."""
        ...

    def size(self, path: str) -> int | None:
        """A file's length in bytes; None when it does not exist."""
        ...

    def read_bytes(self, path: str) -> bytes: ...

    def write_atomic(self, path: str, data: bytes) -> None:
        """Readers see the old content or the new, never a part."""
        ...

    def makedirs(self, path: str) -> None: ...

    def remove_tree(self, path: str) -> None: ...

    def upload(self, local: str, path: str) -> None: ...

    def download(self, path: str, local: str) -> None: ...

    def files(self, path: str) -> list[str]:
        """Every file below `path`, relative to it, sorted."""
        ...


class LocalStorage:
    def join(self, base: str, *parts: str) -> str:
        return os.path.join(base, *parts)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def names(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def size(self, path: str) -> int | None:
        try:
            return os.stat(path).st_size
        except FileNotFoundError:
            return None

    def read_bytes(self, path: str) -> bytes:
        return Path(path).read_bytes()

    def write_atomic(self, path: str, data: bytes) -> None:
        tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def remove_tree(self, path: str) -> None:
        # metadata.json first: a kill half-way leaves the directory looking incomplete.
        Path(path, "metadata.json").unlink(missing_ok=True)
        shutil.rmtree(path, ignore_errors=True)

    def upload(self, local: str, path: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        shutil.copyfile(local, path)

    def download(self, path: str, local: str) -> None:
        shutil.copyfile(path, local)

    def files(self, path: str) -> list[str]:
        root = Path(path)
        if not root.is_dir():
            return []
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


class MscStorage:
    """multi-storage-client; every path is an msc://PROFILE/... URL."""

    def __init__(self) -> None:
        import multistorageclient

        self.msc: Any = multistorageclient

    def join(self, base: str, *parts: str) -> str:
        return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])

    def exists(self, path: str) -> bool:
        return self.size(path) is not None or self.is_dir(path)

    def is_dir(self, path: str) -> bool:
        return bool(self.names(path))

    def names(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        out = set()
        for item in self.msc.list(prefix, include_directories=True):
            key = str(item.key)
            if key.startswith(prefix):
                out.add(key[len(prefix) :].strip("/").split("/")[0])
        return sorted(n for n in out if n)

    def size(self, path: str) -> int | None:
        try:
            meta = self.msc.info(path)
        except FileNotFoundError:
            return None
        if getattr(meta, "type", "file") == "directory":
            return None
        return int(meta.content_length)

    def read_bytes(self, path: str) -> bytes:
        with self.msc.open(path, "rb") as f:
            data: bytes = f.read()
        return data

    def write_atomic(self, path: str, data: bytes) -> None:
        self.msc.write(path, data)  # one PUT: atomic on every object store

    def makedirs(self, path: str) -> None:
        """Object stores have no directories: a key's prefix exists once a key under it does."""

    def remove_tree(self, path: str) -> None:
        # metadata.json first, as on a filesystem: a prune killed half-way is seen as incomplete.
        metadata = self.join(path, "metadata.json")
        if self.size(metadata) is not None:
            self.msc.delete(metadata)
        for name in self.files(path):
            self.msc.delete(self.join(path, name))

    def upload(self, local: str, path: str) -> None:
        self.msc.upload_file(path, local)

    def download(self, path: str, local: str) -> None:
        self.msc.download_file(path, local)

    def files(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        found = [str(item.key) for item in self.msc.list_recursive(prefix)]
        return sorted(k[len(prefix) :] for k in found if k.startswith(prefix))


def storage_for(root: str) -> Storage:
    """The storage holding `root` (a directory, or an msc:// URL)."""
    if is_msc_url(root):
        return MscStorage()
    return LocalStorage()


def use_msc(root: str) -> None:
    """Route Megatron-Core's checkpoint I/O through MSC exactly when `root` is an msc:// URL.

    Megatron-Core turns MSC on whenever multi-storage-client is importable; a directory job keeps
    plain file I/O (Megatron-LM's --disable-msc), which is what its checkpoints were tested with."""
    from megatron.core.msc_utils import MultiStorageClientFeature

    if is_msc_url(root):
        MultiStorageClientFeature.enable()
        if not MultiStorageClientFeature.is_enabled():
            raise RuntimeError(
                "checkpoint.dir is an msc:// URL but multi-storage-client is not installed"
            )
    else:
        MultiStorageClientFeature.disable()


def profiles_dir(checkpoint_dir: str, attempt: int) -> str:
    """<checkpoint dir>/profiles/<restart attempt>: the captures of one attempt, one a rank."""
    from megatron_contract.paths import PROFILES_DIR

    return storage_for(checkpoint_dir).join(checkpoint_dir, PROFILES_DIR, str(attempt))


def scratch_dir(*parts: str) -> str:
    """A local directory for files on their way to object storage (MEGATRON_SCRATCH)."""
    import tempfile

    from megatron_contract.env import SCRATCH

    base = os.environ.get(SCRATCH) or os.path.join(tempfile.gettempdir(), "megatron")
    path = os.path.join(base, *parts)
    os.makedirs(path, exist_ok=True)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3 or args[0] != "upload":
        print("usage: python -m megatron_trainer.storage upload LOCAL_FILE URL", file=sys.stderr)
        return 2
    _, local, url = args
    storage_for(url).upload(local, url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
