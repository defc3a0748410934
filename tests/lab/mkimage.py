"""The lab kubelet's container images, made without a registry.

    mkimage.py OUT                  writes OUT/pause.tar and OUT/busybox.tar
    mkimage.py chart OUT.tar BINARY writes the chart's images to OUT.tar

Each archive is in the `docker save` layout that `ctr images import` reads
(manifest.json, each config named by its digest, each layer's plain tar
named by its diff ID; images of one archive share their layers).

`localhost/pause:lab` is the pods' sandbox (containerd's `sandbox_image`):
a shell that waits until it is told to stop. `localhost/busybox:lab` is
what the test pods run. Both are one layer: the host's busybox-static and
a link per applet the tests use.

`chart` makes the images the Helm chart's install runs (tests/tests/
claim_chart_lab.rs), on the Debian base layers scripts/deps-image-base.py
made from the Containerfile's runtime stage:

- `localhost/pillar-csi:lab`: the base and BINARY (debug info stripped) as
  /usr/bin/pillar-csi, the Containerfile's image;
- the CSI sidecars at the references charts/pillar-csi/values.yaml names
  (csi-provisioner, -attacher, -resizer, -snapshotter), each the base and
  the binary scripts/deps-sidecars.sh built at that version;
- `localhost/node-driver-registrar:lab` and `localhost/livenessprobe:lab`:
  the base, its python layer and the lab's stand-in for that sidecar
  (tests/lab/registrar.py, tests/lab/livenessprobe.py), which the Go
  module proxy does not serve.
"""
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

APPLETS = ("sh", "cat", "echo", "sleep", "sync", "dd", "mount", "stat", "test",
           "ls", "mkdir", "rm", "sha256sum", "head", "true", "df")


def member(tar, name, data, mode=0o644):
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def layer():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in ("bin", "dev", "etc", "proc", "sys", "tmp", "data"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        with open("/bin/busybox", "rb") as f:
            member(tar, "bin/busybox", f.read(), 0o755)
        for applet in APPLETS:
            info = tarfile.TarInfo("bin/" + applet)
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
    return buf.getvalue()


CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "pillar-csi")
HERE = os.path.dirname(os.path.abspath(__file__))
VALUES = os.path.join(HERE, "..", "..", "charts", "pillar-csi", "values.yaml")
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_archive(path, images):
    """images: [(reference, [layer tar files], entrypoint, cmd, env)]."""
    diff_ids, manifest = {}, []
    with tarfile.open(path, "w") as tar:
        for ref, layers, entrypoint, cmd, env in images:
            ids = []
            for layer_file in layers:
                if layer_file not in diff_ids:
                    diff_ids[layer_file] = sha256_of(layer_file)
                    tar.add(layer_file, arcname=diff_ids[layer_file] + "/layer.tar")
                ids.append(diff_ids[layer_file])
            config = json.dumps({
                "architecture": "amd64", "os": "linux",
                "config": {"Env": env, "Entrypoint": entrypoint, "Cmd": cmd, "WorkingDir": "/"},
                "rootfs": {"type": "layers", "diff_ids": ["sha256:" + i for i in ids]},
            }, sort_keys=True).encode()
            config_name = hashlib.sha256(config).hexdigest() + ".json"
            member(tar, config_name, config)
            manifest.append({"Config": config_name, "RepoTags": [ref],
                             "Layers": [i + "/layer.tar" for i in ids]})
        member(tar, "manifest.json", json.dumps(manifest).encode())


def file_layer(out, source, dest, strip):
    """A layer of one file at `dest` (its folders too); ELF debug info
    stripped from a copy when `strip`."""
    with tempfile.NamedTemporaryFile(dir=os.path.dirname(out)) as copy:
        if strip:
            subprocess.run(["objcopy", "--strip-debug", source, copy.name], check=True)
            source = copy.name
        with tarfile.open(out, "w") as tar:
            parts = dest.strip("/").split("/")
            for i in range(1, len(parts)):
                info = tarfile.TarInfo("/".join(parts[:i]))
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            info = tar.gettarinfo(source, arcname="/".join(parts))
            info.mode, info.uid, info.gid, info.uname, info.gname = 0o755, 0, 0, "root", "root"
            with open(source, "rb") as f:
                tar.addfile(info, f)
    return out


def sidecar_refs():
    """{binary: image reference} of the controller's sidecars in the chart's values."""
    with open(VALUES) as f:
        refs = re.findall(r"image:\s*(\S+/(csi-(?:provisioner|attacher|resizer|snapshotter)):\S+)", f.read())
    return {name: ref for ref, name in refs}


def chart_images(out, binary):
    base = os.path.join(CACHE, "image-base")
    runtime, python = os.path.join(base, "runtime.tar"), os.path.join(base, "python.tar")
    for layer_file in (runtime, python):
        if not os.path.exists(layer_file):
            sys.exit(f"mkimage: {layer_file} is missing: run scripts/deps-image-base.py (make deps)")
    work = tempfile.mkdtemp(prefix="chart-images.", dir=os.path.dirname(os.path.abspath(out)))
    try:
        images = [("localhost/pillar-csi:lab",
                   [runtime, file_layer(os.path.join(work, "pillar-csi.tar"), binary, "/usr/bin/pillar-csi", True)],
                   ["/usr/bin/pillar-csi"], None, [PATH_ENV])]
        for name, ref in sorted(sidecar_refs().items()):
            layer_file = file_layer(os.path.join(work, name + ".tar"), os.path.join(CACHE, "go-bin", name),
                                    "/usr/bin/" + name, True)
            images.append((ref, [runtime, layer_file], ["/usr/bin/" + name], None, [PATH_ENV]))
        for name, script in (("node-driver-registrar", "registrar.py"), ("livenessprobe", "livenessprobe.py")):
            layer_file = file_layer(os.path.join(work, name + ".tar"), os.path.join(HERE, script),
                                    "/usr/local/bin/" + script, False)
            images.append((f"localhost/{name}:lab", [runtime, python, layer_file],
                           ["python3", "-u", "/usr/local/bin/" + script], None, [PATH_ENV]))
        write_archive(out, images)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for ref, layers, *_ in images:
        print(f"mkimage: {ref} ({len(layers)} layers)")


def busybox_image(path, ref, entrypoint, cmd):
    with tempfile.NamedTemporaryFile(dir=os.path.dirname(os.path.abspath(path))) as f:
        f.write(layer())
        f.flush()
        write_archive(path, [(ref, [f.name], entrypoint, cmd, ["PATH=/bin"])])


def main():
    if sys.argv[1:2] == ["chart"] and len(sys.argv) == 4:
        chart_images(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) != 2:
        sys.exit("usage: mkimage.py OUT | mkimage.py chart OUT.tar BINARY")
    out = sys.argv[1]
    busybox_image(out + "/pause.tar", "localhost/pause:lab",
                  ["/bin/sh", "-c", "trap 'exit 0' TERM INT; sleep 2147483647 & wait"], None)
    busybox_image(out + "/busybox.tar", "localhost/busybox:lab", None, ["/bin/sh"])


if __name__ == "__main__":
    main()
