"""A synthetic text corpus generated from a tiny grammar: nothing to download, strong structure to learn."""

from __future__ import annotations

import random

_SUBJECTS = ["the cat", "a dog", "the old man", "my sister", "a small bird", "the robot", "our teacher"]
_VERBS = ["sees", "likes", "follows", "draws", "feeds", "finds", "calls"]
_OBJECTS = ["the ball", "a red apple", "the river", "a tall tree", "the moon", "a green box", "the door"]
_PLACES = ["in the park", "at home", "near the sea", "after lunch", "every day", "on monday"]


def sentence(rng: random.Random) -> str:
    words = [rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS)]
    if rng.random() < 0.5:
        words.append(rng.choice(_PLACES))
    return " ".join(words) + ".\n"


def generate(characters: int = 60_000, seed: int = 1234) -> str:
    """The same text for a given (characters, seed) on every machine."""
    rng = random.Random(seed)
    parts: list[str] = []
    total = 0
    while total < characters:
        text = sentence(rng)
        parts.append(text)
        total += len(text)
    return "".join(parts)[:characters]
