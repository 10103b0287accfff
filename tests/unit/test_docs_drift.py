"""The docs stay true to the code they describe: the `kubectl get mj` columns are the CRD's
printer columns, `kubectl logs` names pods the way the operator names them, every `mjob` and
`tests/cluster/cluster` command line in a doc parses with the real parser (so a flag that does
not exist, or `--set` where a command takes none, fails here), and the README's tour prints what
it shows."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from megatron_operator.api.crd import PRINTER_COLUMNS
from megatron_operator.cli.main import build_parser, main
from megatron_operator.core.names import pod_name

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "images" / "README.md"])
COLUMNS = [c["name"] for c in PRINTER_COLUMNS]


def code_lines() -> Iterator[tuple[str, int, str]]:
    """(doc, line number, text) of every line inside a fenced code block."""
    for doc in DOCS:
        inside = False
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                inside = not inside
                continue
            if inside:
                yield doc.name, n, line


def commands(program: str) -> list[tuple[str, int, list[str]]]:
    """Every invocation of `program` in the docs' code blocks, as argv after the program."""
    found = []
    for doc, n, line in code_lines():
        text = line.strip().removeprefix("$ ")
        text = re.split(r"\s+#\s", text, maxsplit=1)[0].rstrip("\\").strip()
        if not text.startswith(program + " "):
            continue
        try:
            words = shlex.split(text)
        except ValueError:
            continue
        found.append((doc, n, words[len(program.split()) :]))
    return found


def test_the_kubectl_get_columns_are_the_crds() -> None:
    headers = [
        (doc, n, line.strip().lstrip("# ").split())
        for doc, n, line in code_lines()
        if re.match(r"^\s*#?\s*NAME\s+PHASE\s", line)
    ]
    assert headers, "no `kubectl get mj` output in the docs: this test would check nothing"
    for doc, n, words in headers:
        assert words == ["NAME", *(c.upper() for c in COLUMNS)], f"{doc}:{n}: {words}"
    listed = [
        (doc, n, m.group(1))
        for doc, n, line in code_lines()
        if (m := re.search(r"kubectl get mj\s+#\s*(.+)$", line))
    ]
    for doc, n, text in listed:
        assert [w.strip() for w in text.split(",")] == COLUMNS, f"{doc}:{n}: {text}"


POD = re.compile(r"^[A-Za-z0-9_.<>-]+-a(\d+|[A-Z]+|<[a-z ]+>)-(\d+|[A-Z]+|<[a-z ]+>)$")


def test_kubectl_logs_names_pods_as_the_operator_does() -> None:
    assert POD.match(pod_name("NAME", 0, 3))  # the pattern is the renderer's naming
    found = 0
    for doc, n, line in code_lines():
        for m in re.finditer(r"kubectl logs\s+(?:-[-\w]+\s+\S+\s+)*([^\s-][^\s]*)", line):
            found += 1
            target = m.group(1)
            if target.startswith(("deploy/", "job/", "pod/")) or "$" in target:
                continue
            assert POD.match(target), (
                f"{doc}:{n}: `kubectl logs {target}` is not <job>-a<attempt>-<rank>"
            )
    assert found, "no `kubectl logs` in the docs: this test would check nothing"


@pytest.mark.parametrize(
    ("doc", "n", "argv"), commands("mjob"), ids=lambda x: x if isinstance(x, str) else None
)
def test_every_mjob_line_parses(doc: str, n: int, argv: list[str]) -> None:
    if argv and argv[0] in ("preprocess", "export"):
        return  # passed through to the trainer's own parser
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        if exc.code != 0:  # --help and --version exit 0
            pytest.fail(f"{doc}:{n}: `mjob {' '.join(argv)}` does not parse")


def _cluster_parser() -> Any:
    path = ROOT / "tests" / "cluster" / "cluster"
    sys.path.insert(0, str(path.parent))  # its helper modules sit beside it
    loader = importlib.machinery.SourceFileLoader("cluster_driver", str(path))
    spec = importlib.util.spec_from_loader("cluster_driver", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["cluster_driver"] = module
    loader.exec_module(module)
    return module.parser()


@pytest.mark.parametrize(
    ("doc", "n", "argv"),
    commands("tests/cluster/cluster"),
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_every_cluster_line_parses(doc: str, n: int, argv: list[str]) -> None:
    try:
        _cluster_parser().parse_args(argv)
    except SystemExit as exc:
        if exc.code != 0:
            pytest.fail(f"{doc}:{n}: `tests/cluster/cluster {' '.join(argv)}` does not parse")


def test_there_are_command_lines_to_check() -> None:
    assert len(commands("mjob")) >= 10 and commands("tests/cluster/cluster")


def _tour() -> list[tuple[list[str], list[str]]]:
    """The README tour's `mjob validate` commands and the lines shown under each."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## A 60-second tour", 1)[1].split("```console", 1)[1].split("```", 1)[0]
    out: list[tuple[list[str], list[str]]] = []
    shown: list[str] | None = None
    for line in block.splitlines():
        if line.startswith("$ mjob validate"):
            shown = []
            out.append((shlex.split(line[2:])[1:], shown))
        elif line.startswith("$ "):
            shown = None  # another command: its output is not checked here
        elif shown is not None and line.strip():
            shown.append(line)
    return out


def test_the_readme_tour_prints_what_it_shows(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(ROOT)
    tour = _tour()
    assert len(tour) == 2
    for argv, shown in tour:
        main(argv)
        captured = capsys.readouterr()
        assert (captured.out + captured.err).splitlines() == shown, argv
