"""The model's own tokenizer, rebuilt from the GGUF's `tokenizer.ggml.*` keys: byte-level BPE (`gpt2`)
or SentencePiece (`llama`), chosen by the GGUF.

`Tokenizer.from_gguf(path)` -> encode / decode / token_bytes; `StreamDecoder` emits complete UTF-8
only; `render_chat` / `chat_prompt` render the GGUF's own Jinja chat template in a sandbox.
"""

from swactor.orchestrator.tokens.tokenizer.chat import ChatTemplateError, Message, chat_prompt, render_chat
from swactor.orchestrator.tokens.tokenizer.stream import StreamDecoder
from swactor.orchestrator.tokens.tokenizer.tokenizer import PromptTooLong, Tokenizer, TokenizerError

__all__ = [
    "ChatTemplateError", "Message", "PromptTooLong", "StreamDecoder", "Tokenizer", "TokenizerError", "chat_prompt",
    "render_chat",
]
