"""SentencePiece (`tokenizer.ggml.model == "llama"`), as llama.cpp's SPM tokenizer runs it.

A fragment (special tokens already cut out) gets a leading space when it opens the text or follows a
special token (unless `tokenizer.ggml.add_space_prefix` is false); every space becomes '▁'; the
characters then merge pairwise, the pair whose merged piece has the highest score first (the merged
piece must be in the vocabulary; ties: leftmost). A final symbol the vocabulary lacks is spelled
with byte-fallback tokens <0xNN>. No other normalization: llama.cpp applies none.
"""

from __future__ import annotations

import re
from functools import lru_cache

from swactor.orchestrator.models.gguf_model import TokenizerData
from swactor.orchestrator.tokens.tokenizer.merge import merge_pairs

ESCAPED_SPACE = "\u2581"  # '▁'
CACHED_WORD_CHARS = 64
# A merge never crosses a '▁' that follows another character when no piece contains such a pair,
# so the text can be merged word by word (and words cached) with the same result as in one piece.
_WORD_START = re.compile(f"(?<=[^{ESCAPED_SPACE}])(?={ESCAPED_SPACE})")
_INNER_SPACE = re.compile(f"[^{ESCAPED_SPACE}]{ESCAPED_SPACE}")


class SentencePiece:
    name = "llama"
    default_add_bos = True

    def __init__(self, data: TokenizerData, ids: dict[str, int]) -> None:
        if len(data.scores) != len(data.tokens):
            raise ValueError(f"tokenizer.ggml.scores has {len(data.scores)} entries for {len(data.tokens)} tokens")
        self._ids = ids
        # A merged piece ranks by the score of the token its text looks up to (llama.cpp: the last of
        # duplicates); rank 0 is the highest score, equal scores share a rank (then leftmost merges first).
        score = {text: float(data.scores[i]) for text, i in ids.items()}
        order = {s: r for r, s in enumerate(sorted(set(score.values()), reverse=True))}
        self._rank = {text: order[s] for text, s in score.items()}
        self.add_space_prefix = True if data.add_space_prefix is None else bool(data.add_space_prefix)
        self._byte_ids = [ids.get(f"<0x{b:02X}>", ids.get(chr(b)) if b < 128 else None) for b in range(256)]
        self._by_word = not any(_INNER_SPACE.search(t) for t in data.tokens)
        # Every byte yields an id, or the text is refused.
        self.unrepresentable_bytes, self.unrepresentable_chars = b"", frozenset()
        self._word_cached = lru_cache(maxsize=65536)(self._word)

    def words(self, fragment: str, after_special: bool) -> list[str]:
        """One fragment (no special tokens in it), space-prefixed and escaped, cut where no merge can cross."""
        if self.add_space_prefix and after_special:
            fragment = " " + fragment
        text = fragment.replace(" ", ESCAPED_SPACE)
        return _WORD_START.split(text) if self._by_word else [text]

    def word_ids(self, word: str) -> tuple[int, ...]:
        return self._word_cached(word) if len(word) <= CACHED_WORD_CHARS else self._word(word)

    def _word(self, word: str) -> tuple[int, ...]:
        ids = self._ids
        out: list[int] = []
        for sym in merge_pairs(list(word), self._rank, joined=True):
            tid = ids.get(sym)
            if tid is not None:
                out.append(tid)
                continue
            for b in sym.encode("utf-8"):
                bid = self._byte_ids[b]
                if bid is None:
                    raise ValueError(f"character {sym!r} is not in the vocabulary, which has no byte-fallback token <0x{b:02X}>")
                out.append(bid)
        return tuple(out)

    @staticmethod
    def piece(text: str) -> bytes:
        """The bytes a normal piece stands for ('▁' is a space)."""
        return text.replace(ESCAPED_SPACE, " ").encode("utf-8")
