"""Prompts the policy reads each turn, and parsing of its answer.

One user chat message per turn, as the GiGPO reference builds them: the task, the last
`history_length` observation/action pairs, the current observation, the admissible
actions, and the answer format. The answer's action is the text inside
`<action>...</action>`. Prompts that do not fit `max_prompt_tokens` lose their oldest
history first, then the tail of the admissible-action list; the task and the current
observation are never dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

INTRO = {
    "alfworld": "You are an expert agent in a household. Your task is to: {task}",
    "webshop": "You are an expert online shopper. Your task is: {task}",
}
_ACTION = re.compile(r"<action>(.*?)</action>", re.IGNORECASE | re.DOTALL)
FALLBACK_CHARS = 100  # an answer without tags sends its last characters to the env (a safe no-op)


@dataclass
class Turn:
    """What the policy needs to act once."""

    task: str
    observation: str
    admissible: list[str]
    history: list[tuple[str, str]]  # (observation, action) pairs, oldest first


def add_history(history: list[tuple[str, str]], observation: str, action: str, k: int) -> list[tuple[str, str]]:
    """The last `k` (observation, action) pairs after this step (none when k = 0)."""
    return [*history, (observation, action)][-k:] if k else []


def format_instruction(require_think: bool) -> str:
    if require_think:
        return (
            "First think step by step inside <think></think>, then give exactly one admissible action "
            "inside <action></action>."
        )
    return "Answer with exactly one admissible action inside <action></action>."


def user_message(env_name: str, turn: Turn, require_think: bool, max_actions: int | None = None) -> str:
    lines = [INTRO[env_name].format(task=turn.task)]
    if turn.history:
        lines.append(f"Your last {len(turn.history)} steps:")
        for obs, act in turn.history:
            lines += [f"Observation: {obs}", f"Action: {act}"]
    lines.append(f"Current observation: {turn.observation}")
    actions = turn.admissible if max_actions is None else turn.admissible[:max_actions]
    if actions:
        lines.append("Admissible actions: " + ", ".join(actions))
    lines.append(format_instruction(require_think))
    return "\n".join(lines)


def render_prompt(tokenizer, env_name: str, turn: Turn, require_think: bool, max_tokens: int) -> list[int]:
    """Token ids of the chat prompt (with the assistant header), fit into `max_tokens`."""

    def ids_for(t: Turn, max_actions: int | None = None) -> list[int]:
        messages = [{"role": "user", "content": user_message(env_name, t, require_think, max_actions)}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    ids = ids_for(turn)
    history = list(turn.history)
    while len(ids) > max_tokens and history:  # drop the oldest history first
        history.pop(0)
        ids = ids_for(Turn(turn.task, turn.observation, turn.admissible, history))
    max_actions = len(turn.admissible)
    while len(ids) > max_tokens and max_actions > 0:  # then the tail of the action list
        max_actions //= 2
        ids = ids_for(Turn(turn.task, turn.observation, turn.admissible, []), max_actions)
    return ids


def parse_action(text: str) -> tuple[str, bool]:
    """(action, valid): the last `<action>` block's text, lowercased and stripped.

    Missing or empty tags make the turn invalid; the env then receives the text's tail
    (which it treats as an unknown command, a no-op).
    """
    found = _ACTION.findall(text)
    if found and found[-1].strip():
        return " ".join(found[-1].split()).lower(), True
    tail = re.sub(r"<[^>]*>", " ", text)[-FALLBACK_CHARS:]
    return " ".join(tail.split()).lower(), False


def format_response(action: str, require_think: bool, thought: str = "") -> str:
    """The answer text for a known action (expert demonstrations for the warm start)."""
    think = f"<think>{thought or 'I will ' + action + '.'}</think>" if require_think else ""
    return f"{think}<action>{action}</action>"
