"""The documentation page "feddg.yaml reference", generated from the experiment schema, never typed.

    python -m feddg.docs_reference            # (re)write docs/reference/feddg-yaml.md (run in the clone's root)
    python -m feddg.docs_reference --check    # write nothing; exit 1 naming the drift

The page lists every section and key of ``feddg.yaml`` with its type, default, allowed values or range and
description, all read from the schema (a pydantic v2 model whose fields are the sections, nested models being
sections of their own): the type and the constraints from its JSON schema, the default from the field, the
description from ``Field(description=...)`` and a section's from its class docstring. Nothing on the page is typed
by hand, so the page cannot disagree with the file the jobs are checked against; a test keeps the committed page
equal to :func:`render`'s output.

With ``require_descriptions`` (``--require-descriptions``) a key or section without a description is refused, every
one named at once (``train.rounds: no description``), so that every key the reader can set is explained.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

PAGE = Path("docs/reference/feddg-yaml.md")  # relative to the repository root
SCHEMA = "feddg.experiment:experiment_schema"  # the whole feddg.yaml: base sections and every method's section
GENERATOR = "python -m feddg.docs_reference"

INTRO = """\
Every job carries one `app/config/feddg.yaml`, read by the server and by every site. It is checked strictly before
anything runs: a value of the wrong type is refused, not converted (an integer is accepted where a number is meant),
as are unknown keys and values outside the ranges below; a file must name `data.task` and `data.root` itself
(`null` for the synthetic data). Checks that relate keys to each other (a held-out site among `data.sites`, a
layout that fits the task, a method's own cross-field checks) run after these; [Jobs and feddg.yaml](../jobs.md)
says how a job is configured and how `--set section.key=value` changes one key without editing files.

A default shown here is the schema's; the committed jobs set several keys to their own values (their
`feddg.yaml` shows them all)."""


class UndescribedError(ValueError):
    """Keys or sections of the schema without a description; the message names every one of them."""


@dataclass(frozen=True)
class Key:
    """One row of a section's table."""

    name: str
    type: str
    default: str
    allowed: str
    description: str


@dataclass(frozen=True)
class Section:
    """One ``feddg.yaml`` section (a nested model of the schema) and its keys, in the schema's order."""

    path: str  # dotted: "data.synthetic"
    description: str
    keys: tuple[Key, ...]


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _anchor(path: str) -> str:
    return path.replace(".", "-")


def _text(value: str | None) -> str:
    """A description as one table-safe markdown line: whitespace collapsed, reST ``code`` as markdown `code`,
    pipes escaped."""
    return " ".join((value or "").split()).replace("``", "`").replace("|", "\\|")


def _section_text(field: Any, model: type[BaseModel]) -> str:
    """A section's description: the field's description (what the parent schema says the section is), then the
    section model's docstring (what its keys are about), either one alone where the other is missing."""
    parts = [_text(field.description).rstrip("."), _text(inspect.cleandoc(model.__doc__) if model.__doc__ else "")]
    parts = [p[:1].upper() + p[1:] for p in parts if p]
    return ". ".join(p.rstrip(".") for p in parts) + "." if parts else ""


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    return defs[ref.rsplit("/", 1)[1]] if ref else node


_TYPES = {"integer": "integer", "number": "number", "string": "string", "boolean": "boolean", "null": "null",
          "object": "mapping"}
_PY_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}


def _type(node: dict[str, Any], defs: dict[str, Any]) -> str:
    """A JSON-schema node as a reader's type: ``integer or null``, ``list of number``."""
    node = _resolve(node, defs)
    if "anyOf" in node:
        return " or ".join(_type(option, defs) for option in node["anyOf"])
    kind = node.get("type")
    if kind == "array":
        return f"list of {_type(node['items'], defs)}" if "items" in node else "list"
    if kind is None and ("const" in node or "enum" in node):  # a Literal of mixed types
        values = node["enum"] if "enum" in node else [node["const"]]
        return " or ".join(dict.fromkeys(_PY_TYPES.get(type(v), "value") for v in values))
    return _TYPES.get(kind, str(kind or "any"))


def _bound(node: dict[str, Any], inclusive: str, exclusive: str) -> tuple[str, str] | None:
    """A numeric bound of a JSON-schema node as (comparison seen from the bound's side, value), or None."""
    if inclusive in node:
        return "<=", json.dumps(node[inclusive])
    if exclusive in node:
        return "<", json.dumps(node[exclusive])
    return None


def _range(node: dict[str, Any]) -> str:
    """``0 <= x < 1``, ``x >= 1``, ``x > 0``: the numeric bounds of a node, or ""."""
    low = _bound(node, "minimum", "exclusiveMinimum")
    high = _bound(node, "maximum", "exclusiveMaximum")
    if low and high:
        return f"{low[1]} {low[0]} x {high[0]} {high[1]}"
    if low:
        return f"x {low[0].replace('<', '>')} {low[1]}"
    if high:
        return f"x {high[0]} {high[1]}"
    return ""


def _allowed(node: dict[str, Any], defs: dict[str, Any]) -> str:
    """What a node accepts beyond its type: choices, numeric range, length, pattern, item constraints."""
    node = _resolve(node, defs)
    if "anyOf" in node:
        return "; ".join(a for a in (_allowed(option, defs) for option in node["anyOf"]) if a)
    parts = []
    if "enum" in node:
        parts.append("one of " + ", ".join(f"`{json.dumps(v)}`" for v in node["enum"]))
    if "const" in node:
        parts.append(f"only `{json.dumps(node['const'])}`")
    if bounds := _range(node):
        parts.append(bounds)
    if "minLength" in node or "maxLength" in node:
        low, high = node.get("minLength"), node.get("maxLength")
        parts.append("length " + (f"{low}-{high}" if low is not None and high is not None else
                                  f">= {low}" if low is not None else f"<= {high}"))
    if "pattern" in node:
        parts.append(f"matches `{node['pattern']}`")
    if node.get("type") == "array":
        low, high = node.get("minItems"), node.get("maxItems")
        if low is not None and low == high:
            parts.append(f"exactly {low} items")
        elif low is not None or high is not None:
            parts.append("items: " + (f"{low}-{high}" if low is not None and high is not None else
                                      f"at least {low}" if low is not None else f"at most {high}"))
        if "items" in node and (each := _allowed(node["items"], defs)):
            parts.append(f"each {each}")
    return "; ".join(parts)


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True, validated_data={})
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return f"`{json.dumps(value)}`"


def sections(schema: type[BaseModel], prefix: str = "", description: str = "") -> Iterator[Section]:
    """Every section of ``schema``, depth first, each followed by the sections nested in it (``prefix``: the
    dotted path of ``schema`` itself, "" for the whole file; ``description``: its own)."""
    json_schema = schema.model_json_schema(mode="validation")
    defs = json_schema.get("$defs", {})
    properties = json_schema.get("properties", {})
    keys, nested = [], []
    for name, field in schema.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        if _is_section(field.annotation):
            nested.append((path, field.annotation, _section_text(field, field.annotation)))
            keys.append(Key(name, "section", "", "", f"see [`{path}`](#{_anchor(path)})"))
            continue
        node = properties[field.alias or name]
        keys.append(Key(name, _type(node, defs), _default(field), _allowed(node, defs), _text(field.description)))
    if prefix:
        yield Section(prefix, description, tuple(keys))
    elif any(k.type != "section" for k in keys):  # keys at the top level of the file, outside any section
        yield Section("", "", tuple(k for k in keys if k.type != "section"))
    for path, model, text in nested:
        yield from sections(model, path, text)


def undescribed(schema: type[BaseModel]) -> list[str]:
    """The dotted paths of every section and key of ``schema`` without a description."""
    missing = []
    for section in sections(schema):
        if section.path and not section.description:
            missing.append(f"{section.path} (section)")
        missing += [f"{section.path + '.' if section.path else ''}{k.name}" for k in section.keys
                    if k.type != "section" and not k.description]
    return missing


def render(schema: type[BaseModel], *, require_descriptions: bool = False) -> str:
    """The reference page for ``schema`` (markdown). UndescribedError, naming every key and section without a
    description, when ``require_descriptions`` is set and any lacks one."""
    if require_descriptions and (missing := undescribed(schema)):
        raise UndescribedError("no description (give each key, and each section, "
                               f"Field(description=...)): {', '.join(missing)}")
    out = ["# feddg.yaml reference", "",
           f"<!-- Generated by `{GENERATOR}` from the experiment schema; edit the schema's descriptions and "
           "regenerate, never this page. -->", "", INTRO, ""]
    for section in sections(schema):
        title = f"`{section.path}`" if section.path else "Top level"
        out += [f"## {title} {{#{_anchor(section.path) or 'top-level'}}}", ""]
        if section.description:
            out += [section.description, ""]
        out += ["| key | type | default | allowed | description |", "| --- | --- | --- | --- | --- |"]
        out += [f"| `{k.name}` | {k.type} | {k.default} | {k.allowed} | {k.description} |" for k in section.keys]
        out.append("")
    return "\n".join(out)


def load_schema(spec: str) -> type[BaseModel]:
    """``module:name`` -> the pydantic model class it names, or that a function of that name returns."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"--schema {spec!r}: expected module:name, e.g. {SCHEMA}")
    importlib.import_module("feddg.flare.registry")  # registers the methods' sections in the experiment model
    try:
        target = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"--schema {spec!r}: {e}") from None
    schema = target() if callable(target) and not _is_section(target) else target
    if not _is_section(schema):
        raise ValueError(f"--schema {spec!r}: not a pydantic model class (got {schema!r})")
    return schema


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=GENERATOR, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--page", type=Path, default=PAGE, help=f"the page to write or check (default: {PAGE})")
    parser.add_argument("--schema", default=SCHEMA, help=f"module:name of the schema (default: {SCHEMA})")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the page differs")
    parser.add_argument("--require-descriptions", action="store_true",
                        help="refuse a key or section without a description")
    args = parser.parse_args(argv)
    try:
        text = render(load_schema(args.schema), require_descriptions=args.require_descriptions)
    except ValueError as e:  # UndescribedError included
        print(f"{GENERATOR}: {e}", file=sys.stderr)
        return 2
    if args.check:
        current = args.page.read_text() if args.page.is_file() else None
        if current != text:
            what = ("is missing" if current is None else
                    f"differs from the schema {args.schema} ({_first_difference(current, text)})")
            print(f"{args.page}: {what}; regenerate with {GENERATOR}", file=sys.stderr)
            return 1
        return 0
    args.page.parent.mkdir(parents=True, exist_ok=True)
    args.page.write_text(text)
    return 0


def _first_difference(old: str, new: str) -> str:
    """The first line where the committed page and the generated one differ, both shown."""
    old_lines, new_lines = old.splitlines(), new.splitlines()
    for number, (a, b) in enumerate(zip(old_lines, new_lines), 1):
        if a != b:
            return f"line {number}: page {a!r}, schema {b!r}"
    return f"the page has {len(old_lines)} lines, the schema gives {len(new_lines)}"


if __name__ == "__main__":
    sys.exit(main())
