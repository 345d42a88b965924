"""gpu-worker compute core: GGUF layer-range loading and the tinygrad llama stage forward (spec §15-17, §33)."""
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
