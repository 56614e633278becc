"""The real WebShop (princeton-nlp's `web_agent_site`, when installed) behind `TextEnv`:
`env.webshop.backend=real`. Pages, actions and rewards are WebShop's own; the action
contract and the process reward's potential are those of `rspo.envs.webshop`."""

from __future__ import annotations

from rspo.config import WebshopConfig
from rspo.envs.base import EnvState, TextEnv
from rspo.envs.webshop import SEARCH_PLACEHOLDER, SPLITS, parse_action

REAL_HINT = (
    "env.webshop.backend=real needs princeton-nlp's WebShop: clone github.com/princeton-nlp/WebShop, "
    "run its setup.sh (product data and search index) and `pip install -e .` it; "
    "or use env.webshop.backend=generated"
)


class RealWebshopEnv(TextEnv):
    """The real WebShop (`web_agent_site`'s `WebAgentTextEnv`, text mode) behind `TextEnv`.

    Goals are its own (`real_human_goals`: the human instructions); test = goals
    0..num_test_goals-1, train = the rest. Actions follow `rspo.envs.webshop`'s contract;
    Φ uses its own `get_reward` on the session's item and options. It has no expert.
    """

    def __init__(self, cfg: WebshopConfig):
        try:
            from web_agent_site.engine.goal import get_reward as real_reward
            from web_agent_site.envs.web_agent_text_env import WebAgentTextEnv
        except ImportError as e:
            raise ImportError(REAL_HINT) from e
        kwargs = {"observation_mode": "text", "human_goals": cfg.real_human_goals}
        kwargs["num_products"] = cfg.real_num_products or None  # None: all products
        if cfg.real_file_path:
            kwargs["file_path"] = cfg.real_file_path
        self.cfg, self.max_steps = cfg, cfg.max_steps
        self._env, self._reward = WebAgentTextEnv(**kwargs), real_reward
        self._goals = self._env.server.goals
        self._state: EnvState | None = None

    def num_tasks(self, split: str) -> int:
        if split not in SPLITS:
            raise ValueError(f"webshop: unknown split {split!r} (valid splits: {', '.join(SPLITS)})")
        n_test = min(self.cfg.num_test_goals, len(self._goals))
        return n_test if split == "test" else len(self._goals) - n_test

    def reset(self, split: str, index: int) -> EnvState:
        if not 0 <= index < self.num_tasks(split):
            raise IndexError(f"webshop: task {index} out of range for split {split!r}")
        goal_id = index if split == "test" else min(self.cfg.num_test_goals, len(self._goals)) + index
        self._env.reset(session=goal_id)
        self._goal, self._steps, self._phi = self._goals[goal_id], 0, 0.0
        self._state = self._observe(self._env.observation, valid=True, reward=0.0, bought=False)
        return self._state

    def step(self, action: str) -> EnvState:
        if self._state is None:
            raise RuntimeError("webshop: call reset() before step()")
        if self._state.done:
            return EnvState(**{**vars(self._state), "outcome": 0.0, "process": 0.0, "valid": False})
        self._steps += 1
        parsed, page = parse_action(action), self._env.get_available_actions()
        valid = parsed is not None and (
            parsed[0] == "search" or (parsed[1] in page["clickables"] and parsed[1] != "search")
        )
        obs, reward, bought = self._env.observation, 0.0, False
        if valid:
            obs, reward, bought, _ = self._env.step(f"{parsed[0]}[{parsed[1]}]")
        self._state = self._observe(obs, valid, float(reward), bool(bought))
        return self._state

    def _potential(self) -> float:
        session = self._env.server.user_sessions[self._env.session]
        url = self._env.browser.current_url or ""
        on_item = "item_page" in url or "item_sub_page" in url
        if not on_item or not session.get("asin"):
            return 0.0
        asin = session["asin"]
        product, price = self._env.server.product_item_dict[asin], self._env.server.product_prices[asin]
        return float(self._reward(product, self._goal, price=price, options=session["options"]))

    def _observe(self, obs: str, valid: bool, reward: float, bought: bool) -> EnvState:
        done = bought or self._steps >= self.max_steps
        phi_before, self._phi = self._phi, (reward if done else self._potential())
        page = self._env.get_available_actions() if not done else {"has_search_bar": False, "clickables": []}
        admissible = [SEARCH_PLACEHOLDER] * page["has_search_bar"]
        admissible += [f"click[{c}]" for c in page["clickables"] if c != "search"]
        return EnvState(
            observation=obs,
            admissible=admissible,
            task=self._goal["instruction_text"],
            task_type=self._goal.get("category", ""),
            done=done,
            outcome=(reward if self.cfg.outcome == "score" else float(reward == 1.0)) if bought else 0.0,
            process=self._phi - phi_before,
            won=bought and reward == 1.0,
            score=reward,
            valid=valid,
            info={"phi": self._phi, "steps": self._steps},
        )

    def expert_action(self) -> str:
        raise NotImplementedError("webshop: the real WebShop backend has no expert (use backend=generated for demos)")
