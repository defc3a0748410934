"""The packaged chart (what `helm package` makes and the OCI release
publishes) renders the same objects as the folder: files/crds, files/rbac and
the templates all travel in the archive."""
import pathlib
import tarfile
import tempfile

import helm_python as helm

from chart import CHART, render


def test_packaged_chart_renders_what_the_folder_renders():
    with tempfile.TemporaryDirectory() as tmp:
        archive = pathlib.Path(helm.Chart.load(str(CHART)).save(tmp))
        assert archive.name == "pillar-csi-0.1.0.tgz"
        with tarfile.open(archive) as tar:
            names = tar.getnames()
        assert "pillar-csi/files/rbac/controller-rules.yaml" in names
        assert [n for n in names if n.startswith("pillar-csi/files/crds/")], names
        assert [n for n in names if n.startswith("pillar-csi/examples/")], names
        assert render(chart=archive) == render()
