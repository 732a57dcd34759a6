"""Run a session with an approval through the SDK (sectr.client).

Start Sectr as the README says (``bash scripts/run.sh``, serving http://127.0.0.1:8000),
create a token, and run this script::

    export SECTR_TOKEN=$(.venv/bin/python manage.py sectr_token admin | tail -n 1)
    .venv/bin/python examples/approval_via_sdk.py            # approves on its own
    .venv/bin/python examples/approval_via_sdk.py --ask      # asks you at the prompt

The demo model calls the gated tool ``write_note``; the run stops on a permission ask;
the `on_permission_ask` responder answers it and the same Run follows the resumed run
to its end. Works the same with a real model that decides to write a note.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from sectr.client import Client, PermissionAsk, SectrError  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=os.environ.get("SECTR_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--token", default=os.environ.get("SECTR_TOKEN"), help="default: $SECTR_TOKEN")
    parser.add_argument("--ask", action="store_true", help="ask for the verdict at the prompt")
    parser.add_argument(
        "--prompt",
        default='!tool write_note {"title": "groceries", "body": "milk, eggs, coffee"}',
        help="what to send (the default makes the demo model call write_note)",
    )
    args = parser.parse_args()
    if not args.token:
        parser.error("pass --token or set SECTR_TOKEN (python manage.py sectr_token admin prints one)")

    def decide(ask: PermissionAsk) -> str:
        print(f"\n[permission] {ask.name}({ask.arguments})")
        if not args.ask:
            print("[permission] approving once")
            return "allow_once"
        answer = input("Approve? [o]nce / [a]lways / [d]eny: ").strip().lower()[:1]
        return {"o": "allow_once", "a": "allow_always"}.get(answer, "deny")

    try:
        with Client(args.url, token=args.token) as client:
            session = client.sessions.create(title="Approval via the SDK")
            print(f"session {session.id}")
            run = session.run(args.prompt, on_permission_ask=decide)
            for event in run:
                if event.kind in ("message.delta", "reasoning.delta"):
                    print(event.text, end="", flush=True)
                elif event.kind == "result":
                    print(f"\n[result] stop={event.payload['stop']} usage={event.payload['usage']}")
                else:
                    print(f"\n[{event.kind}] {event.payload}")
            snapshot = session.snapshot()
            print(f"state={snapshot.state} runs={run.run_ids} notes={snapshot['notes']}")
    except SectrError as exc:
        print(f"error: {exc.code} ({exc.status}): {exc.message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
