"""Text environments behind one interface (`TextEnv`); `make_env` builds one from config."""

from __future__ import annotations

from rspo.config import EnvConfig
from rspo.envs.base import EnvState, TextEnv

__all__ = ["ENVS", "EnvState", "TextEnv", "make_env"]


def _alfworld(cfg: EnvConfig) -> TextEnv:
    from rspo.envs.alfworld import AlfworldEnv  # imports the TextWorld engine: lazy

    return AlfworldEnv(cfg.alfworld)


def _webshop(cfg: EnvConfig) -> TextEnv:
    from rspo.envs.webshop import WebshopEnv
    from rspo.envs.webshop_real import RealWebshopEnv

    return (RealWebshopEnv if cfg.webshop.backend == "real" else WebshopEnv)(cfg.webshop)


ENVS = {"alfworld": _alfworld, "webshop": _webshop}


def make_env(cfg: EnvConfig) -> TextEnv:
    return ENVS[cfg.name](cfg)
