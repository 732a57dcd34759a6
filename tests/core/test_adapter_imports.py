"""The framework adapters are optional: `import sectr` and `import sectr.adapters` load
no framework, and Sectr runs with the frameworks' packages missing altogether."""

from __future__ import annotations

from .test_light_sdk import BLOCKER, run_python

FRAMEWORKS = ("pydantic_ai", "agents", "pydantic_graph")


def test_importing_sectr_and_its_adapters_package_loads_no_framework() -> None:
    result = run_python(
        "import sys, sectr, sectr.adapters, sectr.runtime, sectr.local\n"
        "sectr.SessionContext, sectr.LocalRuntime, sectr.tool\n"
        f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r})\n"
        "print(loaded)"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_sectr_runs_a_session_with_every_framework_blocked() -> None:
    code = BLOCKER.format(blocked=FRAMEWORKS) + (
        "import asyncio, sectr\n"
        "from sectr.providers.demo import DemoProvider\n"
        "async def main():\n"
        "    rt = sectr.LocalRuntime(provider=DemoProvider(delay=0))\n"
        "    sid = await rt.create_session()\n"
        "    print((await rt.send(sid, 'hi')).type.value)\n"
        "asyncio.run(main())\n"
        "try:\n"
        "    import sectr.adapters.pydantic_ai\n"
        "except ImportError as exc:\n"
        "    print('adapter:', exc)\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "INVOCATION_COMPLETED"
    assert lines[1].startswith("adapter: blocked: pydantic_ai")
