"""The live router's settings: sources and their order, and errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from evolving_infra.router.service import ApplierKind, RouterSettings, SettingsError, load_settings


def test_file_environment_and_flags_in_that_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "router.yaml"
    file.write_text("nodes: {n0: '127.0.0.1:5000'}\nport: 7000\nmetrics_port: 7001\nplanner: static\n")
    monkeypatch.setenv("EVOLVING_ROUTER_METRICS_PORT", "7002")
    settings = load_settings(file, {"planner": "dynamo", "port": None})
    assert (settings.port, settings.metrics_port, settings.planner) == (7000, 7002, "dynamo")
    assert settings.nodes == {"n0": "127.0.0.1:5000"} and settings.applier is ApplierKind.LOCAL


def test_bad_settings_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(None, {"nodes": {"n0": "nohost"}, "port": 70000})
    fields = [f for f, _ in info.value.problems]
    assert "port" in fields and "nodes" in fields
    with pytest.raises(SettingsError, match="exactly one of nodes"):
        load_settings(None, {})
    with pytest.raises(SettingsError, match="cluster_name"):
        load_settings(None, {"nodes": {"n0": "h:1"}, "applier": "kubernetes"})
    with pytest.raises(SettingsError, match="unknown setting"):
        load_settings(None, {"nodes": {"n0": "h:1"}, "colour": "red"})
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(SettingsError, match="mapping"):
        load_settings(bad)
    assert RouterSettings(nodes_dns="router-nodes.ns.svc:50051").nodes == {}


def test_unknown_policies_and_policy_settings_are_refused_naming_them(tmp_path: Path) -> None:
    node = {"nodes": {"n0": "h:1"}}
    with pytest.raises(SettingsError, match="unknown planner policy 'magic'; known: ours"):
        load_settings(None, {**node, "planner": "magic"})
    with pytest.raises(SettingsError, match="unknown prefill routing policy 'fastest'"):
        load_settings(None, {**node, "prefill_routing": "fastest"})
    with pytest.raises(SettingsError, match="routing_settings.*cache_treshold"):
        load_settings(None, {**node, "prefill_routing": "cache-aware", "routing_settings": {"cache_treshold": 0.4}})
    with pytest.raises(SettingsError, match=r"planner_settings\.cooldown_s"):
        load_settings(None, {**node, "planner_settings": {"cooldown_s": "soon"}})
    with pytest.raises(SettingsError, match="plugins: cannot load 'no_such_policy_module'"):
        load_settings(None, {**node, "plugins": ["no_such_policy_module"]})
    file = tmp_path / "router.yaml"
    file.write_text("nodes: {n0: 'h:1'}\nplanner: ours\nplanner_settings: {significance: -1}\n")
    with pytest.raises(SettingsError, match="significance must be >= 0"):
        load_settings(file)
