"""The migration history stays one line: one leaf, every migration with at most one parent
in sessions_app and numbered one past it, no merge migrations, no branch tags in names,
and no model change without its migration. CONTRIBUTING.md says how parallel work keeps
it so (rebase, renumber, never merge).

Also: the migrated database has the full-text setup the search relies on, and the admin
names its models in proper English plurals.
"""

from __future__ import annotations

import re
from io import StringIO
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.test import Client

APP = "sessions_app"
# A number, then lowercase words of letters only: "0012_run_deadline". Digits after the
# number are how branch tags ("mod9", "review10b") and merge timestamps read.
MIGRATION_NAME = re.compile(r"^(\d{4})_[a-z]+(?:_[a-z]+)*$")


def history_problems(loader: MigrationLoader, app: str) -> list[str]:
    """What keeps `app`'s migration graph from being one numbered line (empty: nothing)."""
    problems: list[str] = []
    leaves = loader.graph.leaf_nodes(app)
    if len(leaves) != 1:
        problems.append(f"{len(leaves)} leaves: {sorted(name for _, name in leaves)}")
    names = sorted(name for app_label, name in loader.disk_migrations if app_label == app)
    numbers = [name[:4] for name in names]
    problems += [
        f"{number}: used {numbers.count(number)} times" for number in sorted(set(numbers)) if numbers.count(number) > 1
    ]
    for name in names:
        migration = loader.disk_migrations[app, name]
        parents = sorted(dep_name for dep_app, dep_name in migration.dependencies if dep_app == app)
        match = MIGRATION_NAME.match(name)
        if match is None or "merge" in name.split("_"):
            problems.append(f"{name}: not NNNN_words (a branch tag, a merge or a timestamp)")
        if len(parents) > 1:
            problems.append(f"{name}: {len(parents)} parents {parents} (a merge migration)")
        if match is not None:
            number = int(match.group(1))
            parent_number = int(parents[0][:4]) if len(parents) == 1 and parents[0][:4].isdigit() else 0
            if number != parent_number + 1:
                problems.append(f"{name}: numbered {number} after {parents or 'nothing'}")
        if migration.replaces:
            problems.append(f"{name}: replaces {migration.replaces} (squash the files away instead)")
    return problems


def test_the_migration_history_is_one_numbered_line() -> None:
    loader = MigrationLoader(None, ignore_no_migrations=True)
    assert history_problems(loader, APP) == []
    assert ("sessions_app", "0001_initial") in loader.disk_migrations


@pytest.mark.django_db  # makemigrations checks the applied history against the files
def test_models_and_migrations_agree() -> None:
    out = StringIO()
    # --check exits non-zero (SystemExit) when a model change has no migration.
    call_command("makemigrations", APP, "--check", "--dry-run", stdout=out, stderr=out)
    assert "No changes detected" in out.getvalue()


@pytest.mark.django_db
def test_the_migrated_database_has_the_full_text_setup() -> None:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT indexdef FROM pg_indexes WHERE tablename = 'sessions_app_searchentry' "
                "AND indexname = 'searchentry_text_gin'"
            )
            rows = cursor.fetchall()
            assert len(rows) == 1 and "USING gin (to_tsvector('english'::regconfig, text))" in rows[0][0]
        else:
            cursor.execute(
                "SELECT type, name FROM sqlite_master WHERE name LIKE 'sessions_app_searchentry_fts%' "
                "AND type = 'table' OR name LIKE 'searchentry_fts_%' ORDER BY type, name"
            )
            assert cursor.fetchall() == [
                ("table", "sessions_app_searchentry_fts"),
                ("table", "sessions_app_searchentry_fts_config"),
                ("table", "sessions_app_searchentry_fts_data"),
                ("table", "sessions_app_searchentry_fts_docsize"),
                ("table", "sessions_app_searchentry_fts_idx"),
                ("trigger", "searchentry_fts_ad"),
                ("trigger", "searchentry_fts_ai"),
                ("trigger", "searchentry_fts_au"),
            ]


def naive_plural_is_wrong(singular: str) -> bool:
    """Whether Django's default plural (the verbose name plus "s") misspells this one."""
    last = singular.split()[-1]
    return (
        bool(re.search(r"[^aeiou]y$", last))  # entry -> entries
        or last.endswith(("s", "x", "z", "ch", "sh"))  # index -> indexes
        or last in {"media", "data", "usage"}  # uncountable
    )


def test_every_model_has_a_proper_plural() -> None:
    wrong = {
        model.__name__: str(model._meta.verbose_name_plural)
        for model in apps.get_app_config(APP).get_models()
        if naive_plural_is_wrong(str(model._meta.verbose_name))
        and model._meta.verbose_name_plural == f"{model._meta.verbose_name}s"
    }
    assert wrong == {}


@pytest.mark.django_db
def test_the_admin_index_names_models_in_plain_english() -> None:
    user: Any = get_user_model().objects.create_superuser("root", "root@example.org", "x")
    client = Client()
    client.force_login(user)
    page = client.get("/admin/").content.decode()
    for name in ("Ask indexes", "Audit entries", "Daily usage", "Notification deliveries", "API tokens"):
        assert f">{name}</a>" in page
    for naive in ("Ask indexs", "Audit entrys", "Usage dailys", "Notification deliverys", "Api tokens"):
        assert naive not in page
