"""Create the first admin if there is none, and print where to log in."""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Creates the first admin account (once) and prints where to log in."

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        host, port = settings.SECTR_SERVE_HOST, settings.SECTR_SERVE_PORT
        if not User.objects.filter(is_superuser=True).exists():
            username = settings.SECTR_ADMIN_USERNAME
            password = settings.SECTR_ADMIN_PASSWORD or secrets.token_urlsafe(12)
            User.objects.create_superuser(username=username, email="", password=password)
            settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
            secret_file = settings.VAR_DIR / "admin-password.txt"
            secret_file.write_text(f"{username}\n{password}\n")
            secret_file.chmod(0o600)
            self.stdout.write(f"Created the first admin: username {username!r}, password {password!r}")
            self.stdout.write(f"(also saved in {secret_file})")
        self.stdout.write(f"Sectr is starting: log in at http://{host}:{port}/accounts/login/")
