"""The English corpus of the tiny model that speaks (issue 50): Python 3.11's documentation.

Source: Debian bookworm's `python3.11-doc` (PSF License Agreement for the documentation; code
examples also Zero-Clause BSD). Its html/_sources/ holds the reStructuredText of every page
(~11 MB in ~500 files). The package is fetched by name with `apt-get download` and unpacked with
`dpkg-deb -x` into the output folder, so nothing is installed system-wide and no root is needed.

Cleaning (reStructuredText -> plain prose; one document per source file):
  - code is dropped: literal blocks after `::`, doctest (`>>>`) paragraphs, and the bodies of
    code-like directives (code-block, productionlist, toctree, index, tables, ...);
  - prose directives (note, warning, versionchanged, function / class descriptions, ...) keep
    their body and drop their signature / options; comments, targets and footnotes are dropped;
  - section adornments and tables are dropped; titles stay as one-line paragraphs;
  - inline markup is reduced to its text (:role:`text <target>` -> text, ``code`` -> code,
    `link <url>`_ -> link, **strong** / *emphasis* -> the words, |release| -> 3.11);
  - each paragraph (and each list item) becomes one line with single spaces.

Output (default .cache/tiny-k3-speaks/corpus/, git-ignored; the corpus is never committed):
  train.txt      documents separated by an empty line, one paragraph per line
  heldout.txt    every --heldout-every-th document (index % N == N - 1 over the sorted paths)
  manifest.json  package, version, sha256 of the .deb and of both files, counts

Deterministic: files are read in sorted path order; a re-run gives the same bytes (the manifest's
sha256 are in models/tiny-k3-speaks/README.md). Standard library only.
Usage: python3 tools/make_corpus.py [--out DIR] [--heldout-every 10]
"""

import argparse
import hashlib
import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "python3.11-doc"
SOURCES = "usr/share/doc/python3.11/html/_sources"

# Directives whose body is prose; every other directive's body is dropped.
PROSE_DIRECTIVES = {
    "note", "warning", "seealso", "important", "tip", "caution", "attention", "hint", "danger",
    "admonition", "topic", "sidebar", "impl-detail", "versionadded", "versionchanged",
    "deprecated", "deprecated-removed", "function", "method", "class", "attribute", "data",
    "exception", "decorator", "decoratormethod", "classmethod", "staticmethod", "describe",
    "cmdoption", "option", "envvar", "opcode", "pdbcommand", "c:function", "c:type", "c:macro",
    "c:member", "c:var", "glossary", "abstractmethod", "coroutinefunction", "coroutinemethod",
    "module", "currentmodule", "only", "container", "epigraph", "highlights", "pull-quote",
}
VERSION_DIRECTIVES = {
    "versionadded": "New in version {}.",
    "versionchanged": "Changed in version {}:",
    "deprecated": "Deprecated since version {}:",
    "deprecated-removed": "Deprecated since version {}:",
}

DIRECTIVE = re.compile(r"^(\s*)\.\.\s+([\w:-]+)::\s*(.*)$")
COMMENT = re.compile(r"^(\s*)\.\.(\s|$)")
ADORNMENT = re.compile(r"^\s*([=\-~^\"'`#*+<>_:.])\1{2,}\s*$")
TABLE_LINE = re.compile(r"^\s*(\+[-=+]+\+|(=+\s+)+=+|\|.*\|)\s*$")
BULLET = re.compile(r"^(\s*)([*+-]|#\.|\d+\.|\(?[a-z0-9]\))\s+")
OPTION = re.compile(r"^\s*:[\w-]+:")

ROLE = re.compile(r":[\w:+.-]+:`([^`]*)`")
LINK = re.compile(r"`([^`<]*?)\s*<[^`>]*>`_{1,2}")
REF = re.compile(r"`([^`]+)`_{1,2}")
LITERAL = re.compile(r"``(.+?)``")
DEFAULT_ROLE = re.compile(r"`([^`]+)`")
STRONG = re.compile(r"\*\*(.+?)\*\*")
EMPHASIS = re.compile(r"(?<![\w*\\])\*([^*\s](?:[^*]*[^*\s])?)\*(?![\w*])")
FOOTNOTE_REF = re.compile(r"\s?\[(#[\w-]*|\d+|\*)\]_")
SUBSTITUTION = re.compile(r"\|(\w[\w -]*)\|")


def role_text(match):
    inner = match.group(1)
    named = re.match(r"^(.*?)\s*<[^<>]*>$", inner, re.S)
    if named and named.group(1):
        return named.group(1)
    inner = inner.lstrip("!")
    if inner.startswith("~"):
        inner = inner[1:].rsplit(".", 1)[-1]
    return inner


def clean_inline(text):
    text = ROLE.sub(role_text, text)
    text = LINK.sub(r"\1", text)
    text = LITERAL.sub(r"\1", text)
    text = REF.sub(r"\1", text)
    text = DEFAULT_ROLE.sub(r"\1", text)
    text = STRONG.sub(r"\1", text)
    text = EMPHASIS.sub(r"\1", text)
    text = FOOTNOTE_REF.sub("", text)
    text = SUBSTITUTION.sub(lambda m: "3.11" if m.group(1) in ("version", "release") else m.group(1),
                            text)
    text = text.replace("\\ ", "").replace("\\", "")
    return " ".join(text.split())


def indent_of(line):
    return len(line) - len(line.lstrip(" "))


def skip_block(lines, i, indent):
    """Index of the first line after the block that starts below lines[i - 1] (blank lines and
    lines indented deeper than `indent`)."""
    while i < len(lines) and (not lines[i].strip() or indent_of(lines[i]) > indent):
        i += 1
    return i


def paragraphs_of(source):
    """The prose paragraphs of one reStructuredText file, markup removed."""
    lines = source.expandtabs(8).splitlines()
    out = []
    current = []  # lines of the paragraph being read
    literal_indent = None  # the indent of the previous paragraph when it ended with `::`

    def flush():
        nonlocal literal_indent
        if not current:
            return
        block = current[:]
        current.clear()
        if any(TABLE_LINE.match(line) for line in block) or block[0].lstrip().startswith(">>>"):
            return
        items = [[]]
        for line in block:
            if BULLET.match(line) and items[-1]:
                items.append([])
            items[-1].append(BULLET.sub("", line, count=1) if not items[-1] else line)
        for item in items:
            text = " ".join(part.strip() for part in item)
            if text.endswith("::"):
                literal_indent = indent_of(block[0])
                text = text[:-2].rstrip()
                text = text + ":" if text and not text.endswith((":", " ")) else text
            text = clean_inline(text)
            if text:
                out.append(text)

    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            flush()
            i += 1
            continue
        if literal_indent is not None and not current:
            indent, literal_indent = literal_indent, None
            if indent_of(line) > indent:
                i = skip_block(lines, i + 1, indent)
                continue
        directive = DIRECTIVE.match(line)
        if directive:
            flush()
            indent, name, argument = len(directive.group(1)), directive.group(2), directive.group(3)
            i += 1
            if name in PROSE_DIRECTIVES:
                while i < len(lines) and lines[i].strip() and OPTION.match(lines[i]):
                    i += 1
                if name in VERSION_DIRECTIVES and argument:
                    current.append(VERSION_DIRECTIVES[name].format(argument.split()[0]))
                    if i < len(lines) and lines[i].strip() and indent_of(lines[i]) > indent:
                        continue  # the body joins the version line's paragraph
                    flush()
            else:
                i = skip_block(lines, i, indent)
            continue
        if COMMENT.match(line):
            flush()
            i = skip_block(lines, i + 1, indent_of(line))
            continue
        if ADORNMENT.match(line):
            flush()
            i += 1
            continue
        current.append(line)
        i += 1
    flush()
    return out


def fetch_package(out_dir):
    deb_dir = out_dir / "deb"
    deb_dir.mkdir(parents=True, exist_ok=True)
    debs = sorted(deb_dir.glob(f"{PACKAGE}_*.deb"))
    if not debs:
        subprocess.run(["apt-get", "download", PACKAGE], cwd=deb_dir, check=True)
        debs = sorted(deb_dir.glob(f"{PACKAGE}_*.deb"))
    deb = debs[-1]
    extract = out_dir / "extract"
    if not (extract / SOURCES).is_dir():
        subprocess.run(["dpkg-deb", "-x", str(deb), str(extract)], check=True)
    version = subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], check=True,
                             capture_output=True, text=True).stdout.strip()
    return deb, version, extract / SOURCES


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / ".cache/tiny-k3-speaks/corpus")
    parser.add_argument("--heldout-every", type=int, default=10)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    deb, version, sources = fetch_package(args.out)

    files = sorted(p for p in sources.rglob("*.rst.txt"))
    splits = {"train": [], "heldout": []}
    for index, path in enumerate(files):
        paragraphs = paragraphs_of(path.read_text(encoding="utf-8"))
        if not paragraphs:
            continue
        split = "heldout" if index % args.heldout_every == args.heldout_every - 1 else "train"
        splits[split].append("\n".join(paragraphs) + "\n")

    manifest = {
        "package": PACKAGE,
        "version": version,
        "licence": "PSF License Agreement (documentation); Zero-Clause BSD (code examples)",
        "deb_sha256": sha256(deb),
        "num_source_files": len(files),
        "heldout_every": args.heldout_every,
    }
    for split, documents in splits.items():
        path = args.out / f"{split}.txt"
        path.write_text("\n".join(documents), encoding="utf-8")
        manifest[split] = {"file": path.name, "num_documents": len(documents),
                           "num_bytes": path.stat().st_size, "sha256": sha256(path)}
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(json.dumps(manifest, indent=2))


if __name__ == "__main__":
    main()
