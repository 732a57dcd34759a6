"""The team pages' forms: Django forms that turn posted fields into the plain dicts the
actions take (the actions validate again, with the API's words)."""

from __future__ import annotations

import re
from typing import Any

from django import forms

from sectr.events import MODES
from sectr.operations import REASONING_EFFORTS
from sectr.state import LIMIT_KEYS
from sectr.tools import Tool
from sessions_app.models import Membership

ROLE_CHOICES = [(role, role) for role in Membership.ROLES]
LIMIT_LABELS = {
    "max_turns": "Max turns",
    "max_tool_calls": "Max tool calls",
    "max_consecutive_failures": "Max consecutive failures",
    "max_run_tokens": "Max run tokens (0: no limit)",
}


def tool_gate(tool: Tool) -> str:
    """How a tool is gated, in words: what the tool picker and the Tools list show."""
    flags = [flag for flag in ("gated", "mutating", "edit") if getattr(tool, flag, False)]
    return ", ".join(flags) if flags else "runs freely"


class AddMemberForm(forms.Form):
    user = forms.CharField(label="Username or email", max_length=254)
    role = forms.ChoiceField(choices=ROLE_CHOICES, initial=Membership.MEMBER)


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=ROLE_CHOICES)


class NewTeamForm(forms.Form):
    name = forms.SlugField(label="Name", max_length=64, help_text="lower-case letters, digits, hyphens")
    moderator = forms.CharField(
        label="First moderator", max_length=254, required=False, help_text="username or email (optional)"
    )


class RetentionForm(forms.Form):
    retention_days = forms.IntegerField(
        label="Keep idle sessions for (days)",
        required=False,
        min_value=0,
        help_text="0 keeps them for ever; empty uses the installation's default",
    )


class BudgetForm(forms.Form):
    monthly_tokens = forms.IntegerField(label="Monthly tokens", required=False, min_value=0)
    monthly_cost = forms.DecimalField(label="Monthly cost", required=False, min_value=0, decimal_places=4)
    alert_thresholds = forms.CharField(
        label="Alert at (%)", required=False, max_length=100, help_text="comma-separated, e.g. 80, 100"
    )

    def clean_alert_thresholds(self) -> list[float]:
        raw = self.cleaned_data.get("alert_thresholds") or ""
        shares = []
        for part in re.split(r"[,\s]+", raw.strip()):
            if not part:
                continue
            try:
                shares.append(float(part.rstrip("%")) / 100)
            except ValueError:
                raise forms.ValidationError(f"{part!r} is not a percentage") from None
        return shares

    def budget_data(self) -> dict[str, Any]:
        data = self.cleaned_data
        cost = data.get("monthly_cost")
        return {
            "monthly_tokens": data.get("monthly_tokens"),
            "monthly_cost": str(cost) if cost is not None else None,
            "alert_thresholds": data.get("alert_thresholds") or [],
        }


class AgentForm(forms.Form):
    """An agent's definition: the fields of a version, and the note of this save."""

    slug = forms.SlugField(label="Slug", max_length=63, help_text="its name in the API: lower-case, digits, dashes")
    name = forms.CharField(label="Name", max_length=120)
    description = forms.CharField(label="Description", required=False, max_length=2000)
    instructions = forms.CharField(
        label="Instructions",
        required=False,
        max_length=100_000,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 8}),
        help_text="the system message of every model call",
    )
    model = forms.CharField(label="Model", required=False, max_length=200, help_text="empty: the session's model")
    temperature = forms.FloatField(label="Temperature", required=False, min_value=0, max_value=2)
    reasoning_effort = forms.ChoiceField(
        label="Reasoning effort",
        required=False,
        choices=[("", "(model default)")] + [(e, e) for e in REASONING_EFFORTS],
    )
    max_output_tokens = forms.IntegerField(label="Max output tokens", required=False, min_value=1, max_value=10**7)
    all_tools = forms.BooleanField(label="Every tool the installation has (also ones added later)", required=False)
    tools = forms.MultipleChoiceField(label="Tools", required=False, widget=forms.CheckboxSelectMultiple)
    globs = forms.CharField(
        label="More tools by name or glob",
        required=False,
        max_length=4000,
        help_text="space- or comma-separated, e.g. git__* deploy_?",
    )
    mode = forms.ChoiceField(
        label="Mode of new sessions", required=False, choices=[("", "(default)")] + [(m, m) for m in MODES]
    )
    handler = forms.CharField(label="Handler", required=False, max_length=200, initial="default")
    note = forms.CharField(label="Change note", required=False, max_length=500)

    def __init__(self, *args: Any, tools: list[Tool], creating: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.known_tools = tools
        tools_field = self.fields["tools"]
        assert isinstance(tools_field, forms.MultipleChoiceField)
        tools_field.choices = [(tool.name, f"{tool.name} ({tool_gate(tool)})") for tool in tools]
        for key in LIMIT_KEYS:
            self.fields[f"limit_{key}"] = forms.IntegerField(
                label=LIMIT_LABELS.get(key, key), required=False, min_value=0, max_value=10**9
            )
        if not creating:
            del self.fields["slug"]

    def setting_fields(self) -> list[forms.BoundField]:
        return [
            self[key] for key in ("model", "temperature", "reasoning_effort", "max_output_tokens", "mode", "handler")
        ]

    def limit_fields(self) -> list[forms.BoundField]:
        return [self[f"limit_{key}"] for key in LIMIT_KEYS]

    @classmethod
    def initial_from(cls, fields: dict[str, Any], tool_names: set[str]) -> dict[str, Any]:
        """The form's initial values from a version's fields (AgentSpec.to_dict)."""
        params = fields.get("params") or {}
        patterns = fields.get("tools")
        initial: dict[str, Any] = {
            "name": fields.get("name", ""),
            "description": fields.get("description", ""),
            "instructions": fields.get("instructions", ""),
            "model": fields.get("model") or "",
            "temperature": params.get("temperature"),
            "reasoning_effort": params.get("reasoning_effort") or "",
            "max_output_tokens": params.get("max_output_tokens"),
            "all_tools": patterns is None,
            "tools": [p for p in patterns or () if p in tool_names],
            "globs": " ".join(p for p in patterns or () if p not in tool_names),
            "mode": fields.get("mode") or "",
            "handler": fields.get("handler") or "default",
        }
        for key, value in (fields.get("limits") or {}).items():
            initial[f"limit_{key}"] = value
        return initial

    def definition(self) -> dict[str, Any]:
        """The definition the agent actions take."""
        data = self.cleaned_data
        params = {
            key: data[key]
            for key in ("temperature", "reasoning_effort", "max_output_tokens")
            if data.get(key) not in (None, "")
        }
        if data.get("all_tools"):
            tools: list[str] | None = None
        else:
            tools = list(data.get("tools") or []) + [g for g in re.split(r"[,\s]+", data.get("globs") or "") if g]
        limits = {key: data[f"limit_{key}"] for key in LIMIT_KEYS if data.get(f"limit_{key}") is not None}
        return {
            "name": data["name"],
            "description": data.get("description") or "",
            "instructions": data.get("instructions") or "",
            "model": data.get("model") or None,
            "params": params,
            "tools": tools,
            "mode": data.get("mode") or None,
            "limits": limits or None,
            "handler": data.get("handler") or "default",
        }


def _lines_to_headers(raw: str) -> dict[str, str]:
    headers = {}
    for line in raw.splitlines():
        if not line.strip():
            continue
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            # Never echo the line: it may hold a secret.
            raise forms.ValidationError("write one header a line, as Name: value")
        headers[name.strip()] = value.strip()
    return headers


class McpServerForm(forms.Form):
    """A team's Streamable HTTP MCP server. Headers are write-only: the field starts empty
    (the page says which are set); left empty on an edit, the stored ones are kept."""

    name = forms.SlugField(label="Name", max_length=32, help_text="the prefix of its tools: name__tool")
    url = forms.URLField(label="URL", max_length=2000, assume_scheme="https", help_text="its Streamable HTTP endpoint")
    headers = forms.CharField(
        label="Headers",
        required=False,
        max_length=20 * 8192,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 2, "autocomplete": "off", "spellcheck": "false"}),
        help_text="secrets, one a line: Authorization: Bearer ...; never shown again",
    )
    clear_headers = forms.BooleanField(label="Remove the stored headers", required=False)
    timeout_s = forms.FloatField(label="Timeout (s)", min_value=1, max_value=600, initial=60)
    tools = forms.CharField(
        label="Tools to offer",
        required=False,
        max_length=4000,
        help_text="globs of the server's tool names, space-separated; empty: all",
    )
    enabled = forms.BooleanField(label="Enabled", required=False, initial=True)

    def __init__(self, *args: Any, editing: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if editing:
            del self.fields["name"]
        else:
            del self.fields["clear_headers"]

    def clean_headers(self) -> dict[str, str]:
        return _lines_to_headers(self.cleaned_data.get("headers") or "")

    def server_data(self) -> dict[str, Any]:
        """What the MCP server actions take (headers only when given or cleared)."""
        data = self.cleaned_data
        globs = [g for g in re.split(r"[,\s]+", data.get("tools") or "") if g]
        body: dict[str, Any] = {
            "url": data["url"],
            "timeout_s": data["timeout_s"],
            "tools": globs or None,
            "enabled": bool(data.get("enabled")),
        }
        if "name" in data:
            body["name"] = data["name"]
        if data.get("headers") or data.get("clear_headers"):
            body["headers"] = data.get("headers") or {}
        return body

    @staticmethod
    def initial_from(server: Any) -> dict[str, Any]:
        return {
            "url": server.url,
            "timeout_s": server.timeout_s,
            "tools": " ".join(server.tools or ()),
            "enabled": server.enabled,
        }
