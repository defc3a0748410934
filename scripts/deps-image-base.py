"""The Debian base layers of the lab's container images, made offline.

    python3 scripts/deps-image-base.py

The lab installs the Helm chart on its cluster (tests/tests/claim_chart_lab.rs),
so kubelet needs the driver's image without a registry. This makes its base
the way the Containerfile's runtime stage would, from Debian's packages:
`debootstrap --variant=minbase bookworm` (what debian:bookworm-slim is made
of), then the `RUN` lines of the Containerfile's `apt-sources` stage and of
its last stage, run in that root as they are written (so the package list
lives only in the Containerfile). A second layer adds python3 and
python3-grpcio for the lab's two stand-in sidecars (tests/lab/registrar.py,
tests/lab/livenessprobe.py). Each layer is a plain tar with its sha256 (the
layer's diff ID) beside it:

    ~/.cache/pillar-csi/image-base/runtime.tar{,.sha256}
    ~/.cache/pillar-csi/image-base/python.tar{,.sha256}

A stamp holds the hash of this script and the Containerfile: a second run
with neither changed returns at once. tests/lab/mkimage.py puts the images
together.
"""
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONTAINERFILE = os.path.join(TOP, "Containerfile")
OUT = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                   "pillar-csi", "image-base")
PYTHON_PACKAGES = ["python3", "python3-grpcio"]
# Documentation and caches an image does not need (as debian:bookworm-slim
# leaves them out).
TRIM = ["usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale",
        "var/cache/apt", "var/lib/apt/lists", "var/log", "usr/sbin/policy-rc.d"]


def stages(text):
    """The Containerfile's stages: [(name, base image, [(instruction,
    arguments)])], continuation lines joined, comments left out."""
    lines, current = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        lines.append(current + line)
        current = ""
    result = []
    for line in lines:
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            m = re.search(r"\bAS\s+(\S+)", rest, re.I)
            result.append((m.group(1) if m else "", rest.split()[0], []))
        else:
            result[-1][2].append((word.upper(), rest.strip()))
    return result


def run_in(root, command):
    subprocess.run(["chroot", root, "/bin/sh", "-ec", command], check=True,
                   env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive",
                        "LANG": "C"})


def trim(root):
    for path in TRIM:
        full = os.path.join(root, path)
        if os.path.isdir(full) and not os.path.islink(full):
            for entry in os.listdir(full):
                e = os.path.join(full, entry)
                shutil.rmtree(e) if os.path.isdir(e) and not os.path.islink(e) else os.remove(e)
        elif os.path.lexists(full):
            os.remove(full)


def inventory(root):
    """Every path under root with what tells a changed file: type, mode,
    size, mtime, link target."""
    seen = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            link = os.readlink(full) if os.path.islink(full) else None
            seen[os.path.relpath(full, root)] = (st.st_mode, st.st_size, st.st_mtime_ns, link)
    return seen


def write_layer(root, paths, whiteouts, out):
    """A layer tar of `paths` under root (parents first) and whiteout
    entries for the paths deleted."""
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in paths:
            tar.add(os.path.join(root, path), arcname=path, recursive=False)
        for path in whiteouts:
            head, tail = os.path.split(path)
            info = tarfile.TarInfo(os.path.join(head, ".wh." + tail))
            tar.addfile(info)
    digest = hashlib.sha256()
    with open(out, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    with open(out + ".sha256", "w") as f:
        f.write(digest.hexdigest() + "\n")


def mirror():
    try:
        with open("/etc/apt/sources.list.d/debian.sources") as f:
            m = re.search(r"^URIs:\s*(\S+)", f.read(), re.M)
            if m:
                return m.group(1)
    except OSError:
        pass
    return "http://deb.debian.org/debian"


def main():
    with open(__file__, "rb") as f, open(CONTAINERFILE, "rb") as g:
        stamp = hashlib.sha256(f.read() + g.read()).hexdigest()
    stamp_file = os.path.join(OUT, "stamp")
    try:
        with open(stamp_file) as f:
            if f.read().strip() == stamp and all(
                    os.path.exists(os.path.join(OUT, n)) for n in ("runtime.tar.sha256", "python.tar.sha256")):
                return
    except OSError:
        pass
    os.makedirs(OUT, exist_ok=True)
    work = tempfile.mkdtemp(prefix="image-base.")
    try:
        root = os.path.join(work, "root")
        subprocess.run(["debootstrap", "--variant=minbase", "bookworm", root, mirror()],
                       check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(root, "usr/sbin/policy-rc.d"), "w") as f:
            f.write("#!/bin/sh\nexit 101\n")  # no service starts in the chroot
        os.chmod(os.path.join(root, "usr/sbin/policy-rc.d"), 0o755)
        parsed = stages(open(CONTAINERFILE).read())
        _, base, final = parsed[-1]
        # Stages on the same base run in this root (apt-sources); a stage
        # on another (the cargo build) gives the binary, the image's own layer.
        same_base = {name: steps for name, image, steps in parsed if image == base}
        for instruction, args in final:
            if instruction == "RUN":
                run_in(root, args)
            elif instruction == "COPY" and args.startswith("--from="):
                source_stage, src, dst = re.match(r"--from=(\S+)\s+(\S+)\s+(\S+)", args).groups()
                if source_stage not in same_base:
                    continue
                for inner, inner_args in same_base[source_stage]:
                    if inner == "RUN":
                        run_in(root, inner_args)
                shutil.move(os.path.join(root, src.lstrip("/")), os.path.join(root, dst.lstrip("/")))
        trim(root)
        before = inventory(root)
        write_layer(root, sorted(before), [], os.path.join(OUT, "runtime.tar"))
        run_in(root, "apt-get update -q && apt-get install -y -q --no-install-recommends "
               + " ".join(PYTHON_PACKAGES) + " && apt-get clean")
        trim(root)
        after = inventory(root)
        changed = {p for p, v in after.items() if before.get(p) != v}
        # The parents of what changed come along (a layer names its folders).
        for path in list(changed):
            head = os.path.dirname(path)
            while head:
                changed.add(head)
                head = os.path.dirname(head)
        gone = [p for p in before if p not in after and os.path.dirname(p) in after]
        write_layer(root, sorted(changed), sorted(gone), os.path.join(OUT, "python.tar"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    with open(stamp_file, "w") as f:
        f.write(stamp + "\n")
    sizes = ", ".join(f"{n} {os.path.getsize(os.path.join(OUT, n)) >> 20} MiB"
                      for n in ("runtime.tar", "python.tar"))
    print(f"deps-image-base: ready in {OUT} ({sizes})")


if __name__ == "__main__":
    sys.exit(main())
