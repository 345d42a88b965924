"""Record llama.cpp greedy tokens for the re-packed architecture fixtures -> tests/fixtures/llamacpp_arch_greedy.json.

The files (gguf_fixtures.ARCH_FILES: qwen2, qwen2 + YaRN, Llama 3 rope_freqs, linear scaling, qwen3, phi3, phi3 +
LongRoPE) are built by this project's venv; llama.cpp runs under a separate venv holding llama-cpp-python (see
record_llamacpp_fixture.py):
  .venv/bin/python -m tests.fixtures.gguf_fixtures            # build them (cached under .cache/fixtures/gguf-v1/)
  /tmp/llama-venv/bin/python packaging/record_llamacpp_arch_fixture.py [out.json]
Each file's sha256 is stored with its tokens: the test checks that it runs on the same bytes. Greedy = argmax of
llama.cpp's logits, STEPS steps, no stop at EOS, prompts given as token ids (SmolLM2's vocabulary in every file).
"""
from __future__ import annotations

import hashlib
import json
import pathlib
import subprocess
import sys

import numpy as np
from llama_cpp import Llama

ROOT = pathlib.Path(__file__).resolve().parents[1]
STEPS = 24


def prompts() -> dict[str, list[int]]:
  smol = json.loads((ROOT / "tests/fixtures/llamacpp_greedy.json").read_text())["cases"]
  chat = next(c["prompt_tokens"] for c in smol if c["chat_template"] and "France" in c["question"])
  # "count" ("1, 2, 3, 4, 5,"): on phi3_longrope the three others reach near-ties after 23 tokens in all, under the
  # test's 24; this one runs 24 steps without one
  return {"chat_france": chat, "plain_france": [1780, 314, 260, 3575, 282, 4649, 47], "once": [6403, 1980, 253, 655],
          "count": [33, 28, 216, 34, 28, 216, 35, 28, 216, 36, 28, 216, 37, 28]}


def greedy(llm: Llama, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
  llm.reset()
  llm.eval(prompt)
  out, gaps = [], []
  for _ in range(n):
    logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
    top2 = np.sort(logits)[-2:]
    out.append(int(np.argmax(logits)))
    gaps.append(float(top2[1] - top2[0]))
    llm.eval([out[-1]])
  return out, gaps


def sha256(path: pathlib.Path) -> str:
  h = hashlib.sha256()
  with path.open("rb") as f:
    while chunk := f.read(1 << 22):
      h.update(chunk)
  return h.hexdigest()


def main() -> None:
  dest = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "tests/fixtures/llamacpp_arch_greedy.json")
  listing = subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "tests.fixtures.gguf_fixtures"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout  # "name path sha256" per llama.cpp-loadable file
  files = {}
  for line in listing.splitlines():
    name, path = line.split()[:2]
    p = pathlib.Path(path)
    llm = Llama(model_path=str(p), n_ctx=512, logits_all=True, n_threads=2, seed=0, verbose=False)
    cases = []
    for key, toks in prompts().items():
      ids, gaps = greedy(llm, toks, STEPS)
      cases.append({"prompt": key, "prompt_tokens": toks, "greedy_tokens": ids, "top2_gap": gaps,
                    "completion": llm.detokenize(ids).decode("utf-8", "replace")})
    files[name] = {"file": p.name, "sha256": sha256(p), "cases": cases}
    del llm
    print(f"{name}: {[c['completion'][:40] for c in cases]}")
  import llama_cpp
  dest.write_text(json.dumps({"llama_cpp_python": llama_cpp.__version__, "steps": STEPS, "n_threads": 2, "files": files}, indent=1) + "\n")
  print(f"wrote {dest} ({len(files)} files)")


if __name__ == "__main__":
  main()
