"""What a text can cost to tokenize: lower bounds on its token count, found without merging.

A caller with a token budget (the model's context) gets an oversized text refused in time linear in
its length instead of paying for the merges:
- the whole text: a token stands for at most L bytes (L: the longest token text), so a text needs at
  least bytes / L tokens;
- one long word: its tokens are vocabulary pieces spelled with the word's own characters, or
  one-character fallbacks, so it needs at least chars / (the longest such piece) tokens -- far
  tighter than the first bound for a run of letters.
Characters that may yield no token at all (byte-level BPE drops bytes its vocabulary lacks) are not
counted. A single word is never longer than MAX_WORD_CHARS: merging is O(n log n), but in Python
about 200k symbols already cost a second.
"""

from __future__ import annotations

MAX_WORD_CHARS = 1 << 17
# Words at least this long get the per-word bound before merging (it scans the vocabulary once).
WORD_BOUND_CHARS = 4096


class CostBound:
    def __init__(self, tokens: list[str], unrepresentable_bytes: bytes, unrepresentable_chars: frozenset[str]) -> None:
        self.max_token_bytes = max((len(t.encode("utf-8")) for t in tokens), default=1) or 1
        self._unrepresentable_bytes = unrepresentable_bytes
        self._unrepresentable_chars = unrepresentable_chars
        self._longest_first = sorted((t for t in set(tokens) if len(t) > 1), key=len, reverse=True)

    def text_min_tokens(self, raw: bytes) -> int:
        """At least this many ids for the UTF-8 text `raw` (BOS/EOS aside)."""
        counted = len(raw.translate(None, self._unrepresentable_bytes)) if self._unrepresentable_bytes else len(raw)
        return -(-counted // self.max_token_bytes)

    def word_min_tokens(self, word: str) -> int:
        """At least this many ids for one word, in the tokenizer's symbol space (merge input)."""
        alphabet = set(word)
        longest = 1
        for piece in self._longest_first:
            if len(piece) <= longest:
                break
            if alphabet.issuperset(piece):
                longest = len(piece)
                break
        dropped = sum(word.count(c) for c in alphabet & self._unrepresentable_chars)
        return -(-(len(word) - dropped) // longest)
