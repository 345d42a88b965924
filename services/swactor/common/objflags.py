"""ObjectHeader.flags bits (spec §17: "the header supplies runtime facts: object id, sequence, extent, and flags").

The orchestrator sets them on token-in; every stage copies its input's flags onto its output, so they reach every
stage and the last one.

PROMPT_CONTINUES: the object is a prompt chunk that is not the prompt's last (docs/orchestrator.md "Prefill chunks").
The last stage samples no token from it: its token-out object holds NO_TOKEN and still carries the bit, and the
orchestrator counts the chunk as consumed instead of reading a token.

VERIFY and the rewind field: speculative decoding (docs/orchestrator.md "Speculative decoding"). A VERIFY object is
the run's last token followed by drafted tokens; the last stage samples a token after *every* row, and its token-out
object holds one token per row. The rewind field (bits 8..15) of the next object says how many rows of the step
before were rejected drafts: each stage moves the run's position back by that many before this object's rows (their
KV entries are overwritten, never read), and the last stage's sampler takes back the draws it made for them.
"""

PROMPT_CONTINUES = 1 << 0
VERIFY = 1 << 1
REWIND_SHIFT = 8
REWIND_MASK = 0xFF
NO_TOKEN = -1
# Drafted tokens per VERIFY object at most: its rows are drafts + 1, and a rewind never exceeds the drafts.
MAX_DRAFT = 16
DEFAULT_DRAFT = 7  # what `swactor submit --speculate` asks for without a number (bench/speculate.py)
# Rows of one prefill chunk at most: a stage compiles graphs holding chunk x max_seq_len attention scores
# ([orchestrator].prefill_chunk is checked against it, and so is StageRuntimeFacts.prefill_chunk by the worker).
MAX_PREFILL_CHUNK = 1024


def rewind_of(flags: int) -> int:
    """The rows of the step before that this object's stage step drops first (0: none)."""
    return (flags >> REWIND_SHIFT) & REWIND_MASK


def with_rewind(flags: int, rows: int) -> int:
    if not 0 <= rows <= REWIND_MASK:
        raise ValueError(f"rewind {rows} does not fit the header's rewind field (0..{REWIND_MASK})")
    return (flags & ~(REWIND_MASK << REWIND_SHIFT)) | (rows << REWIND_SHIFT)
