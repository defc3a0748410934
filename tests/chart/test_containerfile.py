"""The Containerfile stays honest: every shared library the built binary links
(ldd) comes from a package its runtime stage installs, directly or through that
package's dependencies; the libraries the binary names itself (NEEDED) come from
packages the stage lists by name, or from Debian's required base. No image is
built here (no container engine); the host's dpkg database, the same Debian
release, says which package owns each library."""
import functools
import os
import pathlib
import re
import shlex
import subprocess

import pytest

from chart import ROOT, pillar_csi_binary

CONTAINERFILE = ROOT / "Containerfile"
NODE_TOOLS = {"mkfs.ext4": "e2fsprogs", "mkfs.xfs": "xfsprogs", "iscsiadm": "open-iscsi",
              "exportfs": "nfs-kernel-server"}


def runtime_packages() -> set[str]:
    """Package names of every `apt-get install` in the last stage."""
    text = CONTAINERFILE.read_text().replace("\\\n", " ")
    last_stage = re.split(r"^FROM ", text, flags=re.M)[-1]
    packages = set()
    for command in re.findall(r"apt-get install([^&\n]*)", last_stage):
        words = shlex.split(command)
        skip_next = False
        for word in words:
            if skip_next:
                skip_next = False
            elif word in ("-t", "--target-release"):
                skip_next = True
            elif not word.startswith("-"):
                packages.add(word)
    return packages


@functools.cache
def database() -> dict[str, dict]:
    """Every installed package: its dependencies and whether Debian's base has it."""
    out = subprocess.run(
        ["dpkg-query", "-W", "-f=${Package}\t${db:Status-Status}\t${Essential}\t${Priority}"
         "\t${Depends}, ${Pre-Depends}\n"], capture_output=True, text=True, check=True).stdout
    packages = {}
    for line in out.splitlines():
        name, status, essential, priority, depends = line.split("\t")
        if status != "installed":
            continue
        names = [a.strip().split(" ")[0].split(":")[0] for a in re.split(r"[,|]", depends)]
        packages[name] = {"base": essential == "yes" or priority == "required",
                          "depends": [n for n in names if n]}
    return packages


@functools.cache
def owner(library: str) -> str:
    """The package that ships `library` (usr-merged paths tried both ways)."""
    real = os.path.realpath(library)
    candidates = {library, real}
    for path in list(candidates):
        candidates.add(path[len("/usr"):] if path.startswith("/usr/") else "/usr" + path)
    for path in sorted(candidates):
        result = subprocess.run(["dpkg-query", "-S", path], capture_output=True, text=True)
        for line in result.stdout.splitlines():
            if not line.startswith("diversion"):
                return line.split(":", 1)[0]
    raise AssertionError(f"no Debian package ships {library}")


def closure(packages: set[str]) -> set[str]:
    """The packages and everything they depend on (every installed alternative)."""
    db = database()
    seen, todo = set(), list(packages)
    while todo:
        package = todo.pop()
        if package in seen or package not in db:
            continue
        seen.add(package)
        todo.extend(db[package]["depends"])
    return seen


def base_image() -> set[str]:
    """What every Debian image has: the Essential and Priority: required
    packages and their dependencies."""
    return closure({name for name, p in database().items() if p["base"]})


def ldd(path: pathlib.Path) -> dict[str, str]:
    out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) => (/\S+)", line) or re.match(r"\s*(/\S+) \(", line)
        if m:
            found[m.group(1)] = m.group(m.lastindex)
    return found


def needed(path: pathlib.Path) -> set[str]:
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True,
                         check=True).stdout
    return set(re.findall(r"\(NEEDED\)\s+Shared library: \[(.+)\]", out))


def test_every_linked_library_comes_from_a_package_the_runtime_stage_installs():
    libraries = ldd(pillar_csi_binary())
    assert libraries, "ldd listed no library"
    packages = runtime_packages()
    provided = closure(packages | base_image())
    missing = {lib: owner(path) for lib, path in libraries.items()
               if owner(path) not in provided}
    assert not missing, f"libraries from packages the Containerfile never installs: {missing}"


def test_every_library_the_binary_names_is_listed_by_package():
    libraries = ldd(pillar_csi_binary())
    listed = runtime_packages() | base_image()
    unlisted = {lib: owner(libraries[lib]) for lib in needed(pillar_csi_binary())
                if lib in libraries and owner(libraries[lib]) not in listed}
    assert not unlisted, f"NEEDED libraries whose package the Containerfile does not name: {unlisted}"


def test_the_node_tools_are_installed():
    packages = runtime_packages()
    for tool, package in NODE_TOOLS.items():
        assert package in packages, f"{tool}: {package} is not installed by the Containerfile"


def test_the_check_fails_when_a_library_package_is_dropped():
    """The check can fail: without liblvm2cmd2.03 in the list, liblvm2cmd is missing."""
    packages = runtime_packages() - {"liblvm2cmd2.03"}
    provided = closure(packages | base_image())
    libraries = ldd(pillar_csi_binary())
    assert owner(libraries["liblvm2cmd.so.2.03"]) not in provided
