"""Completions to text: ``tokenizer.decode(row, skip_special_tokens=True)`` of many rows, fast.

Detokenising is on the rollout's critical path (the GPU waits for the texts' rewards): 160 rows of
512 tokens took ~15 ms of shape B's 0.70 s rollout on an H100 host through the Rust
``decode_batch``, most of it moving 82k Python ints into Rust and the strings back (issue #27).

For the byte-level BPE tokenizers of the GPT-2 family (SmolLM2, Qwen, Llama 3) a token's text is a
fixed byte string, so a row's text is the UTF-8 decoding (invalid sequences replaced) of its tokens'
bytes joined: :class:`ByteLevelTable` keeps one ``bytes`` per token id and does exactly that,
reproducing ``tokenizers``' ``ByteLevel`` decoder (its byte-to-character map, its fallback to a
token's own UTF-8 for characters outside that map, its skipping of special tokens). It is used only
where the tokenizer decodes through that decoder alone and, when built, decodes every token of the
vocabulary and random rows exactly as the Rust decoder does (:meth:`ByteLevelTable.agrees_with`);
the tests compare it with the Rust decode on random rows of a real tokenizer. Everything else goes
through the tokenizer.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import weakref

import numpy as np


def _byte_to_char() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, as ``tokenizers``' ``ByteLevel`` builds it
    (``bytes_char``): printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


class ByteLevelTable:
    """The bytes of every token id of a ``tokenizers.Tokenizer`` whose decoder is ``ByteLevel``
    (special tokens: none, as ``skip_special_tokens=True`` drops them; ids without a token: none,
    as the Rust decode drops them), all in one buffer, so that a batch is gathered by numpy in a few
    vectorised ops and only the UTF-8 decoding runs per row."""

    def __init__(self, backend):
        char_to_byte = {c: b for b, c in _byte_to_char().items()}
        special = {t.content for t in backend.get_added_tokens_decoder().values() if t.special}
        pieces = []
        for i in range(backend.get_vocab_size(with_added_tokens=True)):
            token = backend.id_to_token(i)
            if token is None or token in special:
                pieces.append(b"")
            elif all(c in char_to_byte for c in token):
                pieces.append(bytes(char_to_byte[c] for c in token))
            else:  # as the Rust decoder: a token with a character outside the map keeps its UTF-8
                pieces.append(token.encode())
        pieces.append(b"")  # where ids past the vocabulary (a padded LM head) land: no token
        self.size = len(pieces) - 1
        self.lengths = np.array([len(p) for p in pieces], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]])
        self.buffer = np.frombuffer(b"".join(pieces), dtype=np.uint8)

    def agrees_with(self, backend) -> bool:
        """A check when the table is built: every token, in rows of 256 consecutive ids, and 16 rows
        of random ids (pieces that join into characters, special tokens among them) decode as the
        Rust decoder decodes them."""
        gen = np.random.default_rng(0)
        rows = [list(range(start, min(start + 256, self.size))) for start in range(0, self.size, 256)]
        rows += gen.integers(0, self.size, size=(16, 256)).tolist()
        return self.decode(rows) == backend.decode_batch(rows, skip_special_tokens=True)

    def decode(self, rows: list[list[int]]) -> list[str]:
        counts = [len(row) for row in rows]
        ids = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=sum(counts))
        ids = np.where((ids >= 0) & (ids < self.size), ids, self.size)
        lengths = self.lengths[ids]
        # the byte positions of every token's piece, in order: its start plus 0 .. length - 1
        ends = np.cumsum(lengths)
        offsets = np.repeat(self.starts[ids] - (ends - lengths), lengths)
        data = self.buffer[offsets + np.arange(offsets.size)].tobytes()
        row_ends = ends[np.cumsum(counts) - 1] if ids.size else np.zeros(len(rows), dtype=np.int64)
        texts, start = [], 0
        for count, end in zip(counts, row_ends.tolist()):
            end = end if count else start
            texts.append(data[start:end].decode("utf-8", "replace"))
            start = end
        return texts


_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def byte_level_table(tokenizer) -> ByteLevelTable | None:
    """The table of ``tokenizer`` where it applies (built once per tokenizer), else None."""
    try:
        return _TABLES[tokenizer]
    except (KeyError, TypeError):
        pass
    table = None
    backend = _rust_backend(tokenizer)
    if backend is not None and _decodes_byte_level(backend):
        table = ByteLevelTable(backend)
        if not table.agrees_with(backend):
            table = None
    with contextlib.suppress(TypeError):  # not weak-referenceable: rebuilt per call, still correct
        _TABLES[tokenizer] = table
    return table


def _decodes_byte_level(backend) -> bool:
    """Whether the Rust tokenizer's decoder is ``ByteLevel`` (alone or as a one-kind ``Sequence``),
    read from its serialised form (the normalizer and pre-tokenizer play no part in decoding)."""
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    parts = (decoder.get("decoders") or []) if decoder.get("type") == "Sequence" else [decoder]
    return bool(parts) and all(part.get("type") == "ByteLevel" for part in parts)


def _rust_backend(tokenizer):
    """The Rust tokenizer behind a ``tokenizers``-backed tokenizer that adds nothing to its decode
    (no clean-up of spaces, ``_decode`` not overridden), else None."""
    try:  # transformers 5's base of tokenizers-backed tokenizers
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (
        isinstance(tokenizer, TokenizersBackend)
        and backend is not None
        and type(tokenizer)._decode is TokenizersBackend._decode
        and not getattr(tokenizer, "clean_up_tokenization_spaces", True)
    ):
        return backend
    return None


def decode_texts(tokenizer, rows: list[list[int]]) -> list[str]:
    """``tokenizer.decode(row, skip_special_tokens=True)`` of every row: through the byte table where
    it applies (~3x faster than the Rust batch), else the Rust ``decode_batch`` in one call where the
    tokenizer adds nothing to it (160 x 512 tokens: ~35 ms on a 2-core CPU against ~80 ms row by
    row), else row by row."""
    table = byte_level_table(tokenizer)
    if table is not None:
        return table.decode(rows)
    backend = _rust_backend(tokenizer)
    if backend is not None:
        return backend.decode_batch(rows, skip_special_tokens=True)
    return [tokenizer.decode(row, skip_special_tokens=True) for row in rows]
