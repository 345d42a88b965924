"""Record llama.cpp greedy tokens for the default model -> tests/fixtures/llamacpp_greedy.json.

Runs under a separate venv holding llama-cpp-python (it compiles llama.cpp, ~15 min; kept out of CI):
  python3.11 -m venv /tmp/llama-venv && /tmp/llama-venv/bin/pip install llama-cpp-python
  /tmp/llama-venv/bin/python packaging/record_llamacpp_fixture.py [model.gguf] [out.json]
Greedy = argmax of llama.cpp's own logits (ties -> lowest id), N steps, no stop at EOS; the top-2 logit gap of
each step is recorded because llama.cpp quantizes activations (Q8_1) and may flip near-ties.
"""
from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
from llama_cpp import Llama

ROOT = pathlib.Path(__file__).resolve().parents[1]
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
QUESTIONS = ["What is the capital of France?", "Write a Python function that reverses a string.", "Once upon a time"]
STEPS = 32


def chat(q: str) -> str:
  return f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"


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


def main() -> None:
  model = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf")
  dest = pathlib.Path(sys.argv[2] if len(sys.argv) > 2 else ROOT / "tests/fixtures/llamacpp_greedy.json")
  llm = Llama(model_path=model, n_ctx=512, logits_all=True, n_threads=2, seed=0, verbose=False)
  cases = []
  for q in QUESTIONS:
    for templated in (True, False):
      text = chat(q) if templated else q
      toks = llm.tokenize(text.encode(), add_bos=False, special=True)
      toks_bos = llm.tokenize(text.encode(), add_bos=True, special=True)
      ids, gaps = greedy(llm, toks, STEPS)
      cases.append({"question": q, "chat_template": templated, "text": text, "prompt_tokens": toks,
                    "prompt_tokens_add_bos": toks_bos, "greedy_tokens": ids, "top2_gap": gaps,
                    "completion": llm.detokenize(ids).decode("utf-8", "replace")})
  import llama_cpp
  dest.write_text(json.dumps({"model": pathlib.Path(model).name, "llama_cpp_python": llama_cpp.__version__, "steps": STEPS,
                              "n_threads": 2, "cases": cases}, indent=1) + "\n")
  print(f"wrote {dest} ({len(cases)} cases)")


if __name__ == "__main__":
  main()
