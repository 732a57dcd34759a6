"""Tools: schema generation, argument validation, running, the registry and the built-ins."""

# The postponed annotations are on purpose: tools must resolve string hints, as they would
# in any module that uses this import.
from __future__ import annotations

import asyncio
import enum
import json
import re
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

import pytest

from sectr.builtin_tools import BUILTIN_TOOLS, calculator, delete_note, get_time, write_note
from sectr.events import Envelope, EventType
from sectr.state import project
from sectr.tools import SchemaTool, Tool, ToolArgumentError, ToolContext, ToolRegistry, format_result, tool


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


def _params(t: Tool) -> dict[str, Any]:
    return t.schema["function"]["parameters"]


# --- schemas -------------------------------------------------------------------------------


def test_schema_of_a_google_style_function_is_exact() -> None:
    @tool
    def search(
        query: str, limit: int = 10, ratio: float = 0.5, exact: bool = False, tags: list[str] | None = None
    ) -> None:
        """Search the knowledge base.

        Longer explanation that is not part of the description.

        Args:
            query: what to look for.
            limit: how many hits
                to return at most.
            ratio (float): a weight.

        Returns:
            The hits.
        """

    assert search.schema == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the knowledge base.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "what to look for."},
                    "limit": {"type": "integer", "description": "how many hits to return at most.", "default": 10},
                    "ratio": {"type": "number", "description": "a weight.", "default": 0.5},
                    "exact": {"type": "boolean", "default": False},
                    "tags": {"type": "array", "items": {"type": "string"}, "default": None},
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    }


def test_schema_of_literal_enum_and_rest_docstring_is_exact() -> None:
    @tool(gated=True)
    def paint(color: Color, level: Level, finish: Literal["matte", "gloss"] = "matte", note: str | None = None) -> str:
        """Paint the wall
        in one colour.

        :param color: the colour.
        :param Level level: how much paint,
            from low to high.
        :returns: a receipt.
        """
        return ""

    assert paint.schema == {
        "type": "function",
        "function": {
            "name": "paint",
            "description": "Paint the wall in one colour.",
            "parameters": {
                "type": "object",
                "properties": {
                    "color": {"type": "string", "enum": ["red", "green"], "description": "the colour."},
                    "level": {"type": "integer", "enum": [1, 2], "description": "how much paint, from low to high."},
                    "finish": {"type": "string", "enum": ["matte", "gloss"], "default": "matte"},
                    "note": {"type": "string", "default": None},
                },
                "required": ["color", "level"],
                "additionalProperties": False,
            },
        },
    }


def test_optional_without_default_is_still_required() -> None:
    @tool
    def f(a: str | None, b: int | None = None) -> None:
        pass

    assert _params(f)["required"] == ["a"]
    assert _params(f)["properties"]["a"] == {"type": "string"}


def test_container_and_union_types() -> None:
    @tool
    def f(  # type: ignore[no-untyped-def]  # "bare" is unannotated on purpose
        counts: dict[str, int],
        anything: dict,
        pairs: list[list[float]],
        ids: tuple[int, ...],
        plain: list,
        either: int | str,
        loose: Any,
        bare,  # an unannotated parameter accepts anything
    ) -> None:
        pass

    props = _params(f)["properties"]
    assert props["counts"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert props["anything"] == {"type": "object"}
    assert props["pairs"] == {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}
    assert props["ids"] == {"type": "array", "items": {"type": "integer"}}
    assert props["plain"] == {"type": "array"}
    assert props["either"] == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert props["loose"] == {}
    assert props["bare"] == {}


def test_annotated_description_wins_over_docstring() -> None:
    @tool
    def f(city: Annotated[str, "a city name"]) -> None:
        """Weather.

        Args:
            city: ignored.
        """

    assert _params(f)["properties"]["city"] == {"type": "string", "description": "a city name"}


def test_description_name_overrides_and_missing_docstring() -> None:
    @tool(name="lookup-v2", description="Look it up.")
    def lookup(key: str) -> str:
        """Docstring text."""
        return key

    @tool
    def undocumented(x: int) -> int:
        return x

    assert lookup.name == "lookup-v2"
    assert lookup.schema["function"]["name"] == "lookup-v2"
    assert lookup.description == "Look it up."
    assert undocumented.description == ""
    assert undocumented.schema["function"]["description"] == ""


def test_docstring_starting_with_args_section_has_empty_description() -> None:
    @tool
    def f(x: int) -> None:
        """Args:
        x: the x.
        """

    assert f.description == ""


def test_tool_context_parameter_is_hidden_from_schema() -> None:
    @tool
    def needs(title: str, ctx: ToolContext) -> str:
        return title

    @tool
    def maybe(title: str, context: ToolContext | None = None) -> str:
        return title

    for t in (needs, maybe):
        assert list(_params(t)["properties"]) == ["title"]
        assert _params(t)["required"] == ["title"]
        assert t.wants_context
    with pytest.raises(ToolArgumentError, match="unknown argument 'ctx'"):
        needs.validate({"title": "x", "ctx": {}})


@pytest.mark.parametrize(
    "annotation_source",
    ["set[int]", "complex", "bytes", "tuple[int, str]", "type[int]"],
)
def test_unsupported_annotations_fail_at_decoration(annotation_source: str) -> None:
    namespace: dict[str, Any] = {}
    exec(f"def f(x: {annotation_source}) -> None: pass", namespace)  # noqa: S102 - building test signatures
    with pytest.raises(TypeError, match="parameter 'x'"):
        tool(namespace["f"])


def test_star_args_and_positional_only_are_refused() -> None:
    def star(*args: int) -> None:
        pass

    def kw(**kwargs: int) -> None:
        pass

    def pos(x: int, /) -> None:
        pass

    for fn in (star, kw, pos):
        with pytest.raises(TypeError, match="ordinary keyword parameter"):
            tool(fn)


def test_unresolvable_hint_fails_at_decoration() -> None:
    def f(x: NoSuchType) -> None:  # type: ignore[name-defined]  # noqa: F821
        pass

    with pytest.raises(TypeError, match="cannot resolve its type hints"):
        tool(f)


@pytest.mark.parametrize("name", ["", "has space", "x" * 65, "dotted.name"])
def test_invalid_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="invalid tool name"):
        tool(name=name)(lambda: None)


def test_schema_is_json_serialisable() -> None:
    for t in BUILTIN_TOOLS:
        assert json.loads(json.dumps(t.schema)) == t.schema


# --- validate ------------------------------------------------------------------------------


@tool
def typed(
    name: str,
    count: int,
    weight: float = 1.0,
    flag: bool = False,
    color: Color = Color.RED,
    kind: Literal["a", "b"] = "a",
    tags: list[str] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Echo the arguments."""
    return {"name": name, "count": count, "weight": weight, "flag": flag, "color": color, "kind": kind, "tags": tags}


def test_validate_accepts_good_arguments_and_leaves_defaults_to_the_function() -> None:
    assert typed.validate({"name": "x", "count": 2}) == {"name": "x", "count": 2}


def test_validate_coerces_int_to_float_and_enum_values_to_members() -> None:
    out = typed.validate({"name": "x", "count": 2, "weight": 3, "color": "green"})
    assert out["weight"] == 3.0 and isinstance(out["weight"], float)
    assert out["color"] is Color.GREEN


def test_validate_accepts_none_for_optional_and_checks_list_items() -> None:
    assert typed.validate({"name": "x", "count": 1, "tags": None})["tags"] is None
    assert typed.validate({"name": "x", "count": 1, "tags": ["a", "b"]})["tags"] == ["a", "b"]
    with pytest.raises(ToolArgumentError, match=r"argument 'tags\[1\]' must be string, got integer"):
        typed.validate({"name": "x", "count": 1, "tags": ["a", 2]})


def test_validate_reports_missing_argument() -> None:
    with pytest.raises(ToolArgumentError, match="missing required argument 'count'"):
        typed.validate({"name": "x"})


def test_validate_reports_unknown_argument() -> None:
    with pytest.raises(ToolArgumentError, match="unknown argument 'colour'"):
        typed.validate({"name": "x", "count": 1, "colour": "red"})


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"name": 5, "count": 1}, "argument 'name' must be string, got integer"),
        ({"name": "x", "count": "1"}, "argument 'count' must be integer, got string"),
        ({"name": "x", "count": True}, "argument 'count' must be integer, got boolean"),
        ({"name": "x", "count": 1.5}, "argument 'count' must be integer, got number"),
        ({"name": "x", "count": 1, "flag": 1}, "argument 'flag' must be boolean, got integer"),
        ({"name": "x", "count": 1, "weight": "heavy"}, "argument 'weight' must be number, got string"),
        ({"name": "x", "count": 1, "color": "blue"}, 'argument \'color\' must be one of "red", "green"'),
        ({"name": "x", "count": 1, "kind": "c"}, 'argument \'kind\' must be one of "a", "b", got string'),
        ({"name": "x", "count": 1, "tags": "a"}, "argument 'tags' must be array, got string"),
        ({"name": "x", "count": 1, "extra": []}, "argument 'extra' must be object, got array"),
        ({"name": None, "count": 1}, "argument 'name' must be string, got null"),
    ],
)
def test_validate_reports_wrong_types(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ToolArgumentError) as info:
        typed.validate(arguments)
    assert message in str(info.value)
    assert str(info.value).startswith("typed: ")


def test_validate_reports_every_problem_at_once() -> None:
    with pytest.raises(ToolArgumentError) as info:
        typed.validate({"count": "2", "bogus": 1})
    text = str(info.value)
    assert "unknown argument 'bogus'" in text
    assert "missing required argument 'name'" in text
    assert "argument 'count' must be integer" in text


def test_validate_refuses_non_object_arguments() -> None:
    with pytest.raises(ToolArgumentError, match="arguments must be a JSON object, got array"):
        typed.validate([1, 2])  # type: ignore[arg-type]


def test_tool_argument_error_is_a_value_error() -> None:
    assert issubclass(ToolArgumentError, ValueError)


def test_validate_union_tries_each_member() -> None:
    @tool
    def f(x: int | str) -> None:
        pass

    assert f.validate({"x": 1}) == {"x": 1}
    assert f.validate({"x": "1"}) == {"x": "1"}
    with pytest.raises(ToolArgumentError, match="argument 'x' must be integer or string, got array"):
        f.validate({"x": []})


# --- run -----------------------------------------------------------------------------------


async def test_run_sync_tool_in_a_thread() -> None:
    loop_thread = threading.get_ident()

    @tool
    def which_thread(x: int) -> int:
        return threading.get_ident()

    assert await which_thread.run({"x": 1}) != loop_thread


async def test_run_async_tool_is_awaited_and_returns_raw_value() -> None:
    @tool
    async def fetch(n: int) -> dict[str, int]:
        await asyncio.sleep(0)
        return {"n": n * 2}

    assert await fetch.run({"n": 21}) == {"n": 42}


async def test_run_uses_function_defaults_and_coerced_values() -> None:
    result = await typed.run({"name": "x", "count": 2, "weight": 2, "color": "green"})
    assert result == {
        "name": "x",
        "count": 2,
        "weight": 2.0,
        "flag": False,
        "color": Color.GREEN,
        "kind": "a",
        "tags": None,
    }


async def test_run_validates_before_calling() -> None:
    called = []

    @tool
    def f(x: int) -> None:
        called.append(x)

    with pytest.raises(ToolArgumentError):
        await f.run({"x": "no"})
    assert called == []


async def test_run_lets_tool_exceptions_propagate() -> None:
    @tool
    def boom() -> None:
        raise RuntimeError("kaput")

    @tool
    async def aboom() -> None:
        raise KeyError("gone")

    with pytest.raises(RuntimeError, match="kaput"):
        await boom.run({})
    with pytest.raises(KeyError):
        await aboom.run({})


async def test_run_injects_the_context() -> None:
    @tool
    def whoami(ctx: ToolContext) -> str:
        return f"{ctx.session_id}/{ctx.invocation_id}/{sorted(ctx.notes)}"

    context = ToolContext(session_id="s1", invocation_id="i1", notes={"a": "1"})
    assert await whoami.run({}, context) == "s1/i1/['a']"
    with pytest.raises(TypeError, match="needs a ToolContext"):
        await whoami.run({})


async def test_run_leaves_an_optional_context_at_its_default() -> None:
    @tool
    async def maybe(context: ToolContext | None = None) -> str:
        return "none" if context is None else context.session_id

    assert await maybe.run({}) == "none"
    assert await maybe.run({}, ToolContext(session_id="s", invocation_id=None, notes={})) == "s"


def test_tool_is_callable_like_the_function() -> None:
    @tool
    def add(a: int, b: int = 1) -> int:
        """Add."""
        return a + b

    @tool
    async def aadd(a: int) -> int:
        return a + 1

    assert add(2) == 3
    assert add(a=2, b=5) == 7
    assert add.__name__ == "add"
    assert add.__doc__ == "Add."
    assert asyncio.run(aadd(1)) == 2


def test_flags() -> None:
    @tool
    def plain() -> None:
        pass

    @tool()
    def called_empty() -> None:
        pass

    @tool(gated=True, mutating=True)
    def dangerous() -> None:
        pass

    @tool(gated=True, edit=True)
    def edit_file() -> None:
        pass

    assert (plain.gated, plain.mutating, plain.edit) == (False, False, False)
    assert isinstance(called_empty, Tool)
    assert (dangerous.gated, dangerous.mutating, dangerous.edit) == (True, True, False)
    # An edit changes something, so plan mode must refuse it too.
    assert (edit_file.gated, edit_file.mutating, edit_file.edit) == (True, True, True)
    assert "gated=True" in repr(dangerous)


# --- registry ------------------------------------------------------------------------------


@tool
def alpha() -> str:
    """First."""
    return "a"


@tool
def beta() -> str:
    return "b"


def test_registry_lookup_and_listing() -> None:
    registry = ToolRegistry([alpha, beta])
    assert registry.get("alpha") is alpha
    assert "beta" in registry
    assert "gamma" not in registry
    assert 42 not in registry
    assert registry.names() == ["alpha", "beta"]
    assert list(registry) == [alpha, beta]
    assert len(registry) == 2
    assert registry.schemas() == [alpha.schema, beta.schema]


def test_registry_unknown_tool_is_a_lookup_error() -> None:
    with pytest.raises(LookupError, match="unknown tool: gamma"):
        ToolRegistry([alpha]).get("gamma")


def test_registry_later_tool_replaces_earlier() -> None:
    replacement = tool(name="alpha", gated=True)(lambda: "A")
    registry = ToolRegistry([alpha, beta])
    registry.add(replacement)
    assert registry.get("alpha") is replacement
    assert registry.names() == ["alpha", "beta"]
    assert len(registry) == 2


def test_registry_refuses_plain_functions() -> None:
    with pytest.raises(TypeError, match="@sectr.tool"):
        ToolRegistry().add(lambda: None)  # type: ignore[arg-type]


def test_registry_empty() -> None:
    registry = ToolRegistry()
    assert registry.names() == [] and registry.schemas() == [] and list(registry) == []


# --- format_result -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("plain text", "plain text"),
        ("", ""),
        (None, ""),
        (42, "42"),
        (1.5, "1.5"),
        (True, "true"),
        ([1, "zwei"], '[1, "zwei"]'),
        ({"città": "Zürich"}, '{"città": "Zürich"}'),
        ({"when": datetime(2024, 1, 2, tzinfo=UTC)}, '{"when": "2024-01-02 00:00:00+00:00"}'),
    ],
)
def test_format_result(value: Any, text: str) -> None:
    assert format_result(value) == text


# --- calculator ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "result"),
    [
        ("2 + 2", "4"),
        ("2 + 3 * 4", "14"),
        ("(2 + 3) * 4", "20"),
        ("2 ** 3 ** 2", "512"),
        ("-2 ** 2", "-4"),
        ("(-2) ** 2", "4"),
        ("10 - 4 - 3", "3"),
        ("100 / 10 / 5", "2"),
        ("1 / 2", "0.5"),
        ("8 / 2", "4"),
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("7 % 3", "1"),
        ("-7 % 3", "2"),
        ("+5", "5"),
        ("--5", "5"),
        ("2 ** -1", "0.5"),
        ("0.1 + 0.2", "0.3"),
        ("1.5e3", "1500"),
        ("1_000 * 3", "3000"),
        ("2 ** 100", "1267650600228229401496703205376"),
        ("sqrt(16)", "4"),
        ("sqrt(2)", "1.4142135623731"),
        ("abs(-3.5)", "3.5"),
        ("round(2.675, 2)", "2.67"),
        ("round(7.5)", "8"),
        ("min(3, 1, 2)", "1"),
        ("max(3, 1.5)", "3"),
        ("round(pi, 4)", "3.1416"),
        ("e", "2.71828182845905"),
        ("floor(-2.5) + ceil(2.1)", "0"),
        ("log(e)", "1"),
        ("-0.0", "0"),
        ("  3*3  ", "9"),
    ],
)
def test_calculator_evaluates(expression: str, result: str) -> None:
    assert calculator(expression) == result


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("1 / 0", "division by zero"),
        ("1 // 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("__import__('os')", "unknown function '__import__'"),
        ("__import__('os').system('true')", "unknown function"),
        ("open('/etc/passwd')", "unknown function 'open'"),
        ("(1).real", "unsupported syntax: Attribute"),
        ("().__class__", "unsupported syntax: Attribute"),
        ("math.sqrt(4)", "unknown function 'math.sqrt'"),
        ("x + 1", "unknown name 'x'"),
        ("__builtins__", "unknown name '__builtins__'"),
        ("lambda: 1", "unsupported syntax: Lambda"),
        ("(lambda: 1)()", "unknown function"),
        ("[1, 2]", "unsupported syntax: List"),
        ("[x for x in (1,)]", "unsupported syntax: ListComp"),
        ("'a' * 3", "only numbers are allowed"),
        ("True + 1", "only numbers are allowed"),
        ("1j * 2", "only numbers are allowed"),
        ("1 < 2", "unsupported syntax: Compare"),
        ("1 if 1 else 2", "unsupported syntax: IfExp"),
        ("2 ^ 3", "use ** for powers"),
        ("1 << 3", "unsupported operator"),
        ("~1", "unsupported operator"),
        ("not 1", "unsupported operator"),
        ("sqrt(-1)", "math domain error"),
        ("(-8) ** 0.5", "not a real number"),
        ("sqrt(1, 2)", "sqrt() takes 1 argument(s), got 2"),
        ("min()", "min() takes 1 to 50 argument(s), got 0"),
        ("round(1.5, ndigits=1)", "plain positional arguments only"),
        ("max(*(1, 2))", "plain positional arguments only"),
        ("round(1.5, 0.5)", "whole number of digits"),
        ("1e308 * 10", "result too large"),
        ("2.5 ** 5000", "result too large"),
        ("10 ** 400 / 3", "result too large"),
        ("(10 ** 3000) ** 4", "result too large"),
        ("2 ** 20000", "exponent too large"),
        ("", "empty expression"),
        ("   ", "empty expression"),
        ("2 +", "invalid expression"),
        ("1; 2", "invalid expression"),
        ("import os", "invalid expression"),
        ("1" + "+1" * 100, "expression too long"),
    ],
)
def test_calculator_refuses(expression: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        calculator(expression)


def test_calculator_accepts_exactly_200_characters() -> None:
    expression = "10" + "+1" * 99
    assert len(expression) == 200
    assert calculator(expression) == "109"
    assert calculator("1" * 200) == "1" * 200


@pytest.mark.parametrize("expression", ["9**9**9", "9 ** 9 ** 9 ** 9", "(2 ** 9999) ** 9999", "99999 ** 9999"])
def test_calculator_refuses_huge_powers_quickly(expression: str) -> None:
    started = time.perf_counter()
    with pytest.raises(ValueError, match="too large"):
        calculator(expression)
    assert time.perf_counter() - started < 1.0


def test_calculator_never_calls_eval(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    def no_eval(*args: object, **kwargs: object) -> None:
        raise AssertionError("eval was called")

    monkeypatch.setattr(builtins, "eval", no_eval)
    assert calculator("6 * 7") == "42"


async def test_calculator_through_run() -> None:
    assert await calculator.run({"expression": "6 * 7"}) == "42"
    with pytest.raises(ValueError, match="division by zero"):
        await calculator.run({"expression": "1/0"})
    with pytest.raises(ToolArgumentError, match="missing required argument 'expression'"):
        await calculator.run({})


# --- get_time ------------------------------------------------------------------------------


async def test_get_time_is_iso_8601_utc_now() -> None:
    text = await get_time.run({})
    assert isinstance(text, str)
    moment = datetime.fromisoformat(text)
    assert moment.utcoffset() == timedelta(0)
    assert text.endswith("+00:00")
    assert abs(datetime.now(UTC) - moment) < timedelta(seconds=5)


# --- notes ---------------------------------------------------------------------------------


def _context(**notes: str) -> ToolContext:
    return ToolContext(session_id="s1", invocation_id="i1", notes=notes)


async def test_write_note_says_created_or_updated() -> None:
    assert await write_note.run({"title": "todo", "body": "milk"}, _context()) == "saved note 'todo' (created)"
    assert (
        await write_note.run({"title": "todo", "body": "eggs"}, _context(todo="milk")) == "saved note 'todo' (updated)"
    )


async def test_write_note_without_context() -> None:
    assert await write_note.run({"title": "todo", "body": ""}) == "saved note 'todo'"


@pytest.mark.parametrize(
    ("title", "body", "message"),
    [
        ("", "b", "cannot be empty"),
        ("   ", "b", "cannot be empty"),
        ("t" * 121, "b", "at most 120 characters"),
        ("t", "b" * 10_001, "at most 10,000 characters"),
    ],
)
async def test_write_note_validates(title: str, body: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        await write_note.run({"title": title, "body": body}, _context())


async def test_write_note_limits_are_inclusive() -> None:
    result = await write_note.run({"title": "t" * 120, "body": "b" * 10_000}, _context())
    assert result.startswith("saved note 'ttt")


async def test_write_note_refuses_non_string_arguments() -> None:
    with pytest.raises(ToolArgumentError, match="argument 'body' must be string"):
        await write_note.run({"title": "t", "body": 5}, _context())


async def test_delete_note() -> None:
    assert await delete_note.run({"title": "todo"}, _context(todo="milk")) == "deleted note 'todo'"
    with pytest.raises(ValueError, match="no note titled 'shopping'"):
        await delete_note.run({"title": "shopping"}, _context(todo="milk"))
    with pytest.raises(TypeError, match="needs a ToolContext"):
        await delete_note.run({"title": "todo"})


def test_tool_context_notes_are_read_only_and_a_snapshot() -> None:
    notes = {"a": "1"}
    context = ToolContext(session_id="s", invocation_id=None, notes=notes)
    with pytest.raises(TypeError):
        context.notes["b"] = "2"  # type: ignore[index]
    notes["c"] = "3"
    assert dict(context.notes) == {"a": "1"}
    assert ToolContext(session_id="s").notes == {}


async def test_note_tools_agree_with_the_journal_projection() -> None:
    """The tools decide from context.notes; the notes come from the journal's projection."""

    def env(seq: int, type_: EventType, payload: dict[str, Any]) -> Envelope:
        return Envelope("s1", seq, "i1", type_, payload)

    journal = [
        env(1, EventType.SESSION_CREATED, {"mode": "default", "model": "demo"}),
        env(2, EventType.TOOL_CALL, {"message_id": "m", "tool_call_id": "c1", "name": "write_note",
                                     "arguments": json.dumps({"title": "todo", "body": "milk"})}),
        env(3, EventType.TOOL_RESULT, {"tool_call_id": "c1", "name": "write_note", "content": "saved note 'todo'"}),
    ]  # fmt: skip
    context = ToolContext("s1", "i2", project(journal).notes)
    assert await write_note.run({"title": "todo", "body": "eggs"}, context) == "saved note 'todo' (updated)"
    assert await delete_note.run({"title": "todo"}, context) == "deleted note 'todo'"


def test_builtin_tools_and_flags() -> None:
    flags = {t.name: (t.gated, t.mutating, t.edit) for t in BUILTIN_TOOLS}
    assert flags == {
        "get_time": (False, False, False),
        "calculator": (False, False, False),
        "write_note": (True, True, False),
        "delete_note": (True, True, False),
    }
    registry = ToolRegistry(BUILTIN_TOOLS)
    assert registry.names() == ["get_time", "calculator", "write_note", "delete_note"]
    assert _params(write_note)["required"] == ["title", "body"]
    assert list(_params(delete_note)["properties"]) == ["title"]


# ---- tools described by a JSON schema (MCP servers' tools) ----


async def test_a_schema_tool_shows_its_schema_as_given_and_checks_the_top_level() -> None:
    seen: list[tuple[dict[str, Any], ToolContext | None]] = []

    async def remote(arguments: dict[str, Any], context: ToolContext | None = None) -> str:
        seen.append((arguments, context))
        return "ok"

    parameters = {
        "type": "object",
        "properties": {"path": {"type": "string", "minLength": 1}, "depth": {"type": ["integer", "null"]}},
        "required": ["path"],
        "additionalProperties": False,
    }
    schema_tool = SchemaTool(remote, name="fs__read", description="Read a file.", parameters=parameters, gated=True)
    assert schema_tool.schema == {
        "type": "function",
        "function": {"name": "fs__read", "description": "Read a file.", "parameters": parameters},
    }
    assert (schema_tool.gated, schema_tool.mutating, schema_tool.idempotent) == (True, False, False)
    context = ToolContext("s1", tool_call_id="c1")
    assert await schema_tool.run({"path": "a", "depth": None}, context) == "ok"
    assert seen == [({"path": "a", "depth": None}, context)]
    with pytest.raises(ToolArgumentError) as problem:
        schema_tool.validate({"depth": "deep", "mode": "x"})
    assert str(problem.value) == (
        "fs__read: missing required argument 'path'; unknown argument 'mode';"
        " argument 'depth' must be integer or null, got string"
    )
    with pytest.raises(ToolArgumentError):
        schema_tool.validate([])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        SchemaTool(remote, name="fs.read", description="", parameters=parameters)
