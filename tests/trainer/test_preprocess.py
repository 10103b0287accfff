"""`mjob preprocess` (megatron_trainer.preprocess.main): JSON lines -> .bin/.idx with a tokenizer
built on the fly (nothing from a hub), read back through Megatron-Core, and trained on."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from megatron_trainer.preprocess import main

from .trainer_configs import tiny_config
from .trainer_runs import run_trainer

pytestmark = pytest.mark.trainer

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]


def documents(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for _ in range(count):
        start, length = rng.randrange(len(WORDS)), rng.randrange(20, 60)
        docs.append(" ".join(WORDS[(start + k) % len(WORDS)] for k in range(length)) + ".")
    return docs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two JSON-lines files and a small BPE tokenizer with an end-of-text token."""
    root = tmp_path_factory.mktemp("corpus")
    for name, seed in (("a", 0), ("b", 1)):
        lines = [json.dumps({"text": d, "id": i}) for i, d in enumerate(documents(seed, 400))]
        (root / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<|endoftext|>"])
    tokenizer.train_from_iterator(documents(0, 400) + documents(1, 400), trainer)
    (root / "tokenizer").mkdir()
    tokenizer.save(str(root / "tokenizer" / "tokenizer.json"))
    return root


def preprocess(corpus: Path, name: str, prefix: Path, workers: int = 2) -> int:
    return main(
        ["--input", str(corpus / f"{name}.jsonl"), "--tokenizer", str(corpus / "tokenizer"),
         "--output-prefix", str(prefix), "--workers", str(workers)]
    )  # fmt: skip


def test_documents_round_trip_through_megatron(corpus: Path, tmp_path: Path) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    assert preprocess(corpus, "a", tmp_path / "a", workers=3) == 0
    dataset = IndexedDataset(str(tmp_path / "a"))
    assert len(dataset) == 400
    tokenizer = Tokenizer.from_file(str(corpus / "tokenizer" / "tokenizer.json"))
    eod = tokenizer.token_to_id("<|endoftext|>")
    first = json.loads((corpus / "a.jsonl").read_text().splitlines()[0])["text"]
    expected = [*tokenizer.encode(first, add_special_tokens=False).ids, eod]
    assert list(dataset[0]) == expected
    # The same bytes whatever the number of workers: documents keep their input order.
    assert preprocess(corpus, "a", tmp_path / "one", workers=1) == 0
    assert (tmp_path / "one.bin").read_bytes() == (tmp_path / "a.bin").read_bytes()
    assert (tmp_path / "one.idx").read_bytes() == (tmp_path / "a.idx").read_bytes()


def test_bad_input_names_the_line(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n\n{"text": broken\n')
    code = main(
        ["--input", str(bad), "--tokenizer", str(corpus / "tokenizer"),
         "--output-prefix", str(tmp_path / "out")]
    )  # fmt: skip
    assert code == 2
    assert f"{bad}:3: not valid JSON" in capsys.readouterr().err
    assert not list(tmp_path.glob("out*"))  # nothing half-written is left
    code = main(
        ["--input", str(bad), "--tokenizer", str(tmp_path), "--output-prefix", str(tmp_path / "o")]
    )
    assert code == 2
    assert "tokenizer.json does not exist" in capsys.readouterr().err


def test_train_on_a_weighted_blend_and_the_loss_falls(corpus: Path, tmp_path: Path) -> None:
    for name in ("a", "b"):
        assert preprocess(corpus, name, tmp_path / "data" / name) == 0
    cfg = tiny_config(tmp_path / "ckpt", trainIters=15, save_interval=15)
    cfg["data"].update(
        mock=False,
        blend=[
            {"weight": 0.7, "prefix": str(tmp_path / "data" / "a")},
            {"weight": 0.3, "prefix": str(tmp_path / "data" / "b")},
        ],
        tokenizer={"path": str(corpus / "tokenizer")},
        numWorkers=1,
    )
    run = run_trainer(cfg, tmp_path)
    assert run.returncode == 0, run.output[-3000:]
    losses = run.losses()
    assert sorted(losses) == list(range(1, 16))
    assert losses[15] < losses[1] - 1.0, losses
    caches = list((tmp_path / "ckpt" / "data-cache").glob("*/.complete"))
    assert len(caches) == 1  # index caches on the writable volume, committed whole
