"""scripts/syncbn_benefit.py's pieces: the runs it plans (same global batch and steps for every norm) and its summary.

The script itself trains 16 runs (minutes each on 2 cores), so only its planning and reporting are tested here.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("syncbn_benefit", REPO / "scripts" / "syncbn_benefit.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["syncbn_benefit"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def _value(argv: list[str], key: str) -> str:
    return next(a.split("=", 1)[1] for a in argv if a.startswith(key + "="))


def test_every_norm_sees_the_same_global_batch_steps_and_data(tmp_path: Path) -> None:
    bench = _script()
    runs = bench.plan(bench.parse(["--tasks", "cls", "--worlds", "2", "--seeds", "0", "--steps", "40", "--evals", "4"]))
    assert [r.norm for r in runs] == ["bn", "syncbn", "gn", "ref"]
    argvs = {r.norm: r.argv(tmp_path / r.name) for r in runs}
    assert argvs["ref"][4] == "--nproc_per_node=1" and argvs["syncbn"][4] == "--nproc_per_node=2"
    assert _value(argvs["ref"], "data.batch_size") == "4" and _value(argvs["bn"], "data.batch_size") == "2"
    assert _value(argvs["ref"], "norm") == "bn" and _value(argvs["gn"], "norm") == "gn"
    for key in ("data.train_size", "trainer.epochs", "seed", "data.photometric_spread", "optim.lr"):
        assert len({_value(a, key) for a in argvs.values()}) == 1, key
    assert _value(argvs["bn"], "data.train_size") == "40"  # 10 steps per epoch x 4 images per step


def test_summary_and_table_over_seeds() -> None:
    bench = _script()
    records = [{"task": "seg", "world": 2, "batch": 2, "steps": 20, "norm": norm, "returncode": 0,
                "curve": [[10, 0.1], [20, final]]}
               for norm, final in (("syncbn", 0.5), ("bn", 0.3), ("bn", 0.4), ("gn", 0.2))]
    records.append({"task": "seg", "world": 2, "batch": 2, "steps": 20, "norm": "gn", "returncode": 1, "curve": []})
    # Another setting (longer) is its own row, never pooled with the first.
    records.append({"task": "seg", "world": 2, "batch": 2, "steps": 40, "norm": "bn", "returncode": 0,
                    "curve": [[40, 0.9]]})
    summary = bench.summarise(records)
    assert [(s["steps"], s["norm"]) for s in summary] == [(20, "bn"), (20, "syncbn"), (20, "gn"), (40, "bn")]
    bn = summary[0]
    assert bn["n"] == 2 and abs(bn["mean"] - 0.35) < 1e-12 and abs(bn["std"] - 0.05) < 1e-12
    table = bench.markdown_table(summary)
    assert "| seg (miou) | 2 x 2 | 20 | bn | 0.350 ± 0.050 (0.300-0.400) | 2 |" in table
    assert "| seg (miou) | 2 x 2 | 40 | bn | 0.900 ± 0.000 (0.900-0.900) | 1 |" in table


def test_settings_are_named_apart_and_report_only_reads_every_finished_run(tmp_path: Path) -> None:
    bench = _script()
    runs = bench.plan(bench.parse(["--tasks", "cls", "--worlds", "2", "4", "--batch", "2", "4", "--seeds", "0",
                                   "--steps", "40"]))
    assert len({r.name for r in runs}) == len(runs) == 2 * 2 * len(bench.NORMS)
    longer = bench.plan(bench.parse(["--tasks", "cls", "--worlds", "2", "--batch", "2", "--seeds", "0",
                                     "--steps", "80"]))
    assert not {r.name for r in longer} & {r.name for r in runs}  # more steps never reuses a shorter run
    for run, final in ((runs[0], 20.0), (longer[1], 30.0)):  # two invocations' runs, one finished each
        (tmp_path / run.name).mkdir()
        (tmp_path / run.name / "done.json").write_text(bench.json.dumps(
            {**bench.asdict(run), "name": run.name, "returncode": 0, "wall_s": 1.0, "curve": [[run.steps, final]]}))
    (tmp_path / runs[1].name).mkdir()  # started, never finished: not reported
    assert sorted(r["name"] for r in bench.finished(tmp_path)) == sorted([runs[0].name, longer[1].name])
    assert bench.main(["--report-only", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "table.md").read_text()
    assert "| cls (top1) | 2 x 2 | 40 | bn | 20.000" in table and "| cls (top1) | 2 x 2 | 80 | syncbn | 30.000" in table
