"""config.yaml for a sweep point: the text OmegaConf.to_yaml(cfg) gives, at a fraction of its cost.

A point's config is its base composition with a few values overridden, and to_yaml (resolve=False) writes each
top-level key as its own block, independent of the others. So the blocks of the keys a point does not touch are
the base's, rendered once per base and process; only the touched keys are rendered per point, through libyaml's
emitter with OmegaConf's own string quoting. Without libyaml (a PyYAML built without it), OmegaConf.to_yaml.
"""

from __future__ import annotations

import functools
from enum import Enum
from typing import Any

from omegaconf import Container, DictConfig, OmegaConf

# Rendered blocks of untouched keys, per base composition (a point's `base`) and key.
_BLOCKS: dict[tuple[tuple[str, ...], str], str] = {}


def point_yaml(cfg: DictConfig, base: tuple[str, ...], touched: set[str]) -> str:
    """The text of OmegaConf.to_yaml(cfg); ``touched``: the top-level keys the point's overrides set."""
    if _libyaml_dumper() is None:
        return OmegaConf.to_yaml(cfg)
    blocks = []
    for key in cfg:
        cached = _BLOCKS.get((base, str(key))) if key not in touched else None
        if cached is None:
            cached = _dump({key: _container(cfg, str(key))})
            if key not in touched:
                _BLOCKS[(base, str(key))] = cached
        blocks.append(cached)
    return "".join(blocks)


def _container(cfg: DictConfig, key: str) -> Any:
    """What OmegaConf.to_container(cfg, enum_to_str=True) holds at ``key`` (unresolved, as to_yaml writes)."""
    node = cfg._get_node(key)
    if isinstance(node, Container):
        return OmegaConf.to_container(node, enum_to_str=True)
    value = node._value()  # type: ignore[union-attr]  # a value node: OmegaConf's own conversion, as to_container
    return value.name if isinstance(value, Enum) else value


def _dump(container: dict[Any, Any]) -> str:
    import yaml

    return yaml.dump(container, default_flow_style=False, allow_unicode=True, sort_keys=False, Dumper=_libyaml_dumper())


@functools.cache
def _libyaml_dumper() -> Any:
    """OmegaConf's YAML dumper (its quoting of strings) on libyaml's emitter; None without libyaml."""
    import yaml
    from omegaconf._utils import get_omega_conf_dumper

    if not yaml.__with_libyaml__:
        return None
    dumper: Any = type("OmegaConfCDumper", (yaml.CDumper,), {})
    dumper.add_representer(str, get_omega_conf_dumper().str_representer)
    return dumper
