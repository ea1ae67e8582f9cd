"""Compositional instruction prompts (mix v2 of the draft's chat data): the categories a chat assistant is asked.

The first draft mixes (:func:`sage_plugin.train.data.chat_prompts`, prompts ``0 .. MIX_V1_PROMPTS-1``) were a few
dozen templates; the draft overfitted them and agreed with the target far less on open-ended held-out requests.
This module builds many more request shapes offline, deterministically from a seed, in eight categories:

``writing`` (form x topic x constraint), ``roleplay`` (persona x request), ``reasoning`` (generated ordering,
position, direction, family and calendar puzzles), ``math`` (percentages, equations, inequalities, probability,
geometry, sequences), ``extraction`` (stdlib docstring paragraphs or generated records with an instruction:
summarise, extract as JSON, list, rewrite, title), ``knowledge`` (STEM and humanities concept questions),
``code`` (more tasks and phrasings) and ``advice`` (everyday requests).

No prompt is taken from MT-Bench or HumanEval (the held-out evaluation sets); :func:`chat_prompts` also drops any
exact match.  Usage::

    >>> it = instruction_prompts(seed=0)
    >>> len({next(it) for _ in range(800)}) > 700
    True
"""

from __future__ import annotations

import ast
import functools
import random
import re
from collections.abc import Iterator
from pathlib import Path

from .corpus import stdlib_modules

__all__ = ["CATEGORIES", "instruction_prompts"]

# Word lists, kept compact (the formatter would put every item on a line of its own).
# fmt: off
_TOPICS = [
    "a weekend trip to Lisbon", "a new coffee shop in town", "learning to play the guitar", "a rainy day in Tokyo",
    "the first day at a new job", "a community garden", "a solar-powered car", "a lost wallet returned by a stranger",
    "a school science fair", "moving to a new city", "a marathon for charity", "an old lighthouse",
    "a robot that learns to paint", "a village festival", "the discovery of a new planet", "a family recipe",
    "an online course on data science", "a hiking trip in the Alps", "a local bookstore closing down",
    "a smartphone that lasts a week on one charge", "adopting a rescue dog", "a city without cars",
    "the invention of the telephone", "a time traveller visiting ancient Greece", "a football final",
    "a museum of modern art", "working from a café", "a new vaccine", "a volunteering day at an animal shelter",
    "a bike-sharing program", "a concert in the park", "a desert safari", "a startup that recycles plastic",
    "the northern lights", "a mystery in a small town", "an ocean cleanup project", "a chess tournament",
    "a new public library", "a power outage in winter", "a train journey across Canada", "a cooking competition",
    "a student exchange in Kenya", "an electric scooter", "a vertical farm", "a high-school reunion",
    "a wildlife photographer", "a 24-hour hackathon", "a snowstorm", "the history of chocolate", "a space hotel",
]

_FORMS = [
    "a travel blog post", "a short story", "a persuasive essay", "a news article", "a product review",
    "a speech for a graduation ceremony", "a diary entry", "a formal letter", "a cover letter", "an advertisement",
    "a podcast script", "a press release", "a movie plot summary", "a motivational message", "a restaurant review",
    "a job posting", "a children's story", "a newsletter", "a social media post", "an opinion column",
    "a set of interview questions", "a limerick", "a sonnet", "a song chorus", "a short play scene",
]

_CONSTRAINTS = [
    "", "", " Keep it under 150 words.", " Use vivid imagery.", " Write it in a humorous tone.",
    " Make it suitable for children.", " Include a catchy title.", " End with a question to the reader.",
    " Use exactly three paragraphs.", " Highlight both benefits and risks.", " Write it from the first person.",
    " Include at least one statistic.", " Keep the language simple.", " Make it sound professional.",
    " Use bullet points where helpful.", " Start every sentence with a different word.",
]

_WRITE_VERBS = ["Write", "Compose", "Draft", "Create", "Please write", "Help me write"]

_PERSONAS = [
    "a detective solving a case", "a medieval blacksmith", "a tour guide in Rome", "a nutritionist",
    "a stand-up comedian", "a ship's captain in a storm", "a high-school math teacher", "a financial advisor",
    "a marine biologist", "a famous inventor from the 1800s", "a customer service manager", "a yoga instructor",
    "a startup investor", "a news anchor", "a librarian in a huge library", "a mountain guide",
    "a video game character", "a time traveller from the future", "a kind dragon", "a robot butler",
    "a sports coach before the final", "a fashion designer", "a tech support agent", "a gardener",
    "a psychologist", "a travel writer", "a lawyer", "a Shakespearean actor", "a chef judging a contest",
    "an alien visiting Earth", "a museum curator", "an airline pilot", "a veterinarian", "a journalist",
]

_PERSONA_REQUESTS = [
    "Explain what you do all day.", "Give me your best advice for beginners.",
    "Describe the most surprising thing that ever happened to you.", "Convince me to try your favourite activity.",
    "Tell me what you think about modern technology.", "Answer in character: what makes a good leader?",
    "Describe your ideal weekend.", "Explain a common mistake people make in your field.",
    "I am nervous about tomorrow. What do you say to me?", "Describe your workplace in detail.",
    "What would you change about the world, and why?", "Teach me one useful skill in a few steps.",
]

_ROLE_OPENERS = ["Pretend you are {p}.", "Act as {p}.", "Imagine you are {p}.", "You are {p}.",
                 "Take on the role of {p}."]

_NAMES = ["Alice", "Bob", "Carlos", "Dana", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kira", "Liam",
          "Mei", "Noah", "Olga", "Priya", "Quinn", "Rosa", "Sam", "Tariq", "Uma", "Victor", "Wen", "Yusuf", "Zoe"]

_FIELDS = {
    "physics": ["entropy", "momentum", "the photoelectric effect", "special relativity", "quantum tunnelling",
                "superconductivity", "the Doppler effect", "nuclear fission", "friction", "electromagnetic waves"],
    "biology": ["natural selection", "DNA replication", "the cell membrane", "enzymes", "the nervous system",
                "mitosis", "symbiosis", "the circulatory system", "protein synthesis", "ecosystems"],
    "chemistry": ["chemical equilibrium", "oxidation", "covalent bonds", "pH", "catalysts", "isotopes",
                  "polymers", "acids and bases", "the ideal gas law", "electrolysis"],
    "economics": ["opportunity cost", "inflation", "comparative advantage", "monopolies", "interest rates",
                  "fiscal policy", "the labour market", "exchange rates", "public goods", "recessions"],
    "computer science": ["recursion", "hash tables", "operating systems", "compilers", "public-key cryptography",
                         "garbage collection", "TCP/IP", "neural networks", "big-O notation", "version control"],
    "history": ["the fall of the Berlin Wall", "the Magna Carta", "the Meiji Restoration", "the Black Death",
                "the American Revolution", "the age of exploration", "the Ottoman Empire", "the Great Depression",
                "the invention of writing", "the abolition of slavery"],
    "philosophy": ["utilitarianism", "free will", "the social contract", "existentialism", "stoicism",
                   "the trolley problem", "empiricism", "moral relativism", "Plato's cave", "virtue ethics"],
    "psychology": ["cognitive dissonance", "confirmation bias", "classical conditioning", "motivation",
                   "short-term memory", "growth mindset", "the placebo effect", "peer pressure", "habits",
                   "emotional intelligence"],
    "earth science": ["plate tectonics", "the carbon cycle", "ocean currents", "erosion", "the greenhouse effect",
                      "hurricanes", "glaciers", "the rock cycle", "groundwater", "the ozone layer"],
}

_KNOWLEDGE = [
    "In {f}, what is {c}? Explain it with an example.", "What is {c}, and why does it matter in {f}?",
    "Explain {c} in simple terms.", "How does {c} relate to {c2}?", "Describe {c} and give two real-world examples.",
    "What are the most common misunderstandings about {c}?", "Compare {c} and {c2}.",
    "Why do students of {f} find {c} difficult, and how can it be taught better?",
    "Give a short history of how {c} was discovered or developed.", "Write three exam questions about {c}.",
    "Discuss {c} and its impact on everyday life.", "Summarize the key facts about {c} in a numbered list.",
]

_ADVICE = [
    "How can I improve my sleep when I work night shifts?", "What should I pack for a week-long trip to {city}?",
    "Suggest a three-day itinerary for {city}.", "How do I prepare for a job interview at a {company}?",
    "What are some healthy breakfast ideas for busy mornings?", "How can I stay motivated while studying {skill}?",
    "Give me a weekly plan to start learning {skill}.", "How should I split a monthly budget of ${amount}?",
    "What are good gift ideas for a friend who likes {hobby}?", "How do I politely decline an invitation to {event}?",
    "Recommend a routine for someone who wants to get better at {skill}.",
    "What questions should I ask before buying a used {item}?", "How can I make my {room} feel more spacious?",
    "My friend is upset that I forgot {event}. How can I apologise?", "What are the first steps to start a {company}?",
]

_FILL = {
    "city": ["Paris", "Kyoto", "New York", "Cape Town", "Buenos Aires", "Istanbul", "Sydney", "Prague", "Lima",
             "Seoul", "Marrakesh", "Vancouver"],
    "company": ["tech startup", "bank", "hospital", "design agency", "car manufacturer", "school", "bakery",
                "law firm"],
    "skill": ["Spanish", "drawing", "programming", "public speaking", "cooking", "photography", "chess", "piano",
              "statistics", "writing"],
    "amount": ["1500", "2400", "3200", "900", "5000"],
    "hobby": ["hiking", "board games", "gardening", "astronomy", "knitting", "cycling", "baking", "jazz"],
    "event": ["a wedding", "a birthday party", "a team dinner", "a conference", "a housewarming", "a reunion"],
    "item": ["car", "laptop", "bicycle", "camera", "sofa", "piano"],
    "room": ["bedroom", "kitchen", "office", "living room", "balcony"],
}

_CODE_TASKS = [
    "finds the k-th smallest element in an unsorted list", "checks whether a linked list has a cycle",
    "returns the longest palindromic substring of a string", "implements an LRU cache",
    "counts the number of islands in a grid of 0s and 1s", "performs a breadth-first search on a graph",
    "computes the shortest path in a weighted graph with Dijkstra's algorithm", "serialises a binary tree",
    "finds the lowest common ancestor of two nodes in a binary search tree", "implements quicksort",
    "merges overlapping intervals", "validates an email address with a regular expression",
    "reads a CSV file and prints the average of a column", "returns the most frequent words in a text file",
    "converts an integer to its binary representation", "checks whether a sudoku board is valid",
    "generates all permutations of a list", "computes the power set of a set", "implements a trie",
    "finds the maximum subarray sum", "solves the coin change problem", "implements matrix multiplication",
    "parses a simple arithmetic expression", "computes the Levenshtein distance", "implements a binary heap",
    "detects whether two rectangles overlap", "formats a number with thousands separators",
    "counts lines, words and characters in a file", "retries a failing call with exponential backoff",
    "finds the median of two sorted arrays", "implements a rate limiter", "topologically sorts a graph",
]

_CODE_OPENERS = ["Write a {lang} function that {t}.", "Implement a {lang} program that {t}.",
                 "Develop a {lang} function that {t}, and explain its time complexity.",
                 "Write {lang} code that {t}. Add comments.", "Show how to write a {lang} function that {t}.",
                 "Write a {lang} class that {t}, with a short usage example."]

_CODE_LANGS = ["Python", "Python", "Python", "JavaScript", "C++", "Java", "TypeScript", "Go", "Rust", "C#"]

_EXTRACT_INSTR = [
    "Summarize the following text in two sentences.", "List the key points of the following passage.",
    "Rewrite the following passage so that a beginner can understand it.",
    "Suggest a short title for the following text.", "What is the main idea of the following passage?",
    "Extract all technical terms from the following text and output them as a JSON list.",
    "Write three questions that the following passage answers, and answer them.",
    "Read the passage below and explain it in your own words.",
]

_RECORD_INSTR = [
    "Extract the name, age and city of each person from the text below. Output the result as JSON.",
    "From the text below, list each person with their job, one per line.",
    "Read the text below and answer: who is the oldest person, and where do they live?",
    "Create a table with the columns name, age, city and job from the following text.",
]

_JOBS = ["a nurse", "an engineer", "a teacher", "a baker", "a pilot", "a lawyer", "a painter", "a farmer",
         "a programmer", "an architect", "a chemist", "a journalist"]

# fmt: on


def _writing(r: random.Random) -> str:
    return f"{r.choice(_WRITE_VERBS)} {r.choice(_FORMS)} about {r.choice(_TOPICS)}.{r.choice(_CONSTRAINTS)}"


def _roleplay(r: random.Random) -> str:
    return f"{r.choice(_ROLE_OPENERS).format(p=r.choice(_PERSONAS))} {r.choice(_PERSONA_REQUESTS)}"


def _reasoning(r: random.Random) -> str:
    k = r.randrange(6)
    names = r.sample(_NAMES, 4)
    if k == 0:
        a, b, c, _ = names
        rel = r.choice([("taller", "shortest"), ("older", "youngest"), ("faster", "slowest"), ("richer", "poorest")])
        return f"{a} is {rel[0]} than {b}, and {b} is {rel[0]} than {c}. Who is the {rel[1]}? Explain your reasoning."
    if k == 1:
        pos = r.choice(["second", "third", "fourth", "last"])
        return f"In a race, you overtake the person in {pos} place. What is your position now? Explain step by step."
    if k == 2:
        side, d = r.choice(["left", "right", "behind"]), r.choice(["north", "south", "east", "west"])
        return (
            f"In the morning the sun rises in the east. {names[0]} stands facing {d}. Is the sunrise on "
            f"{names[0]}'s {side}? Explain your reasoning."
        )
    if k == 3:
        a, b = names[:2]
        rel = r.choice(["the father of", "the sister of", "the grandmother of", "the uncle of"])
        rel2 = r.choice(["the son of", "the daughter of", "the brother of", "the mother of"])
        return f"{a} is {rel} {b}, and {b} is {rel2} {names[2]}. How is {a} related to {names[2]}? Explain."
    if k == 4:
        day = r.choice(["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"])
        n = r.randint(3, 100)
        return f"If today is {day}, what day of the week will it be in {n} days? Show your reasoning."
    n, m = r.randint(3, 12), r.randint(2, 6)
    return (
        f"There are {n} people at a party and everyone shakes hands with everyone else once. Then {m} more "
        f"people arrive and do the same. How many handshakes happen in total? Explain."
    )


def _math(r: random.Random) -> str:
    k = r.randrange(8)
    a, b, c = r.randint(2, 40), r.randint(2, 40), r.randint(2, 99)
    if k == 0:
        return f"What is {a}% of {b * 10}? Then increase the result by {c}%. Show each step."
    if k == 1:
        return f"Solve the equation {a}x - {b} = {c}. Check your answer."
    if k == 2:
        return f"How many integers satisfy |x - {a}| < {b}? Explain."
    if k == 3:
        return f"Two dice are rolled. What is the probability that the sum is {r.randint(2, 12)}? Explain."
    if k == 4:
        return f"A triangle has vertices (0, 0), ({a}, 0) and (0, {b}). What is its area and perimeter?"
    if k == 5:
        return f"What is the next number in the sequence {a}, {a + b}, {a + 2 * b}, {a + 3 * b}? Explain the rule."
    if k == 6:
        return (
            f"In a class of {a + b + 10} students, {a} play football, {b} play tennis and {min(a, b) // 2} play "
            f"both. How many play neither? Explain."
        )
    return f"A car uses {a // 4 + 4} litres of fuel per 100 km. How much fuel does it need for {c * 10} km?"


def _knowledge(r: random.Random) -> str:
    f = r.choice(sorted(_FIELDS))
    c, c2 = r.sample(_FIELDS[f], 2)
    return r.choice(_KNOWLEDGE).format(f=f, c=c, c2=c2)


def _advice(r: random.Random) -> str:
    t = r.choice(_ADVICE)
    return re.sub(r"\{(\w+)\}", lambda m: r.choice(_FILL[m.group(1)]), t)


def _code(r: random.Random) -> str:
    return r.choice(_CODE_OPENERS).format(lang=r.choice(_CODE_LANGS), t=r.choice(_CODE_TASKS))


def _records(r: random.Random) -> str:
    people = []
    for name in r.sample(_NAMES, r.randint(2, 4)):
        people.append(
            f"{name} is {r.randint(19, 80)} years old, lives in {r.choice(_FILL['city'])} and works as "
            f"{r.choice(_JOBS)}."
        )
    return f"{r.choice(_RECORD_INSTR)}\n\n{' '.join(people)}"


@functools.lru_cache(maxsize=2)
def _docstring_paragraphs(stdlib: str | Path | None) -> tuple[str, ...]:
    """Prose paragraphs (300-1200 characters) of stdlib module, class and function docstrings, in file order
    (parsing the standard library takes seconds: one parse per process and library)."""
    out = []
    for _, tree in stdlib_modules(stdlib):
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            for para in re.split(r"\n\s*\n", doc or ""):
                text = " ".join(line.strip() for line in para.splitlines())
                if 300 <= len(text) <= 1200 and not re.search(r"(>>>|::|==|\+--|\$|@|\{)", text):
                    out.append(text)
    return tuple(out)


CATEGORIES = ("writing", "roleplay", "reasoning", "math", "extraction", "knowledge", "code", "advice")


def instruction_prompts(seed: int, stdlib: str | Path | None = None) -> Iterator[str]:
    """Endless deterministic stream of instruction prompts, one per category in turn (see the module docstring).

    Duplicates are possible from the generators; :func:`sage_plugin.train.data.chat_prompts` de-duplicates.
    """
    r = random.Random(seed + 101)
    paras = list(_docstring_paragraphs(stdlib))
    random.Random(seed + 103).shuffle(paras)
    para_it = iter(paras)

    def extraction() -> str:
        para = next(para_it, None)
        if para is None or r.random() < 0.3:
            return _records(r)
        return f"{r.choice(_EXTRACT_INSTR)}\n\n{para}"

    makers = {
        "writing": lambda: _writing(r),
        "roleplay": lambda: _roleplay(r),
        "reasoning": lambda: _reasoning(r),
        "math": lambda: _math(r),
        "extraction": extraction,
        "knowledge": lambda: _knowledge(r),
        "code": lambda: _code(r),
        "advice": lambda: _advice(r),
    }
    while True:
        for name in CATEGORIES:
            yield makers[name]()
