"""Settings files never crash a service: any bytes give a mapping or a `SettingsError` naming the file (and,
for YAML errors, the line and column); aliases (the YAML bomb) and oversized files are refused; the node
agent CLI exits 2 on each. Bounded fuzzing with hypothesis."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.settings import MAX_SETTINGS_BYTES, SettingsError, read_settings_file

BOMB = b'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + b"".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n".encode() for i in range(8)
)


def read(data: bytes) -> object:
    with tempfile.NamedTemporaryFile(suffix=".yaml") as handle:
        handle.write(data)
        handle.flush()
        return read_settings_file(Path(handle.name))


_yamlish = st.lists(
    st.sampled_from([b"node: a\n", b"peers: {a: b}\n", b"- x\n", b"&a [1]\n", b"*a\n", b"{", b"]", b": ", b"\t", b"\xff",
                     b"!!python/object:os.system\n", b"%YAML 1.1\n", b"---\n", b"key: 'unterminated\n", b"\x00"]),
    max_size=12,
).map(b"".join)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | _yamlish)
def test_any_bytes_give_a_mapping_or_a_settings_error(data: bytes) -> None:
    try:
        assert isinstance(read(data), dict)
    except SettingsError as error:
        assert error.source.endswith(".yaml") and error.problems


def test_alias_bombs_and_huge_files_are_refused_with_a_position() -> None:
    with pytest.raises(SettingsError, match=r"(?s)aliases .* not allowed.*line 2, column"):
        read(BOMB)
    with pytest.raises(SettingsError, match="larger than"):
        read(b"a: b\n" * (MAX_SETTINGS_BYTES // 5 + 1))
    with pytest.raises(SettingsError, match="not UTF-8"):
        read(b"node: \xff\n")


def test_the_node_agent_cli_exits_2_on_a_bomb(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_bytes(BOMB)
    argv = [sys.executable, "-P", "-m", "evolving_infra", "node-agent", "serve", "--settings", str(path), "--insecure"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert str(path) in done.stderr and "line 2" in done.stderr
