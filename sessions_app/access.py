"""Who may do what with a session.

- The owner may do everything with their session.
- A superuser may do everything with every session.
- A moderator (permission ``sessions_app.moderate_session``) may read every session and
  decide its approval asks.
- A reviewer (permission ``sessions_app.review_session``) may read every session: its
  transcript, snapshots and token usage (team review).

Everybody else does not learn that the session exists: NotFound (404), not Forbidden.
A reader who may not act gets Forbidden (403).
"""

from __future__ import annotations

from typing import Any, Literal

from sectr.errors import Forbidden, NotFound
from sessions_app.models import Session

Need = Literal["read", "write", "approve"]


def can_read(user: Any, session: Session) -> bool:
    return bool(
        user.is_authenticated
        and (
            session.owner_id == user.pk
            or user.is_superuser
            or user.has_perm("sessions_app.review_session")
            or user.has_perm("sessions_app.moderate_session")
        )
    )


def can_write(user: Any, session: Session) -> bool:
    return bool(user.is_authenticated and (session.owner_id == user.pk or user.is_superuser))


def can_approve(user: Any, session: Session) -> bool:
    return can_write(user, session) or bool(user.is_authenticated and user.has_perm("sessions_app.moderate_session"))


def is_moderator(user: Any) -> bool:
    return bool(user.is_authenticated and (user.is_superuser or user.has_perm("sessions_app.moderate_session")))


def is_reviewer(user: Any) -> bool:
    return bool(
        user.is_authenticated
        and (
            user.is_superuser
            or user.has_perm("sessions_app.review_session")
            or user.has_perm("sessions_app.moderate_session")
        )
    )


def check_access(user: Any, session: Session, need: Need) -> Session:
    if not can_read(user, session):
        raise NotFound("no such session")
    if need == "write" and not can_write(user, session):
        raise Forbidden("only the session's owner can do this")
    if need == "approve" and not can_approve(user, session):
        raise Forbidden("only the session's owner or a moderator can decide its asks")
    return session


def get_session_for_user(user: Any, session_id: str, need: Need = "read") -> Session:
    """The session if `user` may `need` it; NotFound / Forbidden otherwise."""
    if not isinstance(session_id, str) or len(session_id) > 40:
        raise NotFound("no such session")
    try:
        session = Session.objects.get(pk=session_id)
    except Session.DoesNotExist:
        raise NotFound("no such session") from None
    return check_access(user, session, need)


def visible_sessions(user: Any) -> Any:
    """The sessions `user` sees in lists: their own (team review lists all in /review/)."""
    return Session.objects.filter(owner=user)


# ---- team review (issue 10) ----
# The review pages ask these, so that teams and roles (issue 9) change them in one place.


def reviewable_sessions(user: Any) -> Any:
    """The sessions `user` may find in /review/ (search, usage, bulk export)."""
    if not user.is_authenticated:
        return Session.objects.none()
    if is_reviewer(user):
        return Session.objects.all()
    return Session.objects.filter(owner=user)


def can_review(user: Any, session: Session) -> bool:
    """May rate, annotate, queue, export and share `session` (the reviewer role)."""
    return can_read(user, session) and (is_reviewer(user) or session.owner_id == user.pk)


def check_review(user: Any, session: Session) -> Session:
    if not can_read(user, session):
        raise NotFound("no such session")
    if not can_review(user, session):
        raise Forbidden("only a reviewer of this session's team can do this")
    return session


def usage_user_ids(user: Any) -> Any:
    """Whose token usage `user` may see on /review/usage/ (None: everyone's)."""
    if is_reviewer(user):
        return None
    return [user.pk]
