"""swactor: a distributed runtime serving one GGUF model as a linear pipeline across GPU hosts."""

__version__ = "0.1.0"
