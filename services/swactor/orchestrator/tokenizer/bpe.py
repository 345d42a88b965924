"""Byte-level BPE tokenizer built from the GGUF's vocabulary, merges and token types.

encode: special tokens are cut out first (longest text first, as whole tokens), the rest is split
by the pre-tokenizer, each word is byte-encoded and merged by merge rank; a final symbol missing
from the vocabulary falls back to its single-byte tokens. This follows llama.cpp's gpt2 tokenizer
so prompt ids match what llama.cpp feeds the same model.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from swactor.common.gguf import ModelRefused, open_gguf
from swactor.orchestrator.gguf_model import TokenizerData, read_tokenizer
from swactor.orchestrator.tokenizer.bytemap import decode_chars, encode_bytes
from swactor.orchestrator.tokenizer.pretokenize import PreTokenizer

# GGUF token types (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Token texts llama.cpp also treats as end-of-generation when the GGUF does not name them.
EOG_TEXTS = frozenset(
    {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>", "<|eom_id|>"}
)


class TokenizerError(ValueError):
    """The GGUF's tokenizer is unsupported or a token id is out of range; the message names it."""


class Tokenizer:
    def __init__(self, data: TokenizerData) -> None:
        if data.model != "gpt2":
            raise TokenizerError(
                f"tokenizer.ggml.model {data.model!r} is not supported (only 'gpt2' byte-level BPE)"
            )
        try:
            self._pre = PreTokenizer(data.pre)
        except ValueError as e:
            raise TokenizerError(str(e)) from None
        self.data = data
        self.tokens = data.tokens
        self.token_types = data.token_types
        self._ids = {text: i for i, text in enumerate(self.tokens)}
        self._ranks: dict[tuple[str, str], int] = {}
        for rank, merge in enumerate(data.merges):
            left, sep, right = merge.partition(" ")
            if not sep:
                raise TokenizerError(f"tokenizer.ggml.merges[{rank}] {merge!r} is not 'left right'")
            self._ranks.setdefault((left, right), rank)
        self.bos_id = data.bos_id
        self.eos_id = data.eos_id
        self.pad_id = data.pad_id
        self.add_bos = self._pre.default_add_bos if data.add_bos is None else bool(data.add_bos)
        self.add_eos = bool(data.add_eos)
        # Special tokens are matched as whole tokens, longest text first (llama.cpp's order).
        specials = [i for i, t in enumerate(self.token_types) if t in (CONTROL, USER_DEFINED, UNKNOWN)]
        specials.sort(key=lambda i: -len(self.tokens[i]))
        self._specials = [(self.tokens[i], i, self.token_types[i]) for i in specials if self.tokens[i]]
        eog = {i for i in (data.eos_id, data.eot_id, data.eom_id) if i is not None}
        eog |= {i for i, t in enumerate(self.tokens) if t in EOG_TEXTS and self.token_types[i] == CONTROL}
        self.eog_ids = frozenset(eog)
        self._bpe_word = lru_cache(maxsize=65536)(self._bpe_word_uncached)

    @classmethod
    def from_gguf(cls, path: Path) -> Tokenizer:
        try:
            data = read_tokenizer(open_gguf(path))
        except ModelRefused as e:
            raise TokenizerError(str(e)) from None
        return cls(data)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    # ---- encode ----

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids for `text`; `add_special` adds BOS/EOS as the GGUF asks, `parse_special`
        matches control tokens such as <|im_start|> as whole tokens."""
        ids: list[int] = []
        if add_special and self.add_bos and self.bos_id is not None:
            ids.append(self.bos_id)
        for fragment, special_id in self._partition(text, parse_special):
            if special_id is not None:
                ids.append(special_id)
                continue
            for word in self._pre.split(fragment):
                ids.extend(self._bpe_word(encode_bytes(word.encode("utf-8"))))
        if add_special and self.add_eos and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    def _partition(self, text: str, parse_special: bool) -> list[tuple[str, int | None]]:
        parts: list[tuple[str, int | None]] = [(text, None)]
        for special, token_id, kind in self._specials:
            if not parse_special and kind != USER_DEFINED:
                continue
            out: list[tuple[str, int | None]] = []
            for frag, fid in parts:
                if fid is not None or special not in frag:
                    out.append((frag, fid))
                    continue
                pieces = frag.split(special)
                for k, piece in enumerate(pieces):
                    if piece:
                        out.append((piece, None))
                    if k < len(pieces) - 1:
                        out.append((special, token_id))
            parts = out
        return [(f, i) for f, i in parts if f or i is not None]

    def _bpe_word_uncached(self, word: str) -> tuple[int, ...]:
        if self._pre.ignore_merges and word in self._ids:
            return (self._ids[word],)
        symbols = list(word)
        ranks = self._ranks
        while len(symbols) > 1:
            best_rank, best = None, None
            for k in range(len(symbols) - 1):
                r = ranks.get((symbols[k], symbols[k + 1]))
                if r is not None and (best_rank is None or r < best_rank):
                    best_rank, best = r, (symbols[k], symbols[k + 1])
            if best is None:
                break
            merged: list[str] = []
            k = 0
            while k < len(symbols):
                if k < len(symbols) - 1 and (symbols[k], symbols[k + 1]) == best:
                    merged.append(symbols[k] + symbols[k + 1])
                    k += 2
                else:
                    merged.append(symbols[k])
                    k += 1
            symbols = merged
        out: list[int] = []
        for sym in symbols:
            tid = self._ids.get(sym)
            if tid is not None:
                out.append(tid)
                continue
            # llama.cpp: an unknown symbol falls back to one-byte token texts; a byte whose
            # character the vocabulary lacks is dropped (SmolLM2 has no token for e.g. 0x16).
            for ch in sym:
                cid = self._ids.get(ch) if ord(ch) < 128 else None
                if cid is not None:
                    out.append(cid)
        return tuple(out)

    # ---- decode ----

    def token_bytes(self, token_id: int, *, skip_special: bool = False) -> bytes:
        """The raw bytes token `token_id` stands for (control tokens: their text, or b'' if skipped)."""
        if not 0 <= token_id < len(self.tokens):
            raise TokenizerError(f"token id {token_id} is outside the vocabulary (0..{len(self.tokens) - 1})")
        kind = self.token_types[token_id]
        text = self.tokens[token_id]
        if kind == CONTROL:
            return b"" if skip_special else text.encode("utf-8")
        if kind == USER_DEFINED:
            return text.encode("utf-8")
        return decode_chars(text)

    def decode(self, ids: list[int], *, skip_special: bool = False) -> str:
        data = b"".join(self.token_bytes(i, skip_special=skip_special) for i in ids)
        return data.decode("utf-8", errors="replace")

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids
