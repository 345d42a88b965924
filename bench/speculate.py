"""Speculative decoding benchmark (issue 25 item 4): one run's decode rate with and without `speculate` (prompt-lookup
drafts verified as one object through the pipeline), S=3, at one-way delays between hosts, on three kinds of text.

  .venv/bin/python bench/speculate.py [--delays 0,50] [--speculate 6] [--max-tokens 48] [--stages 3] [--json PATH]

Per delay: one pool of S hosts in network namespaces (localcluster/linkshaping.py: the NFQUEUE delayer). Per text:
a warm-up run, then the run without drafts and the run with them, alternated twice; the figure is each mode's better
of the two (the box is shared). The tokens of the two modes are compared: they must be equal.

  edit    the model rewrites a function of the prompt (code edits: prompt lookup's use)
  code    the model writes a new function (only its own names and lines repeat)
  repeat  the model is asked to repeat a paragraph of the prompt (prompt lookup's best case)
  free    a story (little repeats: the drafts are few and mostly wrong)

Aims (issue 25): at 50 ms, speculative >= 1.5x on code and on text that repeats its prompt, and >= 1.0x on free text.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

from swactor.localcluster import ClusterSpec, LocalCluster
from swactor.localcluster.linkconditions import LinkConditions
from swactor.localcluster.run import RunResult, follow
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import orchestrator_pb2_grpc

ROOT = pathlib.Path(__file__).resolve().parents[1]
PARAGRAPH = ("The harbour was quiet before dawn. Fishing boats rocked against the pier, their ropes creaking, while "
             "gulls waited on the posts for the first catch. An old man mended a net by lantern light and hummed a "
             "song his father had taught him.")
FUNCTION = '''def merge_sorted(a, b):
    result = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            result.append(a[i])
            i += 1
        else:
            result.append(b[j])
            j += 1
    result.extend(a[i:])
    result.extend(b[j:])
    return result'''
TEXTS = {
    "edit": f"Add type hints to this Python function and write it out whole:\n\n```python\n{FUNCTION}\n```",
    "code": "Write a Python function that checks whether a string is a palindrome, with a docstring and tests.",
    "repeat": f"Repeat the following paragraph exactly, word for word:\n\n{PARAGRAPH}",
    "free": "Tell me a short story about a dragon who is afraid of the dark.",
}


def counts(res: RunResult) -> tuple[int, int]:
    done = [e for e in res.events if e.kind == pb.RUN_COMPLETED]
    return (done[0].counters["drafted"], done[0].counters["accepted"]) if done else (0, 0)


def measure(delay_ms: float, stages: int, speculate: int, max_tokens: int) -> list[dict]:
    spec = ClusterSpec(hosts=stages, netns=True, links=LinkConditions(delay_ms=delay_ms), readiness_timeout_s=600.0)
    rows = []
    with LocalCluster(spec, progress=lambda s: print(f"    {s}", file=sys.stderr, flush=True)) as c, c.channel() as ch:
        stub = orchestrator_pb2_grpc.OrchestratorStub(ch)

        def run(text: str, k: int) -> RunResult:
            req = opb.SubmitRunRequest(prompt=text, stages=stages, max_tokens=max_tokens, ignore_eos=True, speculate=k)
            res = follow(stub, req, timeout_s=900)
            assert res.finished is not None and res.finished.outcome == opb.RUN_OUTCOME_COMPLETED, res.summary()
            return res

        run(TEXTS["free"], 0)  # weights fetched, stages warm
        for name, text in TEXTS.items():
            best: dict[int, RunResult] = {}
            for _ in range(2):
                for k in (0, speculate):
                    res = run(text, k)
                    if k in best and res.token_ids != best[k].token_ids:
                        raise SystemExit(f"{name}: two runs with speculate {k} gave different tokens")
                    if k not in best or (res.decode_tok_s or 0) > (best[k].decode_tok_s or 0):
                        best[k] = res
            plain, fast = best[0], best[speculate]
            if plain.token_ids != fast.token_ids:
                raise SystemExit(f"{name}: speculative tokens differ from the plain run's")
            drafted, accepted = counts(fast)
            row = {"text": name, "delay_ms": delay_ms, "stages": stages, "speculate": speculate,
                   "plain_tok_s": plain.decode_tok_s, "speculative_tok_s": fast.decode_tok_s,
                   "ratio": (fast.decode_tok_s or 0) / (plain.decode_tok_s or 1), "drafted": drafted,
                   "accepted": accepted, "tokens": len(fast.token_ids), "plain_ttft_s": plain.ttft_s,
                   "speculative_ttft_s": fast.ttft_s}
            print(f"  {name:6} {delay_ms:g} ms: plain {row['plain_tok_s']:.2f} tok/s, speculative "
                  f"{row['speculative_tok_s']:.2f} tok/s ({row['ratio']:.2f}x), accepted {accepted}/{drafted} drafts",
                  flush=True)
            rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--delays", default="0,50", help="one-way delays between hosts, ms")
    ap.add_argument("--speculate", type=int, default=6, help="drafted tokens per step at most")
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--json", type=pathlib.Path, default=ROOT / "bench" / "out" / "speculate.json")
    a = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cpus; S={a.stages}, {a.max_tokens} tokens, "
          f"speculate {a.speculate}", flush=True)
    rows = [r for d in a.delays.split(",") for r in measure(float(d), a.stages, a.speculate, a.max_tokens)]
    print("\n text    delay ms  plain tok/s  speculative tok/s  ratio  accepted/drafted  tokens")
    for r in rows:
        print(f" {r['text']:7} {r['delay_ms']:>8g} {r['plain_tok_s']:>12.2f} {r['speculative_tok_s']:>18.2f} "
              f"{r['ratio']:>6.2f} {r['accepted']:>9}/{r['drafted']:<7} {r['tokens']:>6}")
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
