"""The agent's config file the chart renders is accepted by the real agent's
parser and checks (agent/src/config.rs): `pillar-csi agent --config` gets past
its configuration and on to start-up. The TLS paths are the pod's, so the test
points the flags (which override the file) at empty files of its own."""
import pathlib
import subprocess

import pytest
import yaml

from chart import CASES, agent_config, pillar_csi_binary, render

REFUSED = "invalid agent configuration"


def run_agent(config: dict, tmp_path: pathlib.Path) -> str:
    """The agent's stderr: it stops at start-up (no /dev/zfs on the host) or,
    where it could start, is stopped after a few seconds."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    args = [str(pillar_csi_binary()), "agent", "--config", str(path),
            "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state")]
    if "tls" in config:
        for flag in ("--tls-cert", "--tls-key", "--tls-client-ca"):
            empty = tmp_path / flag.strip("-")
            empty.touch()
            args += [flag, str(empty)]
    try:
        result = subprocess.run(args, capture_output=True, text=True, timeout=10)
        return result.stderr
    except subprocess.TimeoutExpired as running:
        return (running.stderr or b"").decode()


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_config_is_accepted_by_the_agent(case, tmp_path):
    stderr = run_agent(agent_config(render(CASES[case])), tmp_path)
    assert REFUSED not in stderr, f"{case}: {stderr}"


def test_the_agent_refuses_a_config_key_it_does_not_know(tmp_path):
    """The check can fail: a key the agent does not know is refused by name."""
    config = agent_config(render())
    config["stateDirectory"] = "/tmp"
    stderr = run_agent(config, tmp_path)
    assert REFUSED in stderr and "stateDirectory" in stderr, stderr
