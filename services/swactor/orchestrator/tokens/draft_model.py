"""The draft model: a small GGUF with the runs' tokenizer, run on the orchestrator's host, that drafts tokens for
speculative decoding ([orchestrator] draft_model; docs/orchestrator.md "Speculative decoding").

Prompt lookup drafts only what the run already said; a draft model guesses free text and code too. It runs the whole
small model in this process (the worker's StageModel, one KV slot per run that drafts) on one thread of its own, so
the event loop never waits for its compute: a run asks (RunFsm's DraftWanted), the drafts come back as Drafted.

Each slot keeps the tokens its KV cache holds. A draft first brings the slot to the run's tokens so far (rewinding
past the first that differs: rejected drafts, or another run's tokens in a slot leased again), then decodes as the run
does (greedy, or sampled with the run's own draws: DraftSlot). The drafts only propose: the pipeline verifies them,
so a draft model's guesses never change a run's tokens.

Several runs drafting at once share the model's thread in rounds (DraftModel._pump): each round computes the next
token of every slot that needs one in one batched step (the weights read once for all of them): on this CPU four
runs' drafts took 2.5 times one run's, not 4.5 times (bench/draft_batch.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import threading
import time
import weakref
from collections.abc import Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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
        self._lock = threading.Lock()  # the requests, asked on the event loop and taken on the model's thread
        self._requests: list[_Request] = []
        self._pumping = False  # a _pump is queued or running on the model's thread
        self._closing = False
        self.rounds = self.rows = 0  # batched steps the drafts took, and the rows in them (bench/draft_batch.py)
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
        """Answer the drafts not begun with none; wait for the round being computed (off the event loop)."""
        self._closing = True
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)
        with self._lock:
            left, self._requests = self._requests, []
        for request in left:
            request.answer(())

    # ---- the model's thread ----

    def _ask(self, request: _Request) -> None:
        """Queue a draft (on the event loop); the model's thread serves it in its next round."""
        with self._lock:
            self._requests.append(request)
            if self._pumping:
                return
            self._pumping = True
        try:
            self._executor.submit(self._pump)
        except RuntimeError:  # the orchestrator is closing the model
            request.answer(())

    def _pump(self) -> None:
        """Serve every draft asked for, in rounds: a round takes one row from each slot drafting (a token whose next
        token it needs) and runs them all as one batched step. While none drafts, the slots that drafted last think
        ahead the same way; a draft asked for takes over at the next round (it waits one step at most)."""
        jobs: dict[int, _Job] = {}  # per slot number
        deferred: list[_Request] = []  # asked for a slot still drafting an earlier request (a warm-up)
        while True:
            with self._lock:
                new, self._requests, deferred = deferred + self._requests, [], []
                if self._closing or not (new or jobs):
                    self._pumping = False
                    break
            for request in new:
                number = request.slot.slot
                if number in jobs and jobs[number].request is not None:
                    deferred.append(request)
                else:  # a slot thinking ahead stops: its run asks
                    jobs[number] = _Job(request.slot, request.slot._drafting(request.ids, request.k), request)
            drafting = any(job.request is not None for job in jobs.values())
            rows: list[tuple[int, int]] = []  # (slot number, token)
            for number, job in list(jobs.items()):
                if drafting and job.request is None:
                    continue  # thinking ahead gives way to drafts asked for
                try:
                    rows.append((number, next(job.steps)))
                except StopIteration as end:
                    self._ended(jobs, number, end.value)
                except Exception as e:  # a prompt's rows that failed: that run goes without drafts, the others go on
                    job.slot._failed(e)
                    self._ended(jobs, number, None)
            self._compute(jobs, rows)
        for request in new + [job.request for job in jobs.values() if job.request is not None]:
            request.answer(())

    def _ended(self, jobs: dict[int, _Job], number: int, value: tuple[tuple[int, ...], int | None] | None) -> None:
        """A job is done: a draft goes back to its run (none for a failed one), and the slot thinks ahead where
        the draft said so; thinking ahead just stops."""
        job = jobs.pop(number)
        if job.request is None:
            return
        drafts, think_until = value or ((), None)
        job.request.answer(drafts)
        if think_until is not None:
            jobs[number] = _Job(job.slot, job.slot._thinking_ahead(think_until))

    def _compute(self, jobs: dict[int, _Job], rows: list[tuple[int, int]]) -> None:
        """One batched step of the round's rows; each slot keeps its row's next token."""
        if not rows:
            return
        from swactor.worker.compute.model import BatchRow

        m = self._model
        assert m is not None
        slots = [jobs[number].slot for number, _ in rows]
        try:
            logits = m.step_batch_logits([BatchRow(slot.slot, len(slot._held), np.asarray([t], np.int32), sample=False)
                                          for slot, (_, t) in zip(slots, rows, strict=True)])
            for i, (slot, (_, t)) in enumerate(zip(slots, rows, strict=True)):
                slot._took(t, logits[i])
        except Exception as e:  # every slot of the round forgets; their runs go without these drafts
            for slot, (number, _) in zip(slots, rows, strict=True):
                slot._failed(e)
                self._ended(jobs, number, None)
            return
        self.rounds += 1
        self.rows += len(rows)


@dataclass
class _Job:
    """What one slot does on the model's thread: a run's draft (its request), or thinking ahead (none). `steps`
    yields each token whose next token the slot needs computed."""

    slot: DraftSlot
    steps: Iterator[int]
    request: _Request | None = None


@dataclass
class _Request:
    """One run's draft: asked on the event loop, answered from the model's thread."""

    slot: DraftSlot
    ids: list[int]
    k: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[tuple[int, ...]]

    def answer(self, drafts: tuple[int, ...]) -> None:
        def settle() -> None:
            if not self.future.done():
                self.future.set_result(drafts)

        with contextlib.suppress(RuntimeError):  # the loop is closed: no one waits for it
            self.loop.call_soon_threadsafe(settle)


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
        self._released = False

    async def draft(self, context: Sequence[int], k: int) -> tuple[int, ...]:
        """Up to k tokens to follow `context` (the run's prompt and tokens so far); () when they would not
        fit the draft model's context, or computing them failed (a draft is only a guess: the run goes on)."""
        if self._released or k <= 0 or not context:
            return ()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[int, ...]] = loop.create_future()
        self.owner._ask(_Request(self, list(context), k, loop, future))
        return await future

    async def warm(self, context: Sequence[int]) -> None:
        """Take in the prompt before the first draft is asked for (while the stages take it in too)."""
        await self.draft(context, 1)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.owner._give_back(self.slot)

    # ---- on the draft model's thread (DraftModel._pump) ----

    def _drafting(self, ids: list[int], k: int) -> Generator[int, None, tuple[tuple[int, ...], int | None]]:
        """Draft k tokens after `ids`. Yields each token whose next token the model must compute at the slot's next
        position (the round computes it with the other slots' and gives it back: _took); returns the drafts and how
        many positions to think ahead to (None: not)."""
        m = self.owner._model
        assert m is not None
        if self._released or len(ids) + k - 1 > m.max_seq_len:
            return (), None
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
            self._feed_rows(ids[len(held):-1])
            yield ids[-1]
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
                yield t
        # the next context holds at most k + 1 more tokens; its drafts k + 2
        return tuple(drafts), (len(ids) + 2 * k + 3 if ahead and LOOK_AHEAD else None)

    def _thinking_ahead(self, until: int) -> Iterator[int]:
        """Extend the chain one token a round towards `until` positions."""
        m = self.owner._model
        assert m is not None
        while (not self._released and self._after and self._after[-1] is not None
               and len(self._held) < min(until, m.max_seq_len)):
            yield self._after[-1]

    def _took(self, token: int, logits: np.ndarray) -> None:
        """The round ran `token` at the slot's next position: keep it, and the token the model takes after it."""
        self._held.append(token)
        self._after.append(self._next_token(logits, len(self._held) - 1))

    def _failed(self, e: Exception) -> None:
        self.owner.log.warning("draft_failed", slot=self.slot, error=f"{type(e).__name__}: {e}")
        with contextlib.suppress(Exception):
            self._forget()

    def _forget(self) -> None:
        assert self.owner._model is not None
        self.owner._model.reset(slot=self.slot)
        self._held.clear()
        self._after.clear()

    def _keep(self, n: int) -> None:
        """Forget all but the first n positions."""
        assert self.owner._model is not None
        self.owner._model.rewind(self.slot, len(self._held) - n)
        del self._held[n:], self._after[n:]

    def _feed_rows(self, ids: list[int]) -> None:
        """Run `ids` at the slot's next positions without the head (a prompt, or tokens the run took off the chain):
        the model's next tokens after them are not computed."""
        m, slot, held = self.owner._model, self.slot, self._held
        assert m is not None
        if len(ids) >= FEED_ROW_BY_ROW:
            m.step(np.asarray(ids, np.int32), len(held), sample=False, slot=slot)
        else:
            for i, t in enumerate(ids):
                m.step(np.asarray([t], np.int32), len(held) + i, sample=False, slot=slot)
        held.extend(ids)
        self._after.extend([None] * len(ids))

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
