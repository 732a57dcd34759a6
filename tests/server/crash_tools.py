"""Tools for the crash tests of real worker processes (loaded by crash_settings.py).

`append_line` is a slow side effect that is not idempotent: it appends a line to the
file named by SECTR_TEST_SIDE_EFFECT_FILE, then sleeps long enough for a test to
`kill -9` the worker running it. Running it twice would leave two lines.
"""

from __future__ import annotations

import os
import time

import sectr

#: Seconds the tool sleeps after its side effect (the test kills the worker meanwhile).
SLEEP_SECONDS = float(os.environ.get("SECTR_TEST_SIDE_EFFECT_SLEEP", "30"))


@sectr.tool(mutating=True)
def append_line(text: str, context: sectr.ToolContext) -> str:
    """Append a line to the side-effect file, then take a while.

    Args:
        text: the line to append.
    """
    with open(os.environ["SECTR_TEST_SIDE_EFFECT_FILE"], "a", encoding="utf-8") as file:
        file.write(f"{context.idempotency_key} {text}\n")
        file.flush()
        os.fsync(file.fileno())
    time.sleep(SLEEP_SECONDS)
    return f"appended {text}"
