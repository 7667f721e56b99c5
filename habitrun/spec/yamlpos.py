"""Read YAML into plain data while remembering where every node came from.

Why not ruamel's round-trip objects: the models want plain dicts/lists, error
messages want ``line:col`` for any field path, and safety wants a closed list
of tags. So the document is *composed* (nodes with marks, nothing built), and
this module builds plain values itself: only the YAML core tags are accepted,
duplicate keys are errors, merge keys (``<<``) work, and alias expansion is
bounded so a "billion laughs" file cannot exhaust memory.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from habitrun.errors import RecipeError

Path_ = tuple[Any, ...]
"""A field path: dict keys and list indices from the document root."""

MIN_NODE_LIMIT = 100_000
"""Values built per document, aliases counted each time they are expanded, are
capped at this or the text's length, whichever is larger: without aliases a
document cannot hold more values than characters, so only alias bombs hit it."""

_CORE = "tag:yaml.org,2002:"
_SCALAR_TAGS = {f"{_CORE}{t}" for t in ("str", "int", "float", "bool", "null")}
_TIMESTAMP = f"{_CORE}timestamp"
_MAP, _SEQ, _MERGE = f"{_CORE}map", f"{_CORE}seq", f"{_CORE}merge"


def format_path(path: Path_) -> str:
    """``("stages", 1, "policy", "workers")`` -> ``stages[1].policy.workers``."""
    out = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


@dataclass
class Positions:
    """1-based (line, col) of values and keys by field path, plus the file's name."""

    source: str
    values: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    keys: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    ints: dict[Path_, str] = field(default_factory=dict)
    """Source text of each unquoted integer (``002`` for the value 2), for ids matched as written."""

    def locate(self, path: Path_, *, key: bool = False) -> tuple[int, int]:
        """Position of ``path`` (its key if ``key``), else of its nearest recorded ancestor."""
        if key and path in self.keys:
            return self.keys[path]
        for n in range(len(path), -1, -1):
            pos = self.values.get(tuple(path[:n]))
            if pos is not None:
                return pos
        return (1, 1)


def unreadable_value(text: str, exc: Exception) -> str:
    """Why ``text`` cannot be read, without repeating all of a huge value."""
    digits = sum(ch.isdigit() for ch in text)
    if "digits" in str(exc) and digits > 50:
        return (f"a number of {digits} digits is too long to read (at most "
                f"{sys.get_int_max_str_digits() or digits - 1}); quote it to keep it as text")
    shown = text if len(text) <= 60 else text[:57] + "..."
    reason = str(exc)
    return f"cannot read value {shown!r}: {reason if len(reason) <= 200 else reason[:197] + '...'}"


def _tag(node: Node) -> str:
    tag = node.tag
    return str(getattr(tag, "value", tag))


def _mark(node: Node) -> tuple[int, int]:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


class _Builder:
    """Turns a composed node graph into plain Python values, collecting problems."""

    def __init__(self, loader: YAML, positions: Positions, limit: int) -> None:
        self.constructor = loader.constructor
        self.limit = limit
        self.pos = positions
        self.problems: list[str] = []
        self.count = 0

    def problem(self, node: Node, path: Path_, message: str) -> None:
        line, col = _mark(node)
        self.problems.append(f"{self.pos.source}:{line}:{col}: {format_path(path)}: {message}")

    def build(self, node: Node, path: Path_, active: frozenset[int] = frozenset()) -> Any:
        self.count += 1
        if self.count > self.limit:
            raise RecipeError(
                f"{self.pos.source}:{_mark(node)[0]}:{_mark(node)[1]}: {format_path(path)}: "
                f"the document expands to more than {self.limit} values (aliases?)"
            )
        self.pos.values.setdefault(path, _mark(node))
        if id(node) in active:
            self.problem(node, path, "an alias refers to a node that contains it")
            return None
        tag = _tag(node)
        if isinstance(node, ScalarNode):
            return self.scalar(node, path, tag)
        if isinstance(node, SequenceNode):
            if tag != _SEQ:
                self.problem(node, path, f"tag {tag!r} is not allowed (only plain YAML values)")
                return None
            inner = active | {id(node)}
            return [self.build(item, (*path, i), inner) for i, item in enumerate(node.value)]
        if isinstance(node, MappingNode):
            if tag != _MAP:
                self.problem(node, path, f"tag {tag!r} is not allowed (only plain YAML values)")
                return None
            return self.mapping(node, path, active | {id(node)})
        self.problem(node, path, "unsupported YAML node")
        return None

    def scalar(self, node: ScalarNode, path: Path_, tag: str) -> Any:
        if tag == _TIMESTAMP:
            return str(node.value)  # dates stay text: they go to JSON and file names
        if tag not in _SCALAR_TAGS:
            self.problem(node, path, f"tag {tag!r} is not allowed (only plain YAML values)")
            return None
        try:
            value = self.constructor.construct_object(node, deep=True)
        except (YAMLError, ValueError, TypeError) as exc:
            self.problem(node, path, unreadable_value(str(node.value), exc))
            return None
        if type(value) is int and not node.style:
            self.pos.ints.setdefault(path, str(node.value))
        return value

    def key(self, node: Node, path: Path_) -> Any:
        if not isinstance(node, ScalarNode):
            self.problem(node, path, "a key must be a plain value, not a list or mapping")
            return None
        tag = _tag(node)
        value = self.scalar(node, path, tag)
        if isinstance(value, float) or value is None:
            self.problem(node, path, f"{node.value!r} is not a usable key")
            return None
        return value

    def merged_pairs(self, node: MappingNode, path: Path_, active: frozenset[int]) -> Iterator[tuple[Node, Node, bool]]:
        """(key node, value node, from_merge) in order; ``<<`` mappings expand in place."""
        for key_node, value_node in node.value:
            if _tag(key_node) == _MERGE:
                sources = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
                for src in sources:
                    if not isinstance(src, MappingNode) or id(src) in active:
                        self.problem(value_node, path, "'<<' must merge a mapping (or a list of mappings)")
                        continue
                    for pair in self.merged_pairs(src, path, active | {id(src)}):
                        yield pair[0], pair[1], True
            else:
                yield key_node, value_node, False

    def mapping(self, node: MappingNode, path: Path_, active: frozenset[int]) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        explicit: set[Any] = set()
        merged_later: list[tuple[Any, Node, Node]] = []
        for key_node, value_node, from_merge in self.merged_pairs(node, path, active):
            key = self.key(key_node, path)
            if key is None:
                continue
            if from_merge:
                merged_later.append((key, key_node, value_node))
                continue
            if key in explicit:
                self.problem(key_node, (*path, key), f"duplicate key {key!r}")
                continue
            explicit.add(key)
            self.pos.keys.setdefault((*path, key), _mark(key_node))
            out[key] = self.build(value_node, (*path, key), active)
        for key, key_node, value_node in merged_later:
            if key not in out:  # explicit keys win over merged ones, first merge wins
                self.pos.keys.setdefault((*path, key), _mark(key_node))
                out[key] = self.build(value_node, (*path, key), active)
        return out


def _syntax_problem(source: str, exc: YAMLError) -> str:
    if isinstance(exc, MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        what = " ".join(str(p) for p in (exc.context, exc.problem) if p) or str(exc)
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        return f"{source}:{line}:{col}: syntax: {what}"
    position = getattr(exc, "position", None)
    text = " ".join(str(exc).split())
    if isinstance(position, int):
        return f"{source}: syntax: {text} (at character {position})"
    return f"{source}:1:1: syntax: {text}"


def load_with_positions(text: str, source: str) -> tuple[Any, Positions]:
    """Parse one YAML document into plain data and the positions of its nodes.

    Raises :class:`RecipeError` for a syntax error, a non-core tag, a
    duplicate key or more than one document.
    """
    loader = YAML(typ="safe", pure=True)
    positions = Positions(source)
    try:
        nodes = list(loader.compose_all(text))
    except YAMLError as exc:
        raise RecipeError([_syntax_problem(source, exc)]) from None
    except RecursionError:
        raise RecipeError([f"{source}:1:1: syntax: the document is nested too deeply"]) from None
    if not nodes:
        return None, positions
    if len(nodes) > 1:
        line, col = _mark(nodes[1])
        lines = text.splitlines()
        marker = next((n for n in range(line - 1, 0, -1) if lines[n - 1].startswith("---")), None)
        line, col = (marker, 1) if marker else (line, col)
        raise RecipeError([f"{source}:{line}:{col}: syntax: expected one YAML document, found several (remove '---')"])
    builder = _Builder(loader, positions, max(MIN_NODE_LIMIT, len(text)))
    try:
        data = builder.build(nodes[0], ())
    except RecursionError:
        raise RecipeError([f"{source}:1:1: syntax: the document is nested too deeply"]) from None
    if builder.problems:
        raise RecipeError(builder.problems)
    return data, positions


def parse_scalar(text: str) -> Any:
    """One value as YAML reads it (``8`` -> 8, ``null`` -> None, ``[a, b]`` -> list).

    Raises :class:`RecipeError` (without position) when it is not valid YAML.
    """
    data, _ = load_with_positions(text, "<value>")
    return data


def dump_yaml(data: Any) -> str:
    """Plain data as YAML text that loads back equal.

    Readable UTF-8 normally; ruamel mangles a few characters (a NEL, U+0085,
    for one), so when the text does not read back equal it is written again
    with every non-ASCII character escaped.
    """
    import io

    for allow_unicode in (True, False):
        yaml = YAML(typ="safe", pure=True)
        yaml.default_flow_style = False
        yaml.allow_unicode = allow_unicode
        yaml.sort_base_mapping_type_on_output = False  # type: ignore[assignment]
        out = io.StringIO()
        yaml.dump(data, out)
        text = out.getvalue()
        if allow_unicode and YAML(typ="safe", pure=True).load(text) != data:
            continue
        return text
    raise AssertionError("unreachable")  # pragma: no cover
