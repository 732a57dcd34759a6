"""`sectr.client`: the Python SDK for a running Sectr server (docs/sdk.md).

    from sectr.client import Client, SessionMode, text_part, image_part_from_path

    client = Client("http://127.0.0.1:8000", token="sectr_...")
    session = client.sessions.create(title="Demo")
    run = session.run("hello", on_permission_ask=lambda ask: "allow_once")
    for event in run:                      # or: result = run.result() (not both)
        if event.kind == "message.delta":
            print(event.text, end="")

`AsyncClient` is the asyncio twin. Built on httpx and nothing else: it imports
neither Django nor the runtime's model providers.

Every call takes request controls besides its own options, as keywords (``timeout=``,
``deadline=``, ``headers=``, ``cancel=``) or as one ``controls=RequestControls(...)``;
any other keyword is a TypeError naming the method.
"""

from sectr.client.aio import AsyncClient, AsyncRun, AsyncSession
from sectr.client.errors import (
    AskAlreadyResolvedError,
    AuthenticationError,
    DeadlineExceededError,
    InvalidRequestError,
    InvalidStateError,
    NotFoundError,
    PermissionDeniedError,
    PromptValidationError,
    ProtocolError,
    RateLimitError,
    RedirectError,
    RequestCancelled,
    SectrError,
    SessionBusyError,
    TransportError,
)
from sectr.client.models import (
    Edit,
    PermissionAsk,
    ResolvedModel,
    Respond,
    RunEvent,
    RunResult,
    SessionMode,
    Snapshot,
    Title,
    Transcript,
    TranscriptMessage,
    Verdict,
)
from sectr.client.parts import (
    audio_part_from_bytes,
    audio_part_from_path,
    check_parts,
    image_part_from_bytes,
    image_part_from_path,
    image_part_from_url,
    text_part,
)
from sectr.client.protocol import AFFINITY_HEADER, Cancellation, RequestControls
from sectr.client.records import (
    ApprovalRule,
    AskInfo,
    AskPage,
    Experiment,
    PairVerdict,
    QueuedPairs,
    Rating,
    Ratings,
    RunInfo,
    ScoreDefinition,
    SessionPage,
    Webhook,
)
from sectr.client.sync import Client, Decision, Run, Session

__all__ = [
    "Edit",
    "Respond",
    "AFFINITY_HEADER",
    "DeadlineExceededError",
    "RequestControls",
    "Title",
    "check_parts",
    "ApprovalRule",
    "Webhook",
    "Rating",
    "Ratings",
    "ScoreDefinition",
    "Experiment",
    "PairVerdict",
    "QueuedPairs",
    "AskAlreadyResolvedError",
    "AskInfo",
    "AskPage",
    "AsyncClient",
    "AsyncRun",
    "AsyncSession",
    "AuthenticationError",
    "Cancellation",
    "Client",
    "Decision",
    "InvalidRequestError",
    "InvalidStateError",
    "NotFoundError",
    "PermissionAsk",
    "PermissionDeniedError",
    "PromptValidationError",
    "ProtocolError",
    "RateLimitError",
    "RedirectError",
    "RequestCancelled",
    "ResolvedModel",
    "Run",
    "RunEvent",
    "RunInfo",
    "RunResult",
    "SectrError",
    "Session",
    "SessionBusyError",
    "SessionMode",
    "SessionPage",
    "Snapshot",
    "Transcript",
    "TranscriptMessage",
    "TransportError",
    "Verdict",
    "audio_part_from_bytes",
    "audio_part_from_path",
    "image_part_from_bytes",
    "image_part_from_path",
    "image_part_from_url",
    "text_part",
]
