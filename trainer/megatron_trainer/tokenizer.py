"""A Hugging Face `tokenizer.json` from a local directory (never a hub download)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def megatron_tokenizer(directory: str) -> Any:
    """Wrap the tokenizer in Megatron-Core's tokenizer interface (for GPTDatasetConfig)."""
    from megatron.core.datasets.megatron_tokenizer import MegatronTokenizer

    class _HFTokenizer(MegatronTokenizer):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(directory)
            self._tok = load_tokenizer(directory)
            self._eod = find_eod(self._tok, directory)

        def tokenize(self, text: str) -> list[int]:
            return list(self._tok.encode(text, add_special_tokens=False).ids)

        @property
        def vocab(self) -> dict[str, int]:
            return dict(self._tok.get_vocab(with_added_tokens=True))

        @property
        def inv_vocab(self) -> dict[int, str]:
            return {v: k for k, v in self.vocab.items()}

        @property
        def vocab_size(self) -> int:
            return int(self._tok.get_vocab_size(with_added_tokens=True))

        @property
        def eod(self) -> int:
            return self._eod

    return _HFTokenizer()
