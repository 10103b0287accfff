"""A checkpoint's `.metadata` is a pickle: `mjob export --hf` (which scans every `iter_*`
directory it is given) and `checkpoint.init` read it with a restricted unpickler, so a planted
`.metadata` is refused by name instead of running its code (megatron_trainer/safe_metadata.py)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemWriter, save
from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING
from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType

from megatron_trainer.checkpoint import scan
from megatron_trainer.safe_metadata import MetadataError, SafeReader, read_metadata

pytestmark = pytest.mark.trainer


class Planted:
    """Unpickling this runs a shell command (what a hostile .metadata would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def _real_checkpoint(path: Path) -> None:
    path.mkdir(parents=True)
    state = {"w": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), "x": torch.ones(2)}
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        save(state, storage_writer=FileSystemWriter(str(path)), no_dist=True)
    (path / "metadata.json").write_text("{}")
    torch.save({}, path / "common.pt")


def _planted(path: Path, marker: Path) -> None:
    path.mkdir(parents=True)
    (path / ".metadata").write_bytes(pickle.dumps(Planted(marker)))
    (path / "metadata.json").write_text("{}")
    (path / "common.pt").write_bytes(b"")


def test_real_metadata_reads_and_a_planted_one_is_refused(tmp_path: Path) -> None:
    good = tmp_path / "ckpt" / "iter_0000001"
    _real_checkpoint(good)
    meta = read_metadata(good)
    assert set(meta.state_dict_metadata) == {"w", "x"}
    reader = SafeReader(str(good))
    assert reader.read_metadata().state_dict_metadata["w"].size == torch.Size([2, 3])
    marker = tmp_path / "pwned"
    _planted(tmp_path / "ckpt" / "iter_0000002", marker)
    with pytest.raises(MetadataError, match=r"(posix|os)\.system"):
        read_metadata(tmp_path / "ckpt" / "iter_0000002")
    found = scan(tmp_path / "ckpt")  # what `mjob export` and resume scan
    assert found.complete == [1]
    assert found.broken == [] and "refused to load" in found.refused[0][1]
    assert not marker.exists()


def test_enum_members_pickled_by_name_read_and_nothing_else_through_getattr(
    tmp_path: Path,
) -> None:
    """Debian's Python 3.11.2 (the trainer image) pickles an enum member as
    getattr(EnumClass, NAME): every TensorProperties' memory format. Such a checkpoint reads;
    getattr on anything but a checkpoint metadata enum is refused."""
    good = tmp_path / "ckpt" / "iter_0000001"
    _real_checkpoint(good)
    members = {_MEM_FORMAT_ENCODING, WriteItemType, LoadItemType}
    saved = {cls: cls.__dict__.get("__reduce_ex__") for cls in members}
    meta = read_metadata(good)
    try:
        for cls in members:
            cls.__reduce_ex__ = lambda self, proto: (getattr, (type(self), self.name))  # type: ignore[method-assign,assignment]
        data = pickle.dumps(meta)
    finally:
        for cls, reduce in saved.items():
            if reduce is None:
                del cls.__reduce_ex__
            else:
                cls.__reduce_ex__ = reduce  # type: ignore[method-assign]
    assert b"getattr" in data
    (good / ".metadata").write_bytes(data)
    again = read_metadata(good)
    assert again.state_dict_metadata["w"].properties.memory_format == torch.contiguous_format
    assert scan(tmp_path / "ckpt").complete == [1]

    class Hostile:
        """getattr on a class the reader allows, but no enum: Path.home, a callable."""

        def __reduce__(self) -> tuple[object, tuple[object, str]]:
            return (getattr, (Path, "home"))

    bad = tmp_path / "ckpt" / "iter_0000002"
    bad.mkdir()
    (bad / ".metadata").write_bytes(pickle.dumps(Hostile()))
    with pytest.raises(MetadataError, match="refused getattr"):
        read_metadata(bad)


def test_mjob_export_never_runs_a_planted_metadata(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    root = tmp_path / "ckpt"
    _planted(root / "iter_0000005", marker)
    (root / "latest_checkpointed_iteration.txt").write_text("5")
    proc = subprocess.run(
        [sys.executable, "-m", "megatron_operator.cli.main", "export", "--hf", str(root),
         "--output", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "refused to load" in proc.stderr and "Traceback" not in proc.stderr
    assert not marker.exists()
