"""The built-in tools every session has (docs/journal.md).

`get_time` and `calculator` are read-only and run without asking. `write_note` and
`delete_note` are gated and mutating. They store nothing themselves: a note exists
because the journal holds a successful call of one of them (`sectr.state` projects the
notes from TOOL_CALL + TOOL_RESULT), so these functions only validate and describe.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sectr.tools import Tool, ToolContext, tool

__all__ = ["BUILTIN_TOOLS", "calculator", "delete_note", "get_time", "write_note"]

NOTE_TITLE_MAX = 120
NOTE_BODY_MAX = 10_000


# The built-in tools are idempotent: get_time and calculator only read, and the notes
# are a projection of the journal (a note tool's effect is its TOOL_RESULT), so a call a
# crash cut off took no effect and is simply run again.
@tool(idempotent=True)
def get_time() -> str:
    """Get the current date and time in UTC, as an ISO 8601 string."""
    return datetime.now(UTC).isoformat(timespec="seconds")


# --- calculator ----------------------------------------------------------------------------

EXPRESSION_MAX = 200
#: `a ** b` with |b| above this is refused before it is computed.
EXPONENT_MAX = 10_000
#: Integer results are capped well below Python's 4300-digit int-to-str limit.
INT_BITS_MAX = 10_000

Number = int | float

_BINARY_OPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY_OPS: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}


def _round(x: Number, ndigits: Number | None = None) -> Number:
    if ndigits is None:
        return round(x)
    if not isinstance(ndigits, int):
        raise ValueError("round() takes a whole number of digits")
    return round(x, ndigits)


def _log(x: Number, base: Number | None = None) -> float:
    return math.log(x) if base is None else math.log(x, base)


#: name -> (function, min args, max args)
_FUNCTIONS: dict[str, tuple[Callable[..., Number], int, int]] = {
    "sqrt": (math.sqrt, 1, 1),
    "abs": (abs, 1, 1),
    "round": (_round, 1, 2),
    "min": (lambda *xs: min(xs), 1, 50),
    "max": (lambda *xs: max(xs), 1, 50),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
    "log": (_log, 1, 2),
    "exp": (math.exp, 1, 1),
}


def _check_size(value: Number) -> Number:
    if isinstance(value, int) and value.bit_length() > INT_BITS_MAX:
        raise ValueError("result too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("result too large" if math.isinf(value) else "result is not a number")
    return value


def _power(base: Number, exponent: Number) -> Number:
    if abs(exponent) > EXPONENT_MAX:
        raise ValueError(f"exponent too large (the limit is {EXPONENT_MAX})")
    # Estimate before computing: 9 ** 10000 is quick, but (10 ** 3000) ** 10000 is not.
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        if (abs(base).bit_length() - 1) * exponent > INT_BITS_MAX:
            raise ValueError("result too large")
    result = base**exponent
    if isinstance(result, complex):
        raise ValueError("result is not a real number (fractional power of a negative number)")
    return result


def _evaluate(node: ast.AST) -> Number:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return node.value
        raise ValueError(f"unsupported value {node.value!r}: only numbers are allowed")
    if isinstance(node, ast.BinOp):
        op = _BINARY_OPS.get(type(node.op))
        if op is None:
            hint = " (use ** for powers)" if isinstance(node.op, ast.BitXor) else ""
            raise ValueError(f"unsupported operator {type(node.op).__name__}{hint}")
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            return _check_size(_power(left, right))
        return _check_size(op(left, right))
    if isinstance(node, ast.UnaryOp):
        unary = _UNARY_OPS.get(type(node.op))
        if unary is None:
            raise ValueError(f"unsupported operator {type(node.op).__name__}")
        return _check_size(unary(_evaluate(node.operand)))
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        raise ValueError(f"unknown name {node.id!r}")
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS:
            called = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            raise ValueError(f"unknown function {called!r}")
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise ValueError(f"{node.func.id}() takes plain positional arguments only")
        fn, least, most = _FUNCTIONS[node.func.id]
        if not least <= len(node.args) <= most:
            expected = str(least) if least == most else f"{least} to {most}"
            raise ValueError(f"{node.func.id}() takes {expected} argument(s), got {len(node.args)}")
        return _check_size(fn(*(_evaluate(a) for a in node.args)))
    raise ValueError(f"unsupported syntax: {type(node).__name__}")


def _format_number(value: Number) -> str:
    if isinstance(value, int):
        return str(value)
    if value == 0:
        return "0"  # and not "-0"
    return format(value, ".15g")  # 0.1 + 0.2 -> "0.3", 8 / 2 -> "4"


def evaluate_expression(expression: str) -> str:
    """Evaluate arithmetic safely (an AST walk over a whitelist, never `eval`)."""
    text = expression.strip()
    if not text:
        raise ValueError("empty expression")
    if len(text) > EXPRESSION_MAX:
        raise ValueError(f"expression too long (the limit is {EXPRESSION_MAX} characters)")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"invalid expression: {exc.msg}") from None
    except (RecursionError, MemoryError):
        raise ValueError("expression too deeply nested") from None
    try:
        return _format_number(_evaluate(tree))
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    except OverflowError:
        raise ValueError("result too large") from None
    except RecursionError:
        raise ValueError("expression too deeply nested") from None
    except (TypeError, ArithmeticError) as exc:
        raise ValueError(f"cannot evaluate: {exc}") from None
    except ValueError as exc:
        if str(exc) == "math domain error":
            raise ValueError("math domain error (e.g. the square root of a negative number)") from None
        raise


@tool(idempotent=True)
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Args:
        expression: numbers, + - * / // % ** and parentheses; the functions sqrt, abs,
            round, min, max, floor, ceil, log, exp; the constants pi, e and tau.
            Example: "round(sqrt(2) * 10, 2)".
    """
    return evaluate_expression(expression)


# --- notes ---------------------------------------------------------------------------------


def _check_note_title(title: str) -> None:
    if not title.strip():
        raise ValueError("a note title cannot be empty")
    if len(title) > NOTE_TITLE_MAX:
        raise ValueError(f"a note title has at most {NOTE_TITLE_MAX} characters (got {len(title)})")


@tool(gated=True, mutating=True, idempotent=True)
def write_note(title: str, body: str, context: ToolContext | None = None) -> str:
    """Save a note on this session's page, replacing any note with the same title.

    Args:
        title: the note's title, 1 to 120 characters.
        body: the note's text, at most 10,000 characters.
    """
    _check_note_title(title)
    if len(body) > NOTE_BODY_MAX:
        raise ValueError(f"a note body has at most {NOTE_BODY_MAX:,} characters (got {len(body):,})")
    if context is None:
        return f"saved note {title!r}"
    action = "updated" if title in context.notes else "created"
    return f"saved note {title!r} ({action})"


@tool(gated=True, mutating=True, idempotent=True)
def delete_note(title: str, context: ToolContext) -> str:
    """Delete a note from this session's page.

    Args:
        title: the title of the note to delete, exactly as written.
    """
    if title not in context.notes:
        raise ValueError(f"no note titled {title!r}")
    return f"deleted note {title!r}"


BUILTIN_TOOLS: list[Tool] = [get_time, calculator, write_note, delete_note]
