"""Every citation of the method's or the design's sections names a heading of docs/ (issue 46).

The code, the configuration and the docs cite docs/METHOD.md and docs/DESIGN.md by section
number; a citation that names no heading sends a reader nowhere. This test reads every
git-tracked text file (no node_modules, no committed bundles under ``dist/``, no binary files)
line by line and checks each citation against the headings the two documents define.

A section heading is ``## N. Title`` (N an integer), exactly that form, in either document;
METHOD's flag glossary is its heading ``## Glossary: ...``.

Citations recognised:

- a document name, ``METHOD``, ``METHOD.md``, ``DESIGN`` or ``DESIGN.md`` (with or without
  ``docs/``), then ``§N``; the ``§N`` that follow it on the line belong to the same document:
  lists (``METHOD §11, §17``), ranges (``METHOD §15–§18``, ``§10-§13``: both ends and every
  section between), and the ``§N`` after a second name belong to that name (``DESIGN §4,
  METHOD §9–§15`` cites METHOD §15);
- ``METHOD glossary`` (also across a line break): the glossary heading;
- DESIGN or docs/DESIGN.md followed by a capitalised title in single or double quotes: a
  DESIGN heading whose title starts with it (the settled decisions are cited by name).

A bare ``§N`` (no document name before it on its line) is attributed by this rule, in order:

1. preceded by the name of a document outside the repository (:data:`EXTERNAL`: an ISO
   standard, the glTF specification, a book): not ours, not checked;
2. in docs/METHOD.md or docs/DESIGN.md: the document it stands in;
3. at the start of a line that continues a citation (the line before ends with a document name
   or a ``§N``, then at most punctuation or "and"): that citation's document;
4. anywhere else: METHOD. The configuration's comments and the schema's descriptions
   (``(§8)``), and the tests' section banners, cite the method by bare number.

A citation fails when its section has no heading in the attributed document (a dotted
number, a subsection, never has one), naming file:line and the citation as written.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

DOCS = {"METHOD": "docs/METHOD.md", "DESIGN": "docs/DESIGN.md"}
# Documents outside the repository that the code cites by their own section numbers.
EXTERNAL = ("ISO/IEC 14496-12", "glTF 2.0", "Real-Time Collision Detection")
HEADING = re.compile(r"^## (\d+)\. \S", re.M)
TITLES = re.compile(r"^#{2,3} (?:\d+\. )?(.+?)\s*$", re.M)
SECTION = "\u00a7"
TOKEN = re.compile(
    r"(?<![\w/])(?:docs/)?(?P<doc>METHOD|DESIGN)(?:\.md)?(?![\w])"
    rf"|{SECTION}\s?(?P<num>\d+(?:\.\d+)*)(?:\s*[\u2013-]\s*{SECTION}?(?P<end>\d+(?:\.\d+)*))?"
)
# What may follow a citation at the end of a line that the next line continues.
TAIL = re.compile(r"^[\s,;(\u2013-]*(?:and|or)?\s*$")
GLOSSARY = re.compile(r"(?<![\w/])METHOD(?:\.md)?\s+glossary")
QUOTED = re.compile(r"(?<![\w/])(?:docs/)?DESIGN(?:\.md)?\s+([\"'])([A-Z][^\"'\n]*)\1")


def headings(text: str) -> set[str]:
    """The section numbers a document defines (``## N. Title``), as strings."""
    return set(HEADING.findall(text))


def titles(text: str) -> list[str]:
    """Every level-2 and level-3 heading's title, its number left out."""
    return TITLES.findall(text)


def citations(name: str, text: str) -> list[tuple[int, str, str, list[str]]]:
    """Every section citation in ``text`` (the file ``name``, relative to the repository):
    (line number, citation as written, document, section numbers it cites), by the module's
    rules. External citations are left out."""
    own = next((doc for doc, path in DOCS.items() if name == path), None)
    found, carry = [], None
    for number, line in enumerate(text.splitlines(), 1):
        current, last_end = None, None
        for m in TOKEN.finditer(line):
            last_end = m.end()
            if m["doc"]:
                current = m["doc"]
                continue
            before = line[: m.start()].rstrip()
            if any(before.endswith(e) for e in EXTERNAL):
                current = "external"
                continue
            doc = current
            if doc is None:
                at_start = not re.search(r"\w", before)
                doc = own or (carry if at_start and carry else "METHOD")
                current = doc
            start, end = m["num"], m["end"] or m["num"]
            if "." in start or "." in end or int(end) < int(start):
                nums = sorted({start, end})
            else:
                nums = [str(n) for n in range(int(start), int(end) + 1)]
            found.append((number, m.group(0), doc, nums))
        carry = None
        if last_end is not None and TAIL.match(line[last_end:]) and current != "external":
            carry = current
    return found


def problems(files: dict[str, str], docs: dict[str, str]) -> tuple[int, list[str]]:
    """(citations checked, failures as "file:line: citation (why)") for ``files`` (name ->
    text) against the documents ``docs`` (METHOD / DESIGN -> text)."""
    sections = {doc: headings(text) for doc, text in docs.items()}
    design_titles = titles(docs["DESIGN"])
    has_glossary = any(t.startswith("Glossary") for t in titles(docs["METHOD"]))
    checked, bad = 0, []
    for name, text in files.items():
        for number, written, doc, nums in citations(name, text):
            checked += 1
            missing = [n for n in nums if n not in sections[doc]]
            if missing:
                bad.append(
                    f"{name}:{number}: {written!r}: cites {doc} "
                    + ", ".join(SECTION + n for n in missing)
                    + f", which {DOCS[doc]} has no '## N. Title' heading for"
                )
        for m in GLOSSARY.finditer(text):
            checked += 1
            if not has_glossary:
                line = text.count("\n", 0, m.start()) + 1
                bad.append(f"{name}:{line}: {m.group(0)!r}: docs/METHOD.md has no Glossary")
        for m in QUOTED.finditer(text):
            checked += 1
            if not any(t.startswith(m[2]) for t in design_titles):
                line = text.count("\n", 0, m.start()) + 1
                bad.append(f"{name}:{line}: {m.group(0)!r}: no docs/DESIGN.md heading starts so")
    return checked, bad


def tracked_texts() -> dict[str, str]:
    """Every git-tracked text file of the repository: name -> text."""
    proc = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True)
    if proc.returncode == 0 and proc.stdout:
        names = [n for n in proc.stdout.decode().split("\0") if n]
    else:  # not a git checkout (an unpacked archive): every file
        names = [str(p.relative_to(REPO)) for p in REPO.rglob("*") if p.is_file()]
        names = [n for n in names if ".git" not in Path(n).parts]
    out = {}
    for name in names:
        parts = Path(name).parts
        path = REPO / name
        if "node_modules" in parts or "dist" in parts or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        try:
            out[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            continue  # binary
    return out


def read_docs() -> dict[str, str]:
    return {doc: (REPO / path).read_text(encoding="utf-8") for doc, path in DOCS.items()}


def test_every_citation_names_a_heading():
    files = tracked_texts()
    assert "docs/METHOD.md" in files and "docs/DESIGN.md" in files
    checked, bad = problems(files, read_docs())
    # The repository cites its documents hundreds of times: a parser that finds few is broken.
    assert checked > 300, f"only {checked} citations found: is the parser still reading them?"
    assert not bad, f"{len(bad)} of {checked} citations name no heading:\n" + "\n".join(bad)


def test_the_documents_number_their_sections():
    docs = read_docs()
    assert headings(docs["METHOD"]) == {str(n) for n in range(22)}
    assert {"3", "4", "6", "7"} <= headings(docs["DESIGN"])


S = SECTION
DASH = "\u2013"


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("chord/x.py", f"see METHOD {S}15", [("METHOD", ["15"])]),
        ("chord/x.py", f"METHOD.md {S}11, {S}17", [("METHOD", ["11"]), ("METHOD", ["17"])]),
        ("chord/x.py", f"(METHOD {S}15{DASH}{S}17)", [("METHOD", ["15", "16", "17"])]),
        ("config/c.yaml", f"# {S}10-{S}13 guidance", [("METHOD", ["10", "11", "12", "13"])]),
        (
            "chord/x.py",
            f"(DESIGN {S}4, METHOD {S}9{DASH}{S}10)",
            [("DESIGN", ["4"]), ("METHOD", ["9", "10"])],
        ),
        ("chord/x.py", f"(DESIGN {S}6, {S}7)", [("DESIGN", ["6"]), ("DESIGN", ["7"])]),
        ("config/c.yaml", f"x: 1  # T ({S}0, {S}6).", [("METHOD", ["0"]), ("METHOD", ["6"])]),
        ("docs/DESIGN.md", f"escalates ({S}6)", [("DESIGN", ["6"])]),
        ("docs/METHOD.md", f"per {S}14", [("METHOD", ["14"])]),
        ("chord/x.py", f"(METHOD {S}3,\n{S}4): each", [("METHOD", ["3"]), ("METHOD", ["4"])]),
        ("chord/x.py", f"(DESIGN {S}3,\n{S}6) x", [("DESIGN", ["3"]), ("DESIGN", ["6"])]),
        ("chord/x.py", f"done.\n{S}8 cameras", [("METHOD", ["8"])]),
        ("tests/x.py", f"ISO/IEC 14496-12 {S}4.2: a box", []),
        ("tests/x.py", f"glTF 2.0 {S}3.7.2.1: strip", []),
        ("chord/x.py", f"(Real-Time Collision Detection {S}5.1.5)", []),
        ("chord/x.py", f"Detection {S}5.1.5 alone", [("METHOD", ["5.1.5"])]),
        ("chord/x.py", "METHOD_STAGES = 1; DESIGN_X", []),
    ],
)
def test_the_parser_attributes_citations(name, text, expected):
    assert [(doc, nums) for _, _, doc, nums in citations(name, text)] == expected


def test_a_planted_bad_citation_fails(tmp_path):
    """A file citing sections the documents lack is reported with its file:line and the
    citation, whatever the form; the real documents are the judges."""
    planted = tmp_path / "planted.py"
    planted.write_text(
        '"""Fine: METHOD ' + S + "15.\n"
        "Bad: DESIGN " + S + "12, METHOD " + S + "22, and METHOD " + S + "20" + DASH + S + "23.\n"
        "Bad bare: (" + S + "30). Bad dotted: METHOD " + S + "5.1.\n"
        'Bad title: docs/DESIGN.md "' + "No such decision" + '"; fine: DESIGN \'Contact\'."""\n',
        encoding="utf-8",
    )
    checked, bad = problems({"planted.py": planted.read_text(encoding="utf-8")}, read_docs())
    assert checked == 8
    assert [b.split(": ", 2)[:2] for b in bad] == [
        ["planted.py:2", "'" + S + "12'"],
        ["planted.py:2", "'" + S + "22'"],
        ["planted.py:2", "'" + S + "20" + DASH + S + "23'"],
        ["planted.py:3", "'" + S + "30'"],
        ["planted.py:3", "'" + S + "5.1'"],
        ["planted.py:4", "'docs/DESIGN.md \"No such decision\"'"],
    ]
    assert "cites DESIGN " + S + "12" in bad[0] and "cites METHOD " + S + "22" in bad[1]
    assert S + "22, " + S + "23" in bad[2]  # a range names each missing end


# A docs page named by its path (what the code's messages and comments send a reader to), with
# the title of one of its headings when a quoted one follows: ``docs/outputs.md, "Metrics"``.
PAGE = re.compile(r"(?<![\w/.])(docs/[\w-]+\.md)(?:,\s*\"([^\"\n]+)\")?")


def page_problems(files: dict[str, str]) -> tuple[int, list[str]]:
    """(page citations checked, failures) of ``files``: the page must be a file of the
    repository, and a quoted title the start of one of its headings (backticks left out)."""
    checked, bad = 0, []
    for name, text in files.items():
        for number, line in enumerate(text.splitlines(), 1):
            for m in PAGE.finditer(line):
                checked += 1
                page = REPO / m[1]
                if not page.is_file():
                    bad.append(f"{name}:{number}: {m[0]!r}: no such page")
                    continue
                heads = re.findall(r"^#+\s+(.+)$", page.read_text(encoding="utf-8"), re.M)
                if m[2] and not any(h.replace("`", "").startswith(m[2]) for h in heads):
                    bad.append(f"{name}:{number}: {m[0]!r}: no heading of {m[1]} starts so")
    return checked, bad


def test_every_docs_page_the_code_names_exists():
    """The package's messages and comments point at pages of docs/ (the README is a front
    page): each named page is there, with the heading a quoted title names."""
    files = {n: t for n, t in tracked_texts().items() if n.startswith(("chord/", "config/"))}
    checked, bad = page_problems(files)
    assert checked >= 5, f"only {checked} page citations found: is the pattern still reading them?"
    assert not bad, "\n".join(bad)
