"""Models: which the orchestrator serves, what their GGUF headers say, and serving their files to stage hosts.

  models         ModelRegistry: model name -> source, judged from its GGUF header, loaded on first use
  gguf_model     model facts and tokenizer vocabulary from a GGUF header (through swactor.modelfile)
  sources        where a model's GGUF comes from: a local path or an http(s) URL (header read, materialise)
  distributor    model distribution: manifests, the model server, each stage's GgufSource
  model_listing  ListModels: the served models and every node's weights cache
"""
