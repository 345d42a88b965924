from __future__ import annotations

import json
import subprocess
import sys


def test_import_time_logger_follows_later_configuration() -> None:
    code = (
        "from swactor.common.events import get_logger, configure_logging\n"
        "log = get_logger(component='early')\n"
        "configure_logging('svc', node_id=7)\n"
        "log.info('ring_leased', ring_id=3)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    event = json.loads(out.stderr.strip().splitlines()[-1])
    assert event["event"] == "ring_leased"
    assert (event["service"], event["node_id"], event["component"], event["ring_id"]) == ("svc", 7, "early", 3)
