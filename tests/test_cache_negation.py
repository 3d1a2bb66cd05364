"""The negation guard's signatures (the end-to-end check with real embeddings is in
test_cache_semantic.py)."""

from __future__ import annotations

import pytest

from serving.cache.negation import conflict, polarity


def why(a: str, b: str) -> str | None:
    return conflict(polarity(a), polarity(b))


@pytest.mark.parametrize(("a", "b", "reason"), [
    ("turn on the light", "turn off the light", "antonym"),
    ("Is it safe to drink?", "Is it not safe to drink?", "negation"),
    ("Can I pay by card?", "Can't I pay by card?", "negation"),
    ("Why does it start?", "Why doesnt it start?", "negation"),
    ("Coffee with sugar", "Coffee without sugar", "negation"),
    ("Should I take it before meals?", "Should I take it after meals?", "antonym"),
    ("How do I enable 2FA?", "How do I disable 2FA?", "antonym"),
    ("How do I enable dark mode?", "How do I turn off dark mode?", "antonym"),
    ("Can I increase my quota?", "Can I decrease my quota?", "antonym"),
    ("How do I open a ticket?", "How do I close a ticket?", "antonym"),
    ("How do I log in?", "How do I log out?", "antonym"),
    ("How do I add a user?", "How do I remove a user?", "antonym"),
    ("The server started", "The server stopped", "antonym"),
    ("What is 2+2?", "What is 2+3?", "number"),
    ("Is 3 less than 5?", "Is 5 less than 3?", "number"),
    ("Book a table for two", "Book a table for 3", "number"),
    ("How do I lock the screen?", "How do I unlock the screen?", "antonym"),
    ("Is this legal?", "Is this illegal?", "antonym"),
    ("Can I mount the drive?", "Can I unmount the drive?", "antonym"),
    ("How to tangle cables", "How to untangle cables", "prefix: tangle/untangle"),
])
def test_polarity_flips_conflict(a: str, b: str, reason: str) -> None:
    assert why(a, b) == reason
    assert why(b, a) == reason


@pytest.mark.parametrize(("a", "b"), [
    ("How do I reset my password?", "What is the way to reset my password?"),
    ("How do I enable dark mode?", "How do I turn on dark mode?"),
    ("turn on the light", "turn the light on"),
    ("I can't log in", "I cannot sign in"),
    ("Why won't it start?", "Why does it not start?"),
    ("Book a table for two", "Book a table for 2"),
    ("We have 1,000 users", "We have 1000 users"),
    ("Is it safe?", "IS IT SAFE?"),
    ("Don\u2019t stop", "do not stop"),  # typographic apostrophe
])
def test_same_polarity_agrees(a: str, b: str) -> None:
    assert why(a, b) is None


def test_particle_verbs_are_one_token() -> None:
    # "log off" is a logout, not the "off" of a switch.
    assert why("How do I log off?", "How do I log out?") is None
    assert why("How do I sign in?", "How do I log in?") is None
    assert polarity("shut down the VM").polar == frozenset({("active", -1)})


def test_inflections_share_the_axis() -> None:
    assert why("It is enabled", "enable it") is None
    assert why("Stopping the job", "stop the job") is None
    assert why("It denied access", "deny access") is None
