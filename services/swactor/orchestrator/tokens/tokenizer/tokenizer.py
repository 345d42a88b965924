"""The model's tokenizer, rebuilt from the GGUF's `tokenizer.ggml.*` keys as llama.cpp's llama_vocab does.

The tokenizer model is chosen by `tokenizer.ggml.model`: `gpt2` (byte-level BPE, bpe.py) or `llama`
(SentencePiece, spm.py). What both share lives here: special tokens (control, user-defined, unknown)
are cut out of the text first, longest text first, as whole tokens; BOS/EOS per the GGUF's flags;
decode by token type; the end-of-generation ids; and a cheap lower bound on a text's token count
so an oversized prompt is refused before any merging (`max_tokens`).
"""

from __future__ import annotations

import re
from pathlib import Path

from swactor.modelfile.params import ModelRefused, open_header
from swactor.orchestrator.models.gguf_model import TokenizerData, read_tokenizer
from swactor.orchestrator.tokens.tokenizer.bounds import MAX_WORD_CHARS, WORD_BOUND_CHARS, CostBound
from swactor.orchestrator.tokens.tokenizer.bpe import ByteLevelBpe
from swactor.orchestrator.tokens.tokenizer.spm import SentencePiece

# GGUF token types (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPECIAL_TYPES = (CONTROL, USER_DEFINED, UNKNOWN)

# Token texts llama.cpp treats as end-of-generation (and as control tokens) whatever the GGUF says.
EOG_TEXTS = frozenset(
    {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>", "<|eom_id|>",
     "<|end_of_text|>"}
)
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenizerError(ValueError):
    """The GGUF's tokenizer is unsupported, a text cannot be tokenized, or a token id is out of range."""


class PromptTooLong(TokenizerError):
    """The text needs more tokens than the caller allows; raised before (or instead of) finishing."""


class Tokenizer:
    def __init__(self, data: TokenizerData) -> None:
        self.data = data
        self.tokens = data.tokens
        if len(data.token_types) != len(data.tokens):
            raise TokenizerError(f"tokenizer.ggml.token_type has {len(data.token_types)} entries for {len(data.tokens)} tokens")
        self._ids = {text: i for i, text in enumerate(self.tokens)}
        types = list(data.token_types)
        named_eog = {i for i, t in enumerate(self.tokens) if t in EOG_TEXTS}
        for i in named_eog:
            types[i] = CONTROL
        self.token_types = types
        try:
            if data.model == "gpt2":
                self.model: ByteLevelBpe | SentencePiece = ByteLevelBpe(data, self._ids)
            elif data.model == "llama":
                self.model = SentencePiece(data, self._ids)
            else:
                raise TokenizerError(
                    f"tokenizer.ggml.model {data.model!r} is not supported "
                    "(supported: 'gpt2' byte-level BPE, 'llama' SentencePiece)"
                )
        except TokenizerError:
            raise
        except ValueError as e:
            raise TokenizerError(str(e)) from None
        spm = data.model == "llama"
        # llama.cpp's defaults for SentencePiece files that do not name these tokens.
        self.bos_id = self._known(data.bos_id, 1 if spm else None)
        self.eos_id = self._known(data.eos_id, 2 if spm else None)
        self.unk_id = self._known(data.unk_id, 0 if spm else None)
        self.pad_id = data.pad_id
        self.add_bos = self.model.default_add_bos if data.add_bos is None else bool(data.add_bos)
        self.add_eos = bool(data.add_eos)
        specials = [i for i, t in enumerate(types) if t in SPECIAL_TYPES and self.tokens[i]]
        specials.sort(key=lambda i: -len(self.tokens[i].encode("utf-8")))
        self._specials = [(self.tokens[i], i, types[i]) for i in specials]
        eog = {i for i in (self.eos_id, data.eot_id, data.eom_id) if i is not None}
        self.eog_ids = frozenset(eog | named_eog)
        self.bound = CostBound(self.tokens, self.model.unrepresentable_bytes, self.model.unrepresentable_chars)

    def _known(self, token_id: int | None, default: int | None) -> int | None:
        token_id = default if token_id is None else int(token_id)
        return token_id if token_id is not None and 0 <= token_id < len(self.tokens) else None

    @classmethod
    def from_gguf(cls, path: Path) -> Tokenizer:
        try:
            data = read_tokenizer(open_header(path))
        except ModelRefused as e:
            raise TokenizerError(str(e)) from None
        return cls(data)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @property
    def kind(self) -> str:
        """`gpt2` or `llama`, the GGUF's tokenizer model."""
        return self.model.name

    # ---- encode ----

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = True,
               max_tokens: int | None = None) -> list[int]:
        """Token ids for `text`; `add_special` adds BOS/EOS as the GGUF asks, `parse_special` matches
        control tokens such as <|im_start|> as whole tokens. With `max_tokens`, a text that needs more
        ids raises PromptTooLong -- before merging when its length proves it (bounds.py), else as soon
        as the count passes the limit -- so the cost follows the limit, not the text."""
        try:
            raw = text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise TokenizerError(f"text is not valid Unicode: {e.reason} at character {e.start}") from None
        bos = [self.bos_id] if add_special and self.add_bos and self.bos_id is not None else []
        eos = [self.eos_id] if add_special and self.add_eos and self.eos_id is not None else []
        if max_tokens is not None:
            least = len(bos) + len(eos) + self.bound.text_min_tokens(raw)
            if least > max_tokens:
                raise PromptTooLong(
                    f"the text needs at least {least} tokens ({len(raw)} bytes, at most "
                    f"{self.bound.max_token_bytes} bytes per token), more than the {max_tokens} allowed"
                )
        ids = list(bos)
        after_special = True  # SentencePiece prefixes a space to the first fragment and after specials
        for fragment, special_id in self._partition(text, parse_special):
            if special_id is not None:
                ids.append(special_id)
                after_special = True
                continue
            for word in self.model.words(fragment, after_special):
                self._check_word(word, len(ids) + len(eos), max_tokens)
                try:
                    ids.extend(self.model.word_ids(word))
                except ValueError as e:
                    raise TokenizerError(str(e)) from None
                if max_tokens is not None and len(ids) + len(eos) > max_tokens:
                    raise PromptTooLong(f"the text needs more than the {max_tokens} tokens allowed")
            after_special = False
        ids.extend(eos)
        return ids

    def _check_word(self, word: str, count: int, max_tokens: int | None) -> None:
        if len(word) > MAX_WORD_CHARS:
            raise TokenizerError(
                f"the text has a word of {len(word)} characters without a break; the tokenizer merges "
                f"words of at most {MAX_WORD_CHARS}"
            )
        if max_tokens is not None and len(word) >= WORD_BOUND_CHARS:
            least = count + self.bound.word_min_tokens(word)
            if least > max_tokens:
                raise PromptTooLong(
                    f"the text needs at least {least} tokens (one word of {len(word)} characters alone "
                    f"needs {least - count}), more than the {max_tokens} allowed"
                )

    def _partition(self, text: str, parse_special: bool) -> list[tuple[str, int | None]]:
        """Text fragments and special-token ids in order; user-defined tokens match even without
        `parse_special` (llama.cpp, after Hugging Face's added tokens)."""
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

    # ---- decode ----

    def token_bytes(self, token_id: int, *, skip_special: bool = False) -> bytes:
        """The raw bytes token `token_id` stands for (control/unknown tokens: their text, or b'' if skipped)."""
        if not 0 <= token_id < len(self.tokens):
            raise TokenizerError(f"token id {token_id} is outside the vocabulary (0..{len(self.tokens) - 1})")
        kind = self.token_types[token_id]
        text = self.tokens[token_id]
        if kind in (CONTROL, UNKNOWN):
            return b"" if skip_special else text.encode("utf-8")
        if kind == USER_DEFINED:
            return text.encode("utf-8")
        if kind == NORMAL:
            return self.model.piece(text)
        if kind == BYTE:
            m = _BYTE_TOKEN.fullmatch(text)
            return bytes([int(m.group(1), 16)]) if m else self.model.piece(text)
        return b""  # unused / undefined token types print nothing in llama.cpp either

    def decode(self, ids: list[int], *, skip_special: bool = False) -> str:
        """The concatenated token pieces (as llama.cpp's token_to_piece gives them: a SentencePiece
        text keeps the space its first piece carries)."""
        data = b"".join(self.token_bytes(i, skip_special=skip_special) for i in ids)
        return data.decode("utf-8", errors="replace")

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids
