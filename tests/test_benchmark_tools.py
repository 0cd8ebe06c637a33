"""The benchmark harness's own logic that a wrong figure would hide behind (no valgrind run)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest

from benchmarks import harness, instructions
from benchmarks.baselines.async_script import CONTEXT_COLUMNS, request_body
from benchmarks.callers import callers
from benchmarks.harness import manifest
from benchmarks.instructions import function_table, parse_annotated
from fashiontag_pipeline.engine.plainblock import context_block
from fashiontag_pipeline.engine.rows import PlainRows
from fashiontag_pipeline.engine.source import open_manifest

ANNOTATED = """\
--------------------------------------------------------------------------------
2,017,954,802 (100.0%)  PROGRAM TOTALS
--------------------------------------------------------------------------------
Ir                    file:function
--------------------------------------------------------------------------------
179,437,871 ( 8.89%)  ???:json_skip'2 [/v/site-packages/msgspec/_core.so]
  2,000,000 ( 0.10%)  ???:json_skip [/v/site-packages/msgspec/_core.so]
174,394,357 ( 8.64%)  /b/Python/ceval.c:_PyEval_EvalFrameDefault'2 [/r/libpython3.11.so]
 33,153,648 ( 1.64%)  ???:0x000000000029ad80 [/usr/lib/x86_64-linux-gnu/libcrypto.so.3]
"""


def test_parse_annotated_names_functions_and_sums_recursion_levels() -> None:
    assert parse_annotated(ANNOTATED) == {
        "_core.so:json_skip": 181_437_871,
        "ceval.c:_PyEval_EvalFrameDefault": 174_394_357,
        "libcrypto.so.3:0x000000000029ad80": 33_153_648,
    }


def test_callers_reads_each_functions_cost_and_its_callers() -> None:
    text = (
        "Ir  file:function\n\n"
        "  1,200 ( 0.1%)  < /x/bltinmodule.c:builtin_max (3x) [/lib]\n"
        "    300 ( 0.0%)  < /x/ceval.c:_PyEval_EvalFrameDefault'2 (1x) [/lib]\n"
        "  1,500 ( 0.1%)  *  /x/bltinmodule.c:min_max [/lib]\n"
        "\n"
        "     40 ( 0.0%)  < /x/bltinmodule.c:min_max (2x) [/lib]\n"
        "     40 ( 0.0%)  *  /x/object.c:PyObject_RichCompare [/lib]\n"
    )
    assert callers(text) == {
        "/x/bltinmodule.c:min_max": (
            1500,
            {"/x/bltinmodule.c:builtin_max": 1200, "/x/ceval.c:_PyEval_EvalFrameDefault'2": 300},
        ),
        "/x/object.c:PyObject_RichCompare": (40, {"/x/bltinmodule.c:min_max": 40}),
    }


def test_function_table_is_marginal_per_image_largest_difference_first() -> None:
    counted = {
        "engine": {1000: {"a": 1_000, "b": 5_000, "c": 0}, 3000: {"a": 41_000, "b": 9_000, "c": 0}},
        "script": {
            1000: {"a": 1_000, "b": 1_000, "c": 0},
            3000: {"a": 3_000, "b": 3_000, "c": 8_000},
        },
    }
    rows = function_table(counted, "engine", "script", (1000, 3000), 2)
    assert rows[2] == "| `a` | 20 | 1 | +19 |"  # (41,000 - 1,000) / 2,000 rows
    assert rows[3] == "| `b` | 2 | 1 | +1 |"
    assert rows[4] == "| ... | | | |"
    assert rows[5] == "| `c` | 0 | 4 | -4 |"  # the one the script spends more on


def test_manifest_random_ids_are_distinct_unsorted_and_the_same_each_time(tmp_path: Path) -> None:
    path = manifest(tmp_path, 5_000, "random")
    lines = path.read_text().splitlines()
    assert lines[0] == "id,url"
    ids = [line.split(",")[0] for line in lines[1:]]
    assert len(ids) == len(set(ids)) == 5_000
    assert ids != sorted(ids)
    path.unlink()
    assert manifest(tmp_path, 5_000, "random").read_text().splitlines()[1:] == lines[1:]
    assert manifest(tmp_path, 5_000) != path  # sequential ids: another file
    with pytest.raises(ValueError, match="sequential or random"):
        manifest(tmp_path, 10, "uuid")


def test_context_manifest_is_validated_whole_and_the_script_sends_the_same_context(
    tmp_path: Path,
) -> None:
    """The ``context`` manifest measures the engine's block path for context columns (its
    blocks pass whole), and the async script sends each row the context the engine sends (an
    empty cell is no value), so that both do the same work."""
    path = manifest(tmp_path, 2_000, context=True)
    assert path != manifest(tmp_path, 2_000)
    text = path.read_text(encoding="utf-8")
    header, *lines = text.splitlines()
    assert header == "id,url,brand,gender,season" and len(lines) == 2_000
    reader = open_manifest(str(path), 0, 500)
    batch = reader.read_batch()
    reader.close()
    assert batch is not None and isinstance(batch.rows, PlainRows)
    i_id, i_url = 0, 1
    context = [(2, "brand"), (3, "gender"), (4, "season")]
    block, rest = context_block(batch.rows, 5, i_id, i_url, context, 0)
    assert rest == [] and len(block) == 500
    rows = [line.split(",") for line in lines[:500]]
    body = request_body(rows, i_id, i_url, [(i, CONTEXT_COLUMNS[n]) for i, n in context])
    sent = msgspec.json.decode(msgspec.json.encode(body["taggingRequest"]))
    assert sent == msgspec.json.decode(msgspec.json.encode([r for *_, r in block]))
    assert sum(b'"season"' not in msgspec.json.encode(r) for *_, r in block) == 72  # 1 in 7


def test_request_cost_child_imports_exist() -> None:
    """``benchmarks.request_cost``'s child imports the package's names inside its function (so
    that a mode's child loads only what it needs): each must still exist where it imports it
    from, or every child fails at its start and the benchmark measures nothing."""
    import ast
    import importlib

    import benchmarks.request_cost as request_cost

    tree = ast.parse(Path(request_cost.__file__).read_text())
    child = next(n for n in ast.walk(tree) if getattr(n, "name", None) == "_child")
    imported = [
        (node.module, alias.name)
        for node in ast.walk(child)
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    ]
    assert imported
    for module, name in imported:
        assert hasattr(importlib.import_module(module), name), f"{module}.{name}"


FAKE_VALGRIND = """#!/bin/sh
# Records the hash seed each counted child would start with; totals grow with the seed.
for a in "$@"; do case $a in --callgrind-out-file=*) out=${a#*=};; esac; done
case "$*" in *async_script*) who=script;; *) who=engine;; esac
rows=$(grep -c . "$(echo "$*" | grep -o '[^ ]*manifest-[0-9]*\\.csv')")
echo "$who ${PYTHONHASHSEED-unset}" >> "$SEEDS_LOG"
echo "totals: $(( rows * (100 + ${PYTHONHASHSEED:-0}) ))" > "$out"
"""


def test_instructions_gives_every_child_the_hash_seed_and_the_median_of_several(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a fixed PYTHONHASHSEED each child laid out its dicts and sets of ids its own
    way, and three runs of one build moved by ~600 instructions an image (round 13)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "valgrind"
    fake.write_text(FAKE_VALGRIND)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SEEDS_LOG", str(tmp_path / "seeds.log"))
    monkeypatch.setenv("PYTHONHASHSEED", "random")  # the caller's own: never what runs
    monkeypatch.chdir(tmp_path)
    services: list[str] = []

    @contextmanager
    def service(work: Path) -> Iterator[SimpleNamespace]:
        services.append(harness._child_env().get("PYTHONHASHSEED", "unset"))  # what serve gets
        yield SimpleNamespace(url="http://127.0.0.1:9")

    monkeypatch.setattr(instructions, "running_service", service)
    work = ["--rows", "10,20", "--async-script", "--work-dir", str(tmp_path / "w")]

    assert instructions.main(["HEAD", *work]) == 0
    out = capsys.readouterr().out
    assert "PYTHONHASHSEED 0\n" in out
    assert (tmp_path / "seeds.log").read_text().split("\n")[:-1] == [
        "engine 0",
        "script 0",
    ] * 2  # both children at both sizes
    assert services == ["0"] * 4

    (tmp_path / "seeds.log").unlink()
    assert instructions.main(["HEAD", *work, "--hash-seed", "3,1,2"]) == 0
    out = capsys.readouterr().out
    assert "PYTHONHASHSEED 3, 1, 2\n" in out
    seen = (tmp_path / "seeds.log").read_text().split()
    assert seen[1::2] == ["3"] * 4 + ["1"] * 4 + ["2"] * 4
    assert services[4:] == ["3"] * 4 + ["1"] * 4 + ["2"] * 4
    # (header + 20 rows) * (100 + seed) - (header + 10 rows) * (100 + seed): 10 * (100 + seed)
    assert "| async script | 1 | 0.000 | 0.000 | 101 |" in out
    assert "| async script | median | | | 102 |" in out
    assert "/ async script: 1.000x" in out

    (tmp_path / "seeds.log").unlink()
    assert instructions.main(["HEAD", *work, "--hash-seed", "random"]) == 0
    assert "PYTHONHASHSEED random\n" in capsys.readouterr().out
    assert set((tmp_path / "seeds.log").read_text().split()[1::2]) == {"unset"}
    assert set(services[16:]) == {"unset"}
    with pytest.raises(SystemExit):
        instructions.main(["HEAD", *work, "--hash-seed", "-1"])
