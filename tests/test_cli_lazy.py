"""The CLI imports only the module of the command given (`cli.main.COMMANDS`, `cli.bench.BENCHMARKS`): the tables
must name exactly what each module registers, and a parser built for one command must parse it as the full one."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from evolving_infra.cli import bench
from evolving_infra.cli.main import COMMANDS, build_parser


def _choices(parser: argparse.ArgumentParser) -> list[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def _registered(module_name: str) -> list[str]:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    importlib.import_module(module_name).register(sub)
    return _choices(parser)


def test_each_command_module_registers_the_command_it_is_listed_under() -> None:
    for name, module_name in COMMANDS.items():
        assert _registered(module_name) == [name], module_name
    assert _choices(build_parser()) == list(COMMANDS)


def test_each_benchmark_module_registers_the_benchmarks_it_is_listed_under() -> None:
    for module_name in dict.fromkeys(bench.BENCHMARKS.values()):
        listed = [name for name, m in bench.BENCHMARKS.items() if m == module_name]
        assert _registered(module_name) == listed, module_name
    full = build_parser()
    bench_parser = full._subparsers._group_actions[0].choices["bench"]  # type: ignore[union-attr]
    assert _choices(bench_parser) == list(bench.BENCHMARKS)


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "sim", "--duration", "60", "--json"],
        ["bench", "switch"],
        ["bench", "router", "--prefill-nodes", "8"],
        ["simulate", "--workload", "putnam", "--agents", "2"],
        ["fleet", "status", "--partitions", "x.yaml", "--json"],
        ["fleet", "status", "--file", "x.yaml"],  # (not an option of it: refused by both)
        ["trace", "validate", "t.jsonl"],
    ],
)
def test_a_parser_for_one_command_parses_it_as_the_full_parser(argv: list[str]) -> None:
    try:
        expected = vars(build_parser().parse_args(argv))
    except SystemExit:  # (an argument the command does not take: both must refuse it alike)
        with pytest.raises(SystemExit):
            build_parser(argv).parse_args(argv)
        return
    assert vars(build_parser(argv).parse_args(argv)) == expected


def test_unknown_commands_and_benchmarks_are_refused_with_every_choice_listed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv, listed in ((["nope"], COMMANDS), (["bench", "nope"], bench.BENCHMARKS)):
        with pytest.raises(SystemExit) as exc:
            build_parser(argv).parse_args(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert "invalid choice: 'nope'" in err
        assert all(f"'{name}'" in err for name in listed)


def test_a_command_imports_only_its_own_module() -> None:
    code = (
        "import sys; from evolving_infra.cli.main import build_parser, COMMANDS; "
        "build_parser(['bench', 'directory']); "
        "print(sorted(m for m in COMMANDS.values() if m in sys.modules)); "
        "print(sorted(m for m in sys.modules if m.startswith('evolving_infra.cli.bench_')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "['evolving_infra.cli.bench']"
    assert out[1] == "['evolving_infra.cli.bench_directory']"
