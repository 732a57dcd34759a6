"""Settings of a live test server whose workers also load tests/server/crash_tools.py."""

from sectr_web.settings import *  # noqa: F403

SECTR_TOOLS = ["tests.server.crash_tools.append_line"]
