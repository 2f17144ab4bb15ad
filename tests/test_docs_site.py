"""The documentation site (issue 46): `mkdocs build --strict` builds it, a broken link or anchor
fails the build, and the references generated at build time (docs/hooks/references.py) list
every key of the configuration schema and every flag of the command line.

The schema's keys are walked here on their own (not through the hook's walk), so a key the hook
skips is caught. Quick tier: two builds of about 15 s each (torch loads for the CLI page)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from html import unescape

import pytest
import yaml

from tests import components
from tests.conftest import REPO

HOOK = REPO / "docs" / "hooks" / "references.py"


def hook():
    spec = importlib.util.spec_from_file_location("docs_references_hook", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(config, site, cwd):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        components.missing(components.MKDOCS, "the documentation site's build")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_the_site_builds_strictly_with_both_references(tmp_path):
    site = tmp_path / "site"
    proc = build(REPO / "mkdocs.yml", site, tmp_path)  # from elsewhere: no path is cwd's
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = (site / "reference" / "configuration" / "index.html").read_text()
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "method.lambda_contact" in config and "--render_backend" in cli
    # the install page carries the README's two commands, verbatim (a snippet of README.md)
    readme = (REPO / "README.md").read_text()
    commands = [x for x in readme.splitlines() if x.startswith("python3 -m venv .venv")]
    html = (site / "install" / "index.html").read_text()
    text = unescape(re.sub(r"<[^>]+>", "", html))
    assert len(commands) == 2 and all(c in text for c in commands)


def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    """What CI's build guards: a page linking to a missing page or a missing heading."""
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "docs", copy / "docs")
    shutil.copy(REPO / "mkdocs.yml", copy)
    shutil.copy(REPO / "README.md", copy)
    page = copy / "docs" / "upgrading.md"
    page.write_text(page.read_text() + "\nSee [the tiers](tiers.md#no-such-heading).\n")
    proc = build(copy / "mkdocs.yml", tmp_path / "site", copy)
    assert proc.returncode != 0
    assert "upgrading.md" in proc.stderr and "no-such-heading" in proc.stderr, proc.stderr[-3000:]


def schema_keys(schema: dict) -> list[str]:
    """Every key's dotted path; the entries of a mapping of user-named entries (tiers) as
    ``<name>``."""
    defs = schema.get("$defs", {})
    out = []

    def walk(props: dict, prefix: str) -> None:
        for key, spec in props.items():
            ref = spec.get("$ref", "")
            spec = {**defs.get(ref.rsplit("/", 1)[-1], {}), **spec} if ref else spec
            out.append(prefix + key)
            walk(spec.get("properties", {}), f"{prefix}{key}.")
            entry = spec.get("additionalProperties")
            if isinstance(entry, dict):
                walk(entry.get("properties", {}), f"{prefix}{key}.<name>.")

    walk(schema["properties"], "")
    return out


def sections(page: str) -> dict[str, str]:
    """The configuration page's text under each key's heading."""
    out, key = {}, None
    for line in page.splitlines():
        if line.startswith("#") and line.rstrip().endswith("`") and "`" in line:
            key = line.split("`")[1]
            out[key] = ""
        elif key is not None:
            out[key] += line + "\n"
    return out


def test_the_configuration_reference_lists_every_schema_key_with_its_facts():
    page = hook().configuration_page()
    found = sections(page)
    schemas = REPO / "chord" / "config" / "schemas"
    config = yaml.safe_load((schemas / "config.schema.yaml").read_text())
    scenes = yaml.safe_load((schemas / "scenes.schema.yaml").read_text())
    keys = schema_keys(config) + schema_keys(scenes)
    assert len(keys) > 100
    missing = [k for k in keys if k not in found]
    assert not missing, f"keys the configuration reference leaves out: {missing}"
    for section in ("method", "guidance"):
        for key, spec in config["properties"][section]["properties"].items():
            text = found[f"{section}.{key}"]
            facts = next(x for x in text.splitlines() if x.startswith("**type**"))
            facts = dict(f.split(" ", 1) for f in facts.split(" · "))
            reruns = facts["**re-runs**"]
            stages = spec["x-stages"]
            assert all(f"`{s}`" in reruns for s in stages) and (stages or "nothing" in reruns)
            default = spec["default"]  # every method and guidance key has one
            shown = default if isinstance(default, str) else json.dumps(default)
            assert facts["**default**"] == f"`{shown}`", (key, text)
    for key in config["properties"]["memory"]["properties"]:
        assert "nothing (a memory flag)" in found[f"memory.{key}"]


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {
        o
        for a in parser._actions
        if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)
        for o in a.option_strings
    }


def test_the_cli_reference_lists_every_flag_of_every_command():
    from chord.cli import main, upstream_train

    module = hook()
    page = module.cli_page()
    parser = main.build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    commands = {f"chord {n}": p for n, p in subs.choices.items()}
    commands["chord train"] = upstream_train.build_parser()
    for name in module.MODULE_TOOLS:
        commands[f"python -m {name}"] = module.module_parser(name)
    for title, sub in commands.items():
        assert f"### `{title}`" in page, title
        section = page.split(f"### `{title}`", 1)[1].split("\n### ", 1)[0]
        absent = sorted(o for o in options(sub) if f"`{o}`" not in section)
        assert not absent, f"{title}: flags the reference leaves out: {absent}"


@pytest.mark.parametrize("name", ["chord.resources.job_size", "chord.checks.fake_iteration"])
def test_reading_a_tools_parser_runs_nothing(name, tmp_path, monkeypatch):
    """The hook reads a `python -m` tool's parser by stopping its main() at parse_args: no
    report is written, nothing else runs, and parse_args works again afterwards."""
    monkeypatch.chdir(tmp_path)
    parser = hook().module_parser(name)
    assert parser.prog == f"python -m {name}"
    assert list(tmp_path.iterdir()) == []
    assert argparse.ArgumentParser().parse_args([]) == argparse.Namespace()


# What stands for a value in a quoted message: an elided part, a one-letter name (scene S,
# tier T, N GiB), a number, a <name>, a sample value, a key the code composes (tiers.T.runtime_h).
PLACEHOLDER = re.compile(
    r"\.\.\./\S+|\[\.\.\.\]|\(\.\.\.\)|\.\.\.|\btiers\.[A-Z]\.\w+|\b[A-Z]\b|<\w+>|'x'"
    r"|\b\d[\d.*]*\b|\bauto\b|\blowres\b|EXT_foo|;"
)


def test_troubleshooting_quotes_messages_the_code_prints():
    """Each message docs/troubleshooting.md looks up (a bold code span heading an entry) is
    made of the code's own words: every run of three or more words between its placeholders
    stands in a string of chord/, rules/ or the Snakefile (adjacent literals joined)."""
    sources = [*(REPO / "chord").rglob("*.py"), *(REPO / "rules").glob("*.smk"), REPO / "Snakefile"]
    code = "\n".join(re.sub(r"[\"']\s*\n\s*[rf]*[\"']", "", p.read_text()) for p in sources)
    page = (REPO / "docs" / "troubleshooting.md").read_text()
    quoted = [q for line in page.splitlines() if line.startswith("**`") for q in
              re.findall(r"`([^`]+)`", line)]  # fmt: skip
    assert len(quoted) > 15
    stale = {}
    for message in quoted:
        parts = [p.strip(" ,:()") for p in PLACEHOLDER.split(message)]
        if missing := [p for p in parts if len(p.split()) >= 3 and p not in code]:
            stale[message] = missing
    assert not stale, f"messages the code no longer prints: {stale}"
