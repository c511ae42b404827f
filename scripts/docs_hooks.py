"""MkDocs hooks: the reference pages are generated from the code at build time, never copied.

A page holds a marker such as ``<!-- generated: cli -->``; :func:`on_page_markdown` replaces it
with Markdown built from the objects themselves:

- ``cli``: every command of the typer app, its help, arguments and options with defaults;
- ``configuration``: every field of :class:`ctxwarden.config.Settings`, its type, default,
  environment variable and the ``#:`` comment above it in the source;
- ``records``: every field of :class:`ctxwarden.types.Record` the same way;
- ``http``: every operation of the HTTP API's OpenAPI schema, its parameters, request body
  fields and response model (``/openapi.json`` is also written into the site).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import re
from collections.abc import Callable, Iterable
from typing import Any

MARKER = re.compile(r"<!-- generated: ([a-z]+) -->")


def _field_comments(cls: type) -> dict[str, str]:
    """The ``#:`` comment lines directly above each annotated field of ``cls``."""
    source = inspect.getsource(cls)
    lines = source.splitlines()
    comments: dict[str, str] = {}
    for node in (
        ast.parse(inspect.cleandoc("\n" + source) if source[:1].isspace() else source).body[0].body
    ):  # type: ignore[attr-defined]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            text: list[str] = []
            index = node.lineno - 2
            while index >= 0 and lines[index].strip().startswith("#:"):
                text.insert(0, lines[index].strip()[2:].strip())
                index -= 1
            comments[node.target.id] = " ".join(text)
    return comments


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, str):
        text = annotation
    elif getattr(annotation, "__args__", None) or not hasattr(annotation, "__name__"):
        text = str(annotation)  # list[str], str | None, Literal[...]
    else:
        text = annotation.__name__
    return text.replace("typing.", "").replace("collections.abc.", "")


# -- cli -----------------------------------------------------------------------------------------


def _commands(group: Any, prefix: str) -> Iterable[tuple[str, Any]]:
    for name in sorted(group.commands):
        command = group.commands[name]
        path = f"{prefix} {name}"
        if hasattr(command, "commands"):
            yield from _commands(command, path)
        else:
            yield path, command


def _param_rows(params: Iterable[Any]) -> list[str]:
    rows = ["| argument or option | default | what it does |", "|---|---|---|"]
    for param in params:
        if getattr(param, "hidden", False) or param.name == "help":
            continue
        names = ", ".join(f"`{o}`" for o in param.opts)
        if type(param).__name__.endswith("Argument"):
            names = f"`{param.name.upper()}` (argument)"
        default = "required" if param.required else param.default
        if default in (None, False, ()):
            default = ""
        elif not isinstance(default, str) or default != "required":
            default = f"`{default}`"
        rows.append(f"| {names} | {default} | {_cell(param.help or '')} |")
    return rows


def cli_reference() -> str:
    """Every command of ``ctxwarden``, from the typer app."""
    import typer.main

    from ctxwarden.cli import app

    root = typer.main.get_command(app)
    out = ["## Global options", "", *_param_rows(root.params), ""]
    for path, command in _commands(root, "ctxwarden"):
        out += [f"## `{path.strip()}`", "", inspect.cleandoc(command.help or ""), ""]
        out += [*_param_rows(command.params), ""]
    return "\n".join(out)


# -- settings and records ------------------------------------------------------------------------


def configuration_reference() -> str:
    """Every setting, from :class:`ctxwarden.config.Settings`."""
    from pydantic_core import PydanticUndefined

    from ctxwarden.config import Settings

    comments = _field_comments(Settings)
    out = [
        "| setting | environment variable | type | default | what it does |",
        "|---|---|---|---|---|",
    ]
    for name, info in Settings.model_fields.items():
        if info.default_factory is not None:
            default = "(computed)" if name == "db" else f"`{info.default_factory()!r}`"  # type: ignore[call-arg]
        elif info.default is PydanticUndefined:
            default = "required"
        else:
            default = f"`{info.default!r}`"
        env = f"`CTXWARDEN_{name.upper()}`"
        kind = _cell(_type_name(info.annotation))
        out.append(
            f"| `{name}` | {env} | `{kind}` | {_cell(default)} | {_cell(comments.get(name, ''))} |"
        )
    return "\n".join(out)


def records_reference() -> str:
    """Every field of a record, from :class:`ctxwarden.types.Record`."""
    from ctxwarden.types import Record

    comments = _field_comments(Record)
    out = ["| field | type | default | what it is |", "|---|---|---|---|"]
    for item in dataclasses.fields(Record):
        if item.default is not dataclasses.MISSING:
            default = f"`{item.default!r}`"
        elif item.default_factory is not dataclasses.MISSING:
            default = f"`{item.default_factory()!r}`"
        else:
            default = "required"
        out.append(
            f"| `{item.name}` | `{_cell(_type_name(item.type))}` | {_cell(default)} | "
            f"{_cell(comments.get(item.name, ''))} |"
        )
    return "\n".join(out)


# -- the HTTP API --------------------------------------------------------------------------------


def _schema() -> dict[str, Any]:
    from ctxwarden import Engine
    from ctxwarden.server.http import create_app

    with Engine.open(":memory:") as engine:
        return create_app(engine).openapi()


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref:
        return _resolve(schema, schema["components"]["schemas"][ref.rsplit("/", 1)[1]])
    return node


def _describe(schema: dict[str, Any], node: dict[str, Any]) -> str:
    if "$ref" in node:
        return str(node["$ref"].rsplit("/", 1)[1])
    if "anyOf" in node:
        return " or ".join(_describe(schema, n) for n in node["anyOf"])
    if node.get("type") == "array":
        return f"list of {_describe(schema, node.get('items', {}))}"
    if "enum" in node:
        return " \\| ".join(json.dumps(v) for v in node["enum"])
    if "const" in node:
        return json.dumps(node["const"])
    if node.get("type") == "object" or not node:
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and extra:
            return f"object of {_describe(schema, extra)}"
        return "object"
    return str(node.get("type", "any"))


def _fields(schema: dict[str, Any], node: dict[str, Any]) -> list[str]:
    model = _resolve(schema, node)
    required = set(model.get("required", ()))
    rows = ["| field | type | required | description |", "|---|---|---|---|"]
    for name, prop in model.get("properties", {}).items():
        rows.append(
            f"| `{name}` | {_cell(_describe(schema, prop))} | {'yes' if name in required else ''}"
            f" | {_cell(prop.get('description', ''))} |"
        )
    return rows


def http_reference(schema: dict[str, Any] | None = None) -> str:
    """Every operation of the HTTP API, from its OpenAPI schema."""
    schema = schema or _schema()
    out: list[str] = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            out += [f"## `{method.upper()} {path}`", ""]
            out += [inspect.cleandoc(operation.get("description") or operation.get("summary", ""))]
            out.append("")
            params = operation.get("parameters", [])
            if params:
                out += ["| parameter | in | type | required |", "|---|---|---|---|"]
                for param in params:
                    kind = _describe(schema, param.get("schema", {}))
                    needed = "yes" if param.get("required") else ""
                    out.append(f"| `{param['name']}` | {param['in']} | {_cell(kind)} | {needed} |")
                out.append("")
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if body:
                out += ["Request body:", "", *_fields(schema, body["schema"]), ""]
            ok = operation["responses"].get("200", {}).get("content", {}).get("application/json")
            if ok and "$ref" in ok["schema"]:
                name = ok["schema"]["$ref"].rsplit("/", 1)[1]
                out += [f"Answer (`{name}`):", "", *_fields(schema, ok["schema"]), ""]
            errors = sorted(s for s in operation["responses"] if s != "200")
            out += [
                f'Errors: {", ".join(errors)}, as `{{"error": {{type, message, field?}}}}`.',
                "",
            ]
    return "\n".join(out)


GENERATORS: dict[str, Callable[[], str]] = {
    "cli": cli_reference,
    "configuration": configuration_reference,
    "records": records_reference,
    "http": http_reference,
}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each ``<!-- generated: NAME -->`` marker with its generated Markdown."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"{page.file.src_path}: no generator {name!r}")
        return GENERATORS[name]()

    return MARKER.sub(replace, markdown)


def on_files(files: Any, config: Any) -> Any:
    """Add the HTTP API's OpenAPI schema to the site as ``openapi.json``."""
    from mkdocs.structure.files import File

    content = json.dumps(_schema(), indent=2)
    files.append(File.generated(config, "openapi.json", content=content))
    return files
