"""No development history in tracked files: the docs, docstrings, comments and tests state what is, in present tense.

Run history belongs to git (commit messages are history and are not scanned) and to ``CHANGELOG.md`` by version;
a file that numbers work by its run, its work period or its tracker entry reads as a lab notebook, and the numbers
mean nothing to a reader.  Every file ``git ls-files`` lists is scanned, binaries and data files aside; in Python
files only the prose is read (comments and string literals, docstrings included), so code identifiers never match.

What is refused (case-insensitive), and what stays allowed:

* a numbered run: "stop" followed by a number (``stop 33``, ``stops 45-53``, ``stop-40``);
* a numbered tracker entry: "issue" followed by a number (``issue 13``, ``issue #13``), except an upstream
  project's, named right before it (``SGLang issue #123``) or in a URL (``sglang/issues/123``);
* "session" as a word in prose; code uses stay allowed: quoted (``scope="session"``), after a dot or inside an
  identifier (``requests.Session``, ``aiohttp.ClientSession``, ``session_id``, ``start_new_session``) or called
  (``session(``);
* run-relative phrases: "earlier run", "slower day" / "faster day" (or hour), "review mend", "this stop", "last stop".
"""

from __future__ import annotations

import io
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SELF = Path(__file__).resolve().relative_to(REPO).as_posix()  # its docstring and examples name the words

#: not text, or data whose words are not the project's (prompt sets, images, weights, stored answers)
SKIPPED_SUFFIXES = {
    ".png", ".jpg", ".jpeg", ".gif", ".safetensors", ".gz", ".bin", ".pt", ".so", ".pdf", ".jsonl",
}  # fmt: skip
#: projects whose tracker entries a file may cite by number ("SGLang issue #123")
UPSTREAM = ("sglang", "vllm", "tensorrt-llm", "trt-llm", "pytorch", "torch", "transformers", "specforge", "flashinfer")

PATTERNS = {
    "a numbered run": re.compile(r"\bstops?[ -]\d", re.I),
    "a numbered tracker entry": re.compile(r"\bissues?\s*#?\d", re.I),
    "a working period": re.compile(r"(?<![\w.'\"`/$-])sessions?(?![\w'\"`(]|\.[A-Za-z_])", re.I),
    "a run-relative phrase": re.compile(
        r"\bearlier runs?\b|\b(?:slower|faster) (?:day|hour)s?\b|\breview mends?\b|\b(?:this|last) stop\b", re.I
    ),
}


def _tracked_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"not a git checkout ({err}): the scan reads the files git tracks")
    return [p for p in out.stdout.decode().split("\0") if p]


def _prose(path: Path, text: str) -> list[tuple[int, str]]:
    """``(line, text)`` pieces to scan: every line, or a Python file's comments and string literals."""
    if path.suffix != ".py":
        return list(enumerate(text.splitlines(), 1))
    pieces = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in (tokenize.COMMENT, tokenize.STRING):
                for i, line in enumerate(tok.string.splitlines()):
                    pieces.append((tok.start[0] + i, line))
    except (tokenize.TokenError, SyntaxError):
        return list(enumerate(text.splitlines(), 1))
    return pieces


def _upstream_before(line: str, start: int) -> bool:
    before = line[:start].rstrip().lower()
    return before.endswith(UPSTREAM)


def find_process_words(rel: str, text: str) -> list[str]:
    """Every match in one file, as ``path:line: what: text``."""
    hits = []
    for lineno, line in _prose(Path(rel), text):
        for what, pattern in PATTERNS.items():
            for m in pattern.finditer(line):
                if what == "a numbered tracker entry" and _upstream_before(line, m.start()):
                    continue
                hits.append(f"{rel}:{lineno}: {what}: {line.strip()}")
    return hits


def test_the_patterns_allow_code_and_upstream_references():
    allowed = [
        ("x.py", '@pytest.fixture(scope="session")\n'),
        ("x.py", "s = requests.Session()  # one pool\n"),
        ("x.py", "async with aiohttp.ClientSession() as c:\n    pass\n"),
        ("x.py", "Popen(cmd, start_new_session=True)\n"),
        ("x.py", "k = session_id  # the client's\n"),
        ("a.md", "SGLang issue #30263 and vLLM PR #52228, https://github.com/sgl-project/sglang/issues/123\n"),
        ("a.md", "the draft stops at level 3; a stop token ends the request\n"),
    ]
    for rel, text in allowed:
        assert find_process_words(rel, text) == [], text
    refused = [
        ("a.md", "measured at stop 33\n"),
        ("a.md", "over stops 45-53\n"),
        ("a.md", "the cases issue 13 named\n"),
        ("a.md", "in an earlier session\n"),
        ("x.py", "# on a slower day than the earlier run\n"),
        ("x.py", 'def f():\n    """Fixed in this stop."""\n'),
    ]
    for rel, text in refused:
        assert find_process_words(rel, text), text


def test_no_run_history_in_tracked_files():
    hits = []
    for rel in _tracked_files():
        path = REPO / rel
        if rel == SELF or path.suffix.lower() in SKIPPED_SUFFIXES or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue
        hits += find_process_words(rel, data.decode("utf-8", errors="replace"))
    assert not hits, "state what is, in present tense (history belongs to git and CHANGELOG.md):\n" + "\n".join(hits)
