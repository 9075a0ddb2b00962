"""`operator validate` never crashes: byte-mutated copies of an example AgentServingCluster, and documents whose
top-level fields are replaced by random YAML values, exit 0 or 2 (a message naming the file), never with a
traceback; an alias bomb is refused at its first alias. Bounded fuzzing with hypothesis."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evolving_infra.cli.main import main

EXAMPLE = Path(__file__).resolve().parents[2] / "manifests" / "examples" / "fleet-3072-gpus" / "partition-0.yaml"
SOURCE = EXAMPLE.read_bytes()
BASE = yaml.safe_load(SOURCE)


def validate(data: bytes, tmp: Path) -> tuple[int, str]:
    path = tmp / "cr.yaml"
    path.write_bytes(data)
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["operator", "validate", str(path)])
    return code, err.getvalue()


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(SOURCE)
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["set", "insert", "delete"]))
        if op == "set":
            data[pos] = draw(st.integers(0, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.sampled_from([b"\xff", b"\n", b"- ", b"{", b"]", b": ", b"\t", b"&a ", b"*a", b"!!binary "]))
        else:
            del data[pos : pos + draw(st.integers(1, 30))]
    return bytes(data)


_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)


@st.composite
def reshaped(draw: st.DrawFn) -> bytes:
    doc = dict(BASE)
    for key in draw(st.lists(st.sampled_from(["metadata", "spec", "apiVersion", "kind"]), max_size=2, unique=True)):
        doc[key] = draw(_values)
    if isinstance(doc.get("spec"), dict) and draw(st.booleans()):
        spec = dict(doc["spec"])
        if spec:
            spec[draw(st.sampled_from(sorted(spec)))] = draw(_values)
        doc["spec"] = spec
    return yaml.safe_dump(doc).encode()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=mutated() | reshaped())
def test_validate_exits_0_or_2_on_any_input(data: bytes, tmp_path: Path) -> None:
    code, err = validate(data, tmp_path)
    assert code in (0, 2), err
    if code == 2:
        assert "error:" in err and "Traceback" not in err


def test_an_alias_bomb_is_refused_with_its_position(tmp_path: Path) -> None:
    bomb = b'a: &a ["x","x","x","x","x","x","x","x"]\n' + b"".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 8)}]\n".encode() for i in range(9)
    )
    code, err = validate(bomb, tmp_path)
    assert code == 2 and "aliases" in err and "line 2" in err


@pytest.mark.parametrize("data", [b"apiVersion: x\nkind: AgentServingCluster\nmetadata: [1]\n", b"\xff\xfe\x00"])
def test_malformed_documents_are_named_problems(data: bytes, tmp_path: Path) -> None:
    code, err = validate(data, tmp_path)
    assert code == 2 and "Traceback" not in err
