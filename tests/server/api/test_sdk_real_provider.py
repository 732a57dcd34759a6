"""The real OpenAI-compatible provider behind a real server, end to end.

A live Daphne (embedded worker) talks to a local scripted OpenAI-compatible server
(tests/openai_stub_server.py) through the `openai` package; the SDK talks to Daphne.
Only the model is fake.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sectr.client import Client
from tests.liveserver import LiveSectr
from tests.openai_stub_server import OpenAIStubServer, error_reply, text_stream

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stub() -> Iterator[OpenAIStubServer]:
    with OpenAIStubServer() as server:
        yield server


@pytest.fixture(scope="module")
def live(stub: OpenAIStubServer) -> Iterator[LiveSectr]:
    env = {
        "SECTR_PROVIDER": "openai",
        "OPENAI_BASE_URL": stub.base_url,
        "OPENAI_API_KEY": "sk-test",
        "SECTR_MODEL": "gpt-4o-mini",
    }
    with LiveSectr(embedded_worker=True, env=env) as server:
        server.create_user("carol")
        yield server


def test_a_retryable_failure_is_retried_by_the_server_and_then_by_the_user(
    stub: OpenAIStubServer, live: LiveSectr
) -> None:
    # Three 5xx answers exhaust one model step's attempts: the run fails retryably.
    stub.script([error_reply(503), error_reply(500), error_reply(502), text_stream("Hello ", "from the stub.")])
    with Client(live.base_url, token=live.token_for("carol")) as client:
        session = client.sessions.create()
        assert session.snapshot().resolved_model.model_id == "gpt-4o-mini"
        failed = session.run("hi there").result()
        assert failed.stop_reason == "error"
        assert session.snapshot().state == "failed"

        answered = session.retry().result()
        assert answered.stop_reason == "end_turn"
        assert answered.text == "Hello from the stub."
        assert answered.usage.get("input_tokens") == 10 and answered.usage.get("output_tokens") == 5
        assert session.snapshot().state == "completed"

    # What the model was sent: the folded transcript, with the user's message, streamed.
    last = stub.requests[-1]
    assert last["model"] == "gpt-4o-mini"
    assert last["stream"] is True
    assert last["messages"][-1] == {"role": "user", "content": "hi there"}
    assert len(stub.requests) == 4
