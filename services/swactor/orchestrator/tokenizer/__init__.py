"""The model's own tokenizer, rebuilt from the GGUF's `tokenizer.ggml.*` keys (gpt2 / byte-level BPE).

`Tokenizer.from_gguf(path)` -> encode / decode / token_piece; `StreamDecoder` emits complete UTF-8
only; `chat.render` applies the model's chat template (ChatML, Llama 3) natively.
"""

from swactor.orchestrator.tokenizer.bpe import Tokenizer, TokenizerError
from swactor.orchestrator.tokenizer.chat import ChatTemplateError, Message, render_chat
from swactor.orchestrator.tokenizer.stream import StreamDecoder

__all__ = ["ChatTemplateError", "Message", "StreamDecoder", "Tokenizer", "TokenizerError", "render_chat"]
