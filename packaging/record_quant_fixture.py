"""Record llama.cpp greedy tokens for the re-quantized SmolLM2 files -> tests/fixtures/llamacpp_quant_greedy.json.

  .venv/bin/python packaging/record_quant_fixture.py [--llama-python /tmp/llama-venv/bin/python] [--out PATH]

Builds each file of FILES with the test-time builder (tests/fixtures/gguf_fixtures.py: this venv's pinned gguf, so the bytes
are the ones the tests get) and runs llama.cpp on exactly that file in the llama-cpp-python venv (see
record_llamacpp_fixture.py; not part of CI). Each file's sha256 goes into the fixture: the tests refuse a file that
differs from the one llama.cpp ran. Greedy = argmax of llama.cpp's logits, no stop at EOS, with the top-2 gap per step.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
STEPS = 24
N_THREADS = 2
# the default model's llama.cpp fixture: a chat-templated question, and two plain prompts
BASE_FIXTURE = ROOT / "tests/fixtures/llamacpp_greedy.json"
PLAIN = {"plain_france": [1780, 314, 260, 3575, 282, 4649, 47], "once": [6403, 1980, 253, 655]}

LLAMA_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import llama_cpp
from llama_cpp import Llama
from record_llamacpp_fixture import greedy
model, prompts, steps, threads = sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
llm = Llama(model_path=model, n_ctx=512, logits_all=True, n_threads=threads, seed=0, verbose=False)
out = {name: dict(zip(("greedy_tokens", "top2_gap"), greedy(llm, toks, steps))) for name, toks in prompts.items()}
print(json.dumps({"llama_cpp_python": llama_cpp.__version__, "cases": out}))
"""


def prompts() -> dict[str, list[int]]:
  chat = next(c for c in json.loads(BASE_FIXTURE.read_text())["cases"] if c["chat_template"] and "France" in c["question"])
  return {"chat_france": chat["prompt_tokens"], **PLAIN}


def main() -> None:
  sys.path.insert(0, str(ROOT))
  from tests.fixtures.gguf_fixtures import BUILDER_VERSION, FILES, sha256
  ap = argparse.ArgumentParser()
  ap.add_argument("--llama-python", default="/tmp/llama-venv/bin/python")
  ap.add_argument("--out", default=str(ROOT / "tests/fixtures/llamacpp_quant_greedy.json"))
  a = ap.parse_args()
  ps, files, version = prompts(), {}, None
  for mix, make in FILES.items():
    path = make()
    r = subprocess.run([a.llama_python, "-c", LLAMA_SCRIPT, str(ROOT / "packaging"), str(path), json.dumps(ps), str(STEPS), str(N_THREADS)],
                       capture_output=True, text=True, check=True)
    got = json.loads(r.stdout.strip().splitlines()[-1])
    version = got["llama_cpp_python"]
    files[mix] = {"file": path.name, "sha256": sha256(path),
                  "cases": [{"prompt": name, "prompt_tokens": toks, **got["cases"][name]} for name, toks in ps.items()]}
    print(f"{mix}: {path.name} {files[mix]['sha256'][:12]}")
  dest = pathlib.Path(a.out)
  dest.write_text(json.dumps({"builder_version": BUILDER_VERSION, "gguf": importlib.metadata.version("gguf"),
                              "llama_cpp_python": version, "steps": STEPS, "n_threads": N_THREADS, "files": files}, indent=1) + "\n")
  print(f"wrote {dest}")


if __name__ == "__main__":
  main()
