"""Byte-level BPE (`tokenizer.ggml.model == "gpt2"`): GPT-2 byte map, pre-tokenizer, merges by rank.

A text fragment (special tokens already cut out) is split into words by the pre-tokenizer of
`tokenizer.ggml.pre`; each word is byte-encoded and merged by merge rank (merge.py); a final symbol
missing from the vocabulary falls back to its one-byte tokens, and a byte whose character the
vocabulary lacks is dropped (SmolLM2 has no token for e.g. 0x16) -- as llama.cpp's gpt2 tokenizer does,
so prompt ids match what llama.cpp feeds the same model.
"""

from __future__ import annotations

from functools import lru_cache

from swactor.orchestrator.models.gguf_model import TokenizerData
from swactor.orchestrator.tokens.tokenizer.bytemap import BYTE_TO_CHAR, decode_chars, encode_bytes
from swactor.orchestrator.tokens.tokenizer.merge import merge_pairs
from swactor.orchestrator.tokens.tokenizer.pretokenize import PreTokenizer

# Words up to this many characters are cached (prose repeats them); longer ones would only fill memory.
CACHED_WORD_CHARS = 64


class ByteLevelBpe:
    name = "gpt2"

    def __init__(self, data: TokenizerData, ids: dict[str, int]) -> None:
        self._pre = PreTokenizer(data.pre)  # ValueError names an unknown `pre`
        self._ids = ids
        self._ranks: dict[tuple[str, str], int] = {}
        for rank, merge in enumerate(data.merges):
            left, sep, right = merge.partition(" ")
            if not sep:
                raise ValueError(f"tokenizer.ggml.merges[{rank}] {merge!r} is not 'left right'")
            self._ranks.setdefault((left, right), rank)
        self.default_add_bos = self._pre.default_add_bos
        # Bytes that may yield no id at all (for the tokenizer's lower bound on a text's token count):
        # those without a one-byte token, and, if some merge makes a symbol the vocabulary lacks (whose
        # non-ASCII characters are then dropped), every byte whose character is not ASCII.
        orphan_merges = any(a + b not in ids for a, b in self._ranks)
        self.unrepresentable_bytes = bytes(
            b for b in range(256) if BYTE_TO_CHAR[b] not in ids or (orphan_merges and ord(BYTE_TO_CHAR[b]) >= 128)
        )
        self.unrepresentable_chars = frozenset(BYTE_TO_CHAR[b] for b in self.unrepresentable_bytes)
        self._word_cached = lru_cache(maxsize=65536)(self._word)

    def words(self, fragment: str, after_special: bool) -> list[str]:
        """The pre-tokenizer's words of one fragment (no special tokens in it), byte-mapped."""
        return [encode_bytes(word.encode("utf-8")) for word in self._pre.split(fragment)]

    def word_ids(self, word: str) -> tuple[int, ...]:
        return self._word_cached(word) if len(word) <= CACHED_WORD_CHARS else self._word(word)

    def _word(self, word: str) -> tuple[int, ...]:
        ids = self._ids
        if self._pre.ignore_merges and word in ids:
            return (ids[word],)
        symbols = merge_pairs(list(word), self._ranks, joined=False)
        out: list[int] = []
        for sym in symbols:
            tid = ids.get(sym)
            if tid is not None:
                out.append(tid)
                continue
            # llama.cpp looks each UTF-8 byte of the symbol's text up as a one-byte token text:
            # only ASCII characters of the byte-mapped text can match.
            for ch in sym:
                cid = ids.get(ch) if ord(ch) < 128 else None
                if cid is not None:
                    out.append(cid)
        return tuple(out)

    @staticmethod
    def piece(text: str) -> bytes:
        """The bytes a normal token stands for."""
        return decode_chars(text)
