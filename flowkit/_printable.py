"""Text from records, made safe to print on a terminal.

A record's bytes are anyone's: written raw to a terminal, an escape sequence retitles the
window or moves the cursor, a newline forges a line of output, a bidi override shows text
in another order than it is stored. ``printable`` escapes every character that is not
printable (Python's ``str.isprintable``: the C0 and C1 controls, ESC, DEL, format
characters such as the bidi overrides, line and paragraph separators, unassigned code
points) as a backslash escape; ``printable_json`` does the same inside JSON text, where
the escape is JSON's own, so the output still decodes to the same value.
"""

from __future__ import annotations

__all__ = ["printable", "printable_json"]

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` with each character that is not printable as a backslash escape.

    >>> printable("ok \\x1b]0;owned\\x07 \\u202egnp.exe\\n")
    'ok \\\\x1b]0;owned\\\\x07 \\\\u202egnp.exe\\\\n'
    """
    if text.isprintable():  # the usual case: one C loop, nothing copied
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _json_escape(char: str) -> str:
    code = ord(char)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # JSON spells a code point past the BMP as a surrogate pair
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def printable_json(text: str) -> str:
    """JSON ``text`` with each character that is not printable as a ``\\uXXXX`` escape.

    JSON text holds such characters only inside strings, where the escape means the same
    character: the result decodes to the same value.

    >>> printable_json('["a\\u202eb"]')
    '["a\\\\u202eb"]'
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _json_escape(c) for c in text)
