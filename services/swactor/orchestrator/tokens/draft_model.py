"""The draft model: a small GGUF with the runs' tokenizer, run on the orchestrator's host, that drafts tokens for
speculative decoding ([orchestrator] draft_model; docs/orchestrator.md "Speculative decoding").

Prompt lookup drafts only what the run already said; a draft model guesses free text and code too. It runs the whole
small model in this process (the worker's StageModel, one KV slot per run that drafts) on one thread of its own, so
the event loop never waits for its compute: a run asks (RunFsm's DraftWanted), the drafts come back as Drafted.

Each slot keeps the tokens its KV cache holds. A draft first brings the slot to the run's tokens so far (rewinding
past the first that differs: rejected drafts, or another run's tokens in a slot leased again), then decodes as the run
does (greedy, or sampled with the run's own draws: DraftSlot). The drafts only propose: the pipeline verifies them,
so a draft model's guesses never change a run's tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from swactor.common.events import get_logger
from swactor.common.sampling import SamplingPolicy
from swactor.modelfile.params import open_header
from swactor.orchestrator.models.gguf_model import read_tokenizer
from swactor.orchestrator.tokens.tokenizer import Tokenizer

if TYPE_CHECKING:  # tinygrad is imported only when a draft model is configured
    from swactor.worker.compute import StageModel
    from swactor.worker.compute.sampling import Sampler

FEED_ROW_BY_ROW = 8  # fewer new tokens than this run as decode rows (a prefill chunk's graph costs many rows)
LOOK_AHEAD = True  # a slot extends its chain between a run's steps (DraftSlot)


NO_CODE_PAGES = ("; this process may not map writable and executable memory, which tinygrad's CPU device needs "
                 "(systemd's MemoryDenyWriteExecute=yes: give swactor-orchestrator the draft model's drop-in, "
                 "docs/operations.md \"Runs\")")


def may_map_code() -> bool:
    """Whether this process may map memory writable and executable (a compiled kernel's pages)."""
    try:
        mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC).close()
    except OSError:
        return False
    return True


class DraftModelError(Exception):
    """The draft model cannot be loaded: names the file and what is wrong."""


class DraftModel:
    """One small model, loaded once, its slots leased to the runs that draft with it."""

    def __init__(self, path: Path, *, device: str, slots: int, max_seq_len: int, prefill_chunk: int,
                 graph_cache_dir: Path | None, kv_dtype: str = "float32") -> None:
        self.path = path
        try:
            self.vocabulary: tuple[str, ...] = tuple(read_tokenizer(open_header(path)).tokens)
        except Exception as e:  # a missing file, not a GGUF, no vocabulary: the operator's setting names it
            raise self._error(e) from None
        self.device, self.max_seq_len, self.prefill_chunk, self.kv_dtype = device, max_seq_len, prefill_chunk, kv_dtype
        self.graph_cache_dir, self.slots = graph_cache_dir, slots
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="draft-model")  # StageModel is not thread safe
        self._model: StageModel | None = None  # once load() is done
        self._free = list(range(slots))
        # per run model's tokenizer: the first id where the vocabularies differ, -1 where they are the same
        self._differs: weakref.WeakKeyDictionary[Tokenizer, int] = weakref.WeakKeyDictionary()
        self.log = get_logger(component="draft_model")

    async def load(self) -> None:
        """Load and compile (seconds; the graph cache makes a restart quicker), off the event loop."""
        t0 = time.perf_counter()
        self._model = await asyncio.get_running_loop().run_in_executor(self._executor, self._load)
        self.log.info("draft_model_loaded", path=str(self.path), layers=self._model.params.n_layers,
                      slots=self.slots, seconds=round(time.perf_counter() - t0, 3))

    def _load(self) -> StageModel:
        from swactor.worker.compute import GGUFModel, ModelRefused, StageModel, UnsupportedQuant
        from swactor.worker.compute.graphcache import GraphCache

        try:
            g = GGUFModel(self.path)
            model = StageModel(g, 0, g.params.n_layers, device=self.device or None, slots=self.slots,
                               max_seq_len=min(self.max_seq_len, g.params.context_length),
                               prefill_chunk=self.prefill_chunk, kv_dtype=self.kv_dtype,
                               graph_cache=GraphCache(self.graph_cache_dir) if self.graph_cache_dir else None)
            model.prepare()
        except (ModelRefused, UnsupportedQuant, ValueError, OSError, MemoryError) as e:
            raise self._error(e) from None
        except RuntimeError as e:  # tinygrad: no device it can use (or not the one named)
            raise self._error(e, f"device {self.device or 'default'}: ") from None
        return model

    def _error(self, e: Exception, where: str = "") -> DraftModelError:
        """The failure named once with the file (and the likeliest cause when no compiled kernel could run here)."""
        said = str(e)
        named = (f"draft model: {where}{said}" if str(self.path) in said
                 else f"draft model {self.path}: {where}{type(e).__name__}: {said}")
        return DraftModelError(named + ("" if may_map_code() else NO_CODE_PAGES))

    def refuses(self, tokenizer: Tokenizer, model_name: str) -> str:
        """Why runs of `model_name` cannot draft with this model ("" when they can): its drafts are token ids, so
        its vocabulary must be the run's model's, id for id. Asked at each submit: compared once per tokenizer."""
        if (differs := self._differs.get(tokenizer, -2)) == -2:
            theirs = tokenizer.tokens
            differs = -1 if tuple(theirs) == self.vocabulary else next(
                (i for i, (a, b) in enumerate(zip(theirs, self.vocabulary, strict=False)) if a != b),
                min(len(theirs), len(self.vocabulary)))
            self._differs[tokenizer] = differs
        if differs < 0:
            return ""
        return (f"the draft model {self.path.name} has another vocabulary than model {model_name!r} "
                f"({len(self.vocabulary)} tokens against {len(tokenizer.tokens)}; they differ from id {differs})")

    def lease(self, sampling: SamplingPolicy | None = None, prompt_tokens: int = 0) -> DraftSlot | None:
        """A slot for one run (its sampling policy and prompt length: DraftSlot), or None when every slot drafts for
        another run (or the model is not loaded)."""
        if self._model is None or not self._free:
            return None
        return DraftSlot(self, self._free.pop(0), sampling, prompt_tokens)

    def _give_back(self, slot: int) -> None:
        self._free.append(slot)

    async def close(self) -> None:
        """Drop the drafts not begun; wait for the one being computed (off the event loop)."""
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)


class DraftSlot:
    """One run's KV slot in the draft model. It keeps the tokens its KV cache holds and, after each, the token the
    model takes next there, where it computed it: drafts read off that chain, computing only what it lacks. Between a
    run's steps the slot thinks ahead (LOOK_AHEAD) along its own chain, while the object it drafted for crosses the
    pipeline: when the drafts are accepted and the pipeline's next token is the chain's, the next drafts are ready. It
    does so only while the run keeps to the chain: a draft model that is often wrong costs no more than its drafts.

    A sampled run's chain is sampled too, under the run's policy and with the very uniform the last stage draws for
    that token of the answer (its seeded generator, one draw per token): where the two models' distributions agree,
    so do their tokens, and a seeded run's drafts are accepted about as often as a greedy run's."""

    def __init__(self, owner: DraftModel, slot: int, sampling: SamplingPolicy | None = None,
                 prompt_tokens: int = 0) -> None:
        self.owner = owner
        self.slot = slot
        self._sampling = sampling if sampling is not None and not sampling.greedy else None
        self._prompt_tokens = prompt_tokens  # the token after position p is the answer's (p + 1 - prompt_tokens)th
        self._sampler: Sampler | None = None  # made on first use, on the model's thread
        self._draws_start: dict | None = None  # its generator's state before the answer's first draw
        self._held: list[int] = []  # the tokens in the slot's KV cache, from position 0
        self._agreed = 0  # how many tokens the last draft's context and held shared (a hint: checked before use)
        self._after: list[int | None] = []  # the token the model takes after held[:i + 1] (None: not computed)
        self._fresh = True  # the slot may still hold an earlier run's positions
        # drafts asked for (counted on the event loop) and taken up (on the model's thread): thinking ahead gives way
        # to those waiting
        self._asked = self._taken = 0
        self._released = False

    async def draft(self, context: Sequence[int], k: int) -> tuple[int, ...]:
        """Up to k tokens to follow `context` (the run's prompt and tokens so far); () when they would not
        fit the draft model's context."""
        if self._released or k <= 0 or not context:
            return ()
        ids = list(context)
        loop = asyncio.get_running_loop()
        self._asked += 1
        try:
            return await loop.run_in_executor(self.owner._executor, self._draft, ids, k)
        except Exception as e:  # a draft is only a guess: the run goes on without it
            self.owner.log.warning("draft_failed", slot=self.slot, error=f"{type(e).__name__}: {e}")
            await loop.run_in_executor(self.owner._executor, self._forget)
            return ()

    async def warm(self, context: Sequence[int]) -> None:
        """Take in the prompt before the first draft is asked for (while the stages take it in too)."""
        await self.draft(context, 1)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.owner._give_back(self.slot)

    # ---- on the draft model's thread ----

    def _forget(self) -> None:
        assert self.owner._model is not None
        self.owner._model.reset(slot=self.slot)
        self._held.clear()
        self._after.clear()

    def _draft(self, ids: list[int], k: int) -> tuple[int, ...]:
        self._taken += 1
        m = self.owner._model
        assert m is not None
        if self._released or len(ids) + k - 1 > m.max_seq_len:
            return ()
        if self._fresh:
            self._forget()
            self._fresh = False
        held, after = self._held, self._after
        same = self._agreed if held[:self._agreed] == ids[:self._agreed] else 0  # compared in C: the usual case
        while same < min(len(held), len(ids)) and held[same] == ids[same]:
            same += 1
        # the run went the chain's way since the last draft (every draft accepted, the next token the chain's), or
        # this is the first: thinking ahead is likely to pay; else the chain is likely to be left again
        ahead = not held or same >= len(ids)
        if same < len(ids) or after[len(ids) - 1] is None:
            self._keep(min(same, len(ids) - 1))  # the last token runs again at least: its logits give the first draft
            self._feed(ids[len(held):])
        self._agreed = len(ids)  # a run's context only grows: the next is likely to begin with this one
        drafts: list[int] = []
        pos = len(ids) - 1
        while len(drafts) < k:
            t = after[pos]
            assert t is not None
            drafts.append(t)
            pos += 1
            if len(drafts) < k and (pos >= len(held) or held[pos] != t):
                self._keep(min(pos, len(held)))
                self._feed([t])
        if ahead:
            self._think_ahead(len(ids) + 2 * k + 3)  # the next context holds at most k + 1 more; its drafts k + 2
        return tuple(drafts)

    def _think_ahead(self, until: int) -> None:
        """Extend the chain one token at a time, each a job of its own, towards `until` positions while no draft
        is asked for (a step ends while the model thinks: its draft waits one token at most)."""
        m = self.owner._model
        assert m is not None
        if not LOOK_AHEAD or self._released or self._waiting() or len(self._held) >= min(until, m.max_seq_len):
            return
        with contextlib.suppress(RuntimeError):  # the orchestrator is closing the model
            self.owner._executor.submit(self._ahead_one, until)

    def _ahead_one(self, until: int) -> None:
        if self._released or self._waiting() or not self._after or self._after[-1] is None:
            return
        try:
            self._feed([self._after[-1]])
        except Exception as e:
            self.owner.log.warning("draft_failed", slot=self.slot, error=f"{type(e).__name__}: {e}", ahead=True)
            self._forget()
            return
        self._think_ahead(until)

    def _waiting(self) -> bool:
        return self._asked > self._taken

    def _keep(self, n: int) -> None:
        """Forget all but the first n positions."""
        assert self.owner._model is not None
        self.owner._model.rewind(self.slot, len(self._held) - n)
        del self._held[n:], self._after[n:]

    def _feed(self, ids: list[int]) -> None:
        """Run `ids` at the slot's next positions; the token the model takes after the last is kept."""
        m, slot, held = self.owner._model, self.slot, self._held
        assert m is not None
        head, last = ids[:-1], ids[-1:]
        if len(head) >= FEED_ROW_BY_ROW:
            m.step(np.asarray(head, np.int32), len(held), sample=False, slot=slot)
        else:
            for i, t in enumerate(head):
                m.step(np.asarray([t], np.int32), len(held) + i, sample=False, slot=slot)
        held.extend(head)
        self._after.extend([None] * len(head))
        logits = m.step_logits(np.asarray(last, np.int32), len(held), slot=slot)
        held.extend(last)
        self._after.append(self._next_token(logits, len(held) - 1))

    def _next_token(self, logits: np.ndarray, pos: int) -> int:
        """The token the run would take after position `pos` if its model's logits were these: greedy, or the run's
        sampler with the draw the last stage makes for that token of the answer."""
        draw = pos + 1 - self._prompt_tokens
        if self._sampling is None or draw < 0:
            return int(np.argmax(logits))
        if self._sampler is None:
            from swactor.worker.compute.sampling import Sampler

            self._sampler = Sampler(self._sampling)  # past the resumed answer's draws (skip_draws)
            self._draws_start = self._sampler.rng.bit_generator.state
        generator = self._sampler.rng.bit_generator
        generator.state = self._draws_start
        generator.advance(draw)  # one 64-bit output per draw, as Sampler.rewind counts them
        return self._sampler(logits)
