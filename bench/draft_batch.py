"""Several runs drafting with the orchestrator's draft model at once (tokens/draft_model.py): the time a step's drafts
take for N runs together (one batched step a round for all of them) beside the same drafts asked one run after
another (each run's rounds alone), for N = 1, 2, 4, ... up to --runs.

  .venv/bin/python bench/draft_batch.py [--model PATH] [--runs 4] [--drafts 6] [--steps 8]

Each simulated run has its own prompt. A step asks every run for --drafts drafts, then takes half of them and one
token of its own (a rejection: the slot rewinds and computes the correction, the costly case) into its context.
Thinking ahead is off (LOOK_AHEAD), so both ways compute exactly the drafts asked for. Prints, per N: milliseconds
per step both ways, their ratio, and the rows per batched step. A figure, not a check: the drafts' tokens are tested
in tests/orchestrator/test_draft_model.py.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import statistics
import tempfile
import time

from swactor.orchestrator.tokens import draft_model
from swactor.orchestrator.tokens.draft_model import DraftModel, DraftSlot

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = [[1, 504, 2365, 3543, 335, 260, 1947, 30], [1, 1780, 314, 260, 3575, 282, 4649, 47],
           [1, 504, 2365, 28, 3543, 30, 378, 2365], [1, 1780, 314, 4649, 47, 260, 3575, 282]]
OWN_TOKEN = 30  # the token a step takes after the drafts it keeps (the pipeline's, standing in)


async def one_step(slots: list[DraftSlot], contexts: list[list[int]], k: int, together: bool) -> float:
    t0 = time.perf_counter()
    if together:
        drafts = await asyncio.gather(*(s.draft(c, k) for s, c in zip(slots, contexts, strict=True)))
    else:
        drafts = [await s.draft(c, k) for s, c in zip(slots, contexts, strict=True)]
    took = time.perf_counter() - t0
    for c, d in zip(contexts, drafts, strict=True):
        c.extend([*d[:k // 2], OWN_TOKEN])
    return took


async def measure(model: DraftModel, runs: int, k: int, steps: int, together: bool) -> tuple[float, float]:
    """Median ms per step, and rows per batched step."""
    slots = [model.lease() for _ in range(runs)]
    assert None not in slots
    leased: list[DraftSlot] = [s for s in slots if s is not None]
    contexts = [list(PROMPTS[i % len(PROMPTS)]) for i in range(runs)]
    try:
        for s, c in zip(leased, contexts, strict=True):  # the prompts, not timed
            await s.warm(c)
        rounds, rows = model.rounds, model.rows
        times = [await one_step(leased, contexts, k, together) for _ in range(steps)]
        return statistics.median(times) * 1000, (model.rows - rows) / max(1, model.rounds - rounds)
    finally:
        for s in leased:
            s.release()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--drafts", type=int, default=6)
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()
    draft_model.LOOK_AHEAD = False
    with tempfile.TemporaryDirectory() as graphs:
        model = DraftModel(pathlib.Path(a.model), device="", slots=a.runs, max_seq_len=256, prefill_chunk=8,
                           graph_cache_dir=pathlib.Path(graphs))
        t0 = time.perf_counter()
        await model.load()
        print(f"draft model {pathlib.Path(a.model).name}: {a.runs} slots, loaded in {time.perf_counter() - t0:.1f} s; "
              f"{a.drafts} drafts a step, {a.steps} steps")
        print(f"{'runs':>4}  {'one after another':>17}  {'together':>9}  {'ratio':>6}  {'rows a batched step':>19}")
        n = 1
        while n <= a.runs:
            alone, _ = await measure(model, n, a.drafts, a.steps, together=False)
            together, width = await measure(model, n, a.drafts, a.steps, together=True)
            print(f"{n:>4}  {alone:>14.1f} ms  {together:>6.1f} ms  {alone / together:>5.2f}x  {width:>19.2f}")
            n *= 2
        await model.close()


if __name__ == "__main__":
    asyncio.run(main())
