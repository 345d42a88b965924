"""Record Hugging Face's apply_chat_template renders -> tests/fixtures/chat_templates.json.

The reference renderer for the chat-template tests (tests/orchestrator/test_tokenizer_chat.py). Runs
offline in a scratch venv, never in CI:
  python3.11 -m venv /tmp/tok-venv && /tmp/tok-venv/bin/pip install transformers jinja2 gguf
  mkdir -p /tmp/sdist && curl -fsSL -o /tmp/sdist/llama_cpp_python-0.3.36.tar.gz \
    https://files.pythonhosted.org/packages/source/l/llama_cpp_python/llama_cpp_python-0.3.36.tar.gz
  tar xzf /tmp/sdist/llama_cpp_python-0.3.36.tar.gz -C /tmp/sdist
(the sdist straight from PyPI: `pip download --no-binary :all:` builds cmake from source to read its metadata)
  /tmp/tok-venv/bin/python packaging/record_chat_templates.py /tmp/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp
Template strings are data, taken from: llama.cpp's models/templates/*.jinja (copies of the models'
tokenizer_config.json chat_template: Llama 3.1/3.2, Qwen2.5, Qwen3, Phi-3.5, Gemma 2), Gemma 3's (GEMMA3_IT), llama.cpp's
tests/test-chat-template.cpp (Mistral's v3 template, as in Mistral-7B-Instruct-v0.3, and a plain ChatML
one), the default model's GGUF (SmolLM2, read with `gguf`), and swactor's own built-in fallbacks. Each render uses a
fixed clock (what strftime_now reads) and the special tokens recorded beside it, so the test can hand ours exactly the same inputs.
"""
from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import sys
from datetime import datetime

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOW = datetime(2024, 9, 5, 14, 30)

CONVERSATIONS: dict[str, tuple[list[dict], bool]] = {
  "system_multi_turn": ([{"role": "system", "content": "You are a terse assistant."},
                         {"role": "user", "content": "What is 2+2?"},
                         {"role": "assistant", "content": "4."},
                         {"role": "user", "content": "  And 3+3? \n"}], True),
  "user_only": ([{"role": "user", "content": "Hello! Ünïcödé 日本語 👋"}], True),
  "no_generation_prompt": ([{"role": "user", "content": "Hi"},
                            {"role": "assistant", "content": "Hello there. How can I help?"}], False),
  "whitespace": ([{"role": "system", "content": "  padded system  "},
                  {"role": "user", "content": "\n\nline1\n\tline2  "},
                  {"role": "assistant", "content": "  spaced  "},
                  {"role": "user", "content": "x"}], True),
  "tool_result": ([{"role": "system", "content": "Use tools."},
                   {"role": "user", "content": "Weather in Paris?"},
                   {"role": "assistant", "content": "Checking."},
                   {"role": "tool", "content": "{\"temp_c\": 21}"},
                   {"role": "user", "content": "Thanks"}], True),
  "not_alternating": ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], True),
  "multi_turn": ([{"role": "user", "content": "Name a colour."},
                  {"role": "assistant", "content": "Blue."},
                  {"role": "user", "content": "Another?"}], True),  # no system message: Gemma refuses one
  "reasoning_in_replies": ([{"role": "user", "content": "Name a colour."},
                            {"role": "assistant", "content": "<think>\nEasy.\n</think>\n\nBlue."},
                            {"role": "user", "content": "Another?"},
                            {"role": "assistant", "content": "<think>\nNot blue.\n\n</think>\nRed."}], False),
}


# Gemma 3 instruct (google/gemma-3-*-it, tokenizer_config.json's chat_template, which their GGUF files carry as
# tokenizer.chat_template): llama.cpp's models/templates has none. A system turn is folded into the first user turn.
GEMMA3_IT = (
  "{{ bos_token }}\n"
  "{%- if messages[0]['role'] == 'system' -%}\n"
  "    {%- if messages[0]['content'] is string -%}\n"
  "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
  "    {%- else -%}\n"
  "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
  "    {%- endif -%}\n"
  "    {%- set loop_messages = messages[1:] -%}\n"
  "{%- else -%}\n"
  "    {%- set first_user_prefix = \"\" -%}\n"
  "    {%- set loop_messages = messages -%}\n"
  "{%- endif -%}\n"
  "{%- for message in loop_messages -%}\n"
  "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
  "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
  "    {%- endif -%}\n"
  "    {%- if (message['role'] == 'assistant') -%}\n"
  "        {%- set role = \"model\" -%}\n"
  "    {%- else -%}\n"
  "        {%- set role = message['role'] -%}\n"
  "    {%- endif -%}\n"
  "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
  "    {%- if message['content'] is string -%}\n"
  "        {{ message['content'] | trim }}\n"
  "    {%- elif message['content'] is iterable -%}\n"
  "        {%- for item in message['content'] -%}\n"
  "            {%- if item['type'] == 'image' -%}\n"
  "                {{ '<start_of_image>' }}\n"
  "            {%- elif item['type'] == 'text' -%}\n"
  "                {{ item['text'] | trim }}\n"
  "            {%- endif -%}\n"
  "        {%- endfor -%}\n"
  "    {%- else -%}\n"
  "        {{ raise_exception(\"Invalid content type\") }}\n"
  "    {%- endif -%}\n"
  "    {{ '<end_of_turn>\n' }}\n"
  "{%- endfor -%}\n"
  "{%- if add_generation_prompt -%}\n"
  "    {{'<start_of_turn>model\n'}}\n"
  "{%- endif -%}\n"
)


def cpp_test_template(source: str, name_part: str) -> str:
  """The template string of the test-chat-template.cpp case whose name contains `name_part`."""
  at = source.index(name_part)
  m = re.compile(r'/\* \.template_str= \*/ "((?:[^"\\]|\\.)*)"').search(source, at)
  return json.loads('"' + m.group(1) + '"')  # C++ escapes used there (\n \" \\) are JSON's


def swactor_chat_module():
  """swactor's chat.py alone (it needs only jinja2; the package would pull in grpc stubs)."""
  spec = importlib.util.spec_from_file_location("chat", ROOT / "services/swactor/orchestrator/tokens/tokenizer/chat.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules["chat"] = module  # dataclasses look their module up while the class is created
  spec.loader.exec_module(module)
  return module


def smollm2() -> tuple[str, dict[str, str]]:
  from gguf import GGUFReader
  r = GGUFReader(ROOT / ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf")
  tokens = r.fields["tokenizer.ggml.tokens"].contents()
  special = {"bos_token": tokens[r.fields["tokenizer.ggml.bos_token_id"].contents()],
             "eos_token": tokens[r.fields["tokenizer.ggml.eos_token_id"].contents()]}
  return r.fields["tokenizer.chat_template"].contents(), special


def templates(llama_cpp: pathlib.Path) -> dict[str, tuple[str, dict[str, str]]]:
  chat = swactor_chat_module()
  jinja = llama_cpp / "models" / "templates"
  cpp = (llama_cpp / "tests" / "test-chat-template.cpp").read_text()
  llama3 = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
  return {
    "llama-3.1": ((jinja / "meta-llama-Llama-3.1-8B-Instruct.jinja").read_text(), llama3),
    "llama-3.2": ((jinja / "meta-llama-Llama-3.2-3B-Instruct.jinja").read_text(), llama3),
    "qwen2.5": ((jinja / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text(), {"eos_token": "<|im_end|>"}),
    "qwen3": ((jinja / "Qwen-Qwen3-0.6B.jinja").read_text(), {"eos_token": "<|im_end|>"}),
    "phi-3.5": ((jinja / "microsoft-Phi-3.5-mini-instruct.jinja").read_text(), {"bos_token": "<s>", "eos_token": "<|endoftext|>"}),
    "gemma-2": ((jinja / "google-gemma-2-2b-it.jinja").read_text(), {"bos_token": "<bos>", "eos_token": "<eos>"}),
    "gemma-3": (GEMMA3_IT, {"bos_token": "<bos>", "eos_token": "<eos>"}),
    "mistral-v3": (cpp_test_template(cpp, "(mistralai 'v3' template"), {"bos_token": "<s>", "eos_token": "</s>"}),
    "smollm2": smollm2(),
    "chatml": (cpp_test_template(cpp, "teknium/OpenHermes-2.5-Mistral-7B"), {}),
    "builtin-chatml": (chat.CHATML_TEMPLATE, {}),
    "builtin-llama3": (chat.LLAMA3_TEMPLATE, llama3),
  }


def hf_tokenizer(special: dict[str, str]):
  from tokenizers import Tokenizer, models
  from transformers import PreTrainedTokenizerFast
  return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"x": 0})), **special)


def pin_clock() -> None:
  """Make HF's strftime_now read NOW (it calls datetime.now(); a callable passed as a template
  variable would be replaced by a placeholder string in transformers 5)."""
  from transformers.utils import chat_template_utils

  class Fixed(datetime):
    @classmethod
    def now(cls, tz=None):
      return NOW

  chat_template_utils.datetime = Fixed


def main() -> None:
  import transformers
  pin_clock()
  llama_cpp = pathlib.Path(sys.argv[1])
  dest = pathlib.Path(sys.argv[2] if len(sys.argv) > 2 else ROOT / "tests/fixtures/chat_templates.json")
  out_templates, cases = {}, []
  for name, (template, special) in templates(llama_cpp).items():
    hf = hf_tokenizer(special)
    used = dict(hf.special_tokens_map)
    out_templates[name] = {"template": template, "special_tokens": used}
    for conv, (messages, gen) in CONVERSATIONS.items():
      case = {"template": name, "conversation": conv, "add_generation_prompt": gen}
      try:
        case["text"] = hf.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=gen)
      except Exception as e:  # the template's own raise_exception (or a failure it hits) is a result too
        case["error"] = str(e)
      cases.append(case)
  dest.write_text(json.dumps({"transformers": transformers.__version__, "now": NOW.isoformat(),
                              "conversations": {k: {"messages": m, "add_generation_prompt": g} for k, (m, g) in CONVERSATIONS.items()},
                              "templates": out_templates, "cases": cases}, indent=1, ensure_ascii=False) + "\n")
  print(f"wrote {dest}: {len(out_templates)} templates, {len(cases)} renders, "
        f"{sum('error' in c for c in cases)} refused")


if __name__ == "__main__":
  main()
