"""Approval rules: data that decides a gated tool call before a person is asked (docs/moderation.md).

A policy is an ordered list of rules. When a gated call is about to ask, the first rule
whose `tool` glob matches the tool's name and whose `arguments` globs all match the
call's arguments decides:

- ``allow``: the call runs at once; ``deny``: the model gets an error result at once.
  Both are journaled in the same invocation as an APPROVAL_REQUESTED that carries its
  `decision` (``approver: "rule:<id>"``), so the audit sees them and the run never pauses.
- ``ask``: a person decides, as without a rule, but the ask carries the rule's
  `approvals_required` (quorum) and `expires_after_s` (expiry).

No rule matches: the tool's own gate (an ask with the policy's default expiry, if any).

Globs are `fnmatch.fnmatchcase` patterns (``*``, ``?``, ``[abc]``; case-sensitive). An
argument glob matches the argument's string form: the string itself, or the compact JSON
text of any other value (``42``, ``true``, ``{"a":1}``). A call without the argument
does not match a rule that names it.

Rules are frozen values: the runtime gets them from whoever configured it (LocalRuntime's
`rules=`, or the Django worker reading the session's team's rules from the database) and
nothing a handler, a tool or the model writes reaches them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, Literal

from sectr.errors import ValidationFailed

Action = Literal["allow", "deny", "ask"]
ACTIONS: tuple[Action, ...] = ("allow", "deny", "ask")
RULE_KEYS = frozenset({"id", "tool", "arguments", "action", "approvals_required", "expires_after_s"})
MAX_APPROVALS = 20
MAX_EXPIRY_SECONDS = 365 * 24 * 3600
MAX_GLOB = 500
MAX_RULE_ARGUMENTS = 20
MAX_TOOL_GLOB = 100
#: What a tool glob may not consist of only (and is trimmed of): Python's whitespace and
#: U+FEFF, the union of str.isspace() and JSON Schema's (ECMA-262) \s, so the API's
#: schema (`[^\s\x1c-\x1f\x85\ufeff]`, "a character that is not blank") says the same.
BLANK = "".join(chr(code) for code in range(0x3001) if chr(code).isspace()) + "\ufeff"
#: `approver` of a decision made by a rule, and of the denial of an expired ask.
RULE_APPROVER_PREFIX = "rule:"
EXPIRED_APPROVER = "policy:expired"


def argument_text(value: Any) -> str:
    """The string form an argument glob matches: a string as is, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True, slots=True)
class Rule:
    id: str
    tool: str
    action: Action
    arguments: tuple[tuple[str, str], ...] = ()
    approvals_required: int = 1
    expires_after_s: int | None = None

    def matches(self, name: str, arguments: Mapping[str, Any]) -> bool:
        if not fnmatchcase(name, self.tool):
            return False
        for key, glob in self.arguments:
            if key not in arguments or not fnmatchcase(argument_text(arguments[key]), glob):
                return False
        return True

    @property
    def approver(self) -> str:
        return f"{RULE_APPROVER_PREFIX}{self.id}"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"id": self.id, "tool": self.tool, "action": self.action}
        if self.arguments:
            data["arguments"] = dict(self.arguments)
        data["approvals_required"] = self.approvals_required
        data["expires_after_s"] = self.expires_after_s
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rule:
        checked = check_rule(data)
        return cls(
            id=str(data.get("id") or ""),
            tool=checked["tool"],
            action=checked["action"],
            arguments=tuple(sorted(checked["arguments"].items())),
            approvals_required=checked["approvals_required"],
            expires_after_s=checked["expires_after_s"],
        )


def _whole(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 5.0 is the whole number 5 in JSON (and in JSON Schema)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValidationFailed(f"{name} must be a whole number from {low} to {high}", code="invalid_rule")
    return value


def check_rule(data: Any) -> dict[str, Any]:
    """Validate a rule's fields (not its id); returns them normalised. ValidationFailed (400)."""
    if not isinstance(data, Mapping):
        raise ValidationFailed("a rule must be an object", code="invalid_rule")
    unknown = set(data) - RULE_KEYS - {"position"}
    if unknown:
        raise ValidationFailed(f"unknown rule fields: {', '.join(sorted(map(str, unknown)))}", code="invalid_rule")
    tool = data.get("tool")
    if not isinstance(tool, str) or not tool.strip(BLANK) or len(tool) > MAX_TOOL_GLOB:
        raise ValidationFailed(f"tool must be a tool name or glob of 1-{MAX_TOOL_GLOB} characters", code="invalid_rule")
    action = data.get("action")
    if action not in ACTIONS:
        raise ValidationFailed(f"action must be one of {', '.join(ACTIONS)}", code="invalid_rule")
    # Only a missing or null `arguments` means "no argument condition": [] or "" is a
    # mistake, and reading it as {} would store a rule that matches more than was meant.
    arguments = data.get("arguments")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping) or len(arguments) > MAX_RULE_ARGUMENTS:
        raise ValidationFailed(
            f"arguments must be an object of at most {MAX_RULE_ARGUMENTS} {{name: glob}}", code="invalid_rule"
        )
    for key, glob in arguments.items():
        if not isinstance(key, str) or not key or len(key) > 100:
            raise ValidationFailed("each argument name must be a string of 1-100 characters", code="invalid_rule")
        if not isinstance(glob, str) or len(glob) > MAX_GLOB:
            raise ValidationFailed(
                f"the glob of argument {key} must be a string of at most {MAX_GLOB} characters", code="invalid_rule"
            )
    required = data.get("approvals_required", 1)
    required = 1 if required is None else _whole(required, "approvals_required", 1, MAX_APPROVALS)
    expires = data.get("expires_after_s")
    if expires is not None:
        expires = _whole(expires, "expires_after_s", 1, MAX_EXPIRY_SECONDS)
    if action != "ask" and (required != 1 or expires is not None):
        raise ValidationFailed("approvals_required and expires_after_s apply to action ask only", code="invalid_rule")
    return {
        "tool": tool.strip(BLANK),
        "action": action,
        "arguments": {str(k): str(v) for k, v in arguments.items()},
        "approvals_required": required,
        "expires_after_s": expires,
    }


@dataclass(frozen=True, slots=True)
class Policy:
    """An ordered tuple of rules and the default expiry of asks no rule sets one for."""

    rules: tuple[Rule, ...] = ()
    default_expires_after_s: int | None = None

    def first_match(self, name: str, arguments: Mapping[str, Any]) -> Rule | None:
        return next((rule for rule in self.rules if rule.matches(name, arguments)), None)

    def ask_terms(self, rule: Rule | None) -> dict[str, Any]:
        """The APPROVAL_REQUESTED fields an ask gets from its matching rule (or the default)."""
        terms: dict[str, Any] = {}
        if rule is not None:
            terms["rule_id"] = rule.id
            if rule.approvals_required > 1:
                terms["approvals_required"] = rule.approvals_required
        expires = rule.expires_after_s if rule is not None and rule.expires_after_s else self.default_expires_after_s
        if expires:
            terms["expires_after_s"] = expires
        return terms


def as_policy(rules: Policy | Iterable[Rule | Mapping[str, Any]] | None) -> Policy:
    """A Policy from a Policy, or from rules (Rule objects or dicts; dicts get ids r1, r2 ...)."""
    if rules is None:
        return Policy()
    if isinstance(rules, Policy):
        return rules
    built: list[Rule] = []
    for index, rule in enumerate(rules, start=1):
        if isinstance(rule, Rule):
            built.append(rule)
        else:
            built.append(Rule.from_dict({"id": f"r{index}", **dict(rule)}))
    ids = [rule.id for rule in built]
    if len(set(ids)) != len(ids) or not all(ids):
        raise ValidationFailed("every rule needs its own non-empty id", code="invalid_rule")
    return Policy(tuple(built))


@dataclass(frozen=True, slots=True)
class RuleDecision:
    """What a rule decided for one call (journaled in APPROVAL_REQUESTED.decision)."""

    rule: Rule
    approved: bool
    decision: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, rule: Rule) -> RuleDecision:
        approved = rule.action == "allow"
        decision = {"approved": approved, "approver": rule.approver, "verdict": "allow_once" if approved else "deny"}
        return cls(rule, approved, decision)


def rules_from_dicts(rows: Sequence[Mapping[str, Any]]) -> tuple[Rule, ...]:
    """Rules from stored rows (already validated when they were saved), in the given order."""
    return tuple(
        Rule(
            id=str(row["id"]),
            tool=str(row["tool"]),
            action=row["action"],
            arguments=tuple(sorted((str(k), str(v)) for k, v in (row.get("arguments") or {}).items())),
            approvals_required=int(row.get("approvals_required") or 1),
            expires_after_s=row.get("expires_after_s") or None,
        )
        for row in rows
    )
