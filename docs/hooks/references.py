"""MkDocs hook: the configuration reference and the command-line reference, generated at build
time from the code, so they cannot drift from it (issue 46).

- ``reference/configuration.md`` from ``chord/config/schemas/*.schema.yaml``: every key (dotted
  path), its type, default, allowed values, the stages whose result it changes (``x-stages``;
  ``x-neutral`` says why a key changes none) and its description.
- ``reference/cli.md`` from the argparse parsers: ``chord`` and its subcommands
  (``chord.cli.main.build_parser``), ``chord train`` (``chord.cli.upstream_train.build_parser``)
  and the ``python -m`` tools the guides name.

Both pages exist only in the build (``on_files`` adds them); nothing is written to docs/.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import re
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG_PAGE = "reference/configuration.md"
CLI_PAGE = "reference/cli.md"
# The python -m tools the guides name; each builds its parser inside main(), which the hook
# runs with parse_args intercepted, so it reads the parser and runs nothing.
MODULE_TOOLS = (
    "chord.checks.fake_iteration",
    "chord.resources.job_size",
    "chord.guidance.tiny_vae_check",
)


def _import(name: str):
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(name)


# --- the configuration reference -------------------------------------------------------------


def _code(value) -> str:
    """A value as inline code, in JSON (YAML flow style reads it the same)."""
    if isinstance(value, Path):  # a default under the repository, as the user's checkout has it
        value = str(value.relative_to(ROOT) if value.is_relative_to(ROOT) else value)
    text = value if isinstance(value, str) else json.dumps(value)
    return f"`{text}`"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _slug(title: str) -> str:
    """Python-Markdown's toc anchor of a heading (its default slugify)."""
    text = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


@functools.cache
def _sections(doc: str) -> dict[str, str]:
    """``{N: anchor}`` of the numbered headings (``## N. Title``) of docs/<doc>.md."""
    text = (ROOT / "docs" / f"{doc}.md").read_text()
    found = re.finditer(r"^## (\d+)\. (.+?)\s*$", text, re.M)
    return {m[1]: _slug(f"{m[1]}. {m[2]}") for m in found}


def _linked(text: str) -> str:
    """A schema description with each ``§N`` a link into the method (or, after ``DESIGN``, the
    design), as the citations test attributes a bare ``§N``."""

    def link(m: re.Match) -> str:
        doc = "DESIGN" if m[1] else "METHOD"
        anchor = _sections(doc).get(m[2])
        return f"{m[1] or ''}[§{m[2]}](../{doc}.md#{anchor})" if anchor else m[0]

    return re.sub(r"(DESIGN )?§(\d+)", link, text)


def _resolve(spec: dict, defs: dict) -> dict:
    """``spec`` with a ``$ref`` to ``$defs`` merged in (the key's own fields win)."""
    ref = spec.get("$ref", "")
    if ref.startswith("#/$defs/"):
        return {**defs[ref.rsplit("/", 1)[1]], **{k: v for k, v in spec.items() if k != "$ref"}}
    return spec


def _type(spec: dict, defs: dict) -> str:
    spec = _resolve(spec, defs)
    if "const" in spec:
        return type(spec["const"]).__name__.replace("str", "string")
    if "enum" in spec:
        kinds = sorted({type(v).__name__ for v in spec["enum"]})
        return " or ".join(k.replace("str", "string").replace("int", "integer") for k in kinds)
    kind = spec.get("type", "any")
    kinds = kind if isinstance(kind, list) else [kind]
    out = []
    for k in kinds:
        if k == "array" and "items" in spec:
            out.append(f"list of {_type(spec['items'], defs)}")
        elif k == "object" and isinstance(spec.get("additionalProperties"), dict):
            out.append(f"mapping to {_type(spec['additionalProperties'], defs)}")
        else:
            out.append(k)
    return " or ".join(out)


BOUNDS = (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<"))


def _allowed(spec: dict, defs: dict) -> str:
    """The constraints a value must meet, as the schema states them."""
    spec = _resolve(spec, defs)
    parts = []
    if "const" in spec:
        parts.append(f"only {_code(spec['const'])}")
    if "enum" in spec:
        parts.append("one of " + ", ".join(_code(v) for v in spec["enum"]))
    parts += [f"{sign} {spec[key]}" for key, sign in BOUNDS if key in spec]
    if "not" in spec and "const" in spec["not"]:
        parts.append(f"not {_code(spec['not']['const'])}")
    if "pattern" in spec:
        parts.append(f"matches {_code(spec['pattern'])}")
    if "minItems" in spec or "maxItems" in spec:
        lo, hi = spec.get("minItems"), spec.get("maxItems")
        parts.append(f"exactly {lo} items" if lo == hi else f"{lo or 0} to {hi or 'any'} items")
    if spec.get("uniqueItems"):
        parts.append("no repeats")
    items = spec.get("items")
    if isinstance(items, dict) and (inner := _allowed(items, defs)):
        parts.append(f"each item {inner}")
    names = spec.get("propertyNames")
    if isinstance(names, dict) and (inner := _allowed(names, defs)):
        parts.append(f"keys {inner}")
    values = spec.get("additionalProperties")
    if isinstance(values, dict) and (inner := _allowed(values, defs)):
        parts.append(f"values {inner}")
    return "; ".join(parts)


def _reruns(spec: dict, section: str) -> str:
    """What re-runs when the key changes: the stages of ``x-stages`` (and what follows them)."""
    if "x-stages" in spec:
        stages = spec["x-stages"]
        text = ", ".join(f"`{s}`" for s in stages) if stages else "nothing"
        if not stages and "x-neutral" in spec:
            text += f": {spec['x-neutral']}"
        if "x-if" in spec:
            text += f" (read only where `{spec['x-if']}` holds: the Wan teacher with use_tiny_vae)"
        if "x-unhashed-at" in spec:
            at = _code(spec["x-unhashed-at"])
            text += f"; at {at} left out of its stages' params and the training hash"
        return text
    if section == "memory":
        return "nothing (a memory flag)"
    return "—"


def config_rows(schema: dict) -> list[tuple[str, dict, str]]:
    """(dotted key, spec, section) for every key of the schema, depth first; a mapping of
    user-named entries (``tiers``) lists its entries' keys as ``<name>``."""
    defs = schema.get("$defs", {})
    rows = []

    def walk(props: dict, prefix: str, section: str) -> None:
        for key, spec in props.items():
            spec = _resolve(spec, defs)
            path = f"{prefix}{key}"
            rows.append((path, spec, section or key))
            if "properties" in spec:
                walk(spec["properties"], f"{path}.", section or key)
            entry = spec.get("additionalProperties")
            if isinstance(entry, dict) and "properties" in entry:
                walk(entry["properties"], f"{path}.<name>.", section or key)

    walk(schema["properties"], "", "")
    return rows


def _table(schema: dict, top: str = "##") -> list[str]:
    """Each key's heading (``top`` for the schema's own keys, one level more below them) and
    its facts."""
    defs = schema.get("$defs", {})
    out = []
    for path, spec, section in config_rows(schema):
        level = top if "." not in path else top + "#"
        out += [f"{level} `{path}`", ""]
        if spec.get("description"):
            out += [_linked(_cell(spec["description"])), ""]
        default = spec.get("default")
        block = []
        if "default" not in spec:
            default_text = "required" if path in schema.get("required", ()) else "none"
        elif isinstance(default, dict) and len(json.dumps(default)) > 60:
            default_text, block = "below", ["```yaml", *_yaml(default), "```", ""]
        else:
            default_text = _code(default)
        facts = [
            ("type", _type(spec, defs)),
            ("default", default_text),
            ("allowed", _allowed(spec, defs) or "any value of the type"),
            ("re-runs", _reruns(spec, section)),
        ]
        out += [" · ".join(f"**{k}** {v}" for k, v in facts), ""] + block
    return out


def _yaml(value) -> list[str]:
    import yaml

    return yaml.safe_dump(value, sort_keys=False, default_flow_style=None).splitlines()


def configuration_page() -> str:
    """The configuration reference's Markdown."""
    schema_mod = _import("chord.config.schema")
    config = schema_mod.read_schema(schema_mod.CONFIG_SCHEMA)
    scenes = schema_mod.read_schema(schema_mod.SCENES_SCHEMA)
    head = [
        "# Configuration reference",
        "",
        "Generated when the site is built from `chord/config/schemas/config.schema.yaml`, the",
        "schema `config/config.yaml` and every `--configfile` are validated against (unknown",
        "keys and wrong types are errors), and from `scenes.schema.yaml` for the scene sheet.",
        "How the files combine and what a change re-runs: [Configuration](../configuration.md).",
        "",
        "**re-runs** names the stages whose result a key changes (the schema's `x-stages`):",
        "changing the key re-runs those stages for every scene it applies to, and what follows",
        "them. The same keys are each stage's rule params and, for `train`, the training hash.",
        "Memory flags and keys marked `nothing` change no result; `—`: the key is not a",
        "result key (its description says what it does). A `§N` in a description is a section",
        "of [the method](../METHOD.md).",
        "",
    ]
    sheet = [
        "## The scene sheet",
        "",
        "The columns of `config/scenes.tsv` (tab-separated; the config's `scenes` names it),",
        f"from `scenes.schema.yaml`: {_cell(scenes.get('description', ''))}",
        "",
    ]
    return "\n".join(head + _table(config) + sheet + _table(scenes, "###")) + "\n"


# --- the command-line reference --------------------------------------------------------------


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


@contextlib.contextmanager
def _intercepted():
    """parse_args raises with its parser instead of parsing: main() stops there."""
    original = argparse.ArgumentParser.parse_args

    def capture(self, *args, **kwargs):
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = capture
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original


def module_parser(name: str) -> argparse.ArgumentParser:
    """The parser ``python -m name`` builds in its main()."""
    module = _import(name)
    with _intercepted():
        try:
            module.main([])
        except _Captured as found:
            return found.parser
    raise RuntimeError(f"{name}.main() built no argparse parser")


def _flags(action: argparse.Action) -> str:
    if action.option_strings:
        names = ", ".join(f"`{o}`" for o in action.option_strings)
    else:
        names = f"`{action.metavar or action.dest}`"
    takes = action.nargs != 0
    if takes and action.option_strings:
        choices = "{" + ",".join(map(str, action.choices or ())) + "}"
        meta = action.metavar or (choices if action.choices else action.dest.upper())
        more = {"*": " ...", "+": " ...", "?": ""}.get(action.nargs, "")
        names += f" `{meta}{more}`"
    return names


def _schema_defaults() -> dict:
    """The method and memory keys' schema defaults: ``chord train``'s flags named after them
    leave the value unset (argparse.SUPPRESS) and so train with these."""
    settings = _import("chord.config.settings")
    out = {}
    for section in (settings.method_schema(), settings.memory_schema()):
        out.update({k: s["default"] for k, s in section["properties"].items() if "default" in s})
    return out


def _arguments(parser: argparse.ArgumentParser) -> list[str]:
    schema_defaults = _schema_defaults()
    rows = ["| argument | default | what |", "|---|---|---|"]
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
            continue
        if isinstance(action, argparse._HelpAction):
            continue
        default = action.default
        if default == argparse.SUPPRESS and action.dest in schema_defaults:
            default = schema_defaults[action.dest]
        shown = (
            "required"
            if action.required
            else "—"
            if default in (None, False, argparse.SUPPRESS) or default == []
            else _code(default)
        )
        what = action.help or ""
        if action.choices and not action.option_strings:
            what += " (one of " + ", ".join(f"`{c}`" for c in action.choices) + ")"
        rows.append(f"| {_cell(_flags(action))} | {_cell(shown)} | {_cell(what)} |")
    return rows if len(rows) > 2 else []


def _parser_section(parser: argparse.ArgumentParser, title: str, what: str = "") -> list[str]:
    out = [f"### `{title}`", ""]
    what = (parser.description or what or "").strip()
    if what:
        out += [_cell(what.splitlines()[0]), ""]
    out += ["```text", parser.format_usage().strip(), "```", ""]
    return out + _arguments(parser) + [""]


def cli_page() -> str:
    """The command-line reference's Markdown."""
    main = _import("chord.cli.main")
    upstream = _import("chord.cli.upstream_train")
    parser = main.build_parser()
    out = [
        "# Command-line reference",
        "",
        "Generated when the site is built from the commands' argparse parsers",
        "(`chord.cli.main.build_parser`, `chord.cli.upstream_train.build_parser` and each",
        "`python -m` tool's), so every flag here is one the code accepts. A default shown is",
        "the parser's on the machine that built the site. What the commands are for:",
        "[the guides](../index.md). Bad input exits with status 2 and one line naming the",
        "file, field or flag.",
        "",
        "## `chord`",
        "",
        "```text",
        parser.format_usage().strip(),
        "```",
        "",
        *_arguments(parser),
        "",
    ]
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in subs._choices_actions}
    for name, sub in subs.choices.items():
        if name == "train":  # CHORD's train.py flags, parsed apart; its first paragraph
            sub = upstream.build_parser()
            sub.description = " ".join(upstream.__doc__.split("\n\n")[0].split())
        out += _parser_section(sub, f"chord {name}", helps.get(name, ""))
    out += ["## Tools run with `python -m`", ""]
    for name in MODULE_TOOLS:
        tool = module_parser(name)
        out += _parser_section(tool, tool.prog)
    return "\n".join(out) + "\n"


# --- the hook ----------------------------------------------------------------------------------

PAGES = {CONFIG_PAGE: configuration_page, CLI_PAGE: cli_page}


def on_files(files, config):
    from mkdocs.structure.files import File

    for path, make in PAGES.items():
        files.append(File.generated(config, path, content=make()))
    return files
