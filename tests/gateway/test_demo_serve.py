"""`swactor demo --serve`: the demo answers its prompt, then serves the OpenAI API on 127.0.0.1 with the line the
docs promise, and Ctrl-C tears it all down."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from tests.e2e.conftest import needs_model
from tests.gateway.helpers import MODEL, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), needs_model]
LINE = re.compile(r"OpenAI API: (http://127\.0\.0\.1:(\d+)/v1) \(token file: (\S+)\)")


def test_demo_serves_the_openai_api_until_interrupted() -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "swactor.cli.main", "demo", "--hosts", "2", "--max-tokens", "8",
                             "--serve", "--openai-port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        url = token_file = None
        deadline = time.monotonic() + 240
        lines = []
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            if (m := LINE.search(line)) is not None:
                url, token_file = m.group(1), Path(m.group(3))
                assert int(m.group(2)) == port
            if "until Ctrl-C" in line:
                break
        assert url is not None and token_file is not None, "".join(lines)
        client = openai.OpenAI(base_url=url, api_key=token_file.read_text().strip(), max_retries=0)
        answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=4, temperature=0)
        assert answer.usage is not None and answer.usage.completion_tokens >= 1
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out.strip()  # the demo's own answer came first
        assert not token_file.exists()  # the pool's directory went with it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
