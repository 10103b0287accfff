"""A Hugging Face `tokenizer.json` from a local directory (never a hub download)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

# Tried in order; the first one the vocabulary holds marks the end of a document.
EOD_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>", "[SEP]")


class TokenizerError(Exception):
    """The tokenizer directory cannot be used; the message says why and how to fix it."""


def load_tokenizer(directory: str | Path) -> Tokenizer:
    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        raise TokenizerError(
            f"{path} does not exist; pass a directory holding a Hugging Face tokenizer.json"
        )
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # the Rust side raises a plain Exception for malformed files
        raise TokenizerError(f"{path} is not a valid tokenizer.json: {err}") from err


def find_eod(tokenizer: Tokenizer, directory: str | Path = "") -> int:
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    for token in EOD_CANDIDATES:
        if token in vocab:
            return int(vocab[token])
    raise TokenizerError(
        f"tokenizer {directory} has no end-of-document token; add one of "
        f"{', '.join(EOD_CANDIDATES)} to its vocabulary"
    )


class DatasetTokenizer:
    """What Megatron-Core's GPTDataset reads from a tokenizer: `vocab_size`, `eod`, and
    `unique_identifiers` (part of the key of its index cache). Duck-typed on purpose: the legacy
    base class logs a deprecation warning, and the new one requires chat templates."""

    def __init__(self, directory: str) -> None:
        tokenizer = load_tokenizer(directory)
        self.vocab_size = int(tokenizer.get_vocab_size(with_added_tokens=True))
        self.eod = find_eod(tokenizer, directory)
        self.unique_identifiers = {
            "class": type(self).__name__,
            "tokenizer_path": [str(Path(directory).resolve())],
        }
