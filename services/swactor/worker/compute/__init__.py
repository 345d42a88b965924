"""gpu-worker compute core: GGUF layer-range loading and the tinygrad llama stage forward (spec §15-17, §33).

  gguf_weights  one stage's weights from the GGUF (memory-mapped, its layer range only)
  quant         GGML block formats (numpy dequantisers)     linear  device-side weight matrices
  cpu_matvec    hand-scheduled CPU block matvecs            rope    rotary position embedding
  model         the llama-family forward of one layer range (StageModel)
  sampling      token selection under the run's SamplingPolicy
  graphcache    the disk cache of captured TinyJit graphs   replay  direct replay of them on the CPU
"""
from .gguf_weights import GGUFModel, LlamaParams, LoadProgress, ModelRefused, load_stage
from .graphcache import kernel_cache_per_thread
from .model import StageModel
from .quant import UnsupportedQuant
from .sampling import Sampler

kernel_cache_per_thread()

__all__ = [
           "GGUFModel",
           "LlamaParams",
           "LoadProgress",
           "ModelRefused",
           "Sampler",
           "StageModel",
           "UnsupportedQuant",
           "load_stage",
]
