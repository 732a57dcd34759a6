"""Tools: plain Python functions the model may call, with their OpenAI function schemas.

`@tool` turns a function (sync or async) into a `Tool`. The schema is built once, at
decoration time, from the signature, the type hints and the docstring, so a mistake in a
tool's annotations fails at import, not in the middle of a run::

    @tool(gated=True, mutating=True)
    def write_file(path: str, text: str, context: ToolContext) -> str:
        '''Write a text file.

        Args:
            path: where to write, relative to the workspace.
            text: the whole new content.
        '''

A parameter annotated with `ToolContext` is injected by the runtime and never appears in
the schema. Tools never see the journal: the runtime journals their calls and results, and
turns their exceptions into error results.
"""

from __future__ import annotations

import asyncio
import collections.abc
import enum
import functools
import inspect
import json
import re
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints, overload

__all__ = [
    "SchemaTool",
    "Tool",
    "ToolArgumentError",
    "ToolContext",
    "ToolOutput",
    "ToolRegistry",
    "format_result",
    "tool",
]

#: What the OpenAI API accepts as a function name.
_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class ToolContext:
    """What the runtime tells a tool about where it runs. Injected, never part of the schema."""

    session_id: str
    invocation_id: str | None = None
    #: The session's notes (title -> body) when the call started, read-only.
    notes: Mapping[str, str] = field(default_factory=dict)
    #: The id of the tool call being answered (None for an `execute` without `call_id`).
    tool_call_id: str | None = None

    @property
    def idempotency_key(self) -> str | None:
        """A key that stays the same when this very call runs again (after a crash, an
        idempotent tool is re-run): pass it to the systems the tool calls (an
        ``Idempotency-Key`` header, a unique request id) so they apply the call once.
        It is the tool call id; None when the call has none."""
        return self.tool_call_id

    def __post_init__(self) -> None:
        # A plain dict would let a tool change the session's notes behind the journal's back;
        # the copy keeps a tool running in a thread from seeing the projection move under it.
        if not isinstance(self.notes, types.MappingProxyType):
            object.__setattr__(self, "notes", types.MappingProxyType(dict(self.notes)))


class ToolArgumentError(ValueError):
    """The model called a tool with missing, unknown or mistyped arguments."""


# --- docstrings -----------------------------------------------------------------------------

_GOOGLE_ARGS_HEADERS = {"args:", "arguments:", "parameters:", "params:", "keyword args:", "keyword arguments:"}
_SECTION_HEADER_RE = re.compile(r"^[A-Z][A-Za-z ]*:\s*$")
_GOOGLE_ENTRY_RE = re.compile(r"^\**(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_REST_PARAM_RE = re.compile(r"^:(?:param|parameter|arg|argument|key|keyword)\s+(?:[^:]*\s)?\**(\w+)\s*:\s*(.*)$")
_REST_FIELD_RE = re.compile(r"^:\w+")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a docstring into (description, {parameter: description}).

    The description is the first paragraph, joined into one line. Parameter descriptions
    come from a Google-style ``Args:`` section or from reST ``:param name:`` fields.
    """
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()

    summary: list[str] = []
    for line in lines:
        stripped = line.strip()
        if not stripped or _SECTION_HEADER_RE.match(stripped) or _REST_FIELD_RE.match(stripped):
            break
        summary.append(stripped)

    params: dict[str, str] = {}
    current: str | None = None
    section_indent: int | None = None  # inside a Google "Args:" section: the header's indent
    entry_indent: int | None = None
    for line in lines:
        stripped = line.strip()
        rest = _REST_PARAM_RE.match(stripped)
        if rest:
            section_indent = None
            current = rest.group(1)
            params[current] = rest.group(2).strip()
            continue
        if stripped.lower() in _GOOGLE_ARGS_HEADERS:
            section_indent, entry_indent, current = _indent(line), None, None
            continue
        if not stripped:
            continue
        indent = _indent(line)
        if section_indent is not None:
            if indent <= section_indent:
                section_indent, current = None, None
            else:
                if entry_indent is None:
                    entry_indent = indent
                entry = _GOOGLE_ENTRY_RE.match(stripped) if indent == entry_indent else None
                if entry:
                    current = entry.group(1)
                    params[current] = entry.group(2).strip()
                elif current is not None:
                    params[current] = f"{params[current]} {stripped}".strip()
                continue
        if _REST_FIELD_RE.match(stripped) or _SECTION_HEADER_RE.match(stripped):
            current = None
        elif current is not None and indent > 0:
            params[current] = f"{params[current]} {stripped}".strip()  # a reST continuation line
        else:
            current = None
    return " ".join(summary), {k: v for k, v in params.items() if v}


# --- types -> JSON schema, and the matching argument checks ---------------------------------

_JSON_TYPE_NAMES: dict[type, str] = {str: "string", bool: "boolean", int: "integer", float: "number"}


def _json_type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _strip_annotated(tp: Any) -> tuple[Any, str | None]:
    description = None
    while get_origin(tp) is Annotated:
        base, *metadata = get_args(tp)
        description = next((m for m in metadata if isinstance(m, str)), description)
        tp = base
    return tp, description


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def _enum_schema(values: list[Any]) -> dict[str, Any]:
    schema: dict[str, Any] = {}
    kinds = {_json_type_of(v) for v in values}
    if len(kinds) == 1:
        schema["type"] = kinds.pop()
    elif kinds <= {"integer", "number"}:
        schema["type"] = "number"
    schema["enum"] = values
    return schema


_ARRAY_ORIGINS = (list, tuple, collections.abc.Sequence)
_OBJECT_ORIGINS = (dict, collections.abc.Mapping)


def _schema_for(tp: Any) -> dict[str, Any]:
    """The JSON schema of one annotation. TypeError for what a tool argument cannot be."""
    tp, _ = _strip_annotated(tp)
    if tp is Any or tp is inspect.Parameter.empty or tp is object:
        return {}
    if tp is None or tp is type(None):
        return {"type": "null"}
    if tp in _JSON_TYPE_NAMES:
        return {"type": _JSON_TYPE_NAMES[tp]}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum_schema([member.value for member in tp])
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return _enum_schema([a.value if isinstance(a, enum.Enum) else a for a in args])
    if _is_union(tp):
        members = [a for a in args if a is not type(None)]
        if len(members) == 1:
            return _schema_for(members[0])  # X | None: the model sees X; validate() also takes null
        return {"anyOf": [_schema_for(a) for a in members]}
    if tp in _ARRAY_ORIGINS or origin in _ARRAY_ORIGINS:
        schema: dict[str, Any] = {"type": "array"}
        item = _array_item_type(tp)
        if item is not None:
            schema["items"] = _schema_for(item)
        return schema
    if tp in _OBJECT_ORIGINS or origin in _OBJECT_ORIGINS:
        schema = {"type": "object"}
        if len(args) == 2 and _schema_for(args[1]):
            schema["additionalProperties"] = _schema_for(args[1])
        return schema
    raise TypeError(f"unsupported type annotation {tp!r}")


def _array_item_type(tp: Any) -> Any | None:
    args = get_args(tp)
    if not args:
        return None
    if get_origin(tp) is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0]
        raise TypeError(f"unsupported type annotation {tp!r}: use tuple[X, ...] or list[X]")
    return args[0]


def _type_name(tp: Any) -> str:
    schema = _schema_for(tp)
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    if "anyOf" in schema:
        return " or ".join(_type_name(a) for a in get_args(tp) if a is not type(None))
    return str(schema.get("type", "any value"))


class _Mismatch(Exception):  # noqa: N818 - internal signal, never escapes this module
    def __init__(self, path: str, expected: str, value: Any) -> None:
        super().__init__(f"argument {path!r} must be {expected}, got {_json_type_of(value)}")


def _check(value: Any, tp: Any, path: str) -> Any:
    """Check `value` against the annotation `tp`; returns it, coerced where the hint says so."""
    tp, _ = _strip_annotated(tp)
    if tp is Any or tp is inspect.Parameter.empty or tp is object:
        return value
    if tp is None or tp is type(None):
        if value is None:
            return None
        raise _Mismatch(path, "null", value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch(path, "boolean", value)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Mismatch(path, "integer", value)
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise _Mismatch(path, "number", value)
    if tp is str:
        if isinstance(value, str):
            return value
        raise _Mismatch(path, "string", value)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if isinstance(value, tp):
            return value
        for member in tp:
            if type(member.value) is type(value) and member.value == value:
                return member
        raise _Mismatch(path, _type_name(tp), value)
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        for allowed in args:
            allowed_value = allowed.value if isinstance(allowed, enum.Enum) else allowed
            if type(allowed_value) is type(value) and allowed_value == value:
                return allowed
        raise _Mismatch(path, _type_name(tp), value)
    if _is_union(tp):
        if value is None and type(None) in args:
            return None
        members = [a for a in args if a is not type(None)]
        if len(members) == 1:  # X | None: report X's own problem, e.g. which list item is wrong
            if value is None:
                raise _Mismatch(path, _type_name(members[0]), value)
            return _check(value, members[0], path)
        for member in members:
            try:
                return _check(value, member, path)
            except _Mismatch:
                continue
        raise _Mismatch(path, _type_name(tp), value)
    if tp in _ARRAY_ORIGINS or origin in _ARRAY_ORIGINS:
        if not isinstance(value, list | tuple):
            raise _Mismatch(path, "array", value)
        item = _array_item_type(tp)
        items = [v if item is None else _check(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if (tp is tuple or origin is tuple) else items
    if tp in _OBJECT_ORIGINS or origin in _OBJECT_ORIGINS:
        if not isinstance(value, dict):
            raise _Mismatch(path, "object", value)
        if len(args) == 2:
            return {k: _check(v, args[1], f"{path}.{k}") for k, v in value.items()}
        return value
    return value  # unreachable for annotations _schema_for accepted


# --- the Tool ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Param:
    name: str
    annotation: Any
    required: bool


def _is_context_annotation(tp: Any) -> bool:
    tp, _ = _strip_annotated(tp)
    if tp is ToolContext:
        return True
    return _is_union(tp) and ToolContext in get_args(tp)


def _json_default(value: Any) -> tuple[bool, Any]:
    """(True, json value) when a parameter default can be shown to the model."""
    if isinstance(value, enum.Enum):
        value = value.value
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False, None
    return True, list(value) if isinstance(value, tuple) else value


class Tool:
    """A function the model may call, with its schema and its approval flags.

    - `gated`: every call waits for a person's approval (unless granted or auto-approved).
    - `mutating`: changes something; refused in `plan` mode.
    - `edit`: an edit, run without asking in `accept_edits` mode. An edit is mutating.
    - `idempotent`: running a call twice has the effect of running it once (it only
      reads, or it dedupes on `ToolContext.idempotency_key`). A call a crash cut off is
      re-run after recovery only when its tool is idempotent; otherwise the model gets
      an error result saying it may or may not have taken effect.

    Calling the Tool object calls the original function directly.
    """

    name: str
    description: str
    gated: bool
    mutating: bool
    edit: bool
    idempotent: bool
    fn: Callable[..., Any]
    schema: dict[str, Any]
    #: The MCP server a tool comes from (`sectr.mcp`); None for a Python tool. Agents
    #: that name no tools (the built-in default agent) are offered no MCP tools.
    mcp_server: str | None = None
    # Copied from the function by functools.update_wrapper, like any decorator's wrapper.
    __name__: str
    __wrapped__: Callable[..., Any]

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        gated: bool = False,
        mutating: bool = False,
        edit: bool = False,
        idempotent: bool = False,
        name: str | None = None,
        description: str | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"a tool needs a callable, got {fn!r}")
        tool_name = name or getattr(fn, "__name__", None)
        if not tool_name or not _NAME_RE.match(tool_name):
            raise ValueError(f"invalid tool name {tool_name!r}: use 1-64 letters, digits, '_' or '-'")
        self.name = tool_name
        self.fn = fn
        self.gated = gated
        self.edit = edit
        self.mutating = mutating or edit
        self.idempotent = idempotent
        self.is_async = inspect.iscoroutinefunction(fn)

        summary, param_docs = parse_docstring(inspect.getdoc(fn))
        self.description = description if description is not None else summary
        try:
            hints = get_type_hints(fn, include_extras=True)
        except Exception as exc:  # NameError for an unresolvable forward reference, mostly
            raise TypeError(f"tool {tool_name}: cannot resolve its type hints: {exc}") from exc

        self._params: dict[str, _Param] = {}
        self._context_param: str | None = None
        self._context_required = False
        properties: dict[str, Any] = {}
        required: list[str] = []
        for param in inspect.signature(fn).parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
                raise TypeError(f"tool {tool_name}: parameter {param.name!r} must be an ordinary keyword parameter")
            annotation = hints.get(param.name, inspect.Parameter.empty)
            if _is_context_annotation(annotation):
                self._context_param = param.name
                self._context_required = param.default is param.empty
                continue
            try:
                prop = _schema_for(annotation)
            except TypeError as exc:
                raise TypeError(f"tool {tool_name}, parameter {param.name!r}: {exc}") from exc
            _, annotated_doc = _strip_annotated(annotation)
            doc = annotated_doc or param_docs.get(param.name)
            if doc:
                prop["description"] = doc
            is_required = param.default is param.empty
            if is_required:
                required.append(param.name)
            else:
                shown, default = _json_default(param.default)
                if shown:
                    prop["default"] = default
            properties[param.name] = prop
            self._params[param.name] = _Param(param.name, annotation, is_required)

        self.schema = {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": properties,
                    "required": required,
                    "additionalProperties": False,
                },
            },
        }
        functools.update_wrapper(self, fn, updated=())

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments (``schema["function"]["parameters"]``)."""
        parameters: dict[str, Any] = self.schema["function"]["parameters"]
        return parameters

    @property
    def wants_context(self) -> bool:
        return self._context_param is not None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return (
            f"<Tool {self.name} gated={self.gated} mutating={self.mutating} edit={self.edit}"
            f" idempotent={self.idempotent}>"
        )

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Check the model's arguments against the signature; return them, coerced.

        Parameters left out keep the function's own defaults. Raises ToolArgumentError
        naming every missing, unknown or mistyped argument.
        """
        if not isinstance(arguments, dict):
            raise ToolArgumentError(f"{self.name}: arguments must be a JSON object, got {_json_type_of(arguments)}")
        problems: list[str] = []
        for key in arguments:
            if key not in self._params:
                problems.append(f"unknown argument {key!r}")
        for param in self._params.values():
            if param.required and param.name not in arguments:
                problems.append(f"missing required argument {param.name!r}")
        checked: dict[str, Any] = {}
        for key, value in arguments.items():
            spec = self._params.get(key)
            if spec is None:
                continue
            try:
                checked[key] = _check(value, spec.annotation, key)
            except _Mismatch as exc:
                problems.append(str(exc))
        if problems:
            raise ToolArgumentError(f"{self.name}: " + "; ".join(problems))
        return checked

    def bind(self, arguments: dict[str, Any], context: ToolContext | None = None) -> dict[str, Any]:
        """The keyword arguments of a call: the validated arguments, plus the ToolContext
        when the tool declares one."""
        kwargs = self.validate(arguments)
        if self._context_param is not None:
            if context is not None:
                kwargs[self._context_param] = context
            elif self._context_required:
                raise TypeError(f"tool {self.name} needs a ToolContext and none was given")
        return kwargs

    async def run(self, arguments: dict[str, Any], context: ToolContext | None = None) -> Any:
        """Validate the arguments, then call the tool and return its raw value.

        A sync function runs in a thread so a slow tool does not stall the event loop.
        Exceptions propagate: the runtime turns them into error tool results.
        """
        return await self.invoke(self.bind(arguments, context))

    async def invoke(self, kwargs: dict[str, Any]) -> Any:
        """Call the tool with keyword arguments from `bind`; a sync function in a thread."""
        if self.is_async:
            return await self.fn(**kwargs)
        result = await asyncio.to_thread(self.fn, **kwargs)
        if inspect.isawaitable(result):  # a sync wrapper around a coroutine function
            result = await result
        return result


class SchemaTool(Tool):
    """A tool described by a JSON schema rather than a Python signature (an MCP
    server's tool, say): `fn` is ``async fn(arguments: dict, context: ToolContext | None)``
    and `parameters` the JSON schema of its arguments, shown to the model as given.

    `validate` checks only what the schema's top level says (an object, its required
    and, when ``additionalProperties`` is false, unknown properties, and the JSON type of
    each property that names one); the tool's owner checks the rest.
    """

    def __init__(
        self,
        fn: Callable[[dict[str, Any], ToolContext | None], Any],
        *,
        name: str,
        description: str,
        parameters: Mapping[str, Any],
        gated: bool = False,
        mutating: bool = False,
        edit: bool = False,
        idempotent: bool = False,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"a tool needs a callable, got {fn!r}")
        if not _NAME_RE.match(name):
            raise ValueError(f"invalid tool name {name!r}: use 1-64 letters, digits, '_' or '-'")
        self.name = name
        self.fn = fn
        self.gated = gated
        self.edit = edit
        self.mutating = mutating or edit
        self.idempotent = idempotent
        self.is_async = inspect.iscoroutinefunction(fn)
        self.description = description
        self._params = {}
        self._context_param = "context"
        self._context_required = False
        params = dict(parameters) if isinstance(parameters, Mapping) else {}
        params.setdefault("type", "object")
        params.setdefault("properties", {})
        self.schema = {
            "type": "function",
            "function": {"name": name, "description": description, "parameters": params},
        }
        self.__name__ = name
        self.__wrapped__ = fn

    @property
    def wants_context(self) -> bool:
        return True

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(arguments, dict):
            raise ToolArgumentError(f"{self.name}: arguments must be a JSON object, got {_json_type_of(arguments)}")
        params = self.parameters
        properties = params.get("properties") or {}
        problems = [
            f"missing required argument {key!r}" for key in params.get("required") or () if key not in arguments
        ]
        if params.get("additionalProperties") is False:
            problems += [f"unknown argument {key!r}" for key in arguments if key not in properties]
        for key, value in arguments.items():
            expected = (properties.get(key) or {}).get("type") if isinstance(properties.get(key), dict) else None
            kinds = [expected] if isinstance(expected, str) else list(expected or [])
            actual = _json_type_of(value)
            if kinds and actual not in kinds and not (actual == "integer" and "number" in kinds):
                problems.append(f"argument {key!r} must be {' or '.join(kinds)}, got {actual}")
        if problems:
            raise ToolArgumentError(f"{self.name}: " + "; ".join(problems))
        return dict(arguments)

    def bind(self, arguments: dict[str, Any], context: ToolContext | None = None) -> dict[str, Any]:
        return {"arguments": self.validate(arguments), "context": context}


@overload
def tool(
    fn: Callable[..., Any],
    *,
    gated: bool = False,
    mutating: bool = False,
    edit: bool = False,
    idempotent: bool = False,
    name: str | None = None,
    description: str | None = None,
) -> Tool: ...


@overload
def tool(
    fn: None = None,
    *,
    gated: bool = False,
    mutating: bool = False,
    edit: bool = False,
    idempotent: bool = False,
    name: str | None = None,
    description: str | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    gated: bool = False,
    mutating: bool = False,
    edit: bool = False,
    idempotent: bool = False,
    name: str | None = None,
    description: str | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a Tool of a function: ``@tool`` or ``@tool(gated=True, mutating=True, idempotent=False)``."""

    def decorate(func: Callable[..., Any]) -> Tool:
        return Tool(
            func, gated=gated, mutating=mutating, edit=edit, idempotent=idempotent, name=name, description=description
        )

    if fn is None:
        return decorate
    return decorate(fn)


class ToolOutput(str):
    """A tool's text with the media it produced, already stored elsewhere: `media` are
    references (``{"ref", "kind", "mime_type", "bytes"}``) that the TOOL_RESULT journals
    under its ``media`` key, beside the text (docs/journal.md). It is a `str`, so code
    that reads a tool's result as text keeps working; the bytes never reach the journal.
    """

    media: tuple[dict[str, Any], ...]

    def __new__(cls, text: str, media: Iterable[Mapping[str, Any]] = ()) -> ToolOutput:
        made = super().__new__(cls, text)
        made.media = tuple(dict(item) for item in media)
        return made


def format_result(value: Any) -> str:
    """A tool's return value as the text of its TOOL_RESULT."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, default=str, ensure_ascii=False)


class ToolRegistry:
    """The tools of a runtime, by name. A later tool with a name replaces the earlier one."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.add(t)

    def add(self, tool: Tool) -> None:
        if not isinstance(tool, Tool):
            raise TypeError(f"{tool!r} is not a Tool: decorate it with @sectr.tool")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            raise LookupError(f"unknown tool: {name}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self._tools.values()]

    def names(self) -> list[str]:
        return list(self._tools)
