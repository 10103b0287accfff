"""Reading a torch_dist checkpoint's `.metadata` without running code from it.

torch's `FileSystemReader.read_metadata` is a bare `pickle.load`: a `.metadata` file can name any
callable, and loading it calls that callable. `mjob export --hf` scans every `iter_*` directory of
a checkpoint someone hands it, and `checkpoint.init.megatron` reads another job's checkpoint, so
both read it through an unpickler that resolves only the classes a checkpoint's metadata is made
of (torch.distributed.checkpoint's metadata and save-plan dataclasses, torch.Size, the dtypes, the
layout helper); any other global is refused with an error naming it.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

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


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _MODULES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and (
            name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)
        ):
            return super().find_class(module, name)
        raise MetadataError(
            f"refused to load {module}.{name}: not part of a checkpoint's metadata (a .metadata "
            "file that names it could run code)"
        )


def read_metadata(path: str | Path) -> Metadata:
    """The `.metadata` of the checkpoint directory `path`, read with the restricted unpickler."""
    with open(Path(path) / ".metadata", "rb") as f:
        metadata = _Unpickler(f).load()
    if not isinstance(metadata, Metadata):
        raise MetadataError(f"{path}/.metadata holds a {type(metadata).__name__}, not Metadata")
    return metadata


class SafeReader(FileSystemReader):
    """torch's FileSystemReader, reading `.metadata` with the restricted unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(str(self.path))
        storage = metadata.storage_meta
        if storage is None:
            storage = metadata.storage_meta = StorageMeta()
        storage.load_id = self.load_id
        return metadata
