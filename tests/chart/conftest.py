"""A real API server per test module that asks for `server` (scripts/apiserver.sh:
etcd and kube-apiserver 1.20 on free loopback ports, stopped after the module)."""
import shutil
import subprocess

import pytest

from chart import ROOT

APISERVER = ROOT / "scripts" / "apiserver.sh"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if shutil.which("kube-apiserver") is None or shutil.which("kubectl") is None:
        pytest.fail("kube-apiserver or kubectl not on PATH: run `make deps`")
    folder = tmp_path_factory.mktemp("apiserver")
    subprocess.run(["bash", str(APISERVER), "start", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["bash", str(APISERVER), "stop", str(folder)], check=True)
