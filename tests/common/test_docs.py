"""Every document the code cites is in the repository, with the sections and equations cited.

Scans the docstrings, comments and strings of every ``.py`` file under the packages, the
benchmarks and the tests, and the README, the descriptors, the chart's values and ``docs/``
itself, for citations of Markdown documents: a path ending in ``.md`` (repository-relative,
e.g. ``docs/model.md``), optionally followed by what it points at inside the document:

- ``§3``, ``§3.2``, ``§2-4`` or ``section 3`` / ``sections 2-4``: a heading numbered so
  (``## 3. ...``, ``### 3.2 ...``); a range names every whole-numbered section in it;
- ``"Heading text"``: a heading containing that text (case-insensitive);
- ``Eq. 6`` or ``Eqs. 8-9``: an equation tagged ``(Eq. N)`` in the document's text.

Several may follow one path, separated by commas or "and" (``docs/model.md §3, Eq. 6``). A
path that does not resolve inside the repository (a bare ``docs/model.md``, ``../shared/...``) fails,
and so does a section or equation the document lacks. Runs in both environments (standard
library only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: Where citations are looked for: (folder or file, glob).
SCANNED = [("agent", "**/*.py"), ("xapp", "**/*.py"), ("pallas_common", "**/*.py"),
           ("pallas_eval", "**/*.py"), ("pallas_tools", "**/*.py"), ("benchmarks", "**/*.py"),
           ("tests", "**/*.py"), ("proto", "**/*.proto"), ("docs", "**/*.md"), ("descriptors", "*.json"),
           ("helm", "**/*.yaml"), (".", "README.md")]

_DOC = re.compile(r"(?<![\w/.-])((?:\.\./)*\w[\w./-]*\.md)\b")
_NUM = r"\d+(?:\.\d+)*"
_REF = re.compile(
    r"""[`*]*(?:\s*(?:,|\band\b))?\s*(?:
        (?:§|\bsections?\s+)(?P<sec>%s(?:\s*[-–]\s*§?%s)?)
      | (?<=[\s,])"(?P<head>[^"\n]{2,80})"
      | \bEqs?\.\s*(?P<eq>\d+(?:\s*[-–]\s*\d+)?)
    )""" % (_NUM, _NUM), re.X)
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$", re.M)
_HEADING_NUM = re.compile(r"(%s)\.?(?:\s|$)" % _NUM)


@dataclass(frozen=True)
class Citation:
    """One citation: the citing file and line, the document path as written, and the
    sections (numbers as strings), heading texts and equation numbers it names."""

    where: str
    line: int
    doc: str
    sections: tuple[str, ...] = ()
    headings: tuple[str, ...] = ()
    equations: tuple[int, ...] = ()


def _flatten(text: str) -> str:
    """Comment markers (``#``, ``//``) at line starts become spaces, so a citation may wrap
    in a comment. Line numbers are kept."""
    return re.sub(r"\n[ \t]*(?:#+|//+)[ \t]?", "\n ", text)


def _span(a: str, b: str) -> list[str]:
    """A range ``a-b`` of whole section or equation numbers; a single number if not whole."""
    if "." in a or "." in b:
        return [a, b]
    return [str(i) for i in range(int(a), int(b) + 1)]


def citations(text: str, where: str = "<text>") -> list[Citation]:
    """Every document citation in ``text`` (see the module docstring for the syntax)."""
    flat = _flatten(text)
    out = []
    for m in _DOC.finditer(flat):
        secs, heads, eqs = [], [], []
        pos = m.end()
        while (r := _REF.match(flat, pos)) is not None:
            if r.group("sec"):
                parts = re.split(r"\s*[-–]\s*§?", r.group("sec"))
                secs += _span(parts[0], parts[-1]) if len(parts) == 2 else parts
            elif r.group("head"):
                heads.append(r.group("head"))
            else:
                parts = re.split(r"\s*[-–]\s*", r.group("eq"))
                eqs += [int(x) for x in _span(parts[0], parts[-1])]
            pos = r.end()
        out.append(Citation(where, flat.count("\n", 0, m.start()) + 1, m.group(1),
                            tuple(secs), tuple(heads), tuple(eqs)))
    return out


def problems(c: Citation, repo: Path = REPO) -> list[str]:
    """What is wrong with one citation against the documents under ``repo`` (empty: nothing)."""
    at = f"{c.where}:{c.line}: {c.doc}"
    path = (repo / c.doc).resolve()
    if not path.is_relative_to(repo.resolve()) or not path.is_file():
        return [f"{at}: no such document in the repository"]
    text = path.read_text(encoding="utf-8")
    headings = _HEADING.findall(text)
    numbers = {m.group(1) for h in headings if (m := _HEADING_NUM.match(h))}
    out = [f"{at}: no section {s}" for s in c.sections if s not in numbers]
    out += [f'{at}: no heading containing "{h}"' for h in c.headings
            if not any(h.lower() in x.lower() for x in headings)]
    out += [f"{at}: no (Eq. {e})" for e in c.equations if f"(Eq. {e})" not in text]
    return out


def scanned_files(repo: Path = REPO) -> list[Path]:
    files = set()
    for folder, pattern in SCANNED:
        files.update(p for p in (repo / folder).glob(pattern)
                     if p.is_file() and "_pb2" not in p.name and ".venv" not in p.parts)
    return sorted(files)


def test_every_cited_document_and_section_exists():
    found, bad = 0, []
    for path in scanned_files():
        rel = str(path.relative_to(REPO))
        for c in citations(path.read_text(encoding="utf-8"), rel):
            found += 1
            bad += problems(c)
    assert found > 100, f"only {found} citations found: is the scanner broken?"
    assert not bad, "citations that do not resolve:\n" + "\n".join(bad)


def test_docs_the_code_cites_are_there():
    for name in ("architecture", "model", "vllm", "osc", "drive-data"):
        assert (REPO / "docs" / f"{name}.md").is_file(), name


# The synthetic citations below are assembled from pieces so that this file's own text holds
# none that the scan above would check.
MD = ".md"


def test_scanner_reads_each_form():
    text = (f'"""See docs/model{MD} §3.2 and docs/model{MD} sections 2-4, Eq. 6.\n'
            f'    Also (docs/vllm{MD}, "Prefix caching"), docs/model{MD} Eqs. 8-9 and\n'
            f'    # docs/osc{MD}\n    # §4 wrapped in a comment; docs/model{MD}."""\n')
    got = citations(text, "x.py")
    assert [(c.doc, c.sections, c.headings, c.equations) for c in got] == [
        (f"docs/model{MD}", ("3.2",), (), ()),
        (f"docs/model{MD}", ("2", "3", "4"), (), (6,)),
        (f"docs/vllm{MD}", (), ("Prefix caching",), ()),
        (f"docs/model{MD}", (), (), (8, 9)),
        (f"docs/osc{MD}", ("4",), (), ()),
        (f"docs/model{MD}", (), (), ()),
    ]
    assert got[4].line == 3


def _repo_with_doc(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / f"m{MD}").write_text(
        "# Title\n\n## 1. One\n\nx = 1   (Eq. 1)\n\n### 1.2 Sub part\n\n## 2. Two\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / f"m{MD}").write_text("# 1. x\n")
    return repo


@pytest.mark.parametrize("cite", [f"docs/m{MD} §1", f"docs/m{MD} §1.2", f"docs/m{MD} §1-2",
                                  f'docs/m{MD}, "sub part"', f"docs/m{MD} Eq. 1", f"docs/m{MD}"])
def test_resolving_citation_passes(tmp_path, cite):
    repo = _repo_with_doc(tmp_path)
    (c,) = citations(cite)
    assert problems(c, repo) == []


@pytest.mark.parametrize("cite, why", [
    (f"docs/gone{MD} §1", "no such document"),
    (f"m{MD}", "no such document"),                    # bare name: not a repository path
    (f"../outside/m{MD}", "no such document"),         # outside the repository
    (f"docs/m{MD} §3", "no section 3"),
    (f"docs/m{MD} §1.3", "no section 1.3"),
    (f"docs/m{MD} sections 1-3", "no section 3"),
    (f'docs/m{MD} "Three"', 'no heading containing "Three"'),
    (f"docs/m{MD} Eq. 2", "no (Eq. 2)"),
])
def test_broken_citation_fails(tmp_path, cite, why):
    repo = _repo_with_doc(tmp_path)
    (c,) = citations(cite)
    got = problems(c, repo)
    assert len(got) == 1 and why in got[0], got
