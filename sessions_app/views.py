"""Thin views: they read, call actions, and render partials."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

import sectr


@login_required
def home(request: HttpRequest) -> HttpResponse:
    return render(request, "sessions_app/home.html", {"version": sectr.__version__})


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True, "version": sectr.__version__})
