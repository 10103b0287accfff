"""`mjob preprocess`: JSON lines -> Megatron's indexed dataset (<prefix>.bin / <prefix>.idx).

    mjob preprocess --input docs.jsonl --tokenizer DIR --output-prefix data/corpus

Each line is a JSON object whose `--json-key` (default "text") is one document. Documents are
tokenized by worker processes with the Hugging Face tokenizer in DIR (tokenizer.json; nothing is
downloaded), get an end-of-document token appended, and are written in input order, so the output
is the same for any number of workers. The written prefix is what `data.blend[].prefix` names.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from .tokenizer import TokenizerError, find_eod, load_tokenizer

EXIT_BAD_INPUT = 2
LINES_PER_TASK = 256


class InputError(Exception):
    """A problem with the input that the user must fix (exit 2, no traceback)."""


@dataclass(frozen=True)
class Options:
    inputs: tuple[Path, ...]
    tokenizer: Path
    output_prefix: Path
    json_key: str
    workers: int
    append_eod: bool


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="mjob preprocess",
        description="Tokenize JSON lines into a Megatron indexed dataset (.bin/.idx).",
    )
    parser.add_argument("--input", required=True, nargs="+", type=Path, help="JSON lines file(s)")
    parser.add_argument(
        "--tokenizer", required=True, type=Path, help="directory with a Hugging Face tokenizer.json"
    )
    parser.add_argument(
        "--output-prefix", required=True, type=Path, help="writes PREFIX.bin and PREFIX.idx"
    )
    parser.add_argument("--json-key", default="text", help="field holding the text (default: text)")
    parser.add_argument(
        "--workers",
        type=int,
        default=min(8, os.cpu_count() or 1),
        help="tokenizer processes (default: the number of CPUs, at most 8)",
    )
    parser.add_argument(
        "--no-append-eod",
        dest="append_eod",
        action="store_false",
        help="do not end each document with the end-of-document token",
    )
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    return Options(
        tuple(args.input), args.tokenizer, args.output_prefix, args.json_key, args.workers,
        args.append_eod,
    )  # fmt: skip


# -- worker side ---------------------------------------------------------------------------------

_worker_state: dict[str, Any] = {}


def _init_worker(tokenizer_dir: str, json_key: str, eod: int | None) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # parallelism comes from the processes
    _worker_state.update(tokenizer=load_tokenizer(tokenizer_dir), key=json_key, eod=eod)


def _tokenize(task: tuple[str, list[tuple[int, str]]]) -> list[np.ndarray] | str:
    """Token arrays for a chunk of (line number, line), or an error naming the bad line."""
    source, lines = task
    key = _worker_state["key"]
    texts = []
    for number, line in lines:
        where = f"{source}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            return f"{where}: not valid JSON ({err.msg} at column {err.colno})"
        if not isinstance(record, dict) or not isinstance(record.get(key), str):
            return f"{where}: expected an object with a string field {key!r} (see --json-key)"
        texts.append(record[key])
    encodings = _worker_state["tokenizer"].encode_batch(texts, add_special_tokens=False)
    eod = _worker_state["eod"]
    suffix = [eod] if eod is not None else []
    return [np.asarray(list(e.ids) + suffix, dtype=np.int64) for e in encodings]


# -- main side -----------------------------------------------------------------------------------


def _tasks(
    inputs: Sequence[Path], progress: Progress
) -> Iterator[tuple[str, list[tuple[int, str]]]]:
    """Chunks of non-empty lines with their line numbers (for error messages)."""
    for path in inputs:
        with path.open("r", encoding="utf-8") as f:
            chunk: list[tuple[int, str]] = []
            for number, line in enumerate(f, start=1):
                progress.bytes_read += len(line.encode("utf-8"))
                if not line.strip():
                    continue
                chunk.append((number, line))
                if len(chunk) == LINES_PER_TASK:
                    yield str(path), chunk
                    chunk = []
            if chunk:
                yield str(path), chunk


class Progress:
    """A one-line progress bar on a terminal; a line every few seconds otherwise."""

    def __init__(self, total_bytes: int, stream: TextIO = sys.stderr) -> None:
        self.total = max(1, total_bytes)
        self.stream = stream
        self.tty = stream.isatty()
        self.bytes_read = 0
        self.documents = 0
        self.tokens = 0
        self.started = time.monotonic()
        self.last = 0.0

    def update(self, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self.last < (0.2 if self.tty else 5.0):
            return
        self.last = now
        done = min(1.0, self.bytes_read / self.total)
        rate = self.bytes_read / max(1e-9, now - self.started) / 1e6
        width = 30
        bar = "#" * int(done * width) + "." * (width - int(done * width))
        text = (
            f"[{bar}] {done:6.1%}  {self.documents:,} docs  {self.tokens:,} tokens  {rate:.1f} MB/s"
        )
        if self.tty:
            self.stream.write("\r" + text + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def run(options: Options) -> None:
    for path in options.inputs:
        if not path.is_file():
            raise InputError(f"--input: {path} does not exist")
    try:
        tokenizer = load_tokenizer(options.tokenizer)
        eod = find_eod(tokenizer, options.tokenizer) if options.append_eod else None
    except TokenizerError as err:
        raise InputError(f"--tokenizer: {err}") from err
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    out_dir = options.output_prefix.parent
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"--output-prefix: cannot create {out_dir} ({err.strerror})") from err
    if not os.access(out_dir, os.W_OK):
        raise InputError(f"--output-prefix: {out_dir} is not writable")

    progress = Progress(sum(p.stat().st_size for p in options.inputs))
    # Fork the tokenizer processes before importing torch/Megatron-Core in this process.
    context = mp.get_context("fork")
    with context.Pool(
        options.workers,
        initializer=_init_worker,
        initargs=(str(options.tokenizer), options.json_key, eod),
    ) as pool:
        with warnings.catch_warnings():
            # Megatron-Core warns about missing TE/Apex at import: irrelevant for writing data.
            warnings.simplefilter("ignore", UserWarning)
            from .imports import import_megatron_core

            import_megatron_core()
            from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

        prefix = str(options.output_prefix)
        bin_tmp, idx_tmp = prefix + ".bin.tmp", prefix + ".idx.tmp"
        builder = IndexedDatasetBuilder(bin_tmp, dtype=DType.optimal_dtype(vocab_size))
        try:
            for result in pool.imap(_tokenize, _tasks(options.inputs, progress), chunksize=1):
                if isinstance(result, str):
                    raise InputError(result)
                for tokens in result:
                    builder.add_document(tokens, [len(tokens)])
                    progress.documents += 1
                    progress.tokens += len(tokens)
                progress.update()
            builder.finalize(idx_tmp)
        except BaseException:
            builder.data_file.close()
            for tmp in (bin_tmp, idx_tmp):
                Path(tmp).unlink(missing_ok=True)
            raise
    if progress.documents == 0:
        for tmp in (bin_tmp, idx_tmp):
            Path(tmp).unlink(missing_ok=True)
        raise InputError("--input: no documents (all lines are empty)")
    # Rename into place only when complete: a half-written dataset never looks usable.
    os.replace(bin_tmp, prefix + ".bin")
    os.replace(idx_tmp, prefix + ".idx")
    progress.update(final=True)
    print(
        f"wrote {prefix}.bin and {prefix}.idx: {progress.documents:,} documents, "
        f"{progress.tokens:,} tokens (vocabulary {vocab_size})",
        file=sys.stderr,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `mjob preprocess`. Returns the exit code (0, or 2 for bad input)."""
    options = parse_args(argv)
    try:
        run(options)
    except InputError as err:
        print(f"mjob preprocess: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("mjob preprocess: interrupted; no output written", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
