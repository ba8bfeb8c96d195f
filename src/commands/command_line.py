"""The command line checked before Hydra composes it: unknown keys, values of the wrong type, config group options
that do not exist and renamed groups, each as one message with "did you mean" where a close name exists.

Hydra composes the config before any of our code runs; its own refusals ("Could not override 'trainer.max_step'.
To append to your config use +trainer.max_step=5", "Could not find 'model/resnet21'" above the 32 options) end
the process with status 1 and suggest nothing. Every entry point calls `check_command_line` first. It reads the
overrides with Hydra's own parsers, the group options from conf/ and the keys from the config the entry point
composes (its schema in Hydra's ConfigStore, e.g. `train_schema`, and its yaml file), and applies each value as
Hydra will, so what passes here composes there. Group options are checked before torch is imported; the schema
(which imports the model and dataset registries, hence torch) is read only when a key must be checked.

Hydra's own keys (`hydra.*`, `hydra/...`) and the forms that read configs from elsewhere (--config-dir,
--config-path, --config-name, hydra.searchpath, --experimental-rerun) and help / info requests are left to Hydra.
Keys added with `+` are checked by the command itself (validate_config names them, with "did you mean").
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from src.commands.user_errors import exit_on_user_error
from src.errors import UserError, closest_name

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
# Hydra's flags that read the configs from elsewhere or do not run the app: the check would not see what Hydra sees.
_OTHER_CONFIG_FLAGS = ("config_path", "config_dir", "config_name", "experimental_rerun", "help", "hydra_help",
                       "info", "shell_completion")
_MANY_OPTIONS = 12  # a group with more options than this is pointed at, not listed


def check_command_line(config_name: str, schema_module: Optional[str] = None,
                       argv: Optional[Sequence[str]] = None, conf_dir: Path = CONF_DIR) -> None:
    """Exit with one message (src/commands/user_errors.py) when an override of `argv` (default: sys.argv[1:])
    would make Hydra refuse the command line, or names a renamed group; else return with the config's schema
    registered for Hydra.

    config_name: the entry point's config (conf/<config_name>.yaml); schema_module: the module whose import
    registers that config's schema in Hydra's ConfigStore (None: the yaml file is the whole config).
    """
    try:
        find_mistake(config_name, schema_module, list(sys.argv[1:] if argv is None else argv), conf_dir)
    except UserError as err:
        exit_on_user_error(err, same_on_every_rank=True)  # every rank reads the same command line
    if schema_module is not None:  # Hydra composes onto the schema: registered also when no key needed it
        importlib.import_module(schema_module)


def find_mistake(config_name: str, schema_module: Optional[str], argv: list[str], conf_dir: Path) -> None:
    """Raise UserError naming the first override Hydra would refuse (see check_command_line)."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    args, _ = get_args_parser().parse_known_args(argv)
    if any(getattr(args, flag, None) for flag in _OTHER_CONFIG_FLAGS):
        return
    script = f"{config_name}.py"
    parser, overrides = OverridesParser.create(), []
    for arg in args.overrides:
        try:
            overrides += parser.parse_overrides([arg])
        except OverrideParseException as exc:
            # Hydra's lines: maybe "Error parsing override ARG", the parser's reason, a link to its grammar.
            detail = [line for line in str(exc).splitlines() if not line.startswith(("Error parsing", "See "))]
            raise UserError(f"{arg}: not an override{f' ({detail[0]})' if detail else ''}; write key=value, "
                            "group=option, +key=value or ~key (https://hydra.cc/docs/advanced/override_grammar/basic/)"
                            ) from None
    mine = [o for o in overrides if not _is_hydras(o.key_or_group)]
    if any(o.key_or_group == "hydra.searchpath" for o in overrides):
        return  # more config folders: their groups and options are Hydra's to find
    config = _Config(config_name, schema_module, conf_dir)
    for override in mine:
        if override.is_sweep_override() and not args.multirun:
            raise UserError(f"{override.input_line} gives several values: add -m to run one job per value "
                            "(Hydra's multirun), or quote a value that contains a comma")
    for override in mine:  # group options first: conf/ alone answers them, before torch is imported
        if config.is_group(override.key_or_group):
            _check_options(override, config)
    for override in mine:  # a renamed group's message beats "no such key" for whichever key comes first
        top = override.key_or_group.split(".")[0]
        if not config.is_group(top) and top not in config.primary:
            _refuse_renamed_group(override.input_line)
    for override in mine:
        if not config.is_group(override.key_or_group):
            _check_key(override, config, script)


def _is_hydras(key: str) -> bool:
    return key == "hydra" or key.startswith(("hydra.", "hydra/"))


class _Config:
    """What Hydra will compose for one entry point: the groups in conf/ and (read on first use) the keys."""

    def __init__(self, name: str, schema_module: Optional[str], conf_dir: Path) -> None:
        from omegaconf import OmegaConf

        self.name, self.schema_module, self.conf_dir = name, schema_module, conf_dir
        self.primary = OmegaConf.load(conf_dir / f"{name}.yaml")  # its own keys, defaults list and hydra node
        self._tree: Any = None

    def is_group(self, key: str) -> bool:
        """True for a config group (a folder of conf/), e.g. `model` or `tracker`."""
        return "." not in key and (self.conf_dir / key).is_dir()

    def options(self, group: str) -> list[str]:
        """The group's options: its yaml files, as Hydra names them (`sub/name` for files in subfolders)."""
        folder = self.conf_dir / group
        return sorted(p.relative_to(folder).with_suffix("").as_posix() for p in folder.rglob("*.yaml"))

    @property
    def tree(self) -> Any:
        """The entry point's config before overrides: its schema merged with its yaml file (struct: no new keys)."""
        if self._tree is None:
            from omegaconf import OmegaConf

            primary = self.primary.copy()
            defaults = primary.pop("defaults", [])
            primary.pop("hydra", None)
            parts = [self._schema(entry) for entry in defaults if isinstance(entry, str) and entry != "_self_"]
            self._tree = OmegaConf.merge(*[p for p in parts if p is not None], primary)
            OmegaConf.set_struct(self._tree, True)
        return self._tree

    def _schema(self, name: str) -> Any:
        """The ConfigStore node `name` of the defaults list (importing schema_module registers it)."""
        from hydra.core.config_store import ConfigStore

        if self.schema_module is not None:
            importlib.import_module(self.schema_module)
        try:
            return ConfigStore.instance().load(f"{name}.yaml").node  # a deep copy: Hydra's stays as it is
        except Exception:  # noqa: BLE001 - not a stored config: Hydra will say so itself
            return None


def _check_options(override: Any, config: _Config) -> None:
    """Every option an override selects (a value, a list, or each value of a sweep) must be a file of the group."""
    group = override.key_or_group
    if override.is_delete():
        return
    if override.is_sweep_override():
        chosen: Iterable[Any] = list(override.sweep_string_iterator())
    else:
        value = override.value()
        chosen = value if isinstance(value, list) else [value]
    options = config.options(group)
    for option in chosen:
        if option is None or str(option) in options:
            continue
        guess = closest_name(str(option), options)
        hint = f"; did you mean {group}={guess}?" if guess else ""
        listed = (f"the options are {', '.join(options)}" if len(options) <= _MANY_OPTIONS
                  else f"{len(options)} options: the files in conf/{group}/")
        raise UserError(f"{override.input_line}: {group} has no option {option!r}{hint} ({listed})")


def _check_key(override: Any, config: _Config, script: str) -> None:
    """A key override must name a key of the config (with a value of its type); `+key` must name a new one."""
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    key = override.key_or_group
    parts = key.split(".")
    tree = config.tree
    if override.is_force_add() or (override.is_add() and parts[0] not in tree):
        return  # `++key` always composes; a `+` key outside this config is the command's to check
    node: Any = tree
    for depth, part in enumerate(parts):
        if not isinstance(node, DictConfig) or node._is_none() or node._is_missing():
            return  # inside a list, a value or an unset section: Hydra's and OmegaConf's own checks
        if part not in node:
            if override.is_add():
                return  # a new entry, as `+` asks
            raise UserError(_unknown_key_message(override, parts, depth, node, tree, script))
        node = node._get_node(part)
    if override.is_add():
        raise UserError(f"{override.input_line}: {key} exists already; set it without the +: "
                        f"{override.input_line.lstrip('+')}")
    if override.is_delete() or override.is_sweep_override():
        return
    try:
        OmegaConf.update(tree, key, override.value(), merge=True)  # as Hydra applies it
    except OmegaConfBaseException as exc:
        reason = str(exc.msg if hasattr(exc, "msg") else exc).splitlines()[0]
        raise UserError(f"{override.input_line}: {reason}") from None


def _unknown_key_message(override: Any, parts: list[str], depth: int, node: Any, tree: Any, script: str) -> str:
    """`trainer.max_step=5: trainer has no key max_step; did you mean trainer.max_steps?` and the like."""
    from omegaconf import OmegaConf

    missing, where = parts[depth], ".".join(parts[:depth])
    owner = where or script
    guess = closest_name(missing, [str(k) for k in node.keys()])
    if guess:
        fixed = [".".join([*parts[:depth], guess, *parts[depth + 1:]])]
    elif depth == len(parts) - 1:  # the key of another section, e.g. trainer.lr=0.1 for optim.lr=0.1
        fixed = [path for path in _key_paths(tree) if path.rsplit(".", 1)[-1] == missing][:3]
    else:
        fixed = []
    key = override.key_or_group
    hint = f"; did you mean {' or '.join(override.input_line.replace(key, k, 1) for k in fixed)}?" if fixed else ""
    if depth and OmegaConf.get_type(node) is dict:  # a free-form mapping (e.g. model.kwargs): new keys need +
        return (f"{override.input_line}: {owner} has no entry {missing!r} yet{hint}; add one with a leading +: "
                f"+{override.input_line.lstrip('~')}")
    what = "key" if depth else "setting or config group"
    return (f"{override.input_line}: {owner} has no {what} {missing!r}{hint} (`python {script} --cfg job` prints "
            "every key)")


def _key_paths(node: Any, prefix: str = "") -> list[str]:
    """Dotted paths of every key below `node` (mappings only), for the "did you mean" of a key in another group."""
    from omegaconf import DictConfig

    paths = []
    for key in node.keys():
        path = f"{prefix}{key}"
        paths.append(path)
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            paths += _key_paths(child, f"{path}.")
    return paths


def _refuse_renamed_group(argument: str) -> None:
    """A group renamed since runs were made with it gets the message that names the new one."""
    from src.config import refuse_renamed_groups

    refuse_renamed_groups([argument])
