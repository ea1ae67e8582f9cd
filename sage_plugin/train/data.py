"""Training text for draft distillation: corpora, offline chat prompts and the held-out filter.

Three sources feed the label stage (:mod:`sage_plugin.train.labels`):

(a) the CPython stdlib ``.py`` sources of the running interpreter (``sysconfig.get_paths()["stdlib"]``, without
    ``site-packages``), (b) Debian ``python3.11-doc`` reST/text under ``/usr/share/doc/python3.11`` if installed,
    and (c) chat prompts built offline (templated general/role-play/math/code requests, HumanEval-style
    prompts made from stdlib functions and the instruction categories of :mod:`sage_plugin.train.instructions`)
    that the target answers greedily.  Chat prompts never depend on python3.11-doc being installed.

MT-Bench and HumanEval are never used for training: they are the held-out evaluation set
(:func:`sage_plugin.train.evaluate.evaluate_draft`), and any generated prompt equal to one of them is dropped.
No other bundled prompt set (GSM8K) is used either, so ``sage bench`` runs on prompts the draft never saw.
"""

from __future__ import annotations

import ast
import logging
import random
import textwrap
from collections.abc import Iterator
from pathlib import Path

from ..data.prompts import HUMANEVAL_PREFIX, HUMANEVAL_SUFFIX, load_prompts
from .corpus import PYTHON_DOC_DIR, python_doc_files, stdlib_files, stdlib_modules, text_documents
from .instructions import instruction_prompts

logger = logging.getLogger(__name__)

__all__ = [
    "HELD_OUT_DATASETS",
    "PYTHON_DOC_DIR",
    "stdlib_files",
    "stdlib_modules",
    "python_doc_files",
    "text_documents",
    "chat_prompts",
]

HELD_OUT_DATASETS: tuple[str, ...] = ("mt_bench", "humaneval")
"""Bundled prompt sets reserved for evaluation: never used to build training data."""

# ----- chat prompts (training only; never MT-Bench / HumanEval) -------------------------------------------------

# Templates and word lists, kept compact (the formatter would put every item on a line of its own).
# fmt: off
_GENERAL_TEMPLATES = [
    "Write a short blog post about {t}.",
    "Explain {t} to a high-school student.",
    "What are the main advantages and disadvantages of {t}?",
    "Give me five practical tips related to {t}.",
    "Write a short poem about {t}.",
    "Summarize the key ideas behind {t} in three sentences.",
    "Draft a polite email to a colleague about {t}.",
    "Write a dialogue between two friends discussing {t}.",
    "What are common misconceptions about {t}?",
    "Describe the history of {t} briefly.",
    "Prepare a short lesson plan for a class on {t}.",
    "Compare {t} with a related idea and explain the differences.",
    "Write a persuasive paragraph arguing that more people should learn about {t}.",
    "List three questions a beginner might ask about {t}, and answer each one.",
    "Tell a short story in which {t} plays an important role.",
    "How would you explain {t} to a five-year-old?",
    "What skills does someone need to work on {t}?",
    "Write a product description for an app that helps people with {t}.",
    "Give a step-by-step guide to getting started with {t}.",
    "What ethical questions are raised by {t}?",
    "Write a haiku about {t}.",
    "Create a quiz with three multiple-choice questions about {t}, with answers.",
    "Write a tweet announcing an exciting new development in {t}.",
    "Make a table of the pros and cons of {t}.",
    "List the key terms a student should know about {t} and define each one.",
    "What will {t} look like in twenty years? Give a reasoned prediction.",
    "Write a limerick about {t}.",
    "Give an outline for a presentation about {t}.",
]

_TOPICS = [
    "renewable energy", "climate change", "machine learning", "ancient Rome", "the French Revolution",
    "photosynthesis", "black holes", "the human immune system", "healthy sleep habits", "remote work",
    "personal finance", "budgeting for students", "electric cars", "urban gardening", "the history of jazz",
    "Shakespeare's plays", "quantum computing", "the water cycle", "volcanoes", "recycling",
    "public transportation", "social media", "online privacy", "cybersecurity", "the stock market", "inflation",
    "supply and demand", "meditation", "marathon training", "nutrition", "vegetarian cooking", "baking bread",
    "coffee", "time management", "learning a foreign language", "public speaking", "job interviews",
    "leadership", "teamwork", "starting a small business", "marketing", "the Renaissance", "impressionist painting",
    "classical music", "film making", "video game design", "space exploration", "the Moon landing", "the Internet",
    "smartphones", "artificial intelligence in medicine", "vaccines", "antibiotic resistance", "genetics",
    "evolution", "dinosaurs", "ocean conservation", "coral reefs", "rainforests", "bees and pollination",
    "migratory birds", "caring for pets", "dog training", "chess", "football", "the Olympic Games",
    "mountain hiking", "camping", "travelling on a budget", "Japanese culture", "the Silk Road",
    "the printing press", "the Industrial Revolution", "democracy", "human rights", "volunteering",
    "mental health", "stress management", "friendship", "parenting", "early childhood education",
    "online learning", "libraries", "poetry", "science fiction", "mystery novels", "architecture", "bridges",
    "3D printing", "robotics", "blockchain", "cloud computing", "open-source software", "databases",
    "the Python programming language", "sorting algorithms", "prime numbers", "probability", "geometry",
    "statistics", "weather forecasting", "earthquakes", "electricity", "magnetism", "the periodic table",
    "chemistry in the kitchen", "the solar system", "plate tectonics", "the Roman Empire", "ancient Egypt",
    "the Cold War", "world trade", "tourism", "fast fashion", "minimalism", "board games", "gardening",
    "birdwatching", "photography", "podcasts", "journalism", "fake news", "nuclear power", "water scarcity",
]

_PERSONAS = [
    "a pirate captain", "a medieval knight", "a private detective", "a famous chef", "a travel agent",
    "a personal trainer", "a museum guide", "a senior software engineer", "a family doctor", "a history professor",
    "an astronaut", "a kindergarten teacher", "a startup founder", "a park ranger", "a librarian",
    "a sports commentator", "a wise old wizard", "a customer support agent", "a career coach", "a poet",
]

_PERSONA_TASKS = [
    "Introduce yourself and describe a typical day.",
    "Give some advice to someone who is new to your field.",
    "Describe the biggest challenge you have faced.",
    "Answer this question in character: what makes a good friend?",
    "Explain why your job matters to society.",
    "Tell me about a memorable mistake and what you learned from it.",
]

_CODE_TASKS = [
    "reverses the words in a sentence", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "merges two sorted lists into one sorted list", "counts how often each word occurs in a text",
    "flattens a nested list", "checks whether a string is a valid IPv4 address",
    "finds the longest common prefix of a list of strings", "converts Celsius to Fahrenheit",
    "removes duplicates from a list while preserving order", "computes the factorial of n",
    "implements binary search on a sorted list", "parses a line of comma-separated values",
    "computes the greatest common divisor of two integers", "transposes a matrix given as a list of lists",
    "returns the k largest elements of a list", "checks whether two strings are anagrams",
    "converts a Roman numeral to an integer", "groups a list of records by a key",
    "computes a moving average over a list of numbers", "validates balanced parentheses in a string",
    "reads a JSON file and returns the keys of the top-level object", "implements a simple stack class",
    "implements a queue with two stacks", "computes the median of a list", "rotates a list by k positions",
    "finds all pairs in a list that sum to a target", "converts a string to snake_case",
    "counts the vowels in a string", "splits a list into chunks of size n", "computes the dot product of two vectors",
    "returns the second largest number in a list", "checks whether a year is a leap year",
    "compresses a string with run-length encoding", "computes the edit distance between two strings",
]

_LANGS = ["Python", "Python", "Python", "JavaScript", "C", "Java", "Rust", "Go"]

_MATH_TEMPLATES = [
    "A shop sells pencils for ${a} each and notebooks for ${b} each. How much do {c} pencils and {d} notebooks cost?",
    "A train travels {a}0 kilometres in {b} hours. What is its average speed? Answer step by step.",
    "Tom has {a}{b} marbles. He gives {c} to each of his {d} friends. How many marbles does he have left?",
    "What is {a}{b} multiplied by {c}{d}? Show your work.",
    "A rectangle is {a}{c} cm long and {b}{d} cm wide. What are its area and perimeter?",
    "If {a} workers can paint a house in {b}{c} days, how long would {d} workers take at the same rate?",
    "Solve for x: {a}x + {b}{c} = {d}{a}. Explain each step.",
    "A recipe needs {a} eggs for {b} cakes. How many eggs are needed for {c}{d} cakes?",
    "Sarah saves ${a}{b} every week. How many weeks does she need to save ${c}{d}00?",
    "What is {a}{b}% of {c}{d}0? Explain how you calculate it.",
]

# fmt: on


def _heldout_messages() -> set[str]:
    out: set[str] = set()
    for ds in HELD_OUT_DATASETS:
        for p in load_prompts(ds):
            out.update(m["content"].strip() for m in p.messages if isinstance(m.get("content"), str))
    return out


def _stdlib_function_prompts(seed: int, stdlib: str | Path | None = None) -> Iterator[str]:
    """Prompts made from documented stdlib functions: HumanEval-style completion, explanation, re-implementation."""
    kind = 0
    for src, tree in stdlib_modules(stdlib, shuffle_seed=seed + 17):
        lines = src.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc) < 40 or not node.body or node.end_lineno is None:
                continue
            n_lines = node.end_lineno - node.lineno + 1
            if n_lines > 40:
                continue
            header = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.body[0].end_lineno])) + "\n"
            full = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.end_lineno]))
            summary = doc.strip().splitlines()[0].strip().rstrip(".")
            k = kind % 3
            kind += 1
            if k == 0:
                yield HUMANEVAL_PREFIX + header + HUMANEVAL_SUFFIX
            elif k == 1:
                yield f"Explain what the following Python function does:\n\n```python\n{full}\n```"
            elif len(summary) >= 20:
                yield f"Write a Python function `{node.name}` that does the following: {summary}."


MIX_V1_PROMPTS = 3072
"""Prompts ``0 .. MIX_V1_PROMPTS-1`` are the templated mix; later prompts come mostly from
:func:`sage_plugin.train.instructions.instruction_prompts`.  Growing ``n`` never
changes earlier prompts, so label shards of a smaller run stay valid."""


def chat_prompts(n: int, seed: int = 0, stdlib: str | Path | None = None) -> list[str]:
    """``n`` distinct user messages for the target to answer (deterministic for a seed; a prefix of a larger ``n``).

    Sources, interleaved: templated general requests (topic x task), role-play,
    synthetic arithmetic word problems, coding requests, prompts made from documented stdlib functions (HumanEval
    format, explanations, re-implementations); after
    :data:`MIX_V1_PROMPTS` prompts, two in three come from the compositional instruction categories of
    :mod:`sage_plugin.train.instructions` (writing, role-play, reasoning, math, extraction, knowledge, code,
    advice).  Messages equal to an MT-Bench or HumanEval prompt are dropped (those are the held-out evaluation
    sets).  A phase ends when its sources run dry or repeat themselves ``10 x (sources in its pattern) + 1000``
    times in a row.
    """
    if n <= 0:
        return []
    rng = random.Random(seed)
    general = [t.format(t=topic) for t in _GENERAL_TEMPLATES for topic in _TOPICS]
    rng.shuffle(general)
    roleplay = [f"Pretend you are {p}. {t}" for p in _PERSONAS for t in _PERSONA_TASKS]
    rng.shuffle(roleplay)
    code = [f"Write a {lang} function that {task}." for task in _CODE_TASKS for lang in dict.fromkeys(_LANGS)]
    code = [f"Write a Python function that {task}. Include a docstring and an example." for task in _CODE_TASKS] + code
    rng.shuffle(code)

    def math_gen() -> Iterator[str]:
        r = random.Random(seed + 3)
        while True:
            t = r.choice(_MATH_TEMPLATES)
            yield t.format(a=r.randint(2, 9), b=r.randint(2, 9), c=r.randint(2, 9), d=r.randint(2, 9))

    sources: dict[str, Iterator[str]] = {
        "general": iter(general),
        "roleplay": iter(roleplay),
        "math": math_gen(),
        "code": iter(code),
        "stdlib": _stdlib_function_prompts(seed, stdlib),
        "instruction": instruction_prompts(seed, stdlib),
    }
    phases = [
        (
            min(n, MIX_V1_PROMPTS),
            [
                "general",
                "stdlib",
                "general",
                "roleplay",
                "math",
                "code",
                "general",
                "stdlib",
                "math",
                "general",
                "stdlib",
            ],
        ),
        (n, ["instruction", "instruction", "stdlib", "instruction", "instruction", "general"]),
    ]
    held_out = _heldout_messages()
    seen: set[str] = set()
    out: list[str] = []
    for goal, pattern in phases:
        misses = 0
        while len(out) < goal and misses < 10 * len(pattern) + 1000:
            for name in pattern:
                if len(out) >= goal:
                    break
                it = sources.get(name)
                msg = next(it, None) if it is not None else None
                if msg is None:
                    sources.pop(name, None)
                    misses += 1
                    continue
                key = msg.strip()
                if key in held_out or key in seen:
                    misses += 1
                    continue
                seen.add(key)
                out.append(msg)
                misses = 0  # a run of misses ends the phase, not their total
            if not sources:
                break
    if len(out) < n:
        logger.warning("only %d distinct training prompts available (asked for %d)", len(out), n)
    return out
