"""Reading a torch_dist checkpoint's `.metadata` without running code from it.

torch's `FileSystemReader.read_metadata` is a bare `pickle.load`: a `.metadata` file can name any
callable, and loading it calls that callable. `mjob export --hf` scans every `iter_*` directory of
a checkpoint someone hands it, and `checkpoint.init.megatron` reads another job's checkpoint, so
both read it through an unpickler that resolves only the classes a checkpoint's metadata is made
of (torch.distributed.checkpoint's metadata and save-plan dataclasses, torch.Size, the dtypes, the
layout helper); any other global is refused with an error naming it.
"""

from __future__ import annotations

import enum
import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from megatron_contract.config import is_msc_url

from .storage import storage_for

_MODULES = {
    "torch.distributed.checkpoint.metadata": {
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.planner": {
        "SavePlan",
        "TensorWriteData",
        "WriteItem",
        "WriteItemType",
        "LoadPlan",
        "ReadItem",
        "LoadItemType",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "collections": {"OrderedDict"},
    # torch's own writer stores the checkpoint's path (storage_meta.checkpoint_id).
    "pathlib": {"Path", "PosixPath", "PurePosixPath"},
}


class MetadataError(Exception):
    """`.metadata` holds something a checkpoint's metadata never does."""


def _enum_member(cls: Any, name: Any) -> Any:
    """What `builtins.getattr` may do in a `.metadata`: name a member of one of the enums above.

    Some Python 3.11 releases (Debian's 3.11.2, in the trainer image) pickle an enum member as
    `getattr(EnumClass, "NAME")` instead of `EnumClass(value)`; torch's TensorProperties holds
    one (`_MEM_FORMAT_ENCODING`). Refusing that refused every checkpoint those ranks wrote, and
    the resume scan deleted them all as incomplete."""
    allowed = isinstance(cls, type) and issubclass(cls, enum.Enum)
    if not allowed or cls.__name__ not in _MODULES.get(cls.__module__, ()):
        raise MetadataError(
            f"refused getattr on {cls!r}: only a member of a checkpoint metadata enum may be named"
        )
    if not isinstance(name, str) or name not in cls.__members__:
        raise MetadataError(f"{cls.__name__} has no member {name!r}")
    return cls[name]


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _MODULES.get(module, ()):
            return super().find_class(module, name)
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        if module == "torch" and (
            name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)
        ):
            return super().find_class(module, name)
        raise MetadataError(
            f"refused to load {module}.{name}: not part of a checkpoint's metadata (a .metadata "
            "file that names it could run code)"
        )


def read_metadata(path: str | Path) -> Metadata:
    """The `.metadata` of the checkpoint directory `path` (a directory or an msc:// URL), read
    with the restricted unpickler."""
    root = str(path)
    store = storage_for(root)
    metadata = _Unpickler(io.BytesIO(store.read_bytes(store.join(root, ".metadata")))).load()
    if not isinstance(metadata, Metadata):
        raise MetadataError(f"{root}/.metadata holds a {type(metadata).__name__}, not Metadata")
    return metadata


def _loaded(metadata: Metadata, load_id: Any) -> Metadata:
    """What torch's readers add after unpickling."""
    storage = metadata.storage_meta
    if storage is None:
        storage = metadata.storage_meta = StorageMeta()
    storage.load_id = load_id
    return metadata


class SafeReader(FileSystemReader):
    """torch's FileSystemReader, reading `.metadata` with the restricted unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return _loaded(read_metadata(str(self.path)), self.load_id)


def safe_reader(path: str) -> Any:
    """A torch.distributed.checkpoint storage reader for `path` (a directory, or an msc:// URL
    through multi-storage-client) whose `.metadata` is read with the restricted unpickler."""
    if not is_msc_url(path):
        return SafeReader(path)
    import multistorageclient

    class SafeMscReader(multistorageclient.torch.MultiStorageFileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
            return _loaded(read_metadata(path), getattr(self, "load_id", None))

    return SafeMscReader(path)
