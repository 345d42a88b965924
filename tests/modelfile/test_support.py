"""The support declaration and the compute core agree (the declaration is what the orchestrator judges by)."""

from __future__ import annotations

from gguf import GGMLQuantizationType

from swactor.modelfile import support
from swactor.worker.compute import gguf_weights, quant


def test_quant_types_are_what_the_compute_core_loads() -> None:
    assert {q.name for q in quant.BLOCK} == set(support.QUANT_TYPES)
    assert set(support.QUANT_TYPES) <= set(GGMLQuantizationType.__members__)


def test_architectures_are_what_the_compute_core_implements() -> None:
    compute = set(getattr(gguf_weights, "ARCHITECTURES", {"llama": None}))  # the core names only llama today
    assert compute == set(support.ARCHITECTURES)
    layer = {f"{t}.weight" for t in gguf_weights.LAYER_TENSORS}
    for arch in support.ARCHITECTURES.values():
        assert set(arch.layer_tensors) == layer


def test_the_orchestrator_judges_without_the_worker() -> None:
    import subprocess
    import sys

    code = ("import sys; import swactor.orchestrator.main, swactor.modelfile.judge; "
            "bad = [m for m in sys.modules if m.startswith('swactor.worker')]; print(bad); sys.exit(bool(bad))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
