"""Pre-tokenizer: split text into words before BPE, per `tokenizer.ggml.pre` (as llama.cpp does).

llama.cpp applies a list of patterns in turn; each pattern splits every current fragment into its
matches *and* the unmatched gaps between them (gaps stay as words). The patterns need \\p{L} / \\p{N},
which the `regex` package supports and `re` does not.
"""

from __future__ import annotations

import regex

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# tokenizer.ggml.pre -> (patterns applied in order, ignore_merges, default add_bos)
PRE_TYPES: dict[str, tuple[tuple[str, ...], bool, bool]] = {
    "default": ((r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"), False, False),
    "gpt-2": ((GPT2,), False, False),
    "smollm": ((r"\p{N}", GPT2), False, False),
    "starcoder": ((r"\p{N}", GPT2), False, False),
    "llama3": ((LLAMA3,), True, True),
    "llama-v3": ((LLAMA3,), True, True),
    "llama-bpe": ((LLAMA3,), True, True),
    "qwen2": ((QWEN2,), False, False),
}


class PreTokenizer:
    def __init__(self, pre: str) -> None:
        if pre not in PRE_TYPES:
            raise ValueError(
                f"unsupported tokenizer.ggml.pre {pre!r}; supported: {', '.join(sorted(PRE_TYPES))}"
            )
        patterns, self.ignore_merges, self.default_add_bos = PRE_TYPES[pre]
        self.name = pre
        self._patterns = [regex.compile(p) for p in patterns]

    def split(self, text: str) -> list[str]:
        fragments = [text] if text else []
        for pattern in self._patterns:
            out: list[str] = []
            for frag in fragments:
                pos = 0
                for m in pattern.finditer(frag):
                    if m.start() > pos:
                        out.append(frag[pos : m.start()])
                    if m.end() > m.start():
                        out.append(m.group())
                    pos = m.end()
                if pos < len(frag):
                    out.append(frag[pos:])
            fragments = out
        return fragments
