"""Tokenizer benchmarks: encode throughput (byte-level BPE: SmolLM2; SentencePiece: the test vocabulary, and that
vocabulary grown to Gemma 3's 262,144 pieces), the streaming detokenizer's cost per token, the cost of one long word
(the issue-13 hostile prompt: 4 MiB of letters without a space), the worst word the tokenizer still merges, and a
chat-template render. Figures are printed, never asserted.

    .venv/bin/python bench/tokenizer.py
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swactor.orchestrator.tokens.tokenizer import (  # noqa: E402
    Message,
    PromptTooLong,
    Tokenizer,
    TokenizerError,
    render_chat,
)
from swactor.orchestrator.tokens.tokenizer.bounds import MAX_WORD_CHARS  # noqa: E402
from swactor.orchestrator.tokens.tokenizer.stream import StreamDecoder  # noqa: E402
from tests.orchestrator.helpers import MODEL_PATH  # noqa: E402
from tests.orchestrator.spm_gguf import load_vocab, write_spm_gguf  # noqa: E402

# Mixed prose and code: every Python source of the orchestrator, about 150 KB.
TEXT = "".join(p.read_text() for p in sorted((ROOT / "services" / "swactor" / "orchestrator").rglob("*.py")))
FOUR_MIB = 4 << 20
CONTEXT = 8192
GEMMA3_VOCAB = 262_144


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    try:
        out = fn()
    except TokenizerError as e:
        out = e
    return time.perf_counter() - t0, out


def outcome(out: object) -> str:
    if isinstance(out, PromptTooLong):
        return "refused (too many tokens)"
    if isinstance(out, TokenizerError):
        return "refused (word too long)"
    return f"{len(out)} tokens"


def bench(name: str, path: Path) -> None:
    load, tok = timed(lambda: Tokenizer.from_gguf(path))
    fresh = Tokenizer(tok.data)  # empty word cache
    cold, ids = timed(lambda: fresh.encode(TEXT))
    warm, _ = timed(lambda: tok.encode(TEXT))
    warm, _ = timed(lambda: tok.encode(TEXT))
    print(f"{name}: load {load:.2f} s; encode {len(TEXT)} chars -> {len(ids)} tokens: "
          f"cold {len(ids) / cold:,.0f} tok/s, warm {len(ids) / warm:,.0f} tok/s")
    stream = StreamDecoder(tok)
    dt, text = timed(lambda: "".join(stream.push(i) for i in ids) + stream.flush())
    print(f"  streaming detokenizer: {dt / len(ids) * 1e6:.2f} us per token ({len(text)} chars back)")
    hostile = "x" * FOUR_MIB
    dt, out = timed(lambda: tok.encode(hostile, max_tokens=CONTEXT - 1))
    print(f"  4 MiB one-word prompt, context {CONTEXT}: {outcome(out)} in {dt * 1e3:.0f} ms")
    dt, out = timed(lambda: tok.encode(hostile))
    print(f"  4 MiB one-word prompt, no token limit: {outcome(out)} in {dt * 1e3:.0f} ms")
    rnd = random.Random(1)
    letters = "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(MAX_WORD_CHARS - 1))
    for label, word in (("random letters", letters), ("spaces", " " * (MAX_WORD_CHARS - 1))):
        dt, out = timed(lambda w=word: tok.encode(w))
        print(f"  longest word merged ({MAX_WORD_CHARS - 1} {label}): {outcome(out)} in {dt:.2f} s "
              f"({(MAX_WORD_CHARS - 1) / dt:,.0f} symbols/s)")


def write_large_spm(path: Path, pieces: int = GEMMA3_VOCAB) -> Path:
    """The test SentencePiece vocabulary plus seeded word pieces ('▁' and 2-8 letters, scored below its own) up to
    `pieces`: a vocabulary of Gemma 3's size that the tokenizer loads, merges with and streams back as it would."""
    vocab = load_vocab()
    rnd, seen = random.Random(3), set(vocab["tokens"])
    low = min(vocab["scores"])
    while len(vocab["tokens"]) < pieces:
        piece = "\u2581" + "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(2, 8)))
        if piece not in seen:
            seen.add(piece)
            vocab["tokens"].append(piece)
            vocab["scores"].append(low - 1 - rnd.random() * 10)
            vocab["token_types"].append(1)
    return write_spm_gguf(path, vocab=vocab)


def bench_chat() -> None:
    recorded = json.loads((ROOT / "tests/fixtures/chat_templates.json").read_text(encoding="utf-8"))
    entry = recorded["templates"]["llama-3.1"]
    messages = [Message("system", "Be terse."), *[Message(r, "word " * 50) for r in ("user", "assistant") * 10]]
    render_chat(entry["template"], messages, special_tokens=entry["special_tokens"])  # compile once
    n = 200
    dt, _ = timed(lambda: [render_chat(entry["template"], messages, special_tokens=entry["special_tokens"]) for _ in range(n)])
    print(f"chat template (Llama 3.1, 21 messages): {dt / n * 1e3:.2f} ms per render")


def main() -> None:
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    bench("byte-level BPE (SmolLM2)", MODEL_PATH)
    with tempfile.TemporaryDirectory() as d:
        bench("SentencePiece (test vocabulary, 2000 pieces)", write_spm_gguf(Path(d) / "spm.gguf"))
        bench(f"SentencePiece ({GEMMA3_VOCAB:,} pieces: the test vocabulary and seeded words)",
              write_large_spm(Path(d) / "spm262k.gguf"))
    bench_chat()


if __name__ == "__main__":
    main()
