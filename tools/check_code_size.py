#!/usr/bin/env python3
"""Checks hyserve's size limits (STYLE.md: files under ~800 lines, no step function over 150).

  1. every source file (*.cpp *.h *.cu *.cuh) under src/, tests/, bench/ and tools/ (test
     fixtures aside) has at most 800 lines;
  2. every function definition in src/ outside src/kernels/ spans at most 150 lines, from the
     first line of its declarator to its closing brace.

Prints each offender as `path:line: ...` and exits 1 when there is one, else prints a summary
and exits 0. Python 3 standard library only.

Usage: python3 tools/check_code_size.py [--root REPO]   (REPO defaults to this file's repo)

The function scan is a heuristic, not a C++ parser:
  - comments, string and character literals (raw strings too) and preprocessor lines are
    blanked first, keeping the line breaks;
  - braces are matched; a `{` outside parentheses opens a scope whose kind is decided by its
    "head", the text since the last `;` or the last opening or closing of a namespace, class
    or function scope at that level:
      function  - the head ends with `)`, optionally followed by const, volatile, noexcept,
                  override, final, mutable, & or &&, and an optional trailing return type
                  `-> T` (so constructors with initializer lists count from their name);
      container - the head names namespace, class, struct, union or extern: its members are
                  scanned in turn;
      other     - anything else (initializers, enums): skipped, and the head runs on past it;
  - only scopes directly inside the file or a container are measured; lambdas and blocks
    inside a function are part of that function.
"""

import argparse
import os
import re
import sys

MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 150
SOURCE_DIRS = ("src", "tests", "bench", "tools")
SOURCE_EXTENSIONS = (".cpp", ".h", ".cu", ".cuh")
FUNCTION_DIRS = ("src",)
FUNCTION_EXCLUDED = ("src/kernels/",)

_FUNCTION_HEAD = re.compile(
    r"\)\s*(?:(?:const|volatile|noexcept|override|final|mutable|&&|&)\s*)*(?:->[^;{}]*)?$",
    re.S)
_CONTAINER_HEAD = re.compile(r"\b(?:namespace|class|struct|union|extern)\b")
_CONTROL_HEAD = re.compile(r"^(?:if|for|while|switch|catch|do|else|try)\b")


def _blank(text):
    """Comments, literals and preprocessor lines replaced by spaces; line breaks kept."""
    out = []
    i = 0
    n = len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c in " \t":
            out.append(c)
            i += 1
            continue
        if at_line_start and c == "#":
            # A preprocessor line, with its backslash continuations.
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append(" \n")
                    i += 2
                    continue
                out.append(" ")
                i += 1
            continue
        at_line_start = False
        if c == "\n":
            out.append(c)
            at_line_start = True
            i += 1
        elif text.startswith("//", i):
            while i < n and text[i] != "\n":
                out.append(" ")
                i += 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif c == "R" and i + 1 < n and text[i + 1] == '"' and (
                i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            open_paren = text.find("(", i + 2)
            delimiter = text[i + 2:open_paren]
            end = text.find(")" + delimiter + '"', open_paren)
            end = n if end < 0 else end + len(delimiter) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif c == '"' or (c == "'" and not (i > 0 and text[i - 1].isalnum() and
                                             i + 1 < n and text[i + 1].isalnum())):
            # A literal (a ' between two alphanumerics is a digit separator).
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(" " * (j - i))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _function_name(head):
    """The declarator's name: the token before the head's first parenthesis."""
    before = head.split("(", 1)[0].strip()
    if before.endswith("operator"):
        return before.split()[-1] + "()"
    match = re.search(r"([\w:~]*operator\s*\S+|[\w:~]+(?:<[^<>()]*>)?)\s*$", before)
    return match.group(1) if match else before[-40:]


def long_functions(text, limit=MAX_FUNCTION_LINES):
    """(line, name, lines) of each function definition in `text` over `limit` lines."""
    code = _blank(text)
    found = []
    line_of = []  # the line number of each offset
    line = 1
    for c in code:
        line_of.append(line)
        line += c == "\n"
    # Each open scope: (kind, (start line, name) of a function).
    stack = []
    head_start = 0  # offset where the current head begins
    paren = 0
    measuring = lambda: all(kind == "container" for kind, _ in stack)  # noqa: E731
    other_depth = 0  # depth of the "other" scopes open inside the current head
    for i, c in enumerate(code):
        if c == "(":
            paren += 1
        elif c == ")":
            paren = max(0, paren - 1)
        if paren > 0 or c not in ";{}":
            continue
        if not measuring():
            if c == "{":
                stack.append(("inner", None))
            elif c == "}":
                kind, start = stack.pop()
                if kind == "function":
                    lines = line_of[i] - start[0] + 1
                    if lines > limit:
                        found.append((start[0], start[1], lines))
                    head_start = i + 1
            continue
        if other_depth > 0:
            other_depth += {"{": 1, "}": -1, ";": 0}[c]
        elif c == ";":
            head_start = i + 1
        elif c == "{":
            raw = code[head_start:i]
            head = re.sub(r"\s+", " ", raw).strip()
            if _FUNCTION_HEAD.search(head) and not _CONTROL_HEAD.match(head):
                first = head_start + len(raw) - len(raw.lstrip())
                stack.append(("function", (line_of[first], _function_name(head))))
            elif _CONTAINER_HEAD.search(head):
                stack.append(("container", None))
                head_start = i + 1
            else:
                other_depth = 1
        elif stack:  # "}" closing a container
            stack.pop()
            head_start = i + 1
    return found


def _source_files(root):
    for top in SOURCE_DIRS:
        for directory, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(d for d in dirs if d != "fixtures")
            for name in sorted(files):
                if name.endswith(SOURCE_EXTENSIONS):
                    path = os.path.join(directory, name)
                    yield os.path.relpath(path, root).replace(os.sep, "/")


def check(root):
    """Every offence under `root`, as printable lines."""
    problems = []
    for rel in _source_files(root):
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            text = f.read()
        num_lines = len(text.splitlines())
        if num_lines > MAX_FILE_LINES:
            problems.append(f"{rel}:1: file has {num_lines} lines (limit {MAX_FILE_LINES})")
        if rel.startswith(tuple(d + "/" for d in FUNCTION_DIRS)) and not rel.startswith(
                FUNCTION_EXCLUDED):
            for start, name, lines in long_functions(text):
                problems.append(f"{rel}:{start}: function {name} has {lines} lines "
                                f"(limit {MAX_FUNCTION_LINES})")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = parser.parse_args()
    problems = check(args.root)
    for p in problems:
        print(p)
    if problems:
        print(f"code_size: {len(problems)} offender(s)")
        return 1
    print("code_size: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
