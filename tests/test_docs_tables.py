"""docs/training.md's config-group table names every option of every config group in conf/, and nothing else: a
model, dataset or recipe added to conf/ without its row entry (detection's and instance segmentation's were
missing) fails here."""
from __future__ import annotations

import re
from pathlib import Path

from tests.docs_commands import REPO

PAGE = REPO / "docs" / "training.md"


def expand(token: str) -> set[str]:
    """The option names a table entry stands for: `net20/32/44` -> net20, net32, net44 (the trailing number
    replaced); `head[plus]_net18` -> head_net18 and headplus_net18."""
    optional = re.search(r"\[(\w+)\]", token)
    if optional:
        return expand(token.replace(optional.group(0), "")) | expand(token.replace(optional.group(0), optional.group(1)))
    several = re.fullmatch(r"(.*?)(\d+)((?:/\d+)+)", token)
    if several:
        return {several.group(1) + n for n in [several.group(2), *several.group(3).split("/")[1:]]}
    return {token}


def documented_groups(text: str) -> dict[str, set[str]]:
    """{group: options} from the table of the page's "Config groups" section, every part's entries included."""
    lines = text.split("## Config groups", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"\|\s*group\s*\|", line)) + 2  # after its header
    table = lines[start:start + next(i for i, line in enumerate(lines[start:] + [""]) if not line.startswith("|"))]
    groups = {}
    for line in table:
        cells = [c.strip() for c in re.sub(r"<!--.*?-->", "", line).split("|")[1:-1]]
        if len(cells) == 3 and re.fullmatch(r"`\w+`", cells[0]):
            # Entries are the backquoted names; `model.arch=NAME` and `tracker=[a,b]` are usage, not options.
            tokens = [t for t in re.findall(r"`([^`]+)`", cells[1]) if re.fullmatch(r"[\w\[\]/]+", t)]
            groups[cells[0].strip("`")] = set().union(*(expand(t) for t in tokens))
    return groups


def test_the_config_group_table_names_every_option_in_conf() -> None:
    documented = documented_groups(PAGE.read_text())
    in_conf = {d.name: {f.stem for f in d.glob("*.yaml")} for d in sorted((REPO / "conf").iterdir()) if d.is_dir()}
    assert sorted(documented) == sorted(in_conf), "the table's groups are conf/'s folders"
    for group, options in in_conf.items():
        assert documented[group] == options, (f"docs/training.md's `{group}` row: missing "
                                              f"{sorted(options - documented[group])}, not in conf/{group}/: "
                                              f"{sorted(documented[group] - options)}")


def test_the_table_entries_expand_as_written() -> None:
    assert expand("net20/32/110") == {"net20", "net32", "net110"}
    assert expand("head[plus]_net18/34") == {"head_net18", "head_net34", "headplus_net18", "headplus_net34"}
    assert expand("net_v2") == {"net_v2"}
    table = "## Config groups\n| group | options | what |\n|---|---|---|\n| `norm` | `bn`, `gn` (x) | y |\n\n| `a` | `b` | c |"
    assert documented_groups(table) == {"norm": {"bn", "gn"}}
