"""Prompts and parsing: what the policy reads each turn and how its answer becomes an action."""

import functools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rspo.models import build_tiny_tokenizer
from rspo.prompts import Turn, format_response, parse_action, render_prompt, user_message
from rspo.rollout import STOP, response_lengths

CORPUS = [
    "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a fridge 1.",
    "Your task is to: put a hot apple in diningtable. go to fridge 1 open fridge 1 take apple 1 from fridge 1",
    "<action>go to fridge 1</action> <think>I will look.</think> Admissible actions: look, inventory",
] * 20


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer(CORPUS, 400)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<action>go to fridge 1</action>", ("go to fridge 1", True)),
        ("<think>hmm</think><ACTION> Open  Fridge 1 </ACTION>", ("open fridge 1", True)),
        ("<action>look</action> then <action>inventory</action>", ("inventory", True)),  # the last one counts
        ("<action></action>", ("", False)),
        ("go to fridge 1", ("go to fridge 1", False)),  # no tags: invalid, the text's tail goes to the env
        ("<action>go to", ("go to", False)),  # unterminated
    ],
)
def test_parse_action(text, expected):
    assert parse_action(text) == expected


@given(st.text(max_size=300))
def test_parse_action_never_raises(text):
    action, valid = parse_action(text)
    assert isinstance(action, str) and len(action) <= 300 and isinstance(valid, bool)


def test_user_message_holds_every_part():
    turn = Turn(
        "put a hot apple in diningtable",
        "You arrive at fridge 1.",
        ["look", "open fridge 1"],
        [("You are in a room.", "go to fridge 1")],
    )
    msg = user_message("alfworld", turn, require_think=True)
    for part in [
        "put a hot apple in diningtable",
        "You are in a room.",
        "Action: go to fridge 1",
        "Current observation: You arrive at fridge 1.",
        "look, open fridge 1",
        "<think>",
        "<action>",
    ]:
        assert part in msg
    assert "<think>" not in user_message("alfworld", turn, require_think=False)


def test_render_prompt_drops_oldest_history_first(tok):
    history = [(f"old observation number {i} " * 5, f"go to cabinet {i}") for i in range(6)]
    turn = Turn("put a hot apple in diningtable", "You arrive at fridge 1.", ["look", "inventory"], history)
    full = render_prompt(tok, "alfworld", turn, False, 10_000)
    budget = len(full) - 30
    ids = render_prompt(tok, "alfworld", turn, False, budget)
    text = tok.decode(ids)
    assert len(ids) <= budget
    assert "put a hot apple in diningtable" in text and "You arrive at fridge 1." in text
    assert "go to cabinet 5" in text and "go to cabinet 0" not in text  # newest kept, oldest dropped
    tiny = render_prompt(tok, "alfworld", turn, False, 5)  # impossible budget: task and observation survive
    assert "put a hot apple" in tok.decode(tiny)


def test_response_lengths_cut_at_stop_string_or_eos(tok):
    eos = tok.eos_token_id
    pad = tok.pad_token_id
    a = tok("<action>look</action>", add_special_tokens=False)["input_ids"]
    b = tok("<action>go to", add_special_tokens=False)["input_ids"]
    width = max(len(a), len(b)) + 4
    rows = [a + [pad] * (width - len(a)), b + [eos] + [pad] * (width - len(b) - 1)]
    import torch

    lengths = response_lengths(tok, torch.tensor(rows), {eos})
    assert tok.decode(a[: lengths[0]]).endswith(STOP)  # ends exactly at the stop string
    assert lengths[0] == len(a)
    assert lengths[1] == len(b) + 1  # through the eos, which is trained on
    # Pad == eos (SmolLM2): padding after the stop string is not part of the response.
    rows_eos_pad = [a + [eos] * (width - len(a))]
    assert response_lengths(tok, torch.tensor(rows_eos_pad), {eos}) == [len(a)]


def test_format_response_round_trips():
    assert parse_action(format_response("open fridge 1", require_think=True)) == ("open fridge 1", True)
    assert format_response("look", require_think=False) == "<action>look</action>"


WEBSHOP_CORPUS = [
    "B0KP3G4UOX [SEP] Pura Bloom Shampoo [SEP] $9.0\nAdmissible actions: click[b0kp3g4uox], click[16 fl oz]\n"
    "<action>click[b0kp3g4uox]</action>"
] * 20


@functools.cache
def webshop_tokenizer(kind: str):
    return build_tiny_tokenizer(WEBSHOP_CORPUS, 400, kind)


@pytest.mark.parametrize("kind", ["bpe", "words"])
@given(text=st.text(max_size=200))
def test_tiny_tokenizers_lose_no_text(kind, text):
    tokenizer = webshop_tokenizer(kind)
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


def test_words_tokenizer_makes_an_id_one_copyable_token():
    def pieces(kind: str, text: str) -> list[str]:
        return webshop_tokenizer(kind).tokenize(text)

    # GPT-2's splits cut letters from digits: b|0|kp|3|g|4|uox, at best 7 tokens to copy
    assert len(pieces("bpe", "click[b0kp3g4uox]")) >= 2 + 7
    # words: one token for the id, the same in the admissible list and in the answer
    assert pieces("words", "click[b0kp3g4uox]") == ["click", "[", "b0kp3g4uox", "]"]
    assert pieces("words", ", click[b0kp3g4uox],")[2:5] == ["[", "b0kp3g4uox", "]"]
