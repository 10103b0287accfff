"""`mjob run --local`'s pods share this one machine's cores between the job's ranks."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from megatron_operator.local.pods import Layout, local_pods, rank_threads

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "render-cpu-tiny-attempt0.yaml"


def objs() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = yaml.safe_load(GOLDEN.read_text())["items"]
    return items


def threads(items: list[dict[str, Any]], tmp_path: Path, cores: int) -> list[str | None]:
    pods = local_pods(items, Layout(tmp_path), sys.executable, 1, 2, cores)
    return [p.env.get("OMP_NUM_THREADS") for p in pods]


def test_each_rank_gets_its_share_of_the_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    # The example: one pod of two ranks (WORLD_SIZE 2).
    assert threads(objs(), tmp_path, cores=8) == ["4"]
    assert threads(objs(), tmp_path, cores=2) == ["1"]
    assert threads(objs(), tmp_path, cores=1) == ["1"]  # never none
    assert [rank_threads(c, w) for c, w in [(2, 2), (2, 4), (16, 3), (0, 1), (4, 0)]] == [
        1, 1, 5, 1, 4,
    ]  # fmt: skip


def test_the_jobs_own_setting_or_the_shells_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    items = copy.deepcopy(objs())
    pod = next(o for o in items if o["kind"] == "Pod")
    pod["spec"]["containers"][0]["env"].append({"name": "OMP_NUM_THREADS", "value": "3"})
    assert threads(items, tmp_path, cores=8) == ["3"]
    # Exported in the shell that runs `mjob run --local`: the launcher keeps it (its default
    # never overrides the environment), so the runner adds nothing.
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    assert threads(objs(), tmp_path, cores=8) == [None]
