"""ObjectHeader.flags bits (spec §17: "the header supplies runtime facts: object id, sequence, extent, and flags").

PROMPT_CONTINUES: the object is a prompt chunk that is not the prompt's last (docs/orchestrator.md "Prefill chunks").
The orchestrator sets it on token-in; every stage copies its input's flags onto its output, so the bit reaches the
last stage, which then samples no token: its token-out object holds NO_TOKEN and still carries the bit, and the
orchestrator counts the chunk as consumed instead of reading a token.
"""

PROMPT_CONTINUES = 1 << 0
NO_TOKEN = -1
# Rows of one prefill chunk at most: a stage compiles graphs holding chunk x max_seq_len attention scores
# ([orchestrator].prefill_chunk is checked against it, and so is StageRuntimeFacts.prefill_chunk by the worker).
MAX_PREFILL_CHUNK = 1024
