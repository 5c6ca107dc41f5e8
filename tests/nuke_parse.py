"""Test-only reader of the `.nk` text `storage.nuke_script` writes, written apart from the
writer so the tests check the text, not the writer against itself.

It reads what Nuke would: comments, ``version``, ``Root {...}``, ``Class {...}`` blocks of
knob/value pairs, ``set VAR [stack 0]`` and ``push $VAR`` / ``push 0``, and works out each
node's inputs from the node stack (top = input 0). It is strict where Nuke would substitute:
an unescaped ``[`` or ``$`` in a value, or a bare word with quoting characters, is a
NukeParseError, so a value that parses here cannot run TCL when Nuke loads the script.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r"}
_LITERAL_ESCAPES = set('\\"[]${}')
_BARE_FORBIDDEN = set('\\"[]${}')


class NukeParseError(ValueError):
    """The text is not what the writer should produce; says where."""


@dataclass
class NkNode:
    cls: str
    knobs: dict[str, str]
    inputs: tuple[str | None, ...]  # input node names, input 0 first (None: `push 0`)

    @property
    def name(self) -> str:
        return self.knobs["name"]


@dataclass
class NkScript:
    version: str | None = None
    comments: list[str] = field(default_factory=list)
    root: dict[str, str] = field(default_factory=dict)
    nodes: list[NkNode] = field(default_factory=list)

    def node(self, name: str) -> NkNode:
        matches = [node for node in self.nodes if node.name == name]
        assert len(matches) == 1, f"{len(matches)} nodes named {name!r}"
        return matches[0]

    def of_class(self, cls: str) -> list[NkNode]:
        return [node for node in self.nodes if node.cls == cls]


def parse(text: str) -> NkScript:
    return _Parser(text).script()


def evaluates_tcl(value: str) -> bool:
    """Whether Nuke, evaluating `value` as TCL (file and label knobs), would substitute
    something: a ``[`` or ``$`` not escaped by an odd run of backslashes."""
    index = 0
    while index < len(value):
        char = value[index]
        if char == "\\":
            index += 2
            continue
        if char in "[$":
            return True
        index += 1
    return False


def tcl_unliteral(value: str) -> str:
    """What TCL evaluation makes of a value escaped with backslashes (one level)."""
    return re.sub(r"\\(.)", r"\1", value, flags=re.DOTALL)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.stack: list[str | None] = []
        self.variables: dict[str, str | None] = {}
        self.result = NkScript()

    def script(self) -> NkScript:
        while True:
            self._skip_space()
            if self.pos >= len(self.text):
                return self.result
            if self.text[self.pos] == "#":
                line = self._rest_of_line()
                self.result.comments.append(line[1:].strip())
                continue
            word = self._command_word()
            if word == "version":
                self.result.version = self._rest_of_line().strip()
            elif word == "set":
                self._set(self._rest_of_line().strip())
            elif word == "push":
                self._push(self._rest_of_line().strip())
            else:
                self._node(word)

    # -- commands -----------------------------------------------------------------------
    def _set(self, args: str) -> None:
        match = re.fullmatch(r"(\w+) \[stack 0\]", args)
        if not match or not self.stack:
            raise self._error(f"bad set {args!r} (or an empty stack)")
        self.variables[match.group(1)] = self.stack[-1]

    def _push(self, arg: str) -> None:
        if arg == "0":
            self.stack.append(None)
        elif arg.startswith("$") and arg[1:] in self.variables:
            self.stack.append(self.variables[arg[1:]])
        else:
            raise self._error(f"push of an unknown variable {arg!r}")

    def _node(self, cls: str) -> None:
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", cls):
            raise self._error(f"{cls!r} is not a node class")
        self._skip_blanks()
        if self.text[self.pos : self.pos + 1] != "{":
            raise self._error(f"{cls} without a knob block")
        self.pos += 1
        words: list[str] = []
        while True:
            self._skip_space()
            if self.pos >= len(self.text):
                raise self._error(f"{cls} block is not closed")
            if self.text[self.pos] == "}":
                self.pos += 1
                break
            words.append(self._word())
        if len(words) % 2:
            raise self._error(f"{cls}: knob {words[-1]!r} has no value")
        knobs: dict[str, str] = {}
        for name, value in zip(words[::2], words[1::2], strict=True):
            if not _IDENTIFIER.match(name) or name in knobs:
                raise self._error(f"{cls}: bad or repeated knob name {name!r}")
            knobs[name] = value
        count = int(knobs.pop("inputs", "1"))
        if cls == "Root":
            self.result.root = knobs
            return
        if len(self.stack) < count:
            raise self._error(f"{cls} {knobs.get('name')}: {count} inputs, stack has fewer")
        inputs = tuple(self.stack.pop() for _ in range(count))
        node = NkNode(cls, knobs, inputs)
        if "name" not in knobs:
            raise self._error(f"{cls} node without a name")
        self.result.nodes.append(node)
        self.stack.append(node.name)

    # -- words ----------------------------------------------------------------------------
    def _word(self) -> str:
        char = self.text[self.pos]
        if char == '"':
            value = self._quoted()
        elif char == "{":
            value = self._braced()
        else:
            start = self.pos
            while self.pos < len(self.text) and not self.text[self.pos].isspace():
                if self.text[self.pos] == "}":
                    break
                self.pos += 1
            value = self.text[start : self.pos]
            bad = sorted(set(value) & _BARE_FORBIDDEN)
            if bad:
                raise self._error(f"bare word {value!r} holds {bad}")
            return value
        if self.pos < len(self.text) and not (
            self.text[self.pos].isspace() or self.text[self.pos] == "}"
        ):
            raise self._error("a quoted value runs into the next word")
        return value

    def _quoted(self) -> str:
        self.pos += 1
        out: list[str] = []
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == '"':
                self.pos += 1
                return "".join(out)
            if char == "\\":
                out.append(self._escape())
                continue
            if char in "[$":
                raise self._error(f"unescaped {char!r} in a quoted value: Nuke substitutes it")
            if char in "\n\r":
                raise self._error("a raw line break inside a quoted value")
            out.append(char)
            self.pos += 1
        raise self._error("quoted value is not closed")

    def _escape(self) -> str:
        code = self.text[self.pos + 1 : self.pos + 2]
        if code in _LITERAL_ESCAPES:
            self.pos += 2
            return code
        if code in _SIMPLE_ESCAPES:
            self.pos += 2
            return _SIMPLE_ESCAPES[code]
        if code == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", self.text[self.pos + 2 : self.pos + 6]):
            value = chr(int(self.text[self.pos + 2 : self.pos + 6], 16))
            self.pos += 6
            return value
        raise self._error(f"unexpected escape \\{code}")

    def _braced(self) -> str:
        depth, start = 0, self.pos
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == "\\":
                self.pos += 2
                continue
            depth += {"{": 1, "}": -1}.get(char, 0)
            self.pos += 1
            if depth == 0:
                return self.text[start + 1 : self.pos - 1]
        raise self._error("braced value is not closed")

    # -- scanning -------------------------------------------------------------------------
    def _command_word(self) -> str:
        start = self.pos
        while self.pos < len(self.text) and not self.text[self.pos].isspace():
            self.pos += 1
        return self.text[start : self.pos]

    def _rest_of_line(self) -> str:
        end = self.text.find("\n", self.pos)
        end = len(self.text) if end < 0 else end
        line, self.pos = self.text[self.pos : end], end
        return line

    def _skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def _skip_blanks(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1

    def _error(self, reason: str) -> NukeParseError:
        line = self.text.count("\n", 0, self.pos) + 1
        return NukeParseError(f"line {line}: {reason}")
