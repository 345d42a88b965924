"""The token path: a prompt's text to ids, ids into the pipeline and back out, ids to text.

  tokenizer/       the model's own tokenizer from the GGUF (BPE, SentencePiece), streaming decode, chat templates
  prompting        a SubmitRun's prompt ids: chat template and tokenizer in a worker thread
  token_rings      TokenWriter (token-in producer) / TokenReader (token-out consumer) over ring-rs rings
  token_endpoints  RingTokenEndpoints: a run's two token edges through the edge end's EdgeEstablisher
"""
