"""Text from outside (operator input, signal names, usernames) made safe to put in a log line.

A log line is one line: a newline in a signal name would otherwise start a second, forged line
("Operator alice: cancel on workflow 1: Canceled.") that a reader or a log shipper cannot tell
from a real one. :func:`escape` writes control characters (CR, LF, tabs, ANSI escapes, NUL, the
Unicode line and paragraph separators) as ``\\xNN``/``\\uNNNN`` escapes and a backslash as
``\\\\``, so the escaped text maps back to exactly one input and nothing in it can pass for
the logger's own output.
"""

from __future__ import annotations

from typing import Any

#: Longest text kept verbatim; longer input is cut, with a note of its length.
DEFAULT_LIMIT = 200


def _escape_char(char: str) -> str:
    if char == "\\":
        return "\\\\"
    if char.isprintable():
        return char
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escape(value: Any, limit: int = DEFAULT_LIMIT) -> str:
    """``value`` as one printable line: control characters and backslashes escaped, cut after
    ``limit`` characters (a log line is not the place for a megabyte of input)."""
    text = value if isinstance(value, str) else str(value)
    out = "".join(_escape_char(char) for char in text[:limit])
    return f"{out}… ({len(text)} characters)" if len(text) > limit else out
