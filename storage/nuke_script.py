"""A small writer of Nuke's ``.nk`` text format: typed nodes in, script text out.

Why our own: the platform must write a script without Nuke (no ``nuke`` module on the farm),
and a template filled with f-strings lets a path or shot name break out of its quotes.

The format (Nuke's scripting layer is TCL; a saved script is a TCL script):

- ``version 13.0 v1`` names the Nuke release the script is for; ``#`` lines are comments.
- ``Root { ... }`` and one ``Class { ... }`` command per node. The braces hold the knobs as
  name/value pairs, one pair a line here; ``inputs N`` says how many inputs the node takes
  from the node stack (left out when it is 1, as Nuke writes it; ``inputs 0`` for a Read).
- Every node, once made, is pushed on a stack; a node with N inputs pops N nodes, the top
  being input 0. ``set N1 [stack 0]`` keeps the top of the stack in a variable and
  ``push $N1`` pushes it again, which is how one Read feeds several nodes. (Nuke TCL builtins
  ``push``/``stack``: nukepedia.com/reference/Tcl/group__tcl__builtin.html; the node-command
  and operator-stack description: nukepedia.com/reference/Tcl. The same shapes are in every
  saved script, e.g. the Psyop Cryptomatte gizmo, Psyop/Cryptomatte nuke/Cryptomatte.gizmo.)

Values: numbers are written plain, booleans as ``true``/``false``; a string that is only
letters, digits and ``_ . / : + - %`` is written bare, any other string in double quotes with
``\\ " [ ] $ { }`` and control characters backslash-escaped, so nothing in it is substituted
or ends the value when Nuke parses the script (non-ASCII text is written as UTF-8).

Nuke evaluates ``[...]`` TCL expressions again inside some knob *values* when it uses them
(file paths, labels); `tcl_literal` escapes a value for those knobs so that a path holding
``[`` or ``$`` is read as text, not run.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from storage.atomic import atomic_write_bytes
from storage.location import Where

KnobValue = str | int | float | bool
KnobItems = tuple[tuple[str, KnobValue], ...]
Knobs = KnobItems | Mapping[str, KnobValue]

DEFAULT_VERSION = "13.0 v1"  # the native Cryptomatte node needs Nuke 13.0 or later
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CLASS = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_VERSION = re.compile(r"^\d+\.\d+ v\d+$")
_BARE = re.compile(r"^[A-Za-z0-9_./:+%-]+$")
_ESCAPES = {
    "\\": "\\\\",
    '"': '\\"',
    "[": "\\[",
    "]": "\\]",
    "$": "\\$",
    "{": "\\{",
    "}": "\\}",
    "\n": "\\n",
    "\t": "\\t",
    "\r": "\\r",
}
_NEEDS_ESCAPE = re.compile(r'[\\"\[\]${}\x00-\x1f\x7f]')
_COMMENT_UNSAFE = re.compile(r'[\\{}\[\]$"\x00-\x1f\x7f]')
# Knobs that are not knobs: the node's name and input count have fields of their own.
_RESERVED_KNOBS = frozenset({"name", "inputs"})


@dataclass(frozen=True)
class NukeNode:
    """One node: its class, its name, its knobs in writing order and its inputs.

    `inputs` names earlier nodes of the script, input 0 first. `knobs` may be given as a
    mapping or as (name, value) pairs; it is kept as pairs.
    """

    cls: str
    name: str
    knobs: Knobs = ()
    inputs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "knobs", _knob_items(self.knobs, f"node {self.name!r}"))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        if not _CLASS.match(self.cls):
            raise ValueError(f"node {self.name!r}: {self.cls!r} is not a Nuke node class name")
        if not _IDENTIFIER.match(self.name):
            raise ValueError(
                f"node name {self.name!r}: Nuke node names are letters, digits and _, "
                "not starting with a digit"
            )
        reserved = [name for name, _ in self.items if name in _RESERVED_KNOBS]
        if reserved:
            raise ValueError(f"node {self.name!r}: {reserved} are fields of NukeNode, not knobs")

    @property
    def items(self) -> KnobItems:
        """The knobs as (name, value) pairs, in writing order."""
        return cast(KnobItems, self.knobs)

    def knob(self, name: str) -> KnobValue:
        """The value of knob `name` (KeyError when the node does not set it)."""
        for key, value in self.items:
            if key == name:
                return value
        raise KeyError(f"node {self.name!r} has no knob {name!r}")


@dataclass(frozen=True)
class NukeScript:
    """A whole script: Root knobs, nodes in writing order, header comments."""

    root: Knobs = ()
    nodes: tuple[NukeNode, ...] = ()
    comments: tuple[str, ...] = ()
    version: str = DEFAULT_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", _knob_items(self.root, "Root"))
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "comments", tuple(self.comments))
        if not _VERSION.match(self.version):
            raise ValueError(f"version {self.version!r}: expected e.g. '13.0 v1'")

    def node(self, name: str) -> NukeNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"the script has no node {name!r}")


@dataclass
class _Stack:
    """What the writer knows of Nuke's node stack: the top, and the saved variables."""

    top: str | None = None
    saved: dict[str, str] = field(default_factory=dict)  # node name -> variable


def render(script: NukeScript) -> str:
    """The `.nk` text of `script`. Raises ValueError for names that clash or inputs that
    name a node not written before."""
    used_later = _nodes_needing_variables(script.nodes)
    lines = [f"# {_comment(text)}" for comment in script.comments for text in comment.split("\n")]
    lines.append(f"version {script.version}")
    lines.extend(_block("Root", (("inputs", 0), *cast(KnobItems, script.root))))
    stack = _Stack()
    seen: set[str] = set()
    for index, node in enumerate(script.nodes, start=1):
        if node.name in seen:
            raise ValueError(f"node name {node.name!r} is used twice")
        missing = [name for name in node.inputs if name not in seen]
        if missing:
            raise ValueError(f"node {node.name!r}: inputs {missing} are not written before it")
        seen.add(node.name)
        if not (len(node.inputs) == 1 and stack.top == node.inputs[0]):
            # top of the stack is input 0: push the last input first
            lines.extend(f"push ${stack.saved[name]}" for name in reversed(node.inputs))
        head: list[tuple[str, KnobValue]] = []
        if len(node.inputs) != 1:
            head.append(("inputs", len(node.inputs)))
        lines.extend(_block(node.cls, (*head, *node.items, ("name", node.name))))
        stack.top = node.name
        if node.name in used_later:
            variable = f"N{index:08x}"
            lines.append(f"set {variable} [stack 0]")
            stack.saved[node.name] = variable
    return "\n".join(lines) + "\n"


def quote(value: KnobValue) -> str:
    """One knob value as Nuke script text (see the module docstring)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} cannot be written to a Nuke script")
        text = repr(value)
        return text[:-2] if text.endswith(".0") else text
    if isinstance(value, str):
        if _BARE.match(value):
            return value
        return '"' + _NEEDS_ESCAPE.sub(_escape, value) + '"'
    raise TypeError(f"knob values are str, int, float or bool, not {type(value).__name__}")


def tcl_literal(text: str) -> str:
    """`text` escaped for a knob whose value Nuke evaluates as TCL (file paths, labels):
    a backslash before every ``\\``, ``[`` and ``$``, so the value reads as itself."""
    return re.sub(r"([\\\[$])", r"\\\1", text)


def write_nuke_script(where: Where, text: str) -> str:
    """Write script `text` to `where` (local path or object store) atomically; returns its
    URI. Raises StorageError naming the file when it cannot be written.
    """
    return atomic_write_bytes(where, text.encode("utf-8")).uri


def _block(cls: str, knobs: Iterable[tuple[str, KnobValue]]) -> list[str]:
    return [f"{cls} {{", *(f" {name} {quote(value)}" for name, value in knobs), "}"]


def _nodes_needing_variables(nodes: Sequence[NukeNode]) -> set[str]:
    """Nodes some later node takes as input other than straight off the top of the stack."""
    needed: set[str] = set()
    previous: str | None = None
    for node in nodes:
        if not (len(node.inputs) == 1 and node.inputs[0] == previous):
            needed.update(node.inputs)
        previous = node.name
    return needed


def _knob_items(knobs: Knobs, owner: str) -> KnobItems:
    items = tuple(knobs.items()) if isinstance(knobs, Mapping) else tuple(knobs)
    names: set[str] = set()
    for name, value in items:
        if not isinstance(name, str) or not _IDENTIFIER.match(name):
            raise ValueError(f"{owner}: {name!r} is not a knob name")
        if name in names:
            raise ValueError(f"{owner}: knob {name!r} is set twice")
        names.add(name)
        quote(value)  # refuse what cannot be written now, not at render time
    return items


def _escape(match: re.Match[str]) -> str:
    char = match.group(0)
    return _ESCAPES.get(char) or f"\\u{ord(char):04x}"


def _comment(text: str) -> str:
    """A comment line that cannot continue onto the next line or unbalance a brace."""
    return _COMMENT_UNSAFE.sub("?", text)
