"""Start your own project from this template: only the parts you ask for, in a new git repository.

    python scripts/new_project.py DEST --name NAME      # classification only, no cluster material, no GPU dev tools
    python scripts/new_project.py DEST --name NAME --tasks classification,segmentation --cluster slurm,docker
    python scripts/new_project.py DEST --name NAME --full --no-cluster   # every part but the cluster ones
    python scripts/new_project.py DEST --name NAME --dry-run             # what would be left out, and why
    make new-project DEST=../myproj NAME=myproj ARGS="--gpu-tools"

project_parts.toml says which files each part holds and which the template keeps for itself; docs/new-project.md
explains the parts. The new project gets the kept files with the regions of parts left out cut away
(scripts/project_parts.py), README.md titled NAME, and a first commit. Before anything is written, the
reference check (scripts/project_refs.py) scans every kept file; one that still imports, tests, runs or links
something left out stops the generation, listing file:line -> what it refers to.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository root is what `scripts.` is imported from
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.project_parts import REPO, Manifest, ManifestError, Selection, load_manifest, resolve, select  # noqa: E402
from scripts.project_parts import strip_markers, template_files  # noqa: E402
from scripts.project_refs import Finding, check  # noqa: E402


def parse_args(manifest: Manifest, argv: list[str] | None = None) -> argparse.Namespace:
    tasks, clusters = manifest.of_kind("task"), manifest.of_kind("cluster")
    tools = manifest.of_kind("tool")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Parts (project_parts.toml):\n" + "\n".join(
                                         f"  {n:16} {p.kind:8} {p.about}" for n, p in manifest.parts.items()))
    parser.add_argument("dest", type=Path, help="folder of the new project (absent or empty)")
    parser.add_argument("--name", required=True, help="the project's name: README.md's title")
    required = [n for n in tasks if manifest.parts[n].required]
    parser.add_argument("--tasks", help=f"comma-separated, from {','.join(tasks)} (default: {','.join(required)}; "
                                        f"{', '.join(required)} always: the default job trains it)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--cluster", help=f"comma-separated, from {','.join(clusters)}")
    group.add_argument("--no-cluster", action="store_true", help="no cluster material (the default, also with --full)")
    for tool in tools:
        parser.add_argument(f"--{tool}", action="store_true", dest="tool", help=manifest.parts[tool].about)
    parser.add_argument("--full", action="store_true", help="every part (--tasks / --cluster / --no-cluster narrow it)")
    parser.add_argument("--dry-run", action="store_true", help="list what would be left out and why; write nothing")
    return parser.parse_args(argv)


def _listed(value: str, allowed: list[str], flag: str) -> set[str]:
    names = {v.strip() for v in value.split(",") if v.strip()}
    wrong = sorted(names - set(allowed))
    if wrong:
        raise ManifestError(f"{flag} {value}: unknown {wrong}; choose from {','.join(allowed)}")
    return names


def choose(manifest: Manifest, args: argparse.Namespace) -> set[str]:
    """The parts the flags ask for, with the required ones and their requirements; ManifestError when a flag
    names an unknown part or leaves out a required task."""
    tasks, clusters = manifest.of_kind("task"), manifest.of_kind("cluster")
    chosen = set(manifest.parts) if args.full else set()
    if args.tasks is not None:
        picked = _listed(args.tasks, tasks, "--tasks")
        missing = [t for t in tasks if manifest.parts[t].required and t not in picked]
        if missing:
            raise ManifestError(f"--tasks {args.tasks}: every project has {', '.join(missing)} (the default job, "
                                f"`make train`, trains it): add it, e.g. --tasks {','.join([*missing, *sorted(picked)])}")
        chosen = (chosen - set(tasks)) | picked
    if args.cluster is not None:
        chosen = (chosen - set(clusters)) | _listed(args.cluster, clusters, "--cluster")
    elif args.no_cluster:
        chosen -= set(clusters)
    if getattr(args, "tool", False):
        chosen |= set(manifest.of_kind("tool"))
    return resolve(manifest, chosen)


def _readme(text: str, name: str, parts: set[str], manifest: Manifest) -> str:
    """The template's README with the project's name as its title and the parts it was made with."""
    made_with = ", ".join(p for p in manifest.parts if p in parts)
    title, n = re.subn(r"\A# .*\n", f"# {name}\n\nMade from the SyncTrain template with: {made_with}.\n", text)
    if n != 1:
        raise ManifestError("README.md must start with its `# title` line (the new project's name replaces it)")
    return title


def plan(manifest: Manifest, parts: set[str], name: str, root: Path = REPO
         ) -> tuple[Selection, dict[str, str], dict[str, str], dict[str, bytes]]:
    """What the project gets: (selection, template texts, project texts, project binary files)."""
    files = template_files(root)
    selection = select(manifest, files, parts)
    before: dict[str, str] = {}
    binary: dict[str, bytes] = {}
    for path in files:
        data = (root / path).read_bytes()
        try:
            before[path] = data.decode()
        except UnicodeDecodeError:
            if path in selection.kept:
                binary[path] = data
    known = set(manifest.parts)
    after = {p: strip_markers(before[p], parts, known, p) for p in selection.kept if p in before}
    after["README.md"] = _readme(after["README.md"], name, parts, manifest)
    return selection, before, after, binary


def reference_findings(manifest: Manifest, before: dict[str, str], after: dict[str, str],
                       parts: set[str]) -> list[Finding]:
    """The reference check of a project with `parts`, less project_parts.toml's allowed references."""
    return check(before, after, manifest.allowed, [t for t in manifest.of_kind("task") if t not in parts])


def write(dest: Path, root: Path, after: dict[str, str], binary: dict[str, bytes], message: str) -> None:
    """The files under `dest` (file modes as in the template), then `git init` and one commit."""
    for path, content in [*after.items(), *binary.items()]:
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            target.write_text(content)
        else:
            target.write_bytes(content)
        os.chmod(target, (root / path).stat().st_mode & 0o777)
    git = ["git", "-C", str(dest)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    env = dict(os.environ)
    if not subprocess.run([*git, "config", "user.email"], capture_output=True, text=True).stdout.strip():
        # No identity configured: commit under a placeholder rather than fail; `git commit --amend --reset-author`
        # after configuring one replaces it.
        env.update(GIT_AUTHOR_NAME="new_project.py", GIT_AUTHOR_EMAIL="new-project@localhost",
                   GIT_COMMITTER_NAME="new_project.py", GIT_COMMITTER_EMAIL="new-project@localhost")
        print("note: git has no user.email here; the first commit is authored by new_project.py", file=sys.stderr)
    subprocess.run([*git, "commit", "-q", "-m", message], check=True, env=env)


def _check_dest(dest: Path, root: Path) -> None:
    dest = dest.resolve()
    if dest == root or root in dest.parents:
        raise ManifestError(f"{dest} lies inside the template ({root}): choose a folder outside it, e.g. ../{dest.name}")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ManifestError(f"{dest} exists and is not an empty folder: choose a new one")


def main(argv: list[str] | None = None) -> int:
    try:
        manifest = load_manifest()
        args = parse_args(manifest, argv)
        if not args.name.strip() or "\n" in args.name:
            raise ManifestError("--name must be one line of text, e.g. --name 'Road segmentation'")
        parts = choose(manifest, args)
        _check_dest(args.dest, REPO)
        selection, before, after, binary = plan(manifest, parts, args.name.strip())
    except ManifestError as err:
        print(f"new_project.py: {err}", file=sys.stderr)
        return 2
    ordered = [p for p in manifest.parts if p in parts]
    if args.dry_run:
        for path, why in sorted(selection.dropped.items(), key=lambda item: (item[1], item[0])):
            print(f"left out ({why}): {path}")
        print(f"parts: {', '.join(ordered)}; {len(selection.kept)} files kept, {len(selection.dropped)} left out")
    findings = reference_findings(manifest, before, after, parts)
    if findings:
        print(f"new_project.py: the kept files refer to what the project leaves out ({len(findings)}); mark those "
              "regions for their part (docs/new-project.md) or keep what they need:", file=sys.stderr)
        for finding in findings:
            print(f"  {finding}", file=sys.stderr)
        return 1
    if args.dry_run:
        return 0
    try:
        write(args.dest, REPO, after, binary, f"{args.name.strip()}: new project from the SyncTrain template "
                                              f"(parts: {', '.join(ordered)})")
    except (OSError, subprocess.CalledProcessError) as err:
        print(f"new_project.py: writing {args.dest} failed ({err}); it may hold a partial project: delete it "
              "before trying again", file=sys.stderr)
        return 1
    print(f"{args.dest}: {args.name.strip()} with {', '.join(ordered)}: {len(selection.kept)} files "
          f"({len(selection.dropped)} of the template's left out), first commit made.\n"
          f"Next: cd {args.dest} && make train && make test")
    return 0


if __name__ == "__main__":
    sys.exit(main())
