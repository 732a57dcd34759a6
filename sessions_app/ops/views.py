"""Operations endpoints: liveness (more of SPEC section 13 lives here as it is built)."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

import sectr


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True, "version": sectr.__version__})
