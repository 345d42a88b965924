"""Streaming detokenizer: feed token ids one by one, get text back only as complete UTF-8.

A token may end in the middle of a multi-byte character (emoji, CJK split over byte-level BPE tokens
or SentencePiece <0xNN> byte-fallback tokens); those bytes wait until the character completes, so
byte-fallback pieces are assembled into UTF-8 here. A SentencePiece '▁' is a space (Tokenizer.token_bytes).
Bytes that can never form valid UTF-8 become U+FFFD.
"""

from __future__ import annotations

import codecs

from swactor.orchestrator.tokens.tokenizer.tokenizer import Tokenizer


class StreamDecoder:
    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Text that became complete with this token (may be '')."""
        return self._utf8.decode(self._tok.token_bytes(token_id, skip_special=self._skip))

    def flush(self) -> str:
        """End of stream: any incomplete tail becomes U+FFFD."""
        return self._utf8.decode(b"", final=True)
