"""The lab kubelet's two container images, made without a registry.

    mkimage.py OUT    writes OUT/pause.tar and OUT/busybox.tar

Each is a one-layer image in the `docker save` layout that `ctr images
import` reads (manifest.json, the config named by its digest, the layer's
plain tar named by its diff ID), its root the host's busybox-static and a
link per applet the tests use. `localhost/pause:lab` is the pods' sandbox
(containerd's `sandbox_image`): a shell that waits until it is told to
stop. `localhost/busybox:lab` is what the test pods run.
"""
import hashlib
import io
import json
import sys
import tarfile

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


def image(path, ref, entrypoint, cmd):
    data = layer()
    diff_id = hashlib.sha256(data).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Entrypoint": entrypoint, "Cmd": cmd, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + diff_id]},
    }, sort_keys=True).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": [ref], "Layers": [diff_id + "/layer.tar"]}]
    with tarfile.open(path, "w") as tar:
        member(tar, config_name, config)
        member(tar, diff_id + "/layer.tar", data)
        member(tar, "manifest.json", json.dumps(manifest).encode())


def main():
    out = sys.argv[1]
    image(out + "/pause.tar", "localhost/pause:lab",
          ["/bin/sh", "-c", "trap 'exit 0' TERM INT; sleep 2147483647 & wait"], None)
    image(out + "/busybox.tar", "localhost/busybox:lab", None, ["/bin/sh"])


if __name__ == "__main__":
    main()
